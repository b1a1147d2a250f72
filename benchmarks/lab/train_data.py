"""The training data of the DPO and SFT runs: preference pairs of reference samples labelled by a noisy annotator,
and good demonstrations in one style. Deterministic for a seed, so every run of a seed shares its data."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from evalstop_callbacks.demo.overopt import OveroptEnv, gold_score
from evalstop_callbacks.demo.sampling import sample_completions
from evalstop_callbacks.demo.tiny import VOCAB


def reference_samples(env: OveroptEnv, prompts: Sequence[str], n_per_prompt: int, seed: int) -> tuple[list, list]:
    """Samples of the GPT-2 reference policy of ``env`` (the data every DPO and SFT run of a seed shares).

    Args:
        env: The built sentence world.
        prompts: The prompts.
        n_per_prompt: Samples per prompt.
        seed: The sampling seed.

    Returns:
        ``(prompts repeated n_per_prompt times, completions)``.
    """
    return sample_completions(
        env.reference_policy(), env.tokenizer, prompts, n_per_prompt, env.config.max_new_tokens, seed=seed
    )


def preference_pairs(env: OveroptEnv, n: int, noise: float, seed: int) -> list[dict]:
    """``n`` preference pairs on training prompts: two reference samples, the one of higher gold chosen, then each
    label flipped with probability ``noise`` (a noisy annotator). Pairs of equal gold are skipped.

    Args:
        env: The built sentence world.
        n: Pairs wanted.
        noise: Probability of flipping a label.
        seed: The seed of prompts, samples and flips.

    Returns:
        Rows ``{"prompt", "chosen", "rejected", "flipped"}``.

    Raises:
        RuntimeError: when ten rounds of sampling give fewer than ``n`` pairs of unequal gold.
    """
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


def demonstrations(prompts: Sequence[str], n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` good demonstrations in one style for prompts drawn from ``prompts``: three distinct positive adjectives
    joined by "and", sometimes after an intensifier ("very good and warm and kind ."). The reference policy writes
    this style rarely, so SFT has something to learn before it starts memorizing which triple goes with which prompt.

    Args:
        prompts: The prompts to draw from.
        n: Demonstrations wanted.
        seed: The seed of the draw.

    Returns:
        ``(prompts, completions)``, ``n`` each.
    """
    rng = random.Random(seed + 505)
    out_p, out_c = [], []
    for _ in range(n):
        adjs = rng.sample(VOCAB.positive, 3)
        lead = f"{rng.choice(VOCAB.adverbs)} " if rng.random() < 0.3 else ""
        out_p.append(rng.choice(list(prompts)))
        out_c.append(f" {lead}{' and '.join(adjs)} .")
    return out_p, out_c
