"""World-feedback evaluators: the held-out score that EvalStop watches.

An :class:`Evaluator` turns the live model into one number (higher is better) plus, where it has them, one score
per held-out example. Three kinds ship:

- :class:`RewardFunctionEvaluator` generates completions for held-out prompts with the live policy and scores them
  with a function of TRL's reward-function signature ``fn(prompts, completions, **kwargs) -> list[float]``.
- :class:`RewardModelEvaluator` generates the same way and scores prompt + completion with a local
  sequence-classification (gold) model.
- :class:`MetricEvaluator` takes a named metric from the trainer's own evaluation (``on_evaluate`` metrics).

Evaluation must not change training: the generating evaluators save and restore the torch RNG state (CPU and CUDA),
put the model in eval mode and back, and run under ``torch.no_grad()``. Their own sampling uses a fixed seed, so the
same weights always get the same score: that is what lets a test prove that the restored model is the best one.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

logger = logging.getLogger(__name__)


class EvaluatorError(ValueError):
    """An evaluator was misconfigured or produced an unusable score (NaN, wrong length, not a number)."""


@dataclass(frozen=True)
class EvalResult:
    """One evaluation of the live model.

    Args:
        score: Mean world-feedback score (higher is better). Finite.
        scores: Per-example scores in the fixed order of the held-out set, or ``None`` when the evaluator has only
            an aggregate (e.g. :class:`MetricEvaluator`).
        completions: The generated completions, for inspection and traces (not sent to the scheduler).
    """

    score: float
    scores: tuple[float, ...] | None = None
    completions: tuple[str, ...] | None = None


class Evaluator(ABC):
    """Interface of a world-feedback evaluator used by :class:`~evalstop_callbacks.EvalStopCallback`.

    Subclasses implement :meth:`evaluate`. Evaluators that read the trainer's own metrics instead of running the model
    set :attr:`uses_trainer_metrics` to ``True`` and implement :meth:`from_metrics`; the callback then reports at each
    ``on_evaluate`` event instead of running the evaluator itself.
    """

    #: True for evaluators fed by the trainer's ``on_evaluate`` metrics (the callback then forces evaluations).
    uses_trainer_metrics: bool = False

    @abstractmethod
    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        """Score ``model`` (the unwrapped live policy) on the held-out set.

        Args:
            model: The live model, already unwrapped from PPO's policy-and-value wrapper and from DDP.
            tokenizer: The trainer's processing class, used when the evaluator was built without its own tokenizer.

        Returns:
            An :class:`EvalResult` with a finite mean score.
        """

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        """Turn the trainer's evaluation metrics into a result (only for ``uses_trainer_metrics`` evaluators)."""
        raise NotImplementedError(f"{type(self).__name__} does not read trainer metrics")

    def describe(self) -> dict[str, Any]:
        """Plain-data description of the evaluator, recorded in trace headers."""
        return {"evaluator": type(self).__name__}


def _finite_scores(raw: Any, n: int, who: str) -> tuple[float, ...]:
    """Check that ``raw`` is ``n`` finite numbers; raise :class:`EvaluatorError` naming ``who`` and the bad entry."""
    try:
        values = list(raw)
    except TypeError:
        raise EvaluatorError(f"{who} must return a list of {n} numbers, got {type(raw).__name__}") from None
    if len(values) != n:
        raise EvaluatorError(f"{who} returned {len(values)} scores for {n} held-out examples")
    out = []
    for i, v in enumerate(values):
        if hasattr(v, "item"):  # 0-d tensors and numpy scalars
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise EvaluatorError(f"{who} returned a non-number for example {i}: {v!r}")
        if not math.isfinite(v):
            raise EvaluatorError(
                f"{who} returned a non-finite score ({v}) for example {i}; EvalStop never decides on NaN or inf"
            )
        out.append(float(v))
    return tuple(out)


def unwrap_model(model: Any) -> Any:
    """The policy inside the wrappers trainers hand to callbacks.

    Unwraps DDP/DataParallel (``.module``) and TRL's PPO ``PolicyAndValueWrapper`` (``.policy``), in any nesting.
    PEFT models are kept as they are: they generate with their adapters active.
    """
    for _ in range(8):  # wrappers nest at most a few levels; a bound avoids a loop on odd objects
        if type(model).__name__ == "PolicyAndValueWrapper" or (
            hasattr(model, "policy") and hasattr(model, "value_model")
        ):
            model = model.policy
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model
    return model


@contextlib.contextmanager
def preserved_rng(seed: int | None = None) -> Iterator[None]:
    """Run a block without touching the training RNG streams.

    Saves and restores the torch CPU and CUDA RNG states (evaluation sampling would otherwise shift the random
    stream of training) and Python's and NumPy's global ones (a reward function may draw from them). With ``seed``
    the block starts from ``torch.manual_seed(seed)``, so the same weights always get the same completions.
    """
    import random

    import torch

    py_state = random.getstate()
    try:
        import numpy as np
    except ImportError:  # numpy is optional here
        np_state = None
    else:
        np_state = np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        if seed is not None:
            torch.manual_seed(seed)  # also seeds every CUDA device
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(py_state)
        if np_state is not None:  # numpy was imported
            np.random.set_state(np_state)


@contextlib.contextmanager
def isolated_eval(model: Any, seed: int | None) -> Iterator[None]:
    """:func:`preserved_rng` plus eval mode and no gradients; the model gets its previous train/eval mode back."""
    import torch

    was_training = model.training
    try:
        with preserved_rng(seed):
            model.eval()
            with torch.no_grad():
                yield
    finally:
        if was_training:
            model.train()


def _check_prompts(prompts: Any) -> list[Any]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise EvaluatorError(f"prompts must be a list of held-out prompts, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise EvaluatorError("prompts is empty: a world-feedback evaluator needs at least one held-out prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            continue
        if isinstance(p, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in p):
            continue  # conversational prompt, as TRL accepts
        raise EvaluatorError(f"prompts[{i}] must be a string or a list of chat messages, got {type(p).__name__}")
    return prompts


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvaluatorError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class _GeneratingEvaluator(Evaluator):
    """Shared part of the evaluators that sample completions from the live policy."""

    def __init__(
        self,
        prompts: Sequence[Any],
        tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.prompts = _check_prompts(prompts)
        self.tokenizer = tokenizer
        self.max_new_tokens = _check_positive_int("max_new_tokens", max_new_tokens)
        self.batch_size = _check_positive_int("batch_size", batch_size)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise EvaluatorError(f"temperature must be a number > 0, got {temperature!r}")
        self.do_sample = bool(do_sample)
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self._conversational = not isinstance(self.prompts[0], str)

    def describe(self) -> dict[str, Any]:
        return {
            "evaluator": type(self).__name__,
            "n_prompts": len(self.prompts),
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "seed": self.seed,
        }

    def _tokenizer(self, tokenizer: Any) -> Any:
        tok = self.tokenizer if self.tokenizer is not None else tokenizer
        # Processors (multimodal) carry the text tokenizer as .tokenizer.
        if tok is not None and not callable(getattr(tok, "batch_decode", None)) and hasattr(tok, "tokenizer"):
            tok = tok.tokenizer
        if tok is None:
            raise EvaluatorError(
                f"{type(self).__name__} has no tokenizer: pass tokenizer= or train with a processing_class"
            )
        return tok

    def _prompt_texts(self, tok: Any) -> list[str]:
        if not self._conversational:
            return list(self.prompts)
        return [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in self.prompts]

    def generate(self, model: Any, tokenizer: Any = None) -> tuple[list[str], list[list[int]]]:
        """Completions (text and token ids) for every held-out prompt, with the fixed generation settings."""
        from transformers import GenerationConfig

        tok = self._tokenizer(tokenizer)
        model = unwrap_model(model)
        texts = self._prompt_texts(tok)
        gen_config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=self.do_sample,
            temperature=self.temperature if self.do_sample else None,
            top_k=self.top_k if self.do_sample else None,
            top_p=self.top_p if self.do_sample else None,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        completions: list[str] = []
        completion_ids: list[list[int]] = []
        padding_side = getattr(tok, "padding_side", "left")
        device = next(model.parameters()).device
        with isolated_eval(model, self.seed):
            tok.padding_side = "left"  # decoder-only generation needs left padding
            try:
                for start in range(0, len(texts), self.batch_size):
                    batch = tok(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                add_special_tokens=False)
                    batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
                    out = model.generate(**batch, generation_config=gen_config)
                    new = out[:, batch["input_ids"].shape[1]:]
                    for row in new.tolist():
                        ids = [t for t in row if t != gen_config.pad_token_id]
                        completion_ids.append(ids)
                    completions.extend(tok.batch_decode(new, skip_special_tokens=True))
            finally:
                tok.padding_side = padding_side
        return completions, completion_ids


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
        n for n, p in params.items()
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
    ) -> None:
        super().__init__(prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed)
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

    def score(self, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None = None
              ) -> tuple[float, ...]:
        """Score given completions of the held-out prompts with ``reward_fn`` (checked: one finite number each)."""
        raw = self.reward_fn(
            prompts=list(self.prompts), completions=list(completions),
            completion_ids=list(completion_ids) if completion_ids is not None else None, **self.reward_kwargs,
        )
        return _finite_scores(raw, len(self.prompts), f"reward_fn {_reward_fn_name(self.reward_fn)!r}")

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        texts, ids = self.generate(model, tokenizer)
        completions: list[Any] = texts
        if self._conversational:  # TRL hands conversational reward functions message lists
            completions = [[{"role": "assistant", "content": t}] for t in texts]
        with preserved_rng():
            scores = self.score(completions, ids)
        return EvalResult(sum(scores) / len(scores), scores, tuple(texts))


class RewardModelEvaluator(_GeneratingEvaluator):
    """Generate completions for held-out prompts and score them with a local sequence-classification gold model.

    Args:
        prompts: Held-out prompts (strings). Never empty.
        reward_model: A ``*ForSequenceClassification`` model with one output (``num_labels=1``): the gold model.
            It is only read, never trained.
        tokenizer: Tokenizer of the policy. Defaults to the trainer's ``processing_class``.
        reward_tokenizer: Tokenizer of the gold model (default: the policy's).
        max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed: As in
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
    ) -> None:
        super().__init__(prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed)
        if self._conversational:
            raise EvaluatorError("RewardModelEvaluator takes string prompts; apply the chat template first")
        if not callable(reward_model) or not hasattr(reward_model, "parameters"):
            raise EvaluatorError(f"reward_model must be a torch model, got {type(reward_model).__name__}")
        num_labels = getattr(getattr(reward_model, "config", None), "num_labels", 1)
        if num_labels != 1:
            raise EvaluatorError(f"reward_model must have one output (num_labels=1), it has {num_labels}")
        self.reward_model = reward_model
        self.reward_tokenizer = reward_tokenizer

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        texts, _ = self.generate(model, tokenizer)
        tok = self.reward_tokenizer if self.reward_tokenizer is not None else self._tokenizer(tokenizer)
        full = [p + (" " if p and t and not p.endswith(" ") and not t.startswith(" ") else "") + t
                for p, t in zip(self.prompts, texts)]
        device = next(self.reward_model.parameters()).device
        raw: list[float] = []
        with isolated_eval(self.reward_model, None):
            for start in range(0, len(full), self.batch_size):
                batch = tok(full[start:start + self.batch_size], return_tensors="pt", padding=True)
                batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
                logits = self.reward_model(**batch).logits
                raw.extend(logits[:, 0].float().tolist())
        scores = _finite_scores(raw, len(self.prompts), "reward_model")
        return EvalResult(sum(scores) / len(scores), scores, tuple(texts))


class MetricEvaluator(Evaluator):
    """Use a metric of the trainer's own evaluation (``trainer.evaluate()`` on an ``eval_dataset``) as the score.

    The callback asks the trainer to evaluate every ``eval_steps`` steps (``control.should_evaluate``) and reports at
    the ``on_evaluate`` event; the trainer needs an ``eval_dataset``.

    Args:
        metric: Name of the metric, with or without the ``eval_`` prefix (e.g. ``"loss"``, ``"eval_accuracy"``).
        greater_is_better: False for losses: the reported score is then the negated metric, since EvalStop treats
            higher as better.
    """

    uses_trainer_metrics = True

    def __init__(self, metric: str, greater_is_better: bool = True) -> None:
        if not isinstance(metric, str) or not metric:
            raise EvaluatorError(f"metric must be a non-empty metric name, got {metric!r}")
        self.metric = metric
        self.greater_is_better = bool(greater_is_better)

    def describe(self) -> dict[str, Any]:
        return {"evaluator": "MetricEvaluator", "metric": self.metric, "greater_is_better": self.greater_is_better}

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        raise EvaluatorError("MetricEvaluator reads the trainer's on_evaluate metrics; it cannot run by itself")

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        key = self.metric if self.metric in metrics else f"eval_{self.metric}"
        if key not in metrics:
            raise EvaluatorError(
                f"metric {self.metric!r} is not among the trainer's eval metrics ({', '.join(sorted(metrics))})"
            )
        (value,) = _finite_scores([metrics[key]], 1, f"metric {key!r}")
        return EvalResult(value if self.greater_is_better else -value, None)
