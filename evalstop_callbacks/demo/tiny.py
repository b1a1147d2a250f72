"""Tiny models built locally in code: a word-level tokenizer and GPT-2 policies, reward and value models.

Nothing here downloads anything. The tokenizer is trained with ``tokenizers`` on the small corpus shipped in
``evalstop_callbacks/demo/data/corpus.txt`` (made by :func:`generate_corpus`; regenerate it with
``python -m evalstop_callbacks.demo.tiny``). The models are randomly initialised GPT-2s of a few layers; a short language
model pretraining (:func:`pretrain_policy`, about 8 s on one CPU thread) makes the policy write sentence-like text.

These serve the tests, the examples, the demo and the real overoptimization environment.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PAD, UNK, EOS = "[PAD]", "[UNK]", "[EOS]"


@dataclass(frozen=True)
class Vocabulary:
    """The words of the tiny world. Training prompts use ``train_nouns``; held-out evals use ``heldout_nouns`` only."""

    positive: tuple[str, ...] = (
        "good",
        "great",
        "nice",
        "happy",
        "kind",
        "bright",
        "warm",
        "calm",
        "lovely",
        "fresh",
        "sweet",
        "fine",
    )
    negative: tuple[str, ...] = ("bad", "sad", "poor", "dark", "cold", "dull", "ugly", "rude")
    neutral: tuple[str, ...] = ("big", "small", "old", "new", "red", "blue", "tall", "quiet")
    adverbs: tuple[str, ...] = ("very", "quite", "so")
    function: tuple[str, ...] = ("the", "a", "is", "was", "and", ".")
    train_nouns: tuple[str, ...] = ("cat", "dog", "house", "tree", "car", "book", "garden", "city", "road", "boat")
    heldout_nouns: tuple[str, ...] = ("bird", "river", "lamp", "chair", "song", "hill")

    @property
    def adjectives(self) -> tuple[str, ...]:
        return self.positive + self.negative + self.neutral

    @property
    def words(self) -> tuple[str, ...]:
        return self.function + self.adverbs + self.adjectives + self.train_nouns + self.heldout_nouns


VOCAB = Vocabulary()


def generate_corpus(n_lines: int = 4000, seed: int = 0, vocab: Vocabulary = VOCAB) -> list[str]:
    """Template sentences about every noun with a balanced mix of positive, negative and neutral adjectives."""
    rng = random.Random(seed)
    nouns = vocab.train_nouns + vocab.heldout_nouns
    lines = []
    for _ in range(n_lines):
        det, verb = rng.choice((("the", "is"), ("a", "was")))
        noun = rng.choice(nouns)
        n_adj = rng.choice((1, 1, 2, 2, 3))
        adjs = [rng.choice(vocab.adjectives) for _ in range(n_adj)]
        if rng.random() < 0.3:
            adjs[0] = f"{rng.choice(vocab.adverbs)} {adjs[0]}"
        lines.append(f"{det} {noun} {verb} {' and '.join(adjs)} .")
    return lines


def corpus_path() -> Path:
    return Path(str(resources.files("evalstop_callbacks.demo") / "data" / "corpus.txt"))


def load_corpus() -> list[str]:
    """The shipped corpus, one sentence per line."""
    path = corpus_path()
    if not path.exists():
        raise FileNotFoundError(
            f"the tiny corpus is missing at {path}; regenerate it with python -m evalstop_callbacks.demo.tiny"
        )
    return [line for line in path.read_text().splitlines() if line.strip()]


def build_tokenizer(lines: Sequence[str] | None = None):
    """A word-level ``PreTrainedTokenizerFast`` trained on ``lines`` (default: the shipped corpus).

    Pad and EOS differ, as TRL's PPO builds attention masks from ``input_ids != pad_token_id``. Padding is on the
    left, as generation with a decoder-only model needs.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = list(lines) if lines is not None else load_corpus()
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=[PAD, UNK, EOS]))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, unk_token=UNK, eos_token=EOS, bos_token=EOS, padding_side="left"
    )
    fast.model_max_length = 128
    return fast


def _gpt2_config(tokenizer, n_layer: int, n_embd: int, n_head: int, n_positions: int, **extra):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_policy(tokenizer, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, n_positions: int = 64, seed: int = 0):
    """A randomly initialised ``GPT2LMHeadModel`` (2 layers, width 64: about 0.1 M parameters by default)."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return with_generation_tokens(
        GPT2LMHeadModel(_gpt2_config(tokenizer, n_layer, n_embd, n_head, n_positions)), tokenizer
    )


def with_generation_tokens(model: Any, tokenizer: Any) -> Any:
    """``model``, set to generate with ``tokenizer``'s pad and EOS tokens (a fresh config names neither)."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def load_policy(path: str | Path, tokenizer: Any) -> Any:
    """A fresh trainable copy of the causal language model saved at ``path`` (GPT-2 or Llama, as its config says).

    Args:
        path: A folder written by ``save_pretrained``.
        tokenizer: The policy's tokenizer (its pad and EOS tokens go into the generation config).

    Returns:
        The model, in train mode.
    """
    from transformers import AutoModelForCausalLM

    model = with_generation_tokens(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    model.train()
    return model


def build_scalar_model(
    tokenizer, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, n_positions: int = 64, seed: int = 0
):
    """A ``GPT2ForSequenceClassification`` with one output: a reward model, a value model or a gold model."""
    import torch
    from transformers import GPT2ForSequenceClassification

    torch.manual_seed(seed)
    return GPT2ForSequenceClassification(_gpt2_config(tokenizer, n_layer, n_embd, n_head, n_positions, num_labels=1))


def pretrain_policy(
    model,
    tokenizer,
    lines: Sequence[str] | None = None,
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
):
    """Causal-LM pretraining on the corpus so that the policy writes sentence-like text. Returns the model.

    A plain torch loop (not a Trainer): it is the reference policy's construction, not a job evalstop watches.
    """
    import torch

    lines = list(lines) if lines is not None else load_corpus()
    gen = torch.Generator().manual_seed(seed)
    enc = tokenizer([line + f" {EOS}" for line in lines], padding="longest", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        idx = torch.randint(0, ids.shape[0], (batch_size,), generator=gen)
        # Left padding: positions must count from the first real token, as they will at generation time.
        pos = (mask[idx].cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids[idx], attention_mask=mask[idx], position_ids=pos, labels=labels[idx])
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step % 100 == 0:
            logger.debug("pretrain step %d loss %.3f", step, out.loss.item())
    model.eval()
    return model


if __name__ == "__main__":  # regenerate the shipped corpus
    corpus_path().parent.mkdir(parents=True, exist_ok=True)
    corpus_path().write_text("\n".join(generate_corpus()) + "\n")
    print(f"wrote {corpus_path()}")
