"""``trend``: a one-sided test that the score has been *falling* over the last evals (a paired trend test)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np

from ..boundary import EvidenceMode, is_array, sample_std
from ..checks import check_int, check_nonneg, check_optional_nonneg, check_prob
from .base import EvidenceDetector, Spread
from .packed_rows import pack_row, unpack_row
from .progress import PlannedEvidence, check_spend_power
from .pvalues import one_sided_t_p, scipy_module, slope_less_p, unchanged
from .registry import register_detector
from .trend_per_run import PerRunTests

TREND_TESTS: tuple[str, ...] = ("t", "wilcoxon")
MEANS_TESTS: tuple[str, ...] = ("auto", "window", "progress")


def _read_only_vector(scores: Sequence[float]) -> bool:
    """Whether ``scores`` is a read-only one-dimensional float64 array (kept as it is, as a tuple is)."""
    return is_array(scores) and scores.dtype == np.float64 and scores.ndim == 1 and not scores.flags.writeable


@register_detector
class TrendDetector(EvidenceDetector):
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

    The test runs in the richest of three modes the window's evals allow (:meth:`mode`; the decision names it):

    - *per-example*: every eval of the last ``window`` ones has per-example scores (of one length >= 2): the paired
      test above;
    - *mean-and-spread*: every eval of the last ``spread_window`` ones has a spread (``eval_std`` and ``eval_n``, or
      per-example scores it is computed from): the least-squares slope of the means, tested as a one-sided z-test with
      each mean's variance *known*, ``std**2 / n``, instead of estimated from the residuals (a known-variance slope
      test: ``var(slope) = sum(x_i**2 * std_i**2 / n_i) / (sum x_i**2)**2``), at ``spread_alpha``. The variance
      between examples is part of ``std``, so on the same examples at every eval the test is conservative; what
      lets it see a decline that the residuals would hide is that it does not pay for estimating the noise from
      ``spread_window - 2`` degrees of freedom;
    - *means only* (with a warning once per detector): with the ``se`` parameter, a one-sided z-test of the slope of
      the means (``scipy.stats.norm``); otherwise scipy's ``linregress`` one-sided test, which estimates the noise
      from the residuals of the fit (computed as scipy computes it, by
      :func:`~platform_sim.core.detectors.pvalues.slope_less_p`).

    **Per-run error control.** A per-look test at every eval stops a healthy run more often the
    more densely it is evaluated. With ``means_test="auto"`` (the default), once the reports carry the run's
    ``planned_steps`` (:meth:`plan`), the means-only mode is :class:`~.progress.PlannedSlope`'s test instead, whose
    false-stop rate is bounded per run at ``run_alpha`` however densely the run is evaluated: a window of the last
    ``frac`` of the planned steps (at least ``window`` evals), the noise pooled from the run's second differences,
    the level spent by progress (``run_alpha * (p**rho - p'**rho)`` between looks at progress ``p'`` and ``p``,
    ``rho`` = ``spend_power``), and a stop only on a drop of at least ``rel_drop`` of the rise. **The per-example and mean-and-spread modes** then test
    per run too (:class:`~.progress.PlannedEvidence`): each mode's own statistic (the paired slope t, the
    known-variance z) over the same window in planned progress, at the look's share of ``evidence_run_alpha`` spent
    the same way, with a materiality of ``evidence_rel_drop``. Without a plan every mode is its per-look window test
    above, and the reason says so. ``means_test="window"`` keeps the per-look tests whatever the reports carry;
    ``means_test="progress"`` is :class:`~.progress.ProgressSlope`'s anytime variant of the means' test (no plan
    needed: the window a ``frac`` of the steps seen so far, the level spent over geometric epochs of steps; the other
    two modes per look).

    The mode is read from the evals of its window (those there are, before it fills), so a job whose reports carry
    spreads on some evals and not others decides on the means alone until the last ``spread_window`` evals all carry
    one. ``short_window`` is used in the per-example and means-only modes.

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
        spread_window: Evals in the window of the mean-and-spread mode, an integer >= 3; None: ``window``. Left out
            of :meth:`params` when None, so earlier specs are unchanged.
        spread_alpha: Significance level of the mean-and-spread mode, strictly between 0 and 1; None: ``alpha``.
            Left out of :meth:`params` when None.
        means_test: The means-only test: ``"auto"`` (per run by planned progress when the reports carry
            ``planned_steps``, else the per-look window test; left out of :meth:`params`), ``"window"`` (the last
            ``window`` evals, at ``alpha`` per look, always) or ``"progress"`` (per run, anytime, above). The next
            three are listed by :meth:`params` with ``"progress"``, and with ``"auto"`` when they differ from their
            defaults.
        run_alpha: The run's false-stop level of the progress tests, strictly between 0 and 1.
        frac: Share of the steps (planned, or seen so far) that the progress window covers, strictly between 0 and 1.
        rel_drop: Materiality of the progress tests: a share of the run's rise so far, >= 0.
        evidence_run_alpha: The run's false-stop level of the per-run per-example and mean-and-spread tests, strictly
            between 0 and 1 (listed by :meth:`params` when not 0.1).
        evidence_rel_drop: Their materiality, a share of the run's rise so far, >= 0 (listed when not 0).
        spend_power: The shape of the per-run tests' spending by planned progress, ``F(p) = p**spend_power`` up to
            the plan (1: evenly, Pocock-like; 2: little early), a finite number > 0 (listed when not 2). A run keeps
            the shape it started with: it is kept in the detector's state.
    """

    name: ClassVar[str] = "trend"
    uses_example_scores: ClassVar[bool] = True
    takes_score_arrays: ClassVar[bool] = True

    def __init__(
        self,
        window: int = 8,
        alpha: float = 0.2,
        k: int = 1,
        min_drop: float = 0.0,
        test: str = "t",
        se: float | None = None,
        short_window: int | None = None,
        level_alpha: float | None = None,
        warmup: int = 0,
        spread_window: int | None = None,
        spread_alpha: float | None = None,
        means_test: str = "auto",
        run_alpha: float = 0.05,
        frac: float = 0.2,
        rel_drop: float = 0.2,
        evidence_run_alpha: float = 0.1,
        evidence_rel_drop: float = 0.0,
        spend_power: float = 2.0,
    ) -> None:
        self.window = check_int("window", window, 3)
        super().__init__(k, warmup)
        self.alpha = check_prob("alpha", alpha)
        self.min_drop = check_nonneg("min_drop", min_drop)
        if test not in TREND_TESTS:
            raise ValueError(f"test must be one of {', '.join(TREND_TESTS)}, got {test!r}")
        self.test = test
        self.se = check_optional_nonneg("se", se)
        if short_window is not None:
            check_int("short_window", short_window, 3)
            if short_window >= self.window:
                raise ValueError(f"short_window must be < window ({self.window}), got {short_window!r}")
        self.short_window = short_window
        self.level_alpha = None if level_alpha is None else check_prob("level_alpha", level_alpha)
        self.spread_window = None if spread_window is None else check_int("spread_window", spread_window, 3)
        self.spread_alpha = None if spread_alpha is None else check_prob("spread_alpha", spread_alpha)
        if means_test not in MEANS_TESTS:
            raise ValueError(f"means_test must be one of {', '.join(MEANS_TESTS)}, got {means_test!r}")
        self.means_test = means_test
        self.run_alpha = check_prob("run_alpha", run_alpha)
        self.frac = check_prob("frac", frac)
        self.rel_drop = check_nonneg("rel_drop", rel_drop)
        self.evidence_run_alpha = check_prob("evidence_run_alpha", evidence_run_alpha)
        self.evidence_rel_drop = check_nonneg("evidence_rel_drop", evidence_rel_drop)
        self.spend_power = check_spend_power(spend_power)
        # The per-run tests (trend_per_run.py): the anytime one, or the planned ones once a report carries a plan.
        self._per_run = PerRunTests(
            means_test,
            self.run_alpha,
            self.frac,
            self.window,
            self.rel_drop,
            self.evidence_run_alpha,
            self.evidence_rel_drop,
            self.spend_power,
        )
        self.best_score: float | None = None
        self.best_scores: Sequence[float] | None = None
        self.recent_means: list[float] = []
        # Each eval's per-example scores as a tuple: the monitor's validated tuple is kept as it is (no copy per eval).
        self.recent_scores: list[Sequence[float] | None] = []
        # The spread a report carried ([std, n]), per eval of the window; None where it carried none (an eval with
        # per-example scores has its spread computed from them when the mean-and-spread mode needs it).
        self.recent_spreads: list[list[float] | None] = []
        self.last_p: float | None = None  # smallest p-value of the last eval's tests (None: no test ran)
        self.last_slope: float | None = None  # slope of the mean in the window of that p-value
        # The per-example slopes of the last eval's t-tests, in the order tested: one_sided_t_p skips scipy (returns
        # 1.0) when a test cannot be significant, and doubt() then computes the exact p-value from the most negative
        # t statistic among them (computed there, not at every eval: doubt() is asked only about some stops).
        self._last_slopes: list[np.ndarray] = []
        self._windows = (self.window,) if short_window is None else (short_window, self.window)
        self._spread_w = self.window if spread_window is None else spread_window
        self._spread_a = self.alpha if spread_alpha is None else spread_alpha
        self._keep = max(self.window, self._spread_w)  # evals of history the windows need
        self._crit: dict[int, float] = {}  # t critical values by sample size (derived, not state)
        self._level_crit: dict[int, float] = {}
        # The centered positions of each window and their sum of squares (derived, not state).
        self._x: dict[int, tuple[np.ndarray, float]] = {}
        # Derived from the window's evals, not state (rebuilt by _recount on load): how many of the latest evals in a
        # row carry per-example scores of one length >= 2 (that length in _example_len), and how many in a row carry a
        # spread or the scores to compute one. _window_mode reads them instead of re-scanning the window at every eval.
        self._example_run = 0
        self._example_len = 0
        self._spread_run = 0

    def plan(self, planned_steps: int | None) -> None:
        """Take the run's planned steps for the next eval (a report's ``planned_steps``; None: not given, the last
        plan given stays). With ``means_test="auto"`` a plan switches the means-only test to the per-run one."""
        self._per_run.plan(planned_steps)

    @classmethod
    def plan_matters_for(cls, params: Mapping[str, Any]) -> bool:
        """With ``means_test="auto"`` (listed in a spec only when it is not) a plan turns every mode's per-look test
        into the per-run one."""
        return bool(params.get("means_test", "auto") == "auto")

    def _window_mode(self) -> EvidenceMode:
        """The richest mode the evals of the windows allow (module docstring): per-example scores of one length >= 2
        on the last ``window`` evals, else a spread on each of the last ``spread_window``, else the means."""
        held = len(self.recent_scores)
        if held and self._example_run >= min(self.window, held):
            return EvidenceMode.PER_EXAMPLE
        if self._spread_run >= min(self._spread_w, held):
            return EvidenceMode.MEAN_AND_SPREAD
        return EvidenceMode.MEANS_ONLY

    def _count(self, row: Sequence[float] | None, spread: list[float] | None) -> None:
        """Update the runs that :meth:`_window_mode` reads with the eval just appended (``row``, ``spread``)."""
        if row is not None and len(row) >= 2:
            self._example_run = self._example_run + 1 if len(row) == self._example_len else 1
            self._example_len = len(row)
            self._spread_run += 1
        else:
            self._example_run = self._example_len = 0
            self._spread_run = self._spread_run + 1 if spread is not None else 0
        if self._example_run > self._keep:  # bounded: only a window's length of the run matters
            self._example_run = self._keep
        if self._spread_run > self._keep:
            self._spread_run = self._keep

    def _recount(self) -> None:
        """Rebuild the runs of :meth:`_count` from the evals held (after a state is loaded)."""
        self._example_run = self._example_len = self._spread_run = 0
        for row, spread in zip(self.recent_scores, self.recent_spreads):
            self._count(row, spread)

    def _mean_vars(self, w: int) -> np.ndarray:
        """Each of the last ``w`` means' variance, ``std**2 / n``, from the reported spread or the example scores."""
        out = np.empty(w)
        for i, (sp, r) in enumerate(zip(self.recent_spreads[-w:], self.recent_scores[-w:])):
            if sp is not None:
                out[i] = sp[0] * sp[0] / sp[1]
            else:
                assert r is not None  # _window_mode checked it
                out[i] = sample_std(r) ** 2 / len(r)  # the rule that checks a report's eval_std
        return out

    def _p_value(self, mode: EvidenceMode, w: int, slope: float, x: np.ndarray, den: float) -> float:
        """One-sided p-value of "the score falls over the last ``w`` evals" (their mean slope is ``slope`` < 0)."""
        if mode is EvidenceMode.PER_EXAMPLE:
            rows = cast("list[Sequence[float]]", self.recent_scores[-w:])  # of one length (the mode says so)
            # The rows' floats read into one (w, examples) array in one pass: np.asarray on a list of tuples spends
            # more on finding the shape than on the copy (the same array, the same slopes).
            n = len(rows[-1])
            if all(is_array(r) for r in rows):  # read-only float64 rows (the simulator's): one copy
                scores = np.concatenate(cast("list[np.ndarray]", rows)).reshape(w, n)
            else:
                scores = np.fromiter(itertools.chain.from_iterable(rows), np.float64, w * n).reshape(w, n)
            slopes = x @ scores / den  # one slope per example
            # np.ptp and np.max(np.abs(.)) as the array's own reductions: the same values, less dispatch per eval.
            if slopes.max() - slopes.min() <= 1e-12 * max(1.0, float(np.abs(slopes).max())):
                # Every example falls by the same amount: zero variance, scipy has no statistic; certain evidence.
                # Rows that did not change at all have slopes of round-off only, and are none (pvalues.unchanged).
                return 0.0 if slopes[0] < 0 and not unchanged(scores) else 1.0
            if self.test == "wilcoxon":
                p = float(scipy_module("stats").wilcoxon(slopes[slopes != 0.0], alternative="less").pvalue)
            else:
                p = one_sided_t_p(slopes, self.alpha / len(self._windows), self._crit)
                self._last_slopes.append(slopes)  # doubt() computes their t statistics only when asked
        elif mode is EvidenceMode.MEAN_AND_SPREAD:
            var = float(x * x @ self._mean_vars(w)) / (den * den)  # the slope's variance with each mean's known
            if var <= 0.0:  # every std is 0: noise-free means that fall, certain evidence (unchanged: none)
                return 1.0 if unchanged(self.recent_means[-w:]) else 0.0
            p = 0.5 * math.erfc(-slope / math.sqrt(var) / math.sqrt(2.0))  # the normal cdf of the z statistic
        else:
            self._warn_fallback("no per-example eval scores or spread on every eval of the window")
            if self.se is not None:
                if self.se == 0.0:  # noise-free means that fall: certain evidence (unchanged: none)
                    return 1.0 if unchanged(self.recent_means[-w:]) else 0.0
                p = float(scipy_module("stats").norm.cdf(slope / (self.se / math.sqrt(den))))
            else:
                p = slope_less_p(x, np.asarray(self.recent_means[-w:], dtype=float))
        return 1.0 if not math.isfinite(p) else p

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        self.recent_means.append(score)
        row: Sequence[float] | None = None
        if scores is not None and len(scores):
            # A tuple (what the monitor hands on, its floats checked) is immutable: kept as it is, no copy per eval;
            # so is a read-only float64 vector (the simulator's rows, checked by the monitor).
            row = scores if type(scores) is tuple or _read_only_vector(scores) else tuple(map(float, scores))
        spread_row = None if spread is None else [float(spread.std), int(spread.n)]
        self.recent_scores.append(row)
        self.recent_spreads.append(spread_row)
        self._count(row, spread_row)
        if len(self.recent_means) > self._keep:
            del self.recent_means[0], self.recent_scores[0], self.recent_spreads[0]
        significant = False
        self.last_p = self.last_slope = None
        if self._last_slopes:  # most evals run no t-test: no new empty list for them
            self._last_slopes = []
        self._mode = mode = self._window_mode()
        per_run = self._per_run.feed(step, score, self.seen == 0, row, spread_row)
        # The cheap check first: a test runs only when the mean really fell below the best.
        if self.best_score is not None and score < self.best_score - self.min_drop:
            progress = self._per_run.test if per_run else None  # read only here: the evals are fed lazily
            if mode is EvidenceMode.MEANS_ONLY and progress is not None:
                self._warn_fallback("no per-example eval scores or spread on every eval of the window")
                significant, self.last_slope = progress.significant()
                self.last_p = progress.last_p
            elif isinstance(progress, PlannedEvidence):  # a plan is known: the richer modes' per-run tests too
                test = progress.paired if mode is EvidenceMode.PER_EXAMPLE else progress.spread_z
                significant, self.last_slope = test()
                self.last_p = progress.last_p
            else:
                significant = self._window_test(mode)
            if significant and self.level_alpha is not None:
                significant = self._below_best(self.level_alpha)
        if self.best_score is None or score > self.best_score:
            self.best_score = score
            self.best_scores = self.recent_scores[-1]
        return significant

    def _window_test(self, mode: EvidenceMode) -> bool:
        """The test on the last evals' window(s) in ``mode``; sets :attr:`last_p` and :attr:`last_slope`."""
        significant = False
        spread_mode = mode is EvidenceMode.MEAN_AND_SPREAD
        windows = (self._spread_w,) if spread_mode else self._windows
        level = (self._spread_a if spread_mode else self.alpha) / len(windows)
        for w in windows:
            if len(self.recent_means) < w:
                continue
            cached = self._x.get(w)
            if cached is None:
                x = np.arange(w, dtype=float) - (w - 1) / 2.0  # centered positions: slope = x @ y / (x @ x)
                cached = self._x[w] = (x, float(x @ x))
            x, den = cached
            slope = float(x @ np.asarray(self.recent_means[-w:]) / den)
            if slope >= 0.0:
                continue  # a one-sided p-value of a rising fit is >= 0.5: never significant
            p = self._p_value(mode, w, slope, x, den)
            if self.last_p is None or p < self.last_p:
                self.last_p, self.last_slope = p, slope
            if p < level:
                significant = True
                break
        return significant

    def _below_best(self, level_alpha: float) -> bool:
        """The level condition: the current checkpoint is below the best one by a paired t-test at ``level_alpha``."""
        cur, best = self.recent_scores[-1], self.best_scores
        if cur is None or best is None or len(cur) != len(best) or len(cur) < 2:
            self._warn_fallback("no per-example eval scores for the level test against the best checkpoint")
            return True  # the mean guard (score below the best) already holds
        diff = np.asarray(cur, dtype=float) - np.asarray(best, dtype=float)
        if np.ptp(diff) <= 1e-12 * max(1.0, float(np.max(np.abs(diff)))):
            return bool(diff[0] < 0)
        return one_sided_t_p(diff, level_alpha, self._level_crit) < level_alpha

    def doubt(self) -> float | None:
        """The last eval's smallest p-value, exact even where the significance test skipped scipy (None: no test
        ran, because the mean was not below the best or every fitted slope rose)."""
        if self.last_p is None or self.last_p < 1.0 or not self._last_slopes:
            return self.last_p
        last_t: tuple[float, int] | None = None
        for slopes in self._last_slopes:
            sd = float(slopes.std(ddof=1))
            t = float(slopes.mean()) / (sd / math.sqrt(slopes.size)) if sd > 0.0 else -math.inf
            if last_t is None or t < last_t[0]:
                last_t = (t, int(slopes.size))
        assert last_t is not None
        t, n = last_t
        return float(scipy_module("stats").t.cdf(t, n - 1))

    def reason(self) -> str:
        p = "n/a" if self.last_p is None else f"{self.last_p:.3g}"
        slope = "n/a" if self.last_slope is None else f"{self.last_slope:.4g}"
        if self._per_run.decides(self._mode):
            return self._per_run.reason(self._mode, p, slope, self.declines, self.k)
        note = ""
        if self._mode is EvidenceMode.MEAN_AND_SPREAD:
            windows, test, alpha = str(self._spread_w), "known-variance z", self._spread_a
        else:
            windows = " or ".join(str(w) for w in self._windows)
            test = self.test  # as before modes existed: recorded reasons stay the same
            alpha = self.alpha
        if self.means_test == "auto":
            note = " per look: planned steps unknown"  # the per-run tests need the reports' planned_steps
        return (
            f"score falling over the last {windows} evals (slope {slope} per eval, {test} test p={p}, "
            f"alpha={alpha:g}{note}, {self.declines} consecutive, k={self.k})"
        )

    def params(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "alpha": self.alpha,
            "k": self.k,
            "min_drop": self.min_drop,
            "test": self.test,
            "se": self.se,
            "short_window": self.short_window,
            "level_alpha": self.level_alpha,
            "warmup": self.warmup,
            **({} if self.spread_window is None else {"spread_window": self.spread_window}),
            **({} if self.spread_alpha is None else {"spread_alpha": self.spread_alpha}),
            **({} if self.means_test == "auto" else {"means_test": self.means_test}),
            **self._per_run.params(),
        }

    def _rule_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "best_score": self.best_score,
            # Rows packed (packed_rows): the state of a run with many examples is mostly these.
            "best_scores": None if self.best_scores is None else pack_row(self.best_scores),
            "recent_means": list(self.recent_means),
            "recent_scores": [None if r is None else pack_row(r) for r in self.recent_scores],
            "last_p": self.last_p,
            "last_slope": self.last_slope,
        }
        if any(sp is not None for sp in self.recent_spreads):  # left out without spreads: earlier states unchanged
            state["recent_spreads"] = [None if sp is None else list(sp) for sp in self.recent_spreads]
        self._per_run.state_into(state)
        return state

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self.best_score = state["best_score"]
        best_scores = state.get("best_scores")
        self.best_scores = None if best_scores is None else unpack_row(best_scores, "best_scores")
        self.recent_means = [float(m) for m in state["recent_means"]]
        self.recent_scores = [
            None if r is None else unpack_row(r, f"recent_scores[{i}]") for i, r in enumerate(state["recent_scores"])
        ]
        spreads = state.get("recent_spreads")  # absent in states written before spreads were reported
        self.recent_spreads = (
            [None] * len(self.recent_means)
            if spreads is None
            else [None if sp is None else [float(sp[0]), int(sp[1])] for sp in spreads]
        )
        self._recount()
        self._mode = self._window_mode() if self.recent_means else EvidenceMode.MEANS_ONLY
        self._per_run.load(state)
        self.last_p = state["last_p"]
        self.last_slope = state["last_slope"]
