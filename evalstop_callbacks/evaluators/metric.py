"""The trainer's own eval metric as the watched score, with its spread when the trainer logs one.

**The spread.** Trainers' own evaluations often log a mean with its spread rather than per-example scores: TRL's
GRPO and RLOO log ``rewards/<fn>/mean`` with ``rewards/<fn>/std`` (and ``reward`` with ``reward_std``),
lm-evaluation-harness ``acc`` with ``acc_stderr``. A detector decides better on a mean with its standard deviation and
count (the ``mean-and-spread`` evidence mode) than on the mean alone, so :class:`MetricEvaluator` reports them when it
can: the metric's sibling (:func:`spread_siblings`) as ``eval_std``, and the eval set's size as ``eval_n``
(:func:`eval_set_count`; times the generations per prompt of TRL's GRPO/RLOO evaluation). A standard error is turned
into a standard deviation with the count: ``std = stderr * sqrt(n)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from .base import EvalResult, Evaluator, EvaluatorError, _finite_scores

logger = logging.getLogger(__name__)


def spread_siblings(key: str) -> list[tuple[str, bool]]:
    """The metric names that may hold the spread of metric ``key``, in the order they are tried, each with whether it
    is a standard error (else a standard deviation).

    ``.../mean`` -> ``.../std`` (TRL's ``rewards/<fn>/mean``); ``X`` -> ``X_std`` (TRL's ``reward_std``) and
    ``X_stderr`` (lm-evaluation-harness; ``acc,none`` -> ``acc_stderr,none`` with its filter suffix kept).
    """
    out: list[tuple[str, bool]] = []
    if key.endswith("/mean"):
        out.append((key[: -len("mean")] + "std", False))
    name, comma, filt = key.partition(",")
    out += [(f"{name}_std{comma}{filt}", False), (f"{name}_stderr{comma}{filt}", True)]
    return out


def eval_set_count(args: Any, eval_dataset: Any, metric: str = "") -> int | None:
    """How many example scores one of the trainer's evaluations averages: the eval set's size, times the completions
    per prompt of TRL's GRPO/RLOO evaluation (``num_generations_eval``, else ``num_generations``). None when the size
    is not known (an iterable dataset without a length).

    Args:
        args: The trainer's arguments (``GRPOConfig``/``RLOOConfig`` carry ``num_generations``).
        eval_dataset: The trainer's ``eval_dataset``; with a dict of them, the one whose name leads ``metric``
            (the trainer names its metrics ``eval_<name>_<metric>``).
        metric: The metric's name, to pick the dataset of a dict.
    """
    if isinstance(eval_dataset, Mapping):
        bare = metric.removeprefix("eval_")
        eval_dataset = next((d for name, d in eval_dataset.items() if bare.startswith(f"{name}_")), None)
    try:
        size = len(eval_dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
    per_prompt = getattr(args, "num_generations_eval", None) or getattr(args, "num_generations", None) or 1
    return int(size) * int(per_prompt) if isinstance(per_prompt, int) and per_prompt >= 1 else int(size)


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
        std_metric: The metric holding the standard deviation of the example scores behind ``metric``, when its name
            is not one of the automatic siblings (:func:`spread_siblings`); a name ending in ``stderr`` is read as a
            standard error. None (default): the automatic siblings, when the trainer logs one.
        n: How many example scores each evaluation averages. None (default): the eval set's size as the callback
            finds it (:func:`eval_set_count`, times the generations per prompt of GRPO/RLOO).

    Each evaluation carries the spread (``EvalResult.std``/``n``, sent as ``eval_std``/``eval_n``) when both a
    standard deviation (or standard error) and the count are known; the first evaluation logs once which evidence the
    detector gets and why.
    """

    uses_trainer_metrics = True

    def __init__(
        self,
        metric: str,
        greater_is_better: bool | None = None,
        *,
        std_metric: str | None = None,
        n: int | None = None,
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise EvaluatorError(f"metric must be a non-empty metric name, got {metric!r}")
        if greater_is_better is None:
            greater_is_better = not metric.endswith("loss")
        elif not isinstance(greater_is_better, bool) and type(greater_is_better).__name__ != "bool_":
            raise EvaluatorError(f"greater_is_better must be True, False or None, got {greater_is_better!r}")
        if std_metric is not None and (not isinstance(std_metric, str) or not std_metric):
            raise EvaluatorError(f"std_metric must be a non-empty metric name or None, got {std_metric!r}")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise EvaluatorError(f"n must be an integer >= 2 (a spread needs two scores) or None, got {n!r}")
        self.metric = metric
        self.greater_is_better = bool(greater_is_better)
        self.std_metric = std_metric
        self.n = n
        #: The eval set's count of example scores, set by the callback (:meth:`use_eval_set`); ``n`` overrides it.
        self.eval_count: int | None = None
        self._told = False  # the once-only log of the evidence mode
        self._warned_bad_spread = False

    def use_eval_set(self, args: Any, eval_dataset: Any) -> None:
        """Take the count of each evaluation's example scores from the trainer's eval set (:func:`eval_set_count`);
        the callback calls it when it attaches to a trainer. An explicit ``n`` wins."""
        self.eval_count = eval_set_count(args, eval_dataset, self.metric)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "evaluator": "MetricEvaluator",
            "metric": self.metric,
            "greater_is_better": self.greater_is_better,
        }
        if self.std_metric is not None:
            out["std_metric"] = self.std_metric
        if self.n is not None:
            out["n"] = self.n
        return out

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
        std, n = self.spread(metrics, key)
        return EvalResult(value if self.greater_is_better else -value, None, std=std, n=n)

    def spread(self, metrics: Mapping[str, Any], key: str) -> tuple[float | None, int | None]:
        """The ``(std, n)`` of the evaluation whose metric is ``metrics[key]``, or ``(None, None)`` when the metrics
        hold no spread of it or its count is not known. A non-finite or negative spread is left out, with a warning
        once (the mean still decides); the first call logs which evidence the detector gets."""
        found = self._std_key(metrics, key)
        n = self.n if self.n is not None else self.eval_count
        if found is None or n is None or n < 2:
            self._tell(None if found is None else found[0], n, key)
            return None, None
        std_key, is_stderr = found
        raw = metrics[std_key]
        value = raw.item() if hasattr(raw, "item") else raw
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            if not self._warned_bad_spread:
                self._warned_bad_spread = True
                logger.warning(
                    "EvalStop: metric %r is %r, not a finite standard deviation >= 0; the evals where it is are "
                    "reported by their means alone",
                    std_key,
                    raw,
                )
            return None, None
        std = float(value) * math.sqrt(n) if is_stderr else float(value)
        self._tell(std_key, n, key, is_stderr)
        return std, n

    def _std_key(self, metrics: Mapping[str, Any], key: str) -> tuple[str, bool] | None:
        """The metric that holds ``key``'s spread and whether it is a standard error, or None."""
        if self.std_metric is not None:
            for name in (self.std_metric, f"eval_{self.std_metric}"):
                if name in metrics:
                    return name, name.endswith("stderr")
            return None
        return next(((name, se) for name, se in spread_siblings(key) if name in metrics), None)

    def _tell(self, std_key: str | None, n: int | None, key: str, is_stderr: bool = False) -> None:
        """Log once which evidence mode this evaluator's reports give the detector, and why."""
        if self._told:
            return
        self._told = True
        if std_key is not None and n is not None and n >= 2:
            how = "standard error x sqrt(n)" if is_stderr else "standard deviation"
            where = "n=" if self.n is not None else "n from the eval set: "
            logger.info(
                "EvalStop: %r is reported with its spread (%s from %r, %s%d): the detector decides in "
                "mean-and-spread mode",
                key,
                how,
                std_key,
                where,
                n,
            )
        elif std_key is not None:
            logger.info(
                "EvalStop: %r has a spread (%r) but the count of its example scores is not known (the eval set has "
                "no length): means only; pass MetricEvaluator(..., n=N) to decide on the spread",
                key,
                std_key,
            )
        else:
            tried = [self.std_metric] if self.std_metric is not None else [name for name, _ in spread_siblings(key)]
            logger.info(
                "EvalStop: the trainer logs no spread of %r (looked for %s): means only; pass "
                "MetricEvaluator(..., std_metric=NAME, n=N) when it is logged under another name",
                key,
                ", ".join(repr(t) for t in tried),
            )
