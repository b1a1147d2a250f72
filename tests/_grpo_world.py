"""The reward-hacking world of the GRPO tests that run with and without vLLM (tests/test_grpo_vllm.py).

Not a test module. The sentence world of :mod:`evalstop_callbacks.demo.tiny` with two scores of a completion:

- ``gold`` (the world score, :func:`evalstop_callbacks.demo.overopt.gold_score`): +1 per *distinct* positive word,
  -1 per negative word, -0.5 per repeated content word.
- ``proxy`` (what the hacking run optimizes): +1 per positive word, repeats included, -1 per negative word. It agrees
  with gold while the policy learns to be positive and pays for "good good good" that gold punishes, so gold rises,
  peaks and falls.

The policy is a tiny Llama built in code (vLLM runs Llama configs; a word-level tokenizer with a Qwen2 config decodes
without spaces), pretrained for a few seconds on the shipped corpus and saved to a folder, since vLLM loads a model
from a path (``model.name_or_path``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

from evalstop_callbacks.demo.overopt import gold_score
from evalstop_callbacks.demo.sampling import completion_texts
from evalstop_callbacks.demo.tiny import VOCAB, build_tokenizer, pretrain_policy, with_generation_tokens

torch.set_num_threads(int(os.environ.get("EVALSTOP_TEST_THREADS", "1")))

POSITIVE, NEGATIVE = set(VOCAB.positive), set(VOCAB.negative)
FRAMES = (("the", "is"), ("a", "was"))
TRAIN_PROMPTS = [f"{det} {noun} {verb}" for noun in VOCAB.train_nouns for det, verb in FRAMES]
HELDOUT_PROMPTS = [f"{det} {noun} {verb}" for noun in VOCAB.heldout_nouns for det, verb in FRAMES]
COMPLETION_TOKENS = 8
#: Attention heads of the tiny Llama (width 64): head size 32, the smallest vLLM's CPU attention supports.
HEADS = 2


def gold(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """The world score (TRL reward-function signature)."""
    return [gold_score(t) for t in completion_texts(completions)]


def proxy(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """The gameable score: positive words counted with their repeats, minus negative words."""
    return [float(sum((w in POSITIVE) - (w in NEGATIVE) for w in t.split())) for t in completion_texts(completions)]


def trained_gold(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """Gold under another name, for a healthy run that trains on the world score and watches ``gold`` at weight 0."""
    return gold(prompts, completions)


@functools.lru_cache(maxsize=1)
def _pretrained_state() -> tuple[Any, dict[str, torch.Tensor]]:
    from lab.worlds import build_llama_policy

    tok = build_tokenizer()
    model = pretrain_policy(build_llama_policy(tok, n_head=HEADS), tok, steps=150)
    return tok, {k: v.clone() for k, v in model.state_dict().items()}


def saved_policy(folder: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a fresh copy of the pretrained tiny Llama, saved with its tokenizer in ``folder``
    (``model.name_or_path`` points there, where TRL's colocated vLLM engine loads it from)."""
    from lab.worlds import build_llama_policy

    tok, state = _pretrained_state()
    model = build_llama_policy(tok, n_head=HEADS)
    model.load_state_dict(state)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model.name_or_path = str(folder)
    model.config.name_or_path = str(folder)
    return with_generation_tokens(model, tok), tok


def grpo_args(output_dir: Path, use_vllm: bool, steps: int, rloo: bool = False, **extra: Any) -> Any:
    """GRPO (or RLOO) arguments of the tests: CPU, fp32, a learning rate that games the proxy within a few steps."""
    from trl import GRPOConfig, RLOOConfig

    vllm: dict[str, Any] = {}
    if use_vllm:
        vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=64, vllm_gpu_memory_utilization=0.1)
    settings: dict[str, Any] = dict(
        output_dir=str(output_dir / "run"),
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=COMPLETION_TOKENS,
        learning_rate=1e-2,
        warmup_steps=4,  # the first Adam steps at 1e-2 can collapse the tiny policy to "." at once
        max_steps=steps,
        beta=0.0,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    return (RLOOConfig if rloo else GRPOConfig)(**{**settings, **vllm, **extra})


def grpo_trainer(output_dir: Path, args: Any, reward_funcs: list, callbacks: list, eval_prompts: list | None = None):
    """A GRPO (RLOO for RLOO arguments) trainer of the tiny Llama on the training prompts (and ``eval_prompts`` as its
    ``eval_dataset``)."""
    from datasets import Dataset
    from trl import GRPOTrainer, RLOOConfig, RLOOTrainer

    model, tok = saved_policy(output_dir / "policy")
    eval_dataset = Dataset.from_dict({"prompt": eval_prompts}) if eval_prompts else None
    trainer_cls = RLOOTrainer if isinstance(args, RLOOConfig) else GRPOTrainer
    return trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 16}),
        eval_dataset=eval_dataset,
        callbacks=callbacks,
    )
