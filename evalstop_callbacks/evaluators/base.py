"""What every evaluator is: the :class:`Evaluator` interface, its :class:`EvalResult` and the score checks."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
        std: The sample standard deviation of the example scores behind ``score``, when the evaluator has it without
            the scores themselves (a trainer's ``.../std`` metric); reported as ``eval_std``. None: not known.
        n: How many example scores ``std`` is over (``eval_n``, >= 2); given with ``std``.
        engine: What generated them: ``"hf"`` (``generate`` on the live model), ``"vllm-colocate"`` or
            ``"vllm-server"`` (the trainer's vLLM engine); ``None`` for evaluators that generate nothing.
        sampling: The sampling settings that produced them (temperature, top-k, top-p, ..., seed).
    """

    score: float
    scores: tuple[float, ...] | None = None
    completions: tuple[str, ...] | None = None
    std: float | None = None
    n: int | None = None
    engine: str | None = None
    sampling: Mapping[str, Any] | None = None


class Evaluator(ABC):
    """Interface of a world-feedback evaluator used by :class:`~evalstop_callbacks.EvalStopCallback`.

    Subclasses implement :meth:`evaluate`. Evaluators that read the trainer's own metrics instead of running the model
    set :attr:`uses_trainer_metrics` to ``True`` and implement :meth:`from_metrics`; the callback then reports at each
    ``on_evaluate`` event instead of running the evaluator itself.
    """

    #: True for evaluators fed by the trainer's ``on_evaluate`` metrics (the callback then forces evaluations).
    uses_trainer_metrics: bool = False
    #: True for evaluators whose :meth:`evaluate` runs on every rank (each on its shard) and returns the same gathered
    #: result everywhere. False: the callback runs :meth:`evaluate` on the main process only (whole model needed there).
    shards: bool = False

    def to_metric(self, score: float) -> float:
        """The score in the trainer's own convention for ``state.best_metric`` (identity: higher is better)."""
        return score

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


def _example(i: int, prompts: Sequence[Any] | None, index: Sequence[int] | None) -> str:
    number = index[i] if index is not None and i < len(index) else i
    if prompts is None or i >= len(prompts):
        return f"example {number}"
    text = str(prompts[i])
    return f"example {number} (prompt {text[:60] + '...' if len(text) > 60 else text!r})"


def _finite_scores(
    raw: Any,
    n: int,
    who: str,
    prompts: Sequence[Any] | None = None,
    index: Sequence[int] | None = None,
    *,
    keep_non_finite: bool = False,
) -> tuple[float, ...]:
    """Check that ``raw`` is ``n`` finite numbers; raise :class:`EvaluatorError` naming ``who`` and the bad entry.

    Args:
        raw: What the scorer returned.
        n: Number of examples scored.
        who: The scorer, for the message.
        prompts: The prompts of those examples, quoted in the message of a bad entry.
        index: Their positions in the held-out set (default ``0..n-1``).
        keep_non_finite: Keep a NaN or inf score (warned about, naming the example) instead of raising: the
            scorers of a running evaluation do, so that the trainer side's one non-finite policy
            (:mod:`evalstop_callbacks.nonfinite`) records that evaluation and decides nothing on it, and a run is
            never taken down by it. Non-numbers and wrong lengths always raise: they are bugs, not scores.
    """
    if isinstance(raw, (int, float)) or (hasattr(raw, "ndim") and getattr(raw, "ndim", 1) == 0):
        raise EvaluatorError(f"{who} must return a list of {n} numbers (one per example), got one scalar {raw!r}")
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
            raise EvaluatorError(f"{who} returned a non-number for {_example(i, prompts, index)}: {v!r}")
        if not math.isfinite(v):
            message = f"{who} returned a non-finite score ({v}) for {_example(i, prompts, index)}"
            if not keep_non_finite:
                raise EvaluatorError(f"{message}; EvalStop never decides on NaN or inf")
            logger.warning("EvalStop: %s; this evaluation is recorded, not decided on", message)
        out.append(float(v))
    return tuple(out)


def checked_result(result: Any, evaluator: object, step: int) -> EvalResult:
    """``result`` if it is a finite :class:`EvalResult`, else an :class:`EvaluatorError` naming the evaluator and step.

    Args:
        result: What ``evaluator.evaluate`` (or ``from_metrics``) returned.
        evaluator: The evaluator, named in the message.
        step: The evaluation's step, named in the message.
    """
    if not isinstance(result, EvalResult):
        raise EvaluatorError(f"{type(evaluator).__name__}.evaluate must return an EvalResult (at step {step})")
    if not math.isfinite(result.score):
        raise EvaluatorError(
            f"{type(evaluator).__name__} returned a non-finite eval score {result.score} "
            f"at step {step}; EvalStop never decides on NaN or inf"
        )
    return result


def error_at_step(exc: BaseException, step: int) -> BaseException:
    """``exc`` with the evaluation step in its message (an :class:`EvaluatorError`, chained to the original).

    Args:
        exc: The failure of an evaluation.
        step: The step being evaluated.
    """
    if f"at step {step}" in str(exc):
        return exc
    what = str(exc) if isinstance(exc, EvaluatorError) else f"{type(exc).__name__}: {exc}"
    new = EvaluatorError(f"EvalStop evaluation at step {step} failed: {what}")
    new.__cause__ = exc
    return new
