"""The trainer's own eval metric as the watched score."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import EvalResult, Evaluator, EvaluatorError, _finite_scores


class MetricEvaluator(Evaluator):
    """Use a metric of the trainer's own evaluation (``trainer.evaluate()`` on an ``eval_dataset``) as the score.

    The callback reports at the trainer's ``on_evaluate`` events (asking for them every ``eval_steps`` steps when
    given); the trainer needs an ``eval_dataset``. With a dict of eval datasets the trainer names the metrics
    ``eval_<dataset>_<metric>``: pass e.g. ``"b_loss"``.

    Args:
        metric: Name of the metric, with or without the ``eval_`` prefix (e.g. ``"loss"``, ``"eval_accuracy"``,
            ``"b_loss"``).
        greater_is_better: ``True`` or ``False``; ``None`` (default) infers it as transformers does for
            ``metric_for_best_model``: ``False`` for a name ending in ``loss``, else ``True``. When ``False`` the
            reported score is the negated metric, since EvalStop treats higher as better.
    """

    uses_trainer_metrics = True

    def __init__(self, metric: str, greater_is_better: bool | None = None) -> None:
        if not isinstance(metric, str) or not metric:
            raise EvaluatorError(f"metric must be a non-empty metric name, got {metric!r}")
        if greater_is_better is None:
            greater_is_better = not metric.endswith("loss")
        elif not isinstance(greater_is_better, bool) and type(greater_is_better).__name__ != "bool_":
            raise EvaluatorError(f"greater_is_better must be True, False or None, got {greater_is_better!r}")
        self.metric = metric
        self.greater_is_better = bool(greater_is_better)

    def describe(self) -> dict[str, Any]:
        return {"evaluator": "MetricEvaluator", "metric": self.metric, "greater_is_better": self.greater_is_better}

    def to_metric(self, score: float) -> float:
        return score if self.greater_is_better else -score

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        raise EvaluatorError("MetricEvaluator reads the trainer's on_evaluate metrics; it cannot run by itself")

    def key(self, metrics: Mapping[str, Any]) -> str | None:
        """The key of this metric in ``metrics``, or ``None`` when they do not hold it."""
        for key in (self.metric, f"eval_{self.metric}"):
            if key in metrics:
                return key
        return None

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        key = self.key(metrics)
        if key is None:
            raise EvaluatorError(
                f"metric {self.metric!r} is not among the trainer's eval metrics ({', '.join(sorted(metrics))})"
            )
        raw = metrics[key]
        if isinstance(raw, float) and not math.isfinite(raw):  # the trainer side's one non-finite policy decides
            return EvalResult(raw, None)  # (evalstop_callbacks.nonfinite): recorded, not reported, not raised
        (value,) = _finite_scores([raw], 1, f"metric {key!r}")
        return EvalResult(value if self.greater_is_better else -value, None)
