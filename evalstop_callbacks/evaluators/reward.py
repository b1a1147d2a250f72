"""World-feedback scorers of generated completions: a TRL-style reward function or a gold reward model."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import EvaluatorError, _finite_scores
from .generating import _GeneratingEvaluator
from .model_context import isolated_eval, preserved_rng, scoring_precision


def _reward_fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_reward_fn(fn: Any) -> Callable[..., Any]:
    """Check that ``fn`` has TRL's reward-function signature ``fn(prompts, completions, **kwargs)``.

    Raises:
        EvaluatorError: ``fn`` is not callable, or cannot take ``prompts`` and ``completions`` as keyword arguments.
    """
    if not callable(fn):
        raise EvaluatorError(f"reward_fn must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn  # builtins without a signature: the first call will tell
    params = sig.parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in ("prompts", "completions"):
        p = params.get(name)
        if p is None and not has_var_kw:
            raise EvaluatorError(
                f"reward_fn {_reward_fn_name(fn)!r} has the wrong signature {sig}: TRL reward functions take "
                f"keyword arguments prompts and completions (fn(prompts, completions, **kwargs) -> list[float]); "
                f"{name!r} is missing"
            )
        if p is not None and p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise EvaluatorError(f"reward_fn {_reward_fn_name(fn)!r}: {name!r} must be accepted as a keyword")
    required = [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and n not in ("prompts", "completions")
    ]
    if required:
        raise EvaluatorError(
            f"reward_fn {_reward_fn_name(fn)!r} has the wrong signature {sig}: it requires {', '.join(required)}, "
            "which a world-feedback evaluation cannot supply (only prompts, completions and **kwargs)"
        )
    return fn


class RewardFunctionEvaluator(_GeneratingEvaluator):
    """Generate completions for held-out prompts and score them with a TRL-style reward function.

    Args:
        prompts: Held-out prompts (strings, or lists of chat messages as TRL accepts). Never empty. They should not
            appear in the training data: the point is a world-feedback score the policy cannot fit directly.
        reward_fn: The gold score, ``fn(prompts, completions, **kwargs) -> list[float]`` (TRL's reward-function
            signature, checked at construction). It also receives ``completion_ids`` and, per example, every column
            of ``reward_kwargs``.
        tokenizer: Tokenizer of the policy. Defaults to the trainer's ``processing_class`` at evaluation time.
        max_new_tokens: Tokens generated per completion.
        batch_size: Prompts per ``generate`` call.
        do_sample: Sample (default) or decode greedily. Sampling uses ``seed``, so equal weights give equal scores.
        temperature: Sampling temperature (> 0).
        top_k: Top-k filter when sampling (0: none).
        top_p: Nucleus filter when sampling (1.0: none).
        seed: Seed of the evaluation's own random stream (the training stream is saved and restored around it).
        reward_kwargs: Optional per-example columns passed to ``reward_fn`` by name, each a list as long as
            ``prompts`` (like the extra dataset columns TRL passes, e.g. reference answers).
        engine: What generates the completions. ``"auto"`` (default): the trainer's vLLM engine when the callback
            serves a trainer that has one (TRL's ``use_vllm=True``; call ``cb.attach(trainer)``), HF ``generate`` on
            the live model otherwise; ``"vllm"``: the trainer's engine or a refusal before step 1; ``"hf"``: always
            ``generate``. The sampling settings above hold on either; the result names the engine and the settings
            (:mod:`~evalstop_callbacks.evaluators.engines`).
    """

    def __init__(
        self,
        prompts: Sequence[Any],
        reward_fn: Callable[..., Sequence[float]],
        tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        reward_kwargs: Mapping[str, Sequence[Any]] | None = None,
        engine: str = "auto",
    ) -> None:
        super().__init__(
            prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed, engine
        )
        self.reward_fn = check_reward_fn(reward_fn)
        self.reward_kwargs = dict(reward_kwargs or {})
        for key, column in self.reward_kwargs.items():
            if key in ("prompts", "completions", "completion_ids"):
                raise EvaluatorError(f"reward_kwargs may not redefine {key!r}")
            if len(column) != len(self.prompts):
                raise EvaluatorError(
                    f"reward_kwargs[{key!r}] has {len(column)} entries for {len(self.prompts)} prompts"
                )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "reward_fn": _reward_fn_name(self.reward_fn)}

    def score(
        self,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        index: Sequence[int] | None = None,
    ) -> tuple[float, ...]:
        """Score completions of held-out prompts with ``reward_fn`` (checked: one finite number each).

        Args:
            completions: One completion per prompt of ``index``.
            completion_ids: Their token ids, passed on as ``completion_ids``.
            index: Positions in the held-out set of the prompts completed (default: all of them, in order).
        """
        idx = list(range(len(self.prompts))) if index is None else list(index)
        prompts = [self.prompts[i] for i in idx]
        raw = self.reward_fn(
            prompts=prompts,
            completions=list(completions),
            completion_ids=list(completion_ids) if completion_ids is not None else None,
            **{k: [v[i] for i in idx] for k, v in self.reward_kwargs.items()},
        )
        who = f"reward_fn {_reward_fn_name(self.reward_fn)!r}"
        return _finite_scores(raw, len(idx), who, prompts, idx, keep_non_finite=True)

    def _score(
        self, model: Any, tokenizer: Any, index: list[int], texts: list[str], ids: list[list[int]]
    ) -> tuple[float, ...]:
        completions: list[Any] = texts
        if self._conversational:  # TRL hands conversational reward functions message lists
            completions = [[{"role": "assistant", "content": t}] for t in texts]
        with preserved_rng():
            return self.score(completions, ids, index)


class RewardModelEvaluator(_GeneratingEvaluator):
    """Generate completions for held-out prompts and score them with a local sequence-classification gold model.

    Args:
        prompts: Held-out prompts (strings). Never empty.
        reward_model: A ``*ForSequenceClassification`` model with one output (``num_labels=1``): the gold model.
            It is only read, never trained.
        tokenizer: Tokenizer of the policy. Defaults to the trainer's ``processing_class``.
        reward_tokenizer: Tokenizer of the gold model (default: the policy's).
        max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed, engine: As in
            :class:`RewardFunctionEvaluator`.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        reward_model: Any,
        tokenizer: Any = None,
        reward_tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        engine: str = "auto",
    ) -> None:
        super().__init__(
            prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed, engine
        )
        if self._conversational:
            raise EvaluatorError("RewardModelEvaluator takes string prompts; apply the chat template first")
        if not callable(reward_model) or not hasattr(reward_model, "parameters"):
            raise EvaluatorError(f"reward_model must be a torch model, got {type(reward_model).__name__}")
        num_labels = getattr(getattr(reward_model, "config", None), "num_labels", 1)
        if num_labels != 1:
            raise EvaluatorError(f"reward_model must have one output (num_labels=1), it has {num_labels}")
        self.reward_model = reward_model
        self.reward_tokenizer = reward_tokenizer

    def _score(
        self, model: Any, tokenizer: Any, index: list[int], texts: list[str], ids: list[list[int]]
    ) -> tuple[float, ...]:
        tok = self.reward_tokenizer if self.reward_tokenizer is not None else self._tokenizer(tokenizer)
        prompts = [self.prompts[i] for i in index]
        full = [
            p + (" " if p and t and not p.endswith(" ") and not t.startswith(" ") else "") + t
            for p, t in zip(prompts, texts)
        ]
        device = next(self.reward_model.parameters()).device
        raw: list[float] = []
        with isolated_eval(self.reward_model, None), scoring_precision(self.reward_model):
            for start in range(0, len(full), self.batch_size):
                batch = tok(full[start : start + self.batch_size], return_tensors="pt", padding=True)
                batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
                logits = self.reward_model(**batch).logits
                raw.extend(logits[:, 0].float().tolist())
        return _finite_scores(raw, len(index), "reward_model", prompts, index, keep_non_finite=True)
