"""Noise-robust decline detectors: rules that use the eval's standard error, not only the sign of a difference.

The paper's k-decline rule (:class:`~platform_sim.core.detectors.KDeclineDetector`) counts any drop of the mean eval
score as a decline, so its false stops grow with eval noise and on healthy plateaus. Every eval is a mean over
held-out examples, and two checkpoints are scored on the same examples, so the per-example scores tell how large a
drop noise alone makes. The detectors here use them:

- ``k-decline-se``: the paper's rule where a drop counts only if it exceeds ``z`` standard errors of the difference.
- ``paired-test``: a one-sided paired test (Wilcoxon signed-rank, sign test or paired t-test, from scipy) of the
  current checkpoint's per-example scores against the best checkpoint's, with a significance level and a minimum
  effect on the mean; ``k`` consecutive significant evals stop the job.
- ``cusum``: a one-sided CUSUM on the eval-to-eval drops of the mean, with slack and threshold in standard errors.

When an eval has no per-example scores (or fewer than two), each detector falls back to the mean alone: the standard
error comes from the ``se`` parameter if given, otherwise it is estimated from the history of the means (see
:func:`se_from_history`), and the paired test falls back to the k-decline rule on the mean. The fallback is logged
once per detector with a warning.

Like every detector, these assume validated input (the :class:`~platform_sim.core.monitor.JobMonitor` checks finite
scores and increasing steps) and keep their whole state as plain data.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from scipy import stats

from .boundary import InvalidReportError
from .detectors import Detector, _check_int, _check_nonneg, register_detector

logger = logging.getLogger(__name__)

#: Evals of history needed before :func:`se_from_history` gives an estimate.
MIN_HISTORY_FOR_SE = 4

# Normal-consistency constant of the median absolute deviation.
_MAD_TO_SD = 1.482602218505602


def _check_prob(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def _check_optional_nonneg(name: str, value: Any) -> float | None:
    return None if value is None else _check_nonneg(name, value)


def standard_error(scores: Sequence[float] | None) -> float | None:
    """Standard error of the mean of ``scores`` (sample std with ddof=1 over sqrt(n)); None for fewer than 2 scores."""
    if scores is None or len(scores) < 2:
        return None
    arr = np.asarray(scores, dtype=float)
    return float(arr.std(ddof=1) / math.sqrt(arr.size))


def se_from_history(means: Sequence[float]) -> float | None:
    """Estimate the noise (standard error) of one eval mean from the history of means alone.

    Uses the median absolute second difference: for independent noise of std ``s`` on a locally linear curve, the
    second difference ``x[t] - 2 x[t-1] + x[t-2]`` has std ``s * sqrt(6)`` and no trend, and the median makes one
    real drop (the signal we want to detect) count little. Returns None with fewer than
    :data:`MIN_HISTORY_FOR_SE` means.

    Args:
        means: Eval means in step order.
    """
    if len(means) < MIN_HISTORY_FOR_SE:
        return None
    second = np.diff(np.asarray(means, dtype=float), n=2)
    return float(_MAD_TO_SD * np.median(np.abs(second)) / math.sqrt(6.0))


class _FallbackMixin:
    """Shared bookkeeping: the mean history (for the fallback SE estimate) and the once-per-detector warning."""

    name: ClassVar[str]
    se: float | None
    means: list[float]
    _warned: bool

    def _warn_fallback(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("detector %s: %s; falling back to the mean score (warned once per detector)", self.name, why)

    def _eval_se(self, scores: Sequence[float] | None) -> float:
        """SE of this eval: from the per-example scores, else the ``se`` parameter, else the history, else 0."""
        se = standard_error(scores)
        if se is not None:
            return se
        self._warn_fallback("no per-example eval scores" if not scores else "fewer than 2 per-example eval scores")
        if self.se is not None:
            return self.se
        est = se_from_history(self.means)
        # Too few evals to estimate noise: tolerance 0 here (the rule on the bare mean), as the paper's rule does.
        return 0.0 if est is None else est


@register_detector
class KDeclineSEDetector(_FallbackMixin, Detector):
    """The paper's k-decline rule with a tolerance relative to the eval's standard error.

    A decline at eval t is ``score_t < score_{t-1} - max(min_delta, z * SE_diff)``, where
    ``SE_diff = sqrt(SE_t**2 + SE_{t-1}**2)`` and ``SE`` of an eval is the standard error of its mean from its
    per-example scores. Any other eval resets the count; ``k`` consecutive declines stop the job. With ``z=0`` it is
    exactly :class:`~platform_sim.core.detectors.KDeclineDetector`.

    Args:
        k: Consecutive declines that stop the job. Integer >= 1.
        z: Tolerance in standard errors of the difference of two evals. Finite, >= 0.
        min_delta: Absolute floor of the tolerance (same units as the score). Finite, >= 0.
        se: Standard error of one eval mean to use when an eval has no per-example scores. None: estimate it from
            the history of means (:func:`se_from_history`). Finite, >= 0.
    """

    name: ClassVar[str] = "k-decline-se"

    def __init__(self, k: int = 2, z: float = 1.0, min_delta: float = 0.0, se: float | None = None) -> None:
        self.k = _check_int("k", k, 1)
        self.z = _check_nonneg("z", z)
        self.min_delta = _check_nonneg("min_delta", min_delta)
        self.se = _check_optional_nonneg("se", se)
        self.prev_score: float | None = None
        self.prev_se: float = 0.0
        self.means: list[float] = []
        self.declines = 0
        self.last_tolerance = 0.0
        self._warned = False

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        se = self._eval_se(scores)
        prev = self.prev_score
        if prev is not None:
            self.last_tolerance = max(self.min_delta, self.z * math.sqrt(se * se + self.prev_se * self.prev_se))
        if prev is not None and score < prev - self.last_tolerance:
            self.declines += 1
        else:
            self.declines = 0
        self.prev_score, self.prev_se = score, se
        self.means.append(score)
        return self.declines >= self.k

    def reason(self) -> str:
        return (f"{self.declines} consecutive declines beyond {self.z:g} standard errors "
                f"(k={self.k}, tolerance {self.last_tolerance:.4g})")

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "z": self.z, "min_delta": self.min_delta, "se": self.se}

    def state_dict(self) -> dict[str, Any]:
        return {"prev_score": self.prev_score, "prev_se": self.prev_se, "means": list(self.means),
                "declines": self.declines, "last_tolerance": self.last_tolerance}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prev_score = state["prev_score"]
        self.prev_se = float(state["prev_se"])
        self.means = [float(m) for m in state["means"]]
        self.declines = int(state["declines"])
        self.last_tolerance = float(state["last_tolerance"])


PAIRED_TESTS: tuple[str, ...] = ("wilcoxon", "sign", "t")


@register_detector
class PairedTestDetector(_FallbackMixin, Detector):
    """A one-sided paired test of the current checkpoint against the best one, on per-example scores.

    The detector keeps the per-example scores of the best checkpoint so far (highest mean, earliest on ties, as the
    monitor's best step). At each later eval it tests "the current checkpoint scores lower than the best one on the
    same examples" with scipy's one-sided test (``wilcoxon``: signed-rank, zero differences dropped; ``sign``: a
    binomial test on the signs of the non-zero differences; ``t``: paired t-test). An eval is *significant* when the
    p-value is below ``alpha`` and the mean is below the best mean by more than ``min_effect``; the job stops after
    ``k`` consecutive significant evals. Because the mean must be below the best one, a score that never falls below
    its best never stops the job, whatever the per-example scores say.

    Without per-example scores at this eval or at the best checkpoint, the eval is judged on the mean: it counts if
    ``score_t < score_{t-1} - min_effect`` (the k-decline rule), with a warning once per detector.

    The best is chosen on noisy means, so it is biased upwards (the winner's curse); a small ``alpha`` and ``k >= 2``
    keep healthy plateaus from being stopped for that reason alone.

    Args:
        test: ``"wilcoxon"``, ``"sign"`` or ``"t"``.
        alpha: Significance level of each test, strictly between 0 and 1.
        min_effect: Minimum drop of the mean below the best mean (score units). Finite, >= 0.
        k: Consecutive significant evals that stop the job. Integer >= 1.
    """

    name: ClassVar[str] = "paired-test"

    def __init__(self, test: str = "wilcoxon", alpha: float = 0.01, min_effect: float = 0.0, k: int = 2) -> None:
        if test not in PAIRED_TESTS:
            raise ValueError(f"test must be one of {', '.join(PAIRED_TESTS)}, got {test!r}")
        self.test = test
        self.alpha = _check_prob("alpha", alpha)
        self.min_effect = _check_nonneg("min_effect", min_effect)
        self.k = _check_int("k", k, 1)
        self.best_score: float | None = None
        self.best_scores: list[float] | None = None
        self.prev_score: float | None = None
        self.declines = 0
        self.last_p: float | None = None
        self._warned = False

    def _p_value(self, diff: np.ndarray) -> float:
        """One-sided p-value of "current < best" from the paired differences ``current - best``."""
        nonzero = diff[diff != 0.0]
        if nonzero.size == 0:  # identical on every example: no evidence of a decline
            return 1.0
        if self.test == "sign":
            return float(stats.binomtest(int((nonzero < 0).sum()), int(nonzero.size), 0.5,
                                         alternative="greater").pvalue)
        if self.test == "wilcoxon":
            p = stats.wilcoxon(nonzero, alternative="less").pvalue
        else:
            if np.ptp(diff) <= 1e-9 * float(np.max(np.abs(diff))):
                # Every example moved by the same amount: zero variance, no t statistic (scipy gives NaN); a uniform
                # drop on every example is the strongest possible evidence.
                return 0.0 if diff[0] < 0 else 1.0
            p = stats.ttest_1samp(diff, 0.0, alternative="less").pvalue
        return 1.0 if not math.isfinite(p) else float(p)

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        per_example = None if scores is None or len(scores) == 0 else np.asarray(scores, dtype=float)
        if (per_example is not None and self.best_scores is not None
                and per_example.size != len(self.best_scores)):
            raise InvalidReportError(
                f"eval_scores has {per_example.size} entries but the best checkpoint's had {len(self.best_scores)}; "
                "a paired test needs the same held-out examples at every eval")
        best = self.best_score
        significant = False
        self.last_p = None
        if best is not None:
            if per_example is None or self.best_scores is None:
                self._warn_fallback("no per-example eval scores" if per_example is None
                                    else "the best checkpoint has no per-example eval scores")
                significant = self.prev_score is not None and score < self.prev_score - self.min_effect
            elif score < best - self.min_effect:  # cheap pre-check first: the test runs only on a real drop
                self.last_p = self._p_value(per_example - np.asarray(self.best_scores, dtype=float))
                significant = self.last_p < self.alpha
        self.declines = self.declines + 1 if significant else 0
        if best is None or score > best:
            self.best_score = score
            self.best_scores = None if per_example is None else [float(s) for s in per_example]
        self.prev_score = score
        return self.declines >= self.k

    def reason(self) -> str:
        p = "n/a (mean fallback)" if self.last_p is None else f"{self.last_p:.3g}"
        return (f"{self.declines} consecutive evals significantly below the best checkpoint "
                f"({self.test} test, p={p}, alpha={self.alpha:g}, k={self.k})")

    def params(self) -> dict[str, Any]:
        return {"test": self.test, "alpha": self.alpha, "min_effect": self.min_effect, "k": self.k}

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score,
                "best_scores": None if self.best_scores is None else list(self.best_scores),
                "prev_score": self.prev_score, "declines": self.declines, "last_p": self.last_p}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_score = state["best_score"]
        best_scores = state["best_scores"]
        self.best_scores = None if best_scores is None else [float(s) for s in best_scores]
        self.prev_score = state["prev_score"]
        self.declines = int(state["declines"])
        self.last_p = state["last_p"]


@register_detector
class CusumDetector(_FallbackMixin, Detector):
    """A one-sided CUSUM on the eval-to-eval drops of the mean score (a streaming change-point detector).

    With ``d_t = score_{t-1} - score_t`` (a drop is positive) and ``s`` the pooled standard error of one eval
    (root mean square of the evals' standard errors so far), the statistic is
    ``S_t = max(0, S_{t-1} + d_t - slack * s)`` and the job stops when ``S_t > threshold * s + min_delta``. The
    drops telescope, so ``S_t`` is the fall from a recent high minus ``slack * s`` per eval since: a steady decline
    builds it up, a noisy plateau does not. A score that never falls keeps ``S`` at 0 and never stops.

    Args:
        slack: Allowance per eval, in standard errors: drops smaller than this on average never add up. Finite, >= 0.
        threshold: Alarm level in standard errors. Finite, >= 0.
        min_delta: Absolute floor added to the alarm level (score units); keeps noise-free plateaus from stopping on
            rounding-sized drops. Finite, >= 0.
        se: Standard error of one eval mean when evals have no per-example scores. None: estimate it from the
            history of means (:func:`se_from_history`). Finite, >= 0.
    """

    name: ClassVar[str] = "cusum"

    def __init__(self, slack: float = 0.5, threshold: float = 4.0, min_delta: float = 0.0,
                 se: float | None = None) -> None:
        self.slack = _check_nonneg("slack", slack)
        self.threshold = _check_nonneg("threshold", threshold)
        self.min_delta = _check_nonneg("min_delta", min_delta)
        self.se = _check_optional_nonneg("se", se)
        self.prev_score: float | None = None
        self.stat = 0.0
        self.se_sq_sum = 0.0
        self.se_count = 0
        self.means: list[float] = []
        self.declines = 0
        self._warned = False

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        se = self._eval_se(scores)
        self.se_sq_sum += se * se
        self.se_count += 1
        pooled = math.sqrt(self.se_sq_sum / self.se_count)
        stop = False
        if self.prev_score is not None:
            self.stat = max(0.0, self.stat + (self.prev_score - score) - self.slack * pooled)
            stop = self.stat > self.threshold * pooled + self.min_delta
        # "declines" reports evidence as a count: consecutive evals with the statistic above zero.
        self.declines = self.declines + 1 if self.stat > 0.0 else 0
        self.prev_score = score
        self.means.append(score)
        return stop

    def reason(self) -> str:
        return (f"CUSUM of drops {self.stat:.4g} above {self.threshold:g} standard errors "
                f"(slack {self.slack:g}, min_delta {self.min_delta:g})")

    def params(self) -> dict[str, Any]:
        return {"slack": self.slack, "threshold": self.threshold, "min_delta": self.min_delta, "se": self.se}

    def state_dict(self) -> dict[str, Any]:
        return {"prev_score": self.prev_score, "stat": self.stat, "se_sq_sum": self.se_sq_sum,
                "se_count": self.se_count, "means": list(self.means), "declines": self.declines}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prev_score = state["prev_score"]
        self.stat = float(state["stat"])
        self.se_sq_sum = float(state["se_sq_sum"])
        self.se_count = int(state["se_count"])
        self.means = [float(m) for m in state["means"]]
        self.declines = int(state["declines"])
