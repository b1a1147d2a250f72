"""The reference policies the recorded runs start from, beyond the bag-of-words environment's own GPT-2: a
Llama-style policy of the same size and pretraining, and the format world's copying policies. Each is pretrained
once and cached on disk (under :func:`~evalstop_callbacks.demo.overopt.default_cache_dir`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evalstop_callbacks.demo.overopt import OveroptEnv, default_cache_dir
from evalstop_callbacks.demo.tiny import build_policy, load_corpus, load_policy, pretrain_policy

from .runs import RunSpec
from .worlds import build_llama_policy, copy_corpus


def _cached_policy(
    folder: Path,
    build: Callable[..., Any],
    env: OveroptEnv,
    corpus: Callable[[], Sequence[str]],
    steps: int,
    meta: dict,
) -> Path:
    """``folder/policy``: a policy of ``env``'s size and seed made by ``build``, pretrained on ``corpus()`` for
    ``steps`` (torch's global random stream left as it was), unless ``folder/done.json`` says it is there already."""
    import torch

    done = folder / "done.json"
    if done.exists():
        return folder / "policy"
    cfg = env.config
    policy = build(env.tokenizer, cfg.n_layer, cfg.n_embd, seed=cfg.seed)
    with torch.random.fork_rng(devices=[]):
        pretrain_policy(policy, env.tokenizer, corpus(), steps=steps, seed=cfg.seed)
    policy.save_pretrained(folder / "policy")
    done.write_text(json.dumps(meta))  # written last: a half-built folder is rebuilt
    return folder / "policy"


def _root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def llama_reference_dir(env: OveroptEnv, cache_dir: str | Path | None = None) -> Path:
    """The Llama-style reference policy of ``env`` (same tokenizer, corpus, size and pretraining), cached on disk.

    Args:
        env: The built sentence world.
        cache_dir: The cache (default :func:`~evalstop_callbacks.demo.overopt.default_cache_dir`).
    """
    cfg = env.config
    folder = _root(cache_dir) / f"llama-{cfg.key()}"
    return _cached_policy(folder, build_llama_policy, env, load_corpus, cfg.pretrain_steps, {"config": cfg.key()})


def format_reference_dir(model: str, env: OveroptEnv, cache_dir: str | Path | None = None) -> Path:
    """The reference policy of the format world, pretrained on :func:`~.worlds.copy_corpus` for 4 times ``env``'s
    pretraining steps (a 2-layer model needs about 1,000 steps to learn to copy at all), cached on disk.

    Args:
        model: ``gpt2`` or ``llama`` (the size of ``env``'s policy).
        env: The built sentence world.
        cache_dir: The cache (default :func:`~evalstop_callbacks.demo.overopt.default_cache_dir`).
    """
    cfg = env.config
    folder = _root(cache_dir) / f"format-3-{model}-{cfg.key()}"
    build = build_policy if model == "gpt2" else build_llama_policy
    meta = {"config": cfg.key(), "model": model}
    return _cached_policy(folder, build, env, lambda: copy_corpus(seed=cfg.seed), 4 * cfg.pretrain_steps, meta)


def policy_factory(
    spec: RunSpec, env: OveroptEnv, cache_dir: str | Path | None = None
) -> tuple[Callable[[], Any], str]:
    """``() -> a fresh trainable copy`` of the sentence world's reference policy of ``spec.model``, and the model's
    name (``gpt2-2x64``, ``llama-2x64``).

    Args:
        spec: The run (its ``model``).
        env: The built sentence world.
        cache_dir: The cache of the Llama-style policy.
    """
    cfg = env.config
    if spec.model == "gpt2":
        return env.reference_policy, f"gpt2-{cfg.n_layer}x{cfg.n_embd}"
    path = llama_reference_dir(env, cache_dir)
    return lambda: load_policy(path, env.tokenizer), f"llama-{cfg.n_layer}x{cfg.n_embd}"
