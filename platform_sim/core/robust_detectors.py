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


# How far (in t units) a statistic must be from the critical value before scipy's test is skipped. The statistic
# below and scipy's agree to rounding (~1e-12), so with this margin a skipped test is always one that scipy would
# also find not significant: decisions are scipy's; only the cost of clearly hopeless calls is saved.
_T_SKIP_MARGIN = 0.25


def one_sided_t_p(values: np.ndarray, alpha: float, crit_cache: dict[int, float]) -> float:
    """scipy's one-sided one-sample t-test p-value of "mean < 0" for ``values``, or 1.0 when clearly not significant.

    scipy's tests cost about a millisecond per call, most of it overhead, and a detector may run one at every eval
    of every job. The t statistic is computed first; when it lies more than a margin above scipy's critical value
    ``t.ppf(alpha, n - 1)`` (cached per sample size), the test cannot reach ``alpha`` and 1.0 is returned without
    calling it. Otherwise the p-value is ``scipy.stats.ttest_1samp(values, 0, alternative="less").pvalue``.

    Args:
        values: The sample (at least 2 values, not all equal).
        alpha: The significance level the caller compares the p-value with.
        crit_cache: Per-detector cache of critical values by sample size.
    """
    n = values.size
    crit = crit_cache.get(n)
    if crit is None:
        crit = crit_cache[n] = float(stats.t.ppf(alpha, n - 1))
    sd = float(values.std(ddof=1))
    if sd > 0.0 and float(values.mean()) / (sd / math.sqrt(n)) > crit + _T_SKIP_MARGIN:
        return 1.0
    return float(stats.ttest_1samp(values, 0.0, alternative="less").pvalue)


class _FallbackMixin:
    """Shared bookkeeping: the noise of an eval-to-eval difference, the mean history (for the fallback estimate),
    the previous eval's per-example scores (for the paired estimate) and the once-per-detector warning."""

    name: ClassVar[str]
    se: float | None
    means: list[float]
    prev_scores: list[float] | None
    prev_se: float | None
    _warned: bool

    def _warn_fallback(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("detector %s: %s; falling back to the mean score (warned once per detector)", self.name, why)

    def _diff_se(self, scores: Sequence[float] | None) -> float | None:
        """Standard error of ``mean_t - mean_{t-1}``, and remember this eval for the next call (None at the first).

        In order of preference: *paired*, from the per-example differences to the previous eval (the examples are
        the same, so their fixed difficulty cancels and this is the noise the difference really has); *unpaired*,
        ``sqrt(SE_t**2 + SE_{t-1}**2)`` when only one side has per-example scores (overstates the noise when
        examples are correlated across checkpoints); then ``sqrt(2) * se`` with the ``se`` parameter, or with
        :func:`se_from_history`; None while there are too few evals to estimate it (the eval then decides nothing).
        """
        cur = None if scores is None or len(scores) < 2 else np.asarray(scores, dtype=float)
        cur_se = None if cur is None else float(cur.std(ddof=1) / math.sqrt(cur.size))
        out: float | None = None
        if self.means:  # there is a previous eval
            if cur is not None and self.prev_scores is not None and len(self.prev_scores) == cur.size:
                out = float((cur - np.asarray(self.prev_scores)).std(ddof=1) / math.sqrt(cur.size))
            elif cur_se is not None and self.prev_se is not None:
                out = math.sqrt(cur_se * cur_se + self.prev_se * self.prev_se)
            else:
                self._warn_fallback("no per-example eval scores" if not scores
                                    else "fewer than 2 per-example eval scores")
                one = self.se if self.se is not None else se_from_history(self.means)
                # Noise unknown (too few evals to estimate it): no evidence either way, so this eval decides nothing.
                out = None if one is None else math.sqrt(2.0) * one
        self.prev_scores = None if cur is None else cur.tolist()
        self.prev_se = cur_se
        return out


@register_detector
class KDeclineSEDetector(_FallbackMixin, Detector):
    """The paper's k-decline rule with a tolerance relative to the standard error of the eval-to-eval difference.

    A decline at eval t is ``score_t < score_{t-1} - max(min_delta, z * SE_diff)``, where ``SE_diff`` is the standard
    error of ``score_t - score_{t-1}``: from the paired per-example differences when both evals carry per-example
    scores on the same examples, otherwise as described in :meth:`_FallbackMixin._diff_se`. Any other eval resets
    the count; ``k`` consecutive declines stop the job. With ``z=0`` it is exactly
    :class:`~platform_sim.core.detectors.KDeclineDetector`.

    Args:
        k: Consecutive declines that stop the job. Integer >= 1.
        z: Tolerance in standard errors of the difference of two evals. Finite, >= 0.
        min_delta: Absolute floor of the tolerance (same units as the score). Finite, >= 0.
        se: Standard error of one eval mean to use when evals have no per-example scores. None: estimate it from
            the history of means (:func:`se_from_history`). Finite, >= 0.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "k-decline-se"
    #: Reads per-example eval scores when they are reported (simulators generate them only for such detectors).
    uses_example_scores: ClassVar[bool] = True

    def __init__(self, k: int = 2, z: float = 1.0, min_delta: float = 0.0, se: float | None = None,
                 warmup: int = 0) -> None:
        self.k = _check_int("k", k, 1)
        self.warmup = _check_int("warmup", warmup, 0)
        self.z = _check_nonneg("z", z)
        self.min_delta = _check_nonneg("min_delta", min_delta)
        self.se = _check_optional_nonneg("se", se)
        self.prev_scores: list[float] | None = None
        self.prev_se: float | None = None
        self.means: list[float] = []
        self.declines = 0
        self.last_tolerance = 0.0
        self._warned = False

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        diff_se = self._diff_se(scores)
        if diff_se is not None:
            self.last_tolerance = max(self.min_delta, self.z * diff_se)
        if (diff_se is not None and len(self.means) >= max(1, self.warmup)
                and score < self.means[-1] - self.last_tolerance):
            self.declines += 1
        else:
            self.declines = 0
        self.means.append(score)
        return self.declines >= self.k

    def reason(self) -> str:
        return (f"{self.declines} consecutive declines beyond {self.z:g} standard errors "
                f"(k={self.k}, tolerance {self.last_tolerance:.4g})")

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "z": self.z, "min_delta": self.min_delta, "se": self.se, "warmup": self.warmup}

    def state_dict(self) -> dict[str, Any]:
        return {"prev_scores": None if self.prev_scores is None else list(self.prev_scores), "prev_se": self.prev_se,
                "means": list(self.means), "declines": self.declines, "last_tolerance": self.last_tolerance}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prev_scores = None if state["prev_scores"] is None else [float(v) for v in state["prev_scores"]]
        self.prev_se = state["prev_se"]
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
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "paired-test"
    #: Reads per-example eval scores when they are reported (simulators generate them only for such detectors).
    uses_example_scores: ClassVar[bool] = True

    def __init__(self, test: str = "wilcoxon", alpha: float = 0.01, min_effect: float = 0.0, k: int = 2,
                 warmup: int = 0) -> None:
        self.warmup = _check_int("warmup", warmup, 0)
        self.seen = 0
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
        self._crit: dict[int, float] = {}  # t critical values by sample size (derived, not state)

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
            p = one_sided_t_p(diff, self.alpha, self._crit)
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
        self.seen += 1
        significant = significant and self.seen > self.warmup
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
        return {"test": self.test, "alpha": self.alpha, "min_effect": self.min_effect, "k": self.k,
                "warmup": self.warmup}

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score,
                "best_scores": None if self.best_scores is None else list(self.best_scores),
                "prev_score": self.prev_score, "declines": self.declines, "last_p": self.last_p, "seen": self.seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_score = state["best_score"]
        best_scores = state["best_scores"]
        self.best_scores = None if best_scores is None else [float(s) for s in best_scores]
        self.prev_score = state["prev_score"]
        self.declines = int(state["declines"])
        self.last_p = state["last_p"]
        self.seen = int(state.get("seen", 0))


@register_detector
class CusumDetector(_FallbackMixin, Detector):
    """A one-sided CUSUM on the eval-to-eval drops of the mean score (a streaming change-point detector).

    With ``d_t = score_{t-1} - score_t`` (a drop is positive) and ``s`` the pooled noise of one eval mean (the root
    mean square of ``SE_diff / sqrt(2)`` over the evals so far, ``SE_diff`` as in :class:`KDeclineSEDetector`), the
    statistic is ``S_t = max(0, S_{t-1} + d_t - slack * s)`` and the job stops when
    ``S_t > threshold * s + min_delta``. The drops telescope, so ``S_t`` is the fall from a recent high minus
    ``slack * s`` per eval since: a steady decline builds it up, noise around a plateau mostly does not. A score that
    never falls keeps ``S`` at 0 and never stops.

    Args:
        slack: Allowance per eval, in standard errors: drops smaller than this on average never add up. Finite, >= 0.
        threshold: Alarm level in standard errors. Finite, >= 0.
        min_delta: Absolute floor added to the alarm level (score units); keeps noise-free plateaus from stopping on
            rounding-sized drops. Finite, >= 0.
        se: Standard error of one eval mean when evals have no per-example scores. None: estimate it from the
            history of means (:func:`se_from_history`). Finite, >= 0.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "cusum"
    #: Reads per-example eval scores when they are reported (simulators generate them only for such detectors).
    uses_example_scores: ClassVar[bool] = True

    def __init__(self, slack: float = 0.5, threshold: float = 4.0, min_delta: float = 0.0,
                 se: float | None = None, warmup: int = 0) -> None:
        self.warmup = _check_int("warmup", warmup, 0)
        self.slack = _check_nonneg("slack", slack)
        self.threshold = _check_nonneg("threshold", threshold)
        self.min_delta = _check_nonneg("min_delta", min_delta)
        self.se = _check_optional_nonneg("se", se)
        self.prev_scores: list[float] | None = None
        self.prev_se: float | None = None
        self.stat = 0.0
        self.var_sum = 0.0
        self.var_count = 0
        self.means: list[float] = []
        self.declines = 0
        self._warned = False

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        diff_se = self._diff_se(scores)
        stop = False
        if diff_se is not None:
            self.var_sum += diff_se * diff_se / 2.0
            self.var_count += 1
            pooled = math.sqrt(self.var_sum / self.var_count)
            if len(self.means) >= self.warmup:  # drops into the first `warmup` evals are not accumulated
                self.stat = max(0.0, self.stat + (self.means[-1] - score) - self.slack * pooled)
            stop = self.stat > self.threshold * pooled + self.min_delta
        # "declines" reports the evidence as a count: consecutive evals with the statistic above zero.
        self.declines = self.declines + 1 if self.stat > 0.0 else 0
        self.means.append(score)
        return stop

    def reason(self) -> str:
        return (f"CUSUM of drops {self.stat:.4g} above {self.threshold:g} standard errors "
                f"(slack {self.slack:g}, min_delta {self.min_delta:g})")

    def params(self) -> dict[str, Any]:
        return {"slack": self.slack, "threshold": self.threshold, "min_delta": self.min_delta, "se": self.se,
                "warmup": self.warmup}

    def state_dict(self) -> dict[str, Any]:
        return {"prev_scores": None if self.prev_scores is None else list(self.prev_scores), "prev_se": self.prev_se,
                "stat": self.stat, "var_sum": self.var_sum, "var_count": self.var_count, "means": list(self.means),
                "declines": self.declines}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prev_scores = None if state["prev_scores"] is None else [float(v) for v in state["prev_scores"]]
        self.prev_se = state["prev_se"]
        self.stat = float(state["stat"])
        self.var_sum = float(state["var_sum"])
        self.var_count = int(state["var_count"])
        self.means = [float(m) for m in state["means"]]
        self.declines = int(state["declines"])


TREND_TESTS: tuple[str, ...] = ("t", "wilcoxon")


@register_detector
class TrendDetector(_FallbackMixin, Detector):
    """A one-sided test that the score has been *falling* over the last evals (a paired trend test).

    For each held-out example the detector fits the least-squares slope of its scores over the last ``window``
    checkpoints; the examples' fixed difficulty cancels in a slope, so the slopes are paired evidence. scipy's
    one-sided one-sample test (``t``: t-test; ``wilcoxon``: signed-rank) of "the mean slope is below zero" gives a
    p-value. With ``short_window`` the last ``short_window`` checkpoints are tested too and each of the two tests
    runs at ``alpha / 2`` (Bonferroni): the short window reacts fast when the noise is low, the long one sees
    through heavy noise. An eval is *significant* when a test is and the mean is below the best mean so far by more
    than ``min_drop``; ``k`` consecutive significant evals stop the job. A score that never falls below its best
    never stops the job. A window is tested only once that many evals exist.

    Averaging over a window is what lets this detector see a decline through heavy noise, where a rule on one or two
    differences cannot; the price is that a small ``alpha`` is needed on runs that plateau for long (a flat run has a
    negative fitted slope half of the time), and some delay after the peak (the window must fill with falling evals).

    Without per-example scores on every eval of a window, its test falls back to the means (with a warning once per
    detector): with the ``se`` parameter, a one-sided z-test of the slope of the means (``scipy.stats.norm``);
    otherwise scipy's ``linregress`` one-sided test, which estimates the noise from the residuals of the fit.

    Args:
        window: Evals in the (long) fitted window, an integer >= 3.
        alpha: Significance level of an eval (split between the two windows when ``short_window`` is set), strictly
            between 0 and 1.
        k: Consecutive significant evals that stop the job. Integer >= 1.
        min_drop: Minimum drop of the mean below the best mean (score units). Finite, >= 0.
        test: ``"t"`` or ``"wilcoxon"`` (on the per-example slopes).
        se: Standard error of one eval mean, used when evals have no per-example scores. None: estimate the noise
            from the fit's residuals. Finite, >= 0.
        short_window: Optional second, shorter window: an integer >= 3 and < ``window``, or None.
        level_alpha: Optional second condition: the current checkpoint must also be below the best checkpoint by a
            one-sided paired t-test (per-example scores, scipy) at this level, strictly between 0 and 1; None: off.
            Without per-example scores at this eval or at the best checkpoint the condition is the mean guard alone.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "trend"
    #: Reads per-example eval scores when they are reported (simulators generate them only for such detectors).
    uses_example_scores: ClassVar[bool] = True

    def __init__(self, window: int = 8, alpha: float = 0.2, k: int = 1, min_drop: float = 0.0, test: str = "t",
                 se: float | None = None, short_window: int | None = None,
                 level_alpha: float | None = None, warmup: int = 0) -> None:
        self.window = _check_int("window", window, 3)
        self.warmup = _check_int("warmup", warmup, 0)
        self.seen = 0
        self.alpha = _check_prob("alpha", alpha)
        self.k = _check_int("k", k, 1)
        self.min_drop = _check_nonneg("min_drop", min_drop)
        if test not in TREND_TESTS:
            raise ValueError(f"test must be one of {', '.join(TREND_TESTS)}, got {test!r}")
        self.test = test
        self.se = _check_optional_nonneg("se", se)
        if short_window is not None:
            _check_int("short_window", short_window, 3)
            if short_window >= self.window:
                raise ValueError(f"short_window must be < window ({self.window}), got {short_window!r}")
        self.short_window = short_window
        self.level_alpha = None if level_alpha is None else _check_prob("level_alpha", level_alpha)
        self.best_score: float | None = None
        self.best_scores: list[float] | None = None
        self.recent_means: list[float] = []
        self.recent_scores: list[list[float] | None] = []
        self.declines = 0
        self.last_p: float | None = None
        self.last_slope: float | None = None
        self._warned = False
        self._windows = (self.window,) if short_window is None else (short_window, self.window)
        self._crit: dict[int, float] = {}  # t critical values by sample size (derived, not state)
        self._level_crit: dict[int, float] = {}

    def _p_value(self, w: int, slope: float, x: np.ndarray, den: float) -> float:
        """One-sided p-value of "the score falls over the last ``w`` evals" (their mean slope is ``slope`` < 0)."""
        rows = self.recent_scores[-w:]
        n = None if rows[0] is None else len(rows[0])
        if n is not None and n >= 2 and all(r is not None and len(r) == n for r in rows):
            slopes = x @ np.asarray(rows, dtype=float) / den  # one slope per example
            if np.ptp(slopes) <= 1e-12 * max(1.0, float(np.max(np.abs(slopes)))):
                # Every example falls by the same amount: zero variance, scipy has no statistic; certain evidence.
                return 0.0 if slopes[0] < 0 else 1.0
            if self.test == "wilcoxon":
                p = stats.wilcoxon(slopes[slopes != 0.0], alternative="less").pvalue
            else:
                p = one_sided_t_p(slopes, self.alpha / len(self._windows), self._crit)
        else:
            self._warn_fallback("no per-example eval scores on every eval of the window")
            if self.se is not None:
                if self.se == 0.0:
                    return 0.0  # noise-free means that fall: certain evidence
                p = stats.norm.cdf(slope / (self.se / math.sqrt(den)))
            else:
                p = stats.linregress(x, np.asarray(self.recent_means[-w:], dtype=float), alternative="less").pvalue
        return 1.0 if not math.isfinite(p) else float(p)

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        self.recent_means.append(score)
        self.recent_scores.append(None if scores is None or len(scores) == 0 else [float(s) for s in scores])
        if len(self.recent_means) > self.window:
            del self.recent_means[0], self.recent_scores[0]
        significant = False
        self.last_p = self.last_slope = None
        # The cheap check first: a test runs only when the mean really fell below the best.
        if self.best_score is not None and score < self.best_score - self.min_drop:
            level = self.alpha / len(self._windows)
            for w in self._windows:
                if len(self.recent_means) < w:
                    continue
                x = np.arange(w, dtype=float) - (w - 1) / 2.0  # centered positions: slope = x @ y / (x @ x)
                den = float(x @ x)
                slope = float(x @ np.asarray(self.recent_means[-w:]) / den)
                if slope >= 0.0:
                    continue  # a one-sided p-value of a rising fit is >= 0.5: never significant
                p = self._p_value(w, slope, x, den)
                if self.last_p is None or p < self.last_p:
                    self.last_p, self.last_slope = p, slope
                if p < level:
                    significant = True
                    break
            if significant and self.level_alpha is not None:
                significant = self._below_best()
        self.seen += 1
        significant = significant and self.seen > self.warmup
        self.declines = self.declines + 1 if significant else 0
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            self.best_scores = self.recent_scores[-1]
        return self.declines >= self.k

    def _below_best(self) -> bool:
        """The level condition: the current checkpoint is below the best one by a paired t-test at ``level_alpha``."""
        cur, best = self.recent_scores[-1], self.best_scores
        if cur is None or best is None or len(cur) != len(best) or len(cur) < 2:
            self._warn_fallback("no per-example eval scores for the level test against the best checkpoint")
            return True  # the mean guard (score below the best) already holds
        diff = np.asarray(cur, dtype=float) - np.asarray(best, dtype=float)
        if np.ptp(diff) <= 1e-12 * max(1.0, float(np.max(np.abs(diff)))):
            return bool(diff[0] < 0)
        assert self.level_alpha is not None
        return one_sided_t_p(diff, self.level_alpha, self._level_crit) < self.level_alpha

    def reason(self) -> str:
        p = "n/a" if self.last_p is None else f"{self.last_p:.3g}"
        slope = "n/a" if self.last_slope is None else f"{self.last_slope:.4g}"
        windows = " or ".join(str(w) for w in self._windows)
        return (f"score falling over the last {windows} evals (slope {slope} per eval, {self.test} test p={p}, "
                f"alpha={self.alpha:g}, {self.declines} consecutive, k={self.k})")

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "alpha": self.alpha, "k": self.k, "min_drop": self.min_drop,
                "test": self.test, "se": self.se, "short_window": self.short_window, "level_alpha": self.level_alpha,
                "warmup": self.warmup}

    def state_dict(self) -> dict[str, Any]:
        return {"best_score": self.best_score,
                "best_scores": None if self.best_scores is None else list(self.best_scores),
                "recent_means": list(self.recent_means),
                "recent_scores": [None if r is None else list(r) for r in self.recent_scores],
                "declines": self.declines, "last_p": self.last_p, "last_slope": self.last_slope, "seen": self.seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_score = state["best_score"]
        best_scores = state.get("best_scores")
        self.best_scores = None if best_scores is None else [float(v) for v in best_scores]
        self.recent_means = [float(m) for m in state["recent_means"]]
        self.recent_scores = [None if r is None else [float(v) for v in r] for r in state["recent_scores"]]
        self.declines = int(state["declines"])
        self.last_p = state["last_p"]
        self.last_slope = state["last_slope"]
        self.seen = int(state.get("seen", 0))
