"""Text in and out of a policy: the completions TRL hands a reward function, and seeded sampling of completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """The plain text of each completion (or prompt) TRL passes to a reward function.

    Args:
        completions: Plain strings (standard datasets) or lists of messages (conversational ones: the last
            message's ``content`` is the text).

    Raises:
        TypeError: naming the type of an entry that is neither.
    """
    out = []
    for c in completions:
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list) and c and isinstance(c[-1], dict):
            out.append(str(c[-1].get("content", "")))
        else:
            raise TypeError(f"a completion must be a string or a list of messages, got {type(c).__name__}")
    return out


def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    n_per_prompt: int = 1,
    max_new_tokens: int = 16,
    seed: int = 0,
    batch_size: int = 64,
) -> tuple[list[str], list[str]]:
    """Sample completions with fixed settings (temperature 1, no top-k) and a fixed seed.

    The global torch RNG is forked, so sampling never changes a training run's random stream; the model's train/eval
    mode is restored.

    Args:
        model: A causal language model.
        tokenizer: Its tokenizer (left padding).
        prompts: The prompts; each is asked ``n_per_prompt`` times.
        n_per_prompt: Completions per prompt.
        max_new_tokens: Completion length.
        seed: Sampling seed.
        batch_size: Prompts per ``generate`` call.

    Returns:
        ``(prompts repeated n_per_prompt times, completions)``, whitespace normalised.
    """
    import torch

    expanded = [p for p in prompts for _ in range(n_per_prompt)]
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for i in range(0, len(expanded), batch_size):
                chunk = expanded[i : i + batch_size]
                enc = tokenizer(chunk, return_tensors="pt", padding=True)
                enc = {k: v.to(model.device) for k, v in enc.items()}
                gen = model.generate(
                    **enc,
                    do_sample=True,
                    top_k=0,
                    top_p=1.0,
                    temperature=1.0,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
                out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return expanded, [" ".join(t.split()) for t in out]
