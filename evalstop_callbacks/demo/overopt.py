"""A real reward-overoptimization environment, built locally on CPU in seconds.

The world is the tiny language of :mod:`evalstop_callbacks.demo.tiny` ("the cat is very good and warm ."). Three scores:

- **gold** (:func:`gold_score`, the hidden world score, "diverse positivity"): +1 per *distinct* positive word, -1 per
  negative word, -0.5 per repeated content word (adjective, adverb or noun). A policy that repeats "good" forever scores
  badly.
- **proxy** (:class:`~.proxy.BagOfWordsProxy`): a ridge regression on bag-of-words counts of prompt and completion, fitted on a
  few hundred gold-labelled samples of the reference policy. In distribution it agrees with gold (correlation about
  0.9), but a linear model of counts cannot see repetition, so "good . good . good ..." scores ever higher. This is the
  learned reward model that an RL job overoptimizes.
- The proxy is also available as a ``torch`` module (:func:`~.proxy.ProxyRewardModel`) with the layout that TRL 1.12's
  ``PPOTrainer`` expects of a reward model, so PPO and GRPO optimize exactly the same function.

Training prompts use ``Vocabulary.train_nouns``; held-out eval prompts use ``Vocabulary.heldout_nouns`` only, which
never appear in a training prompt. :func:`build_env` is deterministic for a seed and caches the pretrained reference
policy and the fitted proxy on disk (see :func:`default_cache_dir`), so a second build takes well under a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluators import EvalResult, RewardFunctionEvaluator
from .proxy import BagOfWordsProxy, ProxyRewardModel
from .sampling import completion_texts, sample_completions
from .tiny import VOCAB, Vocabulary, build_policy, build_tokenizer, load_corpus, load_policy, pretrain_policy

logger = logging.getLogger(__name__)

#: Bump when anything that changes the built environment changes, so stale caches are never reused.
ENV_VERSION = "overopt-1"

PROMPT_FRAMES: tuple[tuple[str, str], ...] = (("the", "is"), ("a", "was"), ("the", "was"), ("a", "is"))


# -- prompts and scores ---------------------------------------------------------------------------------------------


def train_prompts(vocab: Vocabulary = VOCAB) -> list[str]:
    """Training prompts ("the cat is"): every frame with every training noun (40 prompts by default)."""
    return [f"{det} {noun} {verb}" for noun in vocab.train_nouns for det, verb in PROMPT_FRAMES]


def heldout_prompts(vocab: Vocabulary = VOCAB) -> list[str]:
    """Held-out eval prompts: every frame with every held-out noun, none of which a training prompt contains."""
    return [f"{det} {noun} {verb}" for noun in vocab.heldout_nouns for det, verb in PROMPT_FRAMES]


def _content_words(vocab: Vocabulary) -> frozenset[str]:
    return frozenset(vocab.adjectives + vocab.adverbs + vocab.train_nouns + vocab.heldout_nouns)


def gold_score(text: str, vocab: Vocabulary = VOCAB) -> float:
    """The hidden world score of one completion ("diverse positivity").

    Args:
        text: The completion only (not the prompt), words separated by whitespace.
        vocab: The world's vocabulary.

    Returns:
        ``(#distinct positive words) - (#negative words) - 0.5 * (#repeats of content words)``, where a content word
        seen n > 1 times counts n - 1 repeats.
    """
    words = text.split()
    positive, negative, content = set(vocab.positive), set(vocab.negative), _content_words(vocab)
    seen: dict[str, int] = {}
    for w in words:
        if w in content:
            seen[w] = seen.get(w, 0) + 1
    distinct_pos = sum(1 for w in seen if w in positive)
    n_neg = sum(1 for w in words if w in negative)
    repeats = sum(n - 1 for n in seen.values())
    return float(distinct_pos - n_neg - 0.5 * repeats)


def gold_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """:func:`gold_score` as a TRL reward function (``reward_funcs=[gold_reward]``).

    Args:
        prompts: The prompts (unused: gold judges the completion alone).
        completions: The completions, strings or conversational message lists.
        **kwargs: Other dataset columns TRL passes along; ignored.
    """
    return [gold_score(t) for t in completion_texts(completions)]


# -- evaluation ---------------------------------------------------------------------------------------------------


class OveroptEvaluator(RewardFunctionEvaluator):
    """A :class:`~evalstop_callbacks.evaluators.RewardFunctionEvaluator` scoring gold, that also keeps the proxy.

    The gold mean is the eval score the scheduler sees; :attr:`last_proxy` (mean proxy of the same completions) is
    research data for traces and the demo's side-by-side print, never reported.

    Args:
        prompts: The held-out prompts (repeated for several samples per prompt).
        proxy: The learned proxy.
        **kwargs: Passed to ``RewardFunctionEvaluator`` (tokenizer, max_new_tokens, batch_size, seed, ...).
    """

    def __init__(self, prompts: Sequence[str], proxy: BagOfWordsProxy, **kwargs: Any) -> None:
        super().__init__(prompts, gold_reward, **kwargs)
        self.proxy = proxy
        self.last_proxy: float = float("nan")

    def evaluate(self, model: Any, tokenizer: Any = None, *, local: bool = False) -> EvalResult:
        result = super().evaluate(model, tokenizer, local=local)
        self.last_proxy = float(np.mean(self.proxy(list(self.prompts), list(result.completions or ()))))
        return result

    def trace_extras(self, args: Any = None, state: Any = None) -> dict[str, float]:
        """For ``EvalStopCallback(trace_extras=...)``: the held-out proxy of the evaluation just made.

        Also PPO's loss and KL: TRL 1.12's ``PPOTrainer`` logs a step's metrics (``loss/policy_avg``,
        ``objective/kl``) before ``on_step_end``, so they are the last log entry of the step being evaluated, which
        the callback's own log merge (made for trainers that log after ``on_step_end``) does not see.
        """
        extras = {"proxy_reward": self.last_proxy}
        history = getattr(state, "log_history", None) or []
        last = history[-1] if history else {}
        if last.get("step") == getattr(state, "global_step", None):
            for field, key in (("train_loss", "loss/policy_avg"), ("kl", "objective/kl")):
                value = last.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    extras[field] = float(value)
        return extras


@dataclass(frozen=True)
class EnvConfig:
    """Everything that determines an environment; the cache key hashes it.

    Args:
        seed: Seed of the policy initialisation, its pretraining and the proxy's labelled samples.
        n_layer, n_embd, n_head: Size of the GPT-2 reference policy.
        pretrain_steps: Language-model pretraining steps on the shipped corpus.
        proxy_samples: Gold-labelled reference samples the proxy is fitted on.
        proxy_check_samples: Fresh reference samples on which the proxy's in-distribution correlation is measured.
        ridge_alpha: L2 penalty of the ridge regression.
        max_new_tokens: Completion length, in training and in evaluation.
        eval_per_prompt: Completions per held-out prompt in an evaluation (24 prompts by default).
        eval_seed: Sampling seed of every evaluation (the same at every eval, so scores of two checkpoints differ
            only because the weights differ).
    """

    seed: int = 0
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    pretrain_steps: int = 300
    proxy_samples: int = 300
    proxy_check_samples: int = 200
    ridge_alpha: float = 1.0
    max_new_tokens: int = 16
    eval_per_prompt: int = 2
    eval_seed: int = 1234

    def key(self) -> str:
        blob = json.dumps({"version": ENV_VERSION, **asdict(self)}, sort_keys=True)
        return f"{ENV_VERSION}-seed{self.seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


@dataclass
class OveroptEnv:
    """A built environment. Use :meth:`reference_policy` for a fresh trainable copy of the reference policy.

    Attributes:
        config: What it was built from.
        tokenizer: The word-level tokenizer.
        proxy: The learned proxy reward (a TRL reward function).
        train_prompts: Prompts for training.
        heldout_prompts: Prompts for world-feedback evaluation, never seen in training.
        proxy_fit: ``{"corr_train", "corr_check", "n"}``: proxy/gold correlation on the fitting samples and on fresh
            reference samples.
        reference_gold: Held-out gold score of the reference policy (mean of an :meth:`evaluate`).
        policy_dir: Where the pretrained reference policy is saved.
    """

    config: EnvConfig
    tokenizer: Any
    proxy: BagOfWordsProxy
    train_prompts: list[str]
    heldout_prompts: list[str]
    proxy_fit: dict[str, float]
    reference_gold: float
    policy_dir: Path

    def reference_policy(self) -> Any:
        """A fresh copy of the pretrained reference policy (loaded from disk, in train mode)."""
        return load_policy(self.policy_dir, self.tokenizer)

    def proxy_model(self):
        """The proxy as a reward-model module for TRL 1.12's ``PPOTrainer``."""
        return ProxyRewardModel(self.proxy, self.tokenizer)

    def evaluator(self) -> OveroptEvaluator:
        """The world-feedback evaluator of this environment: gold on sampled completions of the held-out prompts.

        Each held-out prompt is asked ``config.eval_per_prompt`` times (48 completions by default), with the fixed
        sampling seed ``config.eval_seed``; the proxy of the same completions is kept in ``last_proxy``.
        """
        prompts = [p for p in self.heldout_prompts for _ in range(self.config.eval_per_prompt)]
        return OveroptEvaluator(
            prompts,
            proxy=self.proxy,
            tokenizer=self.tokenizer,
            max_new_tokens=self.config.max_new_tokens,
            batch_size=64,
            seed=self.config.eval_seed,
        )

    def evaluate(self, model) -> tuple[float, list[float], float]:
        """Held-out evaluation: ``(mean gold, per-example gold, mean proxy)``, exactly as :meth:`evaluator` scores."""
        ev = self.evaluator()
        result = ev.evaluate(model)
        return result.score, list(result.scores or ()), float(ev.last_proxy)


def default_cache_dir() -> Path:
    """``$EVALSTOP_CACHE``, else ``$XDG_CACHE_HOME/evalstop``, else ``~/.cache/evalstop`` (temp dir if unwritable)."""
    if os.environ.get("EVALSTOP_CACHE"):
        return Path(os.environ["EVALSTOP_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "evalstop"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        return Path(tempfile.gettempdir()) / "evalstop-cache"


def build_env(
    config: EnvConfig | None = None, cache_dir: str | os.PathLike | None = None, use_cache: bool = True
) -> OveroptEnv:
    """Build (or load from the cache) the environment of ``config``.

    Args:
        config: The environment's parameters (default :class:`EnvConfig`, seed 0).
        cache_dir: Where built environments are kept (default :func:`default_cache_dir`). One sub-folder per config.
        use_cache: If False, build from scratch into a fresh temporary folder and ignore the cache.

    Returns:
        The environment. Building from scratch takes about 10 s on one CPU thread (mostly pretraining), loading it from
        the cache well under a second.
    """
    import torch

    config = config or EnvConfig()
    tokenizer = build_tokenizer()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / config.key() if use_cache else Path(tempfile.mkdtemp(prefix="evalstop-env-"))
    meta_path = folder / "env.json"
    if use_cache and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            env = OveroptEnv(
                config,
                tokenizer,
                BagOfWordsProxy.from_dict(meta["proxy"]),
                train_prompts(),
                heldout_prompts(),
                meta["proxy_fit"],
                meta["reference_gold"],
                folder / "policy",
            )
            logger.info("loaded environment %s from cache", config.key())
            return env
        except (KeyError, ValueError, json.JSONDecodeError) as exc:  # a corrupt cache is rebuilt, not trusted
            logger.warning("ignoring unreadable environment cache %s: %s", meta_path, exc)

    policy = build_policy(tokenizer, config.n_layer, config.n_embd, config.n_head, seed=config.seed)
    with torch.random.fork_rng(devices=[]):
        pretrain_policy(policy, tokenizer, load_corpus(), steps=config.pretrain_steps, seed=config.seed)
    tp = train_prompts()
    # The proxy learns from the reference policy's own samples: that is the distribution it is good on.
    rng = np.random.default_rng(config.seed)
    fit_prompts = [tp[i] for i in rng.integers(0, len(tp), config.proxy_samples)]
    _, fit_completions = sample_completions(
        policy, tokenizer, fit_prompts, 1, config.max_new_tokens, seed=config.seed + 101
    )
    fit_gold = [gold_score(c) for c in fit_completions]
    words = [w for w in VOCAB.words]
    proxy = BagOfWordsProxy.fit(fit_prompts, fit_completions, fit_gold, words, alpha=config.ridge_alpha)
    check_prompts = [tp[i] for i in rng.integers(0, len(tp), config.proxy_check_samples)]
    _, check_completions = sample_completions(
        policy, tokenizer, check_prompts, 1, config.max_new_tokens, seed=config.seed + 202
    )
    check_gold = [gold_score(c) for c in check_completions]
    proxy_fit = {
        "n": float(config.proxy_samples),
        "corr_train": float(np.corrcoef(proxy(fit_prompts, fit_completions), fit_gold)[0, 1]),
        "corr_check": float(np.corrcoef(proxy(check_prompts, check_completions), check_gold)[0, 1]),
    }
    folder.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(folder / "policy")
    env = OveroptEnv(config, tokenizer, proxy, tp, heldout_prompts(), proxy_fit, 0.0, folder / "policy")
    env.reference_gold = env.evaluate(policy)[0]
    # Written last and atomically: a half-built folder (killed process) has no env.json and is rebuilt.
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "config": asdict(config),
                "proxy": proxy.to_dict(),
                "proxy_fit": proxy_fit,
                "reference_gold": env.reference_gold,
            },
            indent=1,
        )
    )
    tmp.replace(meta_path)
    logger.info(
        "built environment %s: proxy corr %.3f (check %.3f), reference gold %.2f",
        config.key(),
        proxy_fit["corr_train"],
        proxy_fit["corr_check"],
        env.reference_gold,
    )
    return env
