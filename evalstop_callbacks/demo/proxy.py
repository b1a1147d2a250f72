"""The learned proxy of the bag-of-words environment: a ridge regression on word counts, and the same function as a
``torch`` reward-model module for TRL 1.12's ``PPOTrainer`` (so PPO and GRPO optimize exactly the same function).

In distribution it agrees with gold (correlation about 0.9), but a linear model of counts cannot see repetition, so
"good . good . good ..." scores ever higher: the learned reward model an RL job overoptimizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sampling import completion_texts


@dataclass
class BagOfWordsProxy:
    """A linear reward model on word counts: ``bias + sum_w weight[w] * count_w(prompt + " " + completion)``.

    Callable with TRL's reward-function signature (``reward_funcs=[proxy]``); its ``__name__`` is ``"proxy"`` so
    TRL logs it as ``rewards/proxy``.

    Args:
        words: The feature words, in weight order.
        weights: One weight per word.
        bias: The intercept.
    """

    words: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        self.__name__ = "proxy"  # TRL names a reward function's log key after its __name__
        if len(self.words) != len(self.weights):
            raise ValueError(f"proxy has {len(self.words)} words but {len(self.weights)} weights")
        self._index = {w: i for i, w in enumerate(self.words)}
        self._w = np.asarray(self.weights, dtype=np.float64)

    def features(self, text: str) -> np.ndarray:
        x = np.zeros(len(self.words))
        for w in text.split():
            i = self._index.get(w)
            if i is not None:
                x[i] += 1.0
        return x

    def score(self, prompt: str, completion: str) -> float:
        """The proxy reward of one completion of ``prompt``."""
        return float(self.bias + self.features(f"{prompt} {completion}") @ self._w)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = completion_texts(completions)
        ptexts = completion_texts(prompts) if prompts is not None else [""] * len(texts)
        return [self.score(p, c) for p, c in zip(ptexts, texts)]

    def to_dict(self) -> dict[str, Any]:
        return {"words": list(self.words), "weights": list(self.weights), "bias": self.bias}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BagOfWordsProxy:
        return cls(tuple(d["words"]), tuple(float(w) for w in d["weights"]), float(d["bias"]))

    @classmethod
    def fit(
        cls,
        prompts: Sequence[str],
        completions: Sequence[str],
        targets: Sequence[float],
        words: Sequence[str],
        alpha: float = 1.0,
    ) -> BagOfWordsProxy:
        """Ridge regression (closed form, intercept unpenalised) of ``targets`` on word counts."""
        proto = cls(tuple(words), tuple(0.0 for _ in words), 0.0)
        x = np.stack([proto.features(f"{p} {c}") for p, c in zip(prompts, completions)])
        y = np.asarray(targets, dtype=np.float64)
        xm, ym = x.mean(0), y.mean()
        xc = x - xm
        w = np.linalg.solve(xc.T @ xc + alpha * np.eye(x.shape[1]), xc.T @ (y - ym))
        return cls(tuple(words), tuple(float(v) for v in w), float(ym - xm @ w))


def ProxyRewardModel(proxy: BagOfWordsProxy, tokenizer):  # noqa: N802 - a factory that reads like a class
    """The proxy as a ``torch`` module with the layout TRL 1.12's ``PPOTrainer`` reads from a reward model.

    TRL calls ``getattr(model, model.base_model_prefix)(input_ids=..., ...)`` and then ``model.score`` on the last
    hidden state, and reads the value at the last non-pad token. Here the "backbone" returns the running word counts
    (cumulative one-hot vectors) and ``score`` is the ridge layer, so the value at the last token is exactly
    :meth:`BagOfWordsProxy.score` of prompt + response (special tokens have weight 0).

    Args:
        proxy: The fitted proxy.
        tokenizer: The policy's word-level tokenizer (one token per word).

    Returns:
        A frozen ``torch.nn.Module``.
    """
    from types import SimpleNamespace

    import torch
    from torch import nn

    vocab_size = len(tokenizer)
    weight = torch.zeros(vocab_size)
    for word, w in zip(proxy.words, proxy.weights):
        tid = tokenizer.convert_tokens_to_ids(word)
        if tid is not None and tid != tokenizer.unk_token_id:
            weight[tid] = w

    class _Counts(nn.Module):
        def forward(self, input_ids, attention_mask=None, **kwargs):
            onehot = torch.nn.functional.one_hot(input_ids, vocab_size).float()
            if attention_mask is not None:
                onehot = onehot * attention_mask.unsqueeze(-1).float()
            return SimpleNamespace(hidden_states=(onehot.cumsum(1),))

    class _ProxyModule(nn.Module):
        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.backbone = _Counts()
            self.score = nn.Linear(vocab_size, 1)
            with torch.no_grad():
                self.score.weight.copy_(weight.unsqueeze(0))
                self.score.bias.fill_(proxy.bias)
            self.requires_grad_(False)

    return _ProxyModule()
