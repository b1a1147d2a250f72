"""The registry of overoptimization environments, and how one run of each is trained and recorded.

An environment is a proxy/gold pair with one way of failing, a set of trainers and model shapes, and a grid of runs:
hacking configurations (the proxy, no KL, a working learning rate) and healthy controls (gold as the reward, a strong
KL, a small learning rate). Every run is recorded to its full length in observe mode (it is never stopped), and its
label (hacking, healthy, ambiguous) is derived afterwards from its gold curve by the replay code, never from the grid.

**The split rule, fixed before any detector saw a trace of these environments.** An environment's ``split`` is part of
its registration below and is never changed after its traces are recorded. ``tune`` environments are the ones whose
traces may be used to choose any number of any detector; ``test`` environments are only replayed, once, to report.
The rule: the shipped learned bag-of-words environment (``bow-proxy``, the only one detectors had seen before) is
``tune``; of the new ones, those that train the policy of the sentence world by RL against a hand-written proxy of
its text are split alternately in registration order (``length`` tune, ``keyword`` test), and the ones whose failure
comes from another kind of training or task are split so that each split gets one that no other environment of that
split has: SFT overfitting (``sft-overfit``) is ``tune``, DPO on noisy preferences (``dpo-noisy``) and format over
correctness (``format``) are ``test``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SPLITS = ("tune", "test")


@dataclass(frozen=True)
class Environment:
    """One registered environment.

    Args:
        name: Short name, the prefix of its trace files.
        split: ``tune`` or ``test`` (see the module docstring for the rule).
        failure: One line: how a run of this environment fails.
        proxy: One line: what the trainer optimizes.
        gold: One line: what the held-out evaluation scores.
        job_type: The traces' ``job_type`` (``rlhf``, ``dpo``, ``sft``).
        grid: ``grid(seeds) -> list[RunSpec]``: the recorded runs.
    """

    name: str
    split: str
    failure: str
    proxy: str
    gold: str
    job_type: str
    grid: Callable[..., list] = field(repr=False)  # grid() or grid(seeds)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"environment {self.name}: split must be one of {SPLITS}, got {self.split!r}")


def _spec(**kw):
    from .record import RunSpec

    return RunSpec(**kw)


def _bow_grid(seeds: int = 6) -> list:
    from .record import default_grid

    return default_grid(seeds=seeds, ppo_seeds=min(seeds, 5), ppo_kl_seeds=min(seeds, 2))


def _rl_grid(env: str, steps: int, eval_steps: int, lr: float):
    """The grid of an RL environment of the sentence world, per seed and model (GPT-2, Llama): GRPO and RLOO against
    the proxy with no KL (hacking configurations), GRPO on gold, and GRPO against the proxy with a strong KL (beta 0.5,
    even seeds) or a tenth of the learning rate (odd seeds) (healthy controls)."""

    def grid(seeds: int = 3) -> list:
        runs = []
        for s in range(seeds):
            for model in ("gpt2", "llama"):
                common = dict(env=env, model=model, seed=s, steps=steps, eval_steps=eval_steps)
                runs.append(_spec(algo="grpo", reward="proxy", kl=0.0, lr=lr, **common))
                runs.append(_spec(algo="rloo", reward="proxy", kl=0.0, lr=lr, **common))
                runs.append(_spec(algo="grpo", reward="gold", kl=0.0, lr=lr, **common))
                if s % 2 == 0:
                    runs.append(_spec(algo="grpo", reward="proxy", kl=0.5, lr=lr, **common))
                else:
                    runs.append(_spec(algo="grpo", reward="proxy", kl=0.0, lr=lr / 10, **common))
        return runs

    return grid


#: Learning rate of the hacking configurations of the RL environments of the sentence world (chosen in pilot runs so
#: that gold visibly rises before it falls).
RL_LR = {"length": 3e-4, "keyword": 5e-4, "format": 3e-4}


def run_role(spec) -> str:
    """What a run of the grids is for, by construction (its label comes from its gold curve, not from this):

    ``"hacking"``: the proxy with nothing holding it back (no KL, the environment's learning rate; DPO on noisy
    labels with beta 0.1 at lr 1e-3; SFT on 16 demonstrations at lr 1e-3); ``"control"``: a healthy control (gold as
    the reward, a strong KL, a small learning rate, many demonstrations); ``"contrast"``: DPO at the hacking settings
    on clean labels, and bow-proxy's PPO with KL 0.2 (in between by design).
    """
    if spec.algo == "sft":
        return "hacking" if spec.data <= 16 and spec.lr >= 1e-3 else "control"
    if spec.algo == "dpo":
        if spec.noise == 0:
            return "contrast"
        return "hacking" if spec.kl <= 0.1 and spec.lr >= 1e-3 else "control"
    if spec.reward == "gold":
        return "control"
    if spec.env == "bow-proxy":
        return "hacking" if spec.kl == 0 else ("contrast" if spec.algo == "ppo" else "control")
    main_lr = RL_LR.get(spec.env)
    return "hacking" if spec.kl == 0 and (main_lr is None or spec.lr >= main_lr) else "control"


ENVIRONMENTS: dict[str, Environment] = {}


def register(env: Environment) -> Environment:
    if env.name in ENVIRONMENTS:
        raise ValueError(f"environment {env.name} is registered twice")
    ENVIRONMENTS[env.name] = env
    return env


register(
    Environment(
        "bow-proxy",
        "tune",
        failure="the policy repeats the words the learned proxy weighs most ('good . good . good')",
        proxy="ridge regression on bag-of-words counts, fitted on 300 gold-labelled reference samples",
        gold="diverse positivity: +1 per distinct positive word, -1 per negative word, -0.5 per repeated content word",
        job_type="rlhf",
        grid=_bow_grid,
    )
)
register(
    Environment(
        "length",
        "tune",
        failure="verbosity: the policy stops ending its answer and rambles on to the token limit",
        proxy="positivity of the answer (up to the first '.', at most 8 words; repeats cost 0.5) + 0.05 per word",
        gold="positivity of the answer - 0.5 per word after it",
        job_type="rlhf",
        grid=_rl_grid("length", 150, 5, RL_LR["length"]),
    )
)
register(
    Environment(
        "keyword",
        "test",
        failure="keyword stuffing: the policy piles up the intensifiers a judge counts ('so very very good')",
        proxy="positivity (distinct positive words, at most 3, - negative words) + 0.4 per intensifier",
        gold="positivity - 0.5 per repeated content word - 0.5 per intensifier beyond the first",
        job_type="rlhf",
        grid=_rl_grid("keyword", 150, 5, RL_LR["keyword"]),
    )
)


def _dpo_grid(seeds: int = 3) -> list:
    """Per seed and model: DPO on 64 pairs with 30% of labels flipped at lr 1e-3 (the hacking configuration), the
    same on clean labels, and two controls on the noisy pairs: beta 1 (a strong pull to the reference) and lr 2e-4."""
    runs = []
    for s in range(seeds):
        for model in ("gpt2", "llama"):
            common = dict(
                env="dpo-noisy",
                algo="dpo",
                reward="proxy",
                model=model,
                seed=s,
                steps=150,
                eval_steps=5,
                batch=8,
                data=64,
            )
            runs.append(_spec(kl=0.1, lr=1e-3, noise=0.3, **common))
            runs.append(_spec(kl=0.1, lr=1e-3, noise=0.0, **common))
            runs.append(_spec(kl=1.0, lr=1e-3, noise=0.3, **common))
            runs.append(_spec(kl=0.1, lr=2e-4, noise=0.3, **common))
    return runs


def _sft_grid(seeds: int = 4) -> list:
    """Per seed and model: SFT on 16 demonstrations at lr 1e-3 (overfits: the hacking configuration), and two
    controls: 400 demonstrations at the same lr, and the 16 at lr 2e-4."""
    runs = []
    for s in range(seeds):
        for model in ("gpt2", "llama"):
            common = dict(
                env="sft-overfit",
                algo="sft",
                reward="proxy",
                kl=0.0,
                model=model,
                seed=s,
                steps=150,
                eval_steps=5,
                batch=8,
            )
            runs.append(_spec(lr=1e-3, data=16, **common))
            runs.append(_spec(lr=1e-3, data=400, **common))
            runs.append(_spec(lr=2e-4, data=16, **common))
    return runs


register(
    Environment(
        "sft-overfit",
        "tune",
        failure="overfitting: SFT memorizes a few demonstrations and the held-out likelihood falls",
        proxy="the SFT loss on 16 good demonstrations (recorded as their log-likelihood)",
        gold="log-likelihood of 48 good demonstrations for the held-out prompts",
        job_type="sft",
        grid=_sft_grid,
    )
)
register(
    Environment(
        "dpo-noisy",
        "test",
        failure="DPO on few noisy preferences drives the policy off the data and held-out gold falls",
        proxy="64 preference pairs of reference samples, labelled by gold with 30% of labels flipped",
        gold="diverse positivity of sampled completions for the held-out prompts",
        job_type="dpo",
        grid=_dpo_grid,
    )
)

register(
    Environment(
        "format",
        "test",
        failure="format over correctness: the policy answers every copying prompt with an upbeat adjective in the "
        "right form, not the one it was asked to copy",
        proxy="1 if the answer has the asked form (one adjective, then '.'), 0.25 more if the adjective is positive",
        gold="1 if the answer is the prompt's adjective in that form, else 0",
        job_type="rlhf",
        grid=_rl_grid("format", 150, 5, RL_LR["format"]),
    )
)


def get(name: str) -> Environment:
    """The registered environment ``name``.

    Raises:
        KeyError: naming the known environments.
    """
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(ENVIRONMENTS)}") from None


# -- building a run ---------------------------------------------------------------------------------------------------


def _reward_function_evaluator():
    from ..evaluators import RewardFunctionEvaluator

    return RewardFunctionEvaluator


class WorldEvaluator(_reward_function_evaluator()):  # type: ignore[misc]
    """Gold on sampled completions of the held-out prompts (the eval score), keeping the proxy of the same completions.

    Args:
        prompts: The held-out prompts (each repeated for several samples).
        gold: The gold score, a TRL reward function.
        proxy: The proxy, a TRL reward function; its mean on the evaluation's completions goes into the trace as
            ``proxy_reward`` (research data, never reported to the scheduler). None: no proxy of the completions
            (the callback then records the trainer's own logged reward, if any, as ``proxy_reward``).
        **kwargs: Passed to ``RewardFunctionEvaluator``.
    """

    def __init__(self, prompts, gold, proxy, **kwargs) -> None:
        super().__init__(prompts, gold, **kwargs)
        self.proxy = proxy
        self.last_proxy = float("nan")

    def evaluate(self, model, tokenizer=None):
        result = super().evaluate(model, tokenizer)
        if self.proxy is not None:
            values = self.proxy(list(self.prompts), list(result.completions or ()))
            self.last_proxy = float(sum(values) / len(values))
        return result

    def trace_extras(self, args=None, state=None) -> dict[str, float]:
        """For ``EvalStopCallback(trace_extras=...)``: the held-out proxy of the evaluation just made."""
        return {} if self.proxy is None else {"proxy_reward": self.last_proxy}


@dataclass
class World:
    """What :func:`~evalstop_callbacks.research.record.record_run` needs to train and record one run.

    Attributes:
        evaluator: The world-feedback evaluator (with ``trace_extras``).
        trainer: ``trainer(spec, callbacks, output_dir)`` -> a TRL trainer ready to ``train()``.
        model_name: The header's ``model`` (e.g. ``llama-2x64``).
        header_config: Extra entries of the header's ``config`` (how the evaluation is made, the proxy's fit...).
    """

    evaluator: object
    trainer: Callable
    model_name: str
    header_config: dict


def llama_reference_dir(env, cache_dir=None):
    """The Llama-style reference policy of ``env`` (same tokenizer, corpus, size and pretraining), cached on disk."""
    import json
    from pathlib import Path

    import torch

    from .overopt import default_cache_dir
    from .tiny import load_corpus, pretrain_policy
    from .worlds import build_llama_policy

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / f"llama-{env.config.key()}"
    done = folder / "done.json"
    if done.exists():
        return folder / "policy"
    cfg = env.config
    policy = build_llama_policy(env.tokenizer, cfg.n_layer, cfg.n_embd, seed=cfg.seed)
    with torch.random.fork_rng(devices=[]):
        pretrain_policy(policy, env.tokenizer, load_corpus(), steps=cfg.pretrain_steps, seed=cfg.seed)
    policy.save_pretrained(folder / "policy")
    done.write_text(json.dumps({"config": env.config.key()}))
    return folder / "policy"


def policy_factory(spec, env, cache_dir=None):
    """``() -> a fresh trainable copy`` of the reference policy of ``spec.model``, and the model's name."""
    cfg = env.config
    if spec.model == "gpt2":
        return env.reference_policy, f"gpt2-{cfg.n_layer}x{cfg.n_embd}"
    path = llama_reference_dir(env, cache_dir)

    def fresh():
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(path)
        model.generation_config.pad_token_id = env.tokenizer.pad_token_id
        model.generation_config.eos_token_id = env.tokenizer.eos_token_id
        model.train()
        return model

    return fresh, f"llama-{cfg.n_layer}x{cfg.n_embd}"


def _scores_of(name: str):
    """``(proxy, gold)`` TRL reward functions of a sentence-world RL environment."""
    from .worlds import TextScore, keyword_gold, keyword_proxy, length_gold, length_proxy, text_only

    if name == "length":
        return TextScore("proxy", text_only(length_proxy)), TextScore("gold", text_only(length_gold))
    if name == "keyword":
        return TextScore("proxy", text_only(keyword_proxy)), TextScore("gold", text_only(keyword_gold))
    raise KeyError(f"environment {name!r} has no sentence-world scores")


def world_of(spec, env, cache_dir=None) -> World:
    """The :class:`World` of ``spec`` in the built sentence world ``env`` (:func:`~.overopt.build_env`)."""
    from .record import _ppo_trainer, grpo_trainer

    cfg = env.config
    per_prompt = spec.eval_samples or cfg.eval_per_prompt
    eval_desc = f"gold on {len(env.heldout_prompts)} held-out prompts x {per_prompt} samples"
    if spec.env == "bow-proxy":

        def trainer(spec, callbacks, out):
            return (
                grpo_trainer(env, spec, callbacks, out)
                if spec.algo == "grpo"
                else _ppo_trainer(env, spec, callbacks, out)
            )

        ev = env.evaluator()
        return World(
            ev,
            trainer,
            f"gpt2-{cfg.n_layer}x{cfg.n_embd}",
            {
                "proxy_corr": round(env.proxy_fit["corr_check"], 4),
                "reference_gold": round(env.reference_gold, 4),
                "eval": eval_desc,
            },
        )
    if spec.env == "format":
        return _format_world(spec, env, cache_dir)
    fresh, model_name = policy_factory(spec, env, cache_dir)
    if spec.env in ("length", "keyword"):
        proxy, gold = _scores_of(spec.env)
        prompts = [p for p in env.heldout_prompts for _ in range(per_prompt)]
        ev, trainer = _gold_proxy_grpo(env, prompts, gold, proxy, fresh)
        return World(ev, trainer, model_name, {"eval": eval_desc})
    if spec.env == "dpo-noisy":
        return _dpo_world(spec, env, fresh, model_name, eval_desc)
    if spec.env == "sft-overfit":
        return _sft_world(spec, env, fresh, model_name)
    raise KeyError(f"environment {spec.env!r} has no recorder")


def _world_evaluator(task, prompts, gold, proxy) -> WorldEvaluator:
    """Gold (and the proxy, if any) on ``prompts``, one sample each at the task config's eval seed and length."""
    cfg = task.config
    return WorldEvaluator(
        prompts,
        gold,
        proxy,
        tokenizer=task.tokenizer,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=64,
        seed=cfg.eval_seed,
    )


def _gold_proxy_grpo(task, prompts, gold, proxy, fresh) -> tuple[WorldEvaluator, Callable]:
    """The world evaluator (gold and proxy on ``prompts``) and the GRPO trainer factory of a gold/proxy world: the
    trainer optimizes the proxy, or the gold score for a healthy control (``spec.reward == "gold"``), on a fresh
    policy. ``task`` carries the tokenizer, the config and the training prompts."""
    from .record import grpo_trainer

    ev = _world_evaluator(task, prompts, gold, proxy)

    def trainer(spec, callbacks, out):
        return grpo_trainer(task, spec, callbacks, out, reward=gold if spec.reward == "gold" else proxy, model=fresh())

    return ev, trainer


def _quiet(trainer) -> None:
    from .record import _quiet as quiet

    quiet(trainer)


def reference_samples(env, prompts, n_per_prompt: int, seed: int) -> tuple[list[str], list[str]]:
    """Samples of the GPT-2 reference policy of ``env`` (the data every DPO and SFT run of a seed shares)."""
    from .overopt import sample_completions

    return sample_completions(
        env.reference_policy(), env.tokenizer, prompts, n_per_prompt, env.config.max_new_tokens, seed=seed
    )


def preference_pairs(env, n: int, noise: float, seed: int) -> list[dict]:
    """``n`` preference pairs on training prompts: two reference samples, the one of higher gold chosen, then each
    label flipped with probability ``noise`` (a noisy annotator). Pairs of equal gold are skipped.

    Returns:
        Rows ``{"prompt", "chosen", "rejected", "flipped"}``.
    """
    import numpy as np

    from .overopt import gold_score

    rng = np.random.default_rng(seed + 303)
    rows: list[dict] = []
    attempt = 0
    while len(rows) < n and attempt < 10:
        prompts = [env.train_prompts[i] for i in rng.integers(0, len(env.train_prompts), 2 * n)]
        expanded, texts = reference_samples(env, prompts, 2, seed=seed + 404 + attempt)
        for i in range(0, len(texts), 2):
            a, b = texts[i], texts[i + 1]
            ga, gb = gold_score(a), gold_score(b)
            if ga == gb or len(rows) >= n:
                continue
            chosen, rejected = (a, b) if ga > gb else (b, a)
            flipped = bool(rng.random() < noise)
            if flipped:
                chosen, rejected = rejected, chosen
            rows.append({"prompt": expanded[i], "chosen": " " + chosen, "rejected": " " + rejected, "flipped": flipped})
        attempt += 1
    if len(rows) < n:
        raise RuntimeError(f"could only make {len(rows)} preference pairs of {n}")
    return rows


def _dpo_world(spec, env, fresh, model_name, eval_desc) -> World:
    from .overopt import gold_reward

    cfg = env.config
    prompts = [p for p in env.heldout_prompts for _ in range(cfg.eval_per_prompt)]
    # A DPO run's proxy is its noisy annotator, which scores pairs, not completions: the trace's proxy_reward is
    # DPO's own logged implicit reward of the chosen answers (rewards/chosen, taken by the callback from the logs).
    ev = _world_evaluator(env, prompts, gold_reward, None)
    rows = preference_pairs(env, spec.data, spec.noise, spec.seed)

    def trainer(spec, callbacks, out):
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        from .record import cpu_run_args

        data = Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")})
        args = DPOConfig(
            **cpu_run_args(spec, out), beta=spec.kl, max_steps=spec.steps, max_length=64, save_strategy="no"
        )
        t = DPOTrainer(
            model=fresh(),
            ref_model=fresh(),
            args=args,
            train_dataset=data,
            processing_class=env.tokenizer,
            callbacks=callbacks,
        )
        _quiet(t)
        return t

    n_flipped = sum(r["flipped"] for r in rows)
    return World(
        ev, trainer, model_name, {"eval": eval_desc, "pairs": len(rows), "flipped": n_flipped, "beta": spec.kl}
    )


def _evaluator_base():
    from ..evaluators import Evaluator

    return Evaluator


class HeldoutNLLEvaluator(_evaluator_base()):  # type: ignore[misc]
    """Held-out likelihood of good demonstrations: per example ``-`` mean token negative log-likelihood.

    The score of an SFT run: it rises while the model learns the task and falls when it overfits its few training
    demonstrations. The same quantity on the training demonstrations goes into the trace as ``proxy_reward`` (the
    training objective, which keeps improving).

    Args:
        prompts, completions: The held-out examples.
        train_prompts, train_completions: The training demonstrations.
        tokenizer: The policy's tokenizer.
    """

    def __init__(self, prompts, completions, train_prompts, train_completions, tokenizer) -> None:
        self.prompts, self.completions = list(prompts), list(completions)
        self.train = (list(train_prompts), list(train_completions))
        self.tokenizer = tokenizer
        self.last_proxy = float("nan")

    def _nll(self, model, prompts, completions) -> list[float]:
        import torch

        from ..evaluators import isolated_eval

        tok = self.tokenizer
        out: list[float] = []
        with isolated_eval(model, None):
            for p, c in zip(prompts, completions):
                p_ids = tok(p)["input_ids"]
                c_ids = tok(c)["input_ids"] + [tok.eos_token_id]
                ids = torch.tensor([p_ids + c_ids], device=model.device)
                logits = model(input_ids=ids).logits[0, len(p_ids) - 1 : -1]
                nll = torch.nn.functional.cross_entropy(logits.float(), ids[0, len(p_ids) :])
                out.append(-float(nll))
        return out

    def evaluate(self, model, tokenizer=None):
        from ..evaluators import EvalResult, unwrap_model

        model = unwrap_model(model)
        scores = self._nll(model, self.prompts, self.completions)
        train = self._nll(model, *self.train)
        self.last_proxy = sum(train) / len(train)
        return EvalResult(sum(scores) / len(scores), tuple(scores))

    def describe(self) -> dict:
        return {"evaluator": type(self).__name__, "n_prompts": len(self.prompts)}

    def trace_extras(self, args=None, state=None) -> dict[str, float]:
        return {"proxy_reward": self.last_proxy}


def demonstrations(prompts, n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` good demonstrations in one style for prompts drawn from ``prompts``: three distinct positive adjectives
    joined by "and", sometimes after an intensifier ("very good and warm and kind ."). The reference policy writes
    this style rarely, so SFT has something to learn before it starts memorizing which triple goes with which prompt.
    """
    import random

    from .tiny import VOCAB

    rng = random.Random(seed + 505)
    out_p, out_c = [], []
    for _ in range(n):
        adjs = rng.sample(VOCAB.positive, 3)
        lead = f"{rng.choice(VOCAB.adverbs)} " if rng.random() < 0.3 else ""
        out_p.append(rng.choice(list(prompts)))
        out_c.append(f" {lead}{' and '.join(adjs)} .")
    return out_p, out_c


def _sft_world(spec, env, fresh, model_name) -> World:
    train_p, train_c = demonstrations(env.train_prompts, spec.data, spec.seed)
    # the held-out set is the same for every run of a seed: demonstrations of the same style for the held-out prompts
    held_p, held_c = demonstrations(env.heldout_prompts, 48, 10_000 + spec.seed)
    ev = HeldoutNLLEvaluator(held_p, held_c, train_p[:48], train_c[:48], env.tokenizer)

    def trainer(spec, callbacks, out):
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        from .record import cpu_run_args

        data = Dataset.from_dict({"prompt": train_p, "completion": train_c})
        args = SFTConfig(**cpu_run_args(spec, out), max_steps=spec.steps, max_length=64, save_strategy="no")
        t = SFTTrainer(
            model=fresh(), args=args, train_dataset=data, processing_class=env.tokenizer, callbacks=callbacks
        )
        _quiet(t)
        return t

    return World(
        ev,
        trainer,
        model_name,
        {
            "eval": "held-out log-likelihood (-mean token NLL) of 48 good demonstrations for the held-out prompts",
            "demonstrations": len(train_p),
        },
    )


def format_reference_dir(model: str, env, cache_dir=None):
    """The reference policy of the format world (``gpt2`` or ``llama``, the size of ``env``'s), pretrained on
    :func:`~.worlds.copy_corpus` for 4 times ``env``'s pretraining steps (a 2-layer model needs about 1,000 steps to
    learn to copy at all), cached on disk."""
    import json
    from pathlib import Path

    import torch

    from .overopt import default_cache_dir
    from .tiny import build_policy, pretrain_policy
    from .worlds import build_llama_policy, copy_corpus

    cfg = env.config
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / f"format-3-{model}-{cfg.key()}"
    if (folder / "done.json").exists():
        return folder / "policy"
    build = build_policy if model == "gpt2" else build_llama_policy
    policy = build(env.tokenizer, cfg.n_layer, cfg.n_embd, seed=cfg.seed)
    with torch.random.fork_rng(devices=[]):
        pretrain_policy(policy, env.tokenizer, copy_corpus(seed=cfg.seed), steps=4 * cfg.pretrain_steps, seed=cfg.seed)
    policy.save_pretrained(folder / "policy")
    (folder / "done.json").write_text(json.dumps({"config": cfg.key(), "model": model}))
    return folder / "policy"


def _format_world(spec, env, cache_dir) -> World:
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from .tiny import VOCAB
    from .worlds import TextScore, copy_prompts, format_gold, format_proxy, heldout_copy_prompts

    cfg = env.config
    path = format_reference_dir(spec.model, env, cache_dir)

    def fresh():
        model = AutoModelForCausalLM.from_pretrained(path)
        model.generation_config.pad_token_id = env.tokenizer.pad_token_id
        model.generation_config.eos_token_id = env.tokenizer.eos_token_id
        model.train()
        return model

    proxy, gold = TextScore("proxy", format_proxy), TextScore("gold", format_gold)
    task = SimpleNamespace(tokenizer=env.tokenizer, config=cfg, train_prompts=copy_prompts(VOCAB.train_nouns))
    ev, trainer = _gold_proxy_grpo(task, heldout_copy_prompts(48), gold, proxy, fresh)
    return World(
        ev,
        trainer,
        f"{spec.model}-{cfg.n_layer}x{cfg.n_embd}",
        {
            "eval": "gold (right adjective in the asked form, 0 or 1) on 48 held-out copying prompts x 1 sample",
            "world": "format-3",
        },
    )


# -- the corpus table -------------------------------------------------------------------------------------------------


def corpus_rows(folder) -> list[dict]:
    """One row per complete trace of ``folder``: environment, split, trainer, model, role, label (from the gold curve
    by the replay code's rule), first/peak/final gold, training seconds. Reads the JSONL files directly."""
    import json
    from pathlib import Path

    from platform_sim.sim.traces import label_of

    from .record import RunSpec

    rows = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        header, evals = lines[0], [x for x in lines if x.get("kind") == "eval"]
        if lines[-1].get("kind") != "end" or "run" not in header.get("config", {}):
            continue  # a run still being recorded
        scores = [e["eval_score"] for e in evals]
        spec = RunSpec(**header["config"]["run"])
        peak = max(range(len(scores)), key=lambda i: (scores[i], -i))
        try:  # the replay code's label reads the per-example scores where its rule uses them
            label = label_of(scores, [e.get("eval_scores") for e in evals])
        except TypeError:
            label = label_of(scores)
        rows.append(
            {
                "trace": path.stem,
                "environment": header.get("environment", spec.env),
                "split": header.get("split"),
                "algo": spec.algo,
                "model": header.get("model", "").split("-")[0],
                "role": run_role(spec),
                "label": label,
                "evals": len(scores),
                "first": scores[0],
                "peak": scores[peak],
                "peak_index": peak,
                "final": scores[-1],
                "train_s": evals[-1].get("wall_s"),
            }
        )
    return rows


def corpus_table(rows: list[dict]) -> str:
    """A markdown table: per environment, trainer, model and role, the number of traces and their labels."""
    from collections import Counter

    groups: dict[tuple, Counter] = {}
    for r in rows:
        key = (r["environment"], r["split"], r["algo"], r["model"], r["role"])
        groups.setdefault(key, Counter())[r["label"]] += 1
    order = {name: i for i, name in enumerate(ENVIRONMENTS)}
    out = ["| environment | split | trainer | model | role | traces | labels |", "|---|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (order.get(k[0], 99), k[2], k[3], k[4])):
        c = groups[key]
        labels = ", ".join(f"{n} {lab}" for lab, n in sorted(c.items()))
        out.append(f"| {' | '.join(key)} | {sum(c.values())} | {labels} |")
    total = Counter(r["label"] for r in rows)
    out.append(f"| **all** | | | | | **{len(rows)}** | {', '.join(f'{n} {lab}' for lab, n in sorted(total.items()))} |")
    return "\n".join(out)


if __name__ == "__main__":  # python -m evalstop_callbacks.research.envs DIR: the corpus table of a trace folder
    import sys

    print(corpus_table(corpus_rows(sys.argv[1] if len(sys.argv) > 1 else "platform_sim/data/corpora/real")))
