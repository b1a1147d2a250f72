"""Shared pieces of the callback tests: tiny tokenizer and pretrained policy (built once per process), a gold score.

Not a test module (no ``test_`` prefix); the tests import it from the tests folder.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from evalstop_callbacks.demo.tiny import VOCAB, build_policy, build_tokenizer, pretrain_policy

torch.set_num_threads(int(os.environ.get("EVALSTOP_TEST_THREADS", "1")))

POSITIVE, NEGATIVE = set(VOCAB.positive), set(VOCAB.negative)
TRAIN_PROMPTS = [f"{det} {noun} {verb}" for noun in VOCAB.train_nouns for det, verb in (("the", "is"), ("a", "was"))]
HELDOUT_PROMPTS = [
    f"{det} {noun} {verb}" for noun in VOCAB.heldout_nouns for det, verb in (("the", "is"), ("a", "was"))
]


def gold(prompts, completions, **kwargs) -> list[float]:
    """World score: +1 per positive word, -1 per negative word (TRL reward-function signature)."""
    return [float(sum((w in POSITIVE) - (w in NEGATIVE) for w in c.split())) for c in completions]


def anti_gold(prompts, completions, **kwargs) -> list[float]:
    """A proxy that rewards negative words: training on it makes the world score decline."""
    return [-g for g in gold(prompts, completions)]


@functools.lru_cache(maxsize=1)
def _pretrained() -> tuple[Any, dict[str, torch.Tensor]]:
    tok = build_tokenizer()
    model = pretrain_policy(build_policy(tok), tok, steps=150)
    return tok, {k: v.clone() for k, v in model.state_dict().items()}


def tokenizer():
    return _pretrained()[0]


def policy():
    """A fresh copy of the pretrained tiny policy (2 layers, width 64)."""
    tok, state = _pretrained()
    model = build_policy(tok)
    model.load_state_dict(state)
    return model


#: Training arguments every tiny test trainer shares: CPU, no reports, no progress bar, no checkpoints of its own.
TRAINER_ARGS: dict[str, Any] = dict(
    use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, logging_steps=1, save_strategy="no", seed=0
)


def world_evaluator():
    """The held-out world feedback of the tiny tests: ``gold`` on 4 samples of each held-out prompt."""
    from evalstop_callbacks import RewardFunctionEvaluator

    return RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8)


def tiny_grpo(
    output_dir, cb, reward=anti_gold, max_steps: int = 16, save_total_limit: int | None = None, algo: str = "grpo"
):
    """A GRPO (or, with ``algo="rloo"``, RLOO) trainer of the tiny policy on ``reward`` (default ``anti_gold``: the
    world score declines), at a learning rate that moves it within a few steps, with ``cb`` as its one callback."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config_cls, trainer_cls = {"grpo": (GRPOConfig, GRPOTrainer), "rloo": (RLOOConfig, RLOOTrainer)}[algo]
    args = config_cls(
        output_dir=str(output_dir),
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=8,
        learning_rate=1e-2,
        max_steps=max_steps,
        beta=0.0,
        save_total_limit=save_total_limit,
        **TRAINER_ARGS,
    )
    return trainer_cls(
        model=policy(),
        reward_funcs=reward,
        args=args,
        processing_class=tokenizer(),
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8}),
        callbacks=[cb],
    )


def sentences(kind: str, n: int = 64, seed: int = 0) -> list[str]:
    """Training text whose adjectives are all ``kind`` ('positive' or 'negative'), about the training nouns."""
    import random

    rng = random.Random(seed)
    adjs = VOCAB.positive if kind == "positive" else VOCAB.negative
    return [f"the {rng.choice(VOCAB.train_nouns)} is {rng.choice(adjs)} and {rng.choice(adjs)} ." for _ in range(n)]


def first_k_decline_step(history: list[dict], k: int) -> int | None:
    """Oracle for the tests: step of the first eval that completes k consecutive declines of the recorded scores."""
    run = 0
    for prev, cur in zip(history, history[1:]):
        run = run + 1 if cur["eval_score"] < prev["eval_score"] else 0
        if run >= k:
            return cur["step"]
    return None


def checkpoint_steps(output_dir) -> list[int]:
    """Steps of the Trainer's full checkpoints (``checkpoint-<step>``)."""
    from pathlib import Path

    return sorted(int(p.name.split("-")[1]) for p in Path(output_dir).glob("checkpoint-*") if p.is_dir())


def best_weights_steps(output_dir) -> list[int]:
    """Steps of EvalStop's weights-only best folders (``evalstop-best-<step>``)."""
    from pathlib import Path

    return sorted(int(p.name.rsplit("-", 1)[1]) for p in Path(output_dir).glob("evalstop-best-*") if p.is_dir())


def end_distributed_script() -> None:
    """End a torchrun test script: wait for every rank, destroy the process group, and leave without finalizing.

    Why: gloo's worker threads can still hold work (and tensors with Python references) when the interpreter tears
    down, and destroying them then aborts the process ("terminate called without an active exception", SIGABRT) now
    and then on a loaded machine, after every result was written. The barrier makes no rank leave while another still
    talks to it; ``os._exit`` skips the finalization that races with those threads.
    """
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
