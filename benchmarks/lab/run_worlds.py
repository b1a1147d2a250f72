"""How one run of each environment is set up: its held-out evaluator, its trainer and what its trace header records
(a :class:`World`, built by :func:`world_of` from the run's spec and the built sentence world)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from evalstop_callbacks.demo.overopt import OveroptEnv, gold_reward
from evalstop_callbacks.demo.tiny import VOCAB, load_policy

from .references import format_reference_dir, policy_factory
from .runs import RunSpec
from .train_data import demonstrations, preference_pairs
from .trainers import dpo_trainer, grpo_trainer, ppo_trainer, sft_trainer
from .world_evaluators import HeldoutNLLEvaluator, WorldEvaluator
from .worlds import (
    TextScore,
    copy_prompts,
    format_gold,
    format_proxy,
    heldout_copy_prompts,
    keyword_gold,
    keyword_proxy,
    length_gold,
    length_proxy,
    text_only,
)

#: ``trainer(spec, callbacks, output_dir)`` -> a TRL trainer ready to ``train()``.
TrainerFactory = Callable[[RunSpec, list, str], Any]


@dataclass
class World:
    """What :func:`~lab.record.record_run` needs to train and record one run.

    Attributes:
        evaluator: The world-feedback evaluator (with ``trace_extras``).
        trainer: ``trainer(spec, callbacks, output_dir)`` -> a TRL trainer ready to ``train()``.
        model_name: The header's ``model`` (e.g. ``llama-2x64``).
        header_config: Extra entries of the header's ``config`` (how the evaluation is made, the proxy's fit...).
    """

    evaluator: Any
    trainer: TrainerFactory
    model_name: str
    header_config: dict


def world_of(spec: RunSpec, env: OveroptEnv, cache_dir: str | Path | None = None) -> World:
    """The :class:`World` of ``spec`` in the built sentence world ``env`` (:func:`~evalstop_callbacks.demo.overopt.build_env`).

    Args:
        spec: The run.
        env: The built sentence world of the run's seed.
        cache_dir: The cache of the reference policies beyond ``env``'s own.

    Raises:
        KeyError: for an environment with no recorder.
    """
    cfg = env.config
    per_prompt = spec.eval_samples or cfg.eval_per_prompt
    eval_desc = f"gold on {len(env.heldout_prompts)} held-out prompts x {per_prompt} samples"
    if spec.env == "bow-proxy":

        def bow_trainer(spec: RunSpec, callbacks: list, out: str) -> Any:
            return (
                grpo_trainer(env, spec, callbacks, out)
                if spec.algo == "grpo"
                else ppo_trainer(env, spec, callbacks, out)
            )

        return World(
            env.evaluator(),
            bow_trainer,
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


def _scores_of(name: str) -> tuple[TextScore, TextScore]:
    """``(proxy, gold)`` TRL reward functions of a sentence-world RL environment."""
    if name == "length":
        return TextScore("proxy", text_only(length_proxy)), TextScore("gold", text_only(length_gold))
    if name == "keyword":
        return TextScore("proxy", text_only(keyword_proxy)), TextScore("gold", text_only(keyword_gold))
    raise KeyError(f"environment {name!r} has no sentence-world scores")


def _world_evaluator(task: Any, prompts: list[str], gold: Callable, proxy: Callable | None) -> WorldEvaluator:
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


def _gold_proxy_grpo(
    task: Any, prompts: list[str], gold: Callable, proxy: Callable, fresh: Callable[[], Any]
) -> tuple[WorldEvaluator, TrainerFactory]:
    """The world evaluator (gold and proxy on ``prompts``) and the GRPO trainer factory of a gold/proxy world: the
    trainer optimizes the proxy, or the gold score for a healthy control (``spec.reward == "gold"``), on a fresh
    policy. ``task`` carries the tokenizer, the config and the training prompts."""
    ev = _world_evaluator(task, prompts, gold, proxy)

    def trainer(spec: RunSpec, callbacks: list, out: str) -> Any:
        return grpo_trainer(task, spec, callbacks, out, reward=gold if spec.reward == "gold" else proxy, model=fresh())

    return ev, trainer


def _dpo_world(spec: RunSpec, env: OveroptEnv, fresh: Callable[[], Any], model_name: str, eval_desc: str) -> World:
    cfg = env.config
    prompts = [p for p in env.heldout_prompts for _ in range(cfg.eval_per_prompt)]
    # A DPO run's proxy is its noisy annotator, which scores pairs, not completions: the trace's proxy_reward is
    # DPO's own logged implicit reward of the chosen answers (rewards/chosen, taken by the callback from the logs).
    ev = _world_evaluator(env, prompts, gold_reward, None)
    rows = preference_pairs(env, spec.data, spec.noise, spec.seed)

    def trainer(spec: RunSpec, callbacks: list, out: str) -> Any:
        return dpo_trainer(spec, out, rows, fresh, env.tokenizer, callbacks)

    n_flipped = sum(r["flipped"] for r in rows)
    return World(
        ev, trainer, model_name, {"eval": eval_desc, "pairs": len(rows), "flipped": n_flipped, "beta": spec.kl}
    )


def _sft_world(spec: RunSpec, env: OveroptEnv, fresh: Callable[[], Any], model_name: str) -> World:
    train_p, train_c = demonstrations(env.train_prompts, spec.data, spec.seed)
    # the held-out set is the same for every run of a seed: demonstrations of the same style for the held-out prompts
    held_p, held_c = demonstrations(env.heldout_prompts, 48, 10_000 + spec.seed)
    ev = HeldoutNLLEvaluator(held_p, held_c, train_p[:48], train_c[:48], env.tokenizer)

    def trainer(spec: RunSpec, callbacks: list, out: str) -> Any:
        return sft_trainer(spec, out, train_p, train_c, fresh, env.tokenizer, callbacks)

    return World(
        ev,
        trainer,
        model_name,
        {
            "eval": "held-out log-likelihood (-mean token NLL) of 48 good demonstrations for the held-out prompts",
            "demonstrations": len(train_p),
        },
    )


def _format_world(spec: RunSpec, env: OveroptEnv, cache_dir: str | Path | None) -> World:
    cfg = env.config
    path = format_reference_dir(spec.model, env, cache_dir)
    proxy, gold = TextScore("proxy", format_proxy), TextScore("gold", format_gold)
    task = SimpleNamespace(tokenizer=env.tokenizer, config=cfg, train_prompts=copy_prompts(VOCAB.train_nouns))
    ev, trainer = _gold_proxy_grpo(
        task, heldout_copy_prompts(48), gold, proxy, lambda: load_policy(path, env.tokenizer)
    )
    return World(
        ev,
        trainer,
        f"{spec.model}-{cfg.n_layer}x{cfg.n_embd}",
        {
            "eval": "gold (right adjective in the asked form, 0 or 1) on 48 held-out copying prompts x 1 sample",
            "world": "format-3",
        },
    )
