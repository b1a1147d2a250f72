"""A falling-slope test on the means whose false-stop rate is bounded per *run*, not per look.

``trend``'s means-only test at a fixed window of evals, run at every eval, stops a healthy run more often the more
often it is evaluated: at one eval per step, a noisy plateau gives hundreds of looks, each a chance of a false stop,
and the noise of a 6-eval window is estimated from 4 residual degrees of freedom. :class:`ProgressSlope` changes
three things (designed and chosen on tuning data in the issue-47 error-control study, ``benchmarks/error_control.py``
on the branch that explored it; ``docs/results/mean-and-spread.md``):

- **The window is measured in training progress**: the evals whose step is at least ``(1 - frac)`` times the current
  step (at least ``min_evals`` of them). Denser evals put more points into the same stretch of training, a more
  precise slope, instead of a shorter stretch.
- **The noise is pooled over the whole run so far** from the means' second differences ``d = y[i+1] - 2 y[i] +
  y[i-1]``: ``Var d = 6 sigma**2`` for independent noise on a locally straight curve, and curvature only adds to it
  (the estimate errs high). The slope's ``t = slope / (sigma / sqrt(Sxx))`` (steps as ``x``) is referred to Student's
  t with half the number of second differences as degrees of freedom (they overlap). A running sum: O(1) per eval.
- **The run's level ``run_alpha`` is spent over its looks** (anytime, no planned length needed): steps are cut into
  geometric epochs ``[s0 r**j, s0 r**(j+1))`` with ``r = 1 / (1 - frac)`` (one window length) and ``s0`` the step of
  the first look; epoch ``j`` gets ``run_alpha / ((j+1)(j+2))`` (these sum to ``run_alpha``), shared evenly by the
  looks it can hold at the eval interval seen so far (``floor(length / interval) + 1``). By the union bound the
  chance that a run whose slope never falls is ever stopped is at most ``run_alpha``, whatever its eval density or
  length (as far as the noise is independent, the interval regular and the pooled estimate holds).

A stop also needs **materiality**: the window's fitted level at its last eval must be below the best window mean so
far by at least ``rel_drop`` of the run's rise so far (best window mean minus the first window's mean). Scale-free
and the same at every density: a drift of a few per cent of the gain is never a stop.

:class:`PlannedSlope` is the same test when the run's planned number of steps ``P`` is known (a report's
``planned_steps``): progress is ``p = step / P`` and

- **the window is the last** ``frac`` **of planned progress**: the evals whose step is above ``step - frac * P`` (at
  least ``min_evals``), a fixed stretch of training from the first look on (the anytime window is only
  ``min_evals`` evals early in a dense run, which is where its costly false stops came from);
- **the level is spent by progress**: the look at progress ``p`` after a previous eval at ``p'`` may spend
  ``run_alpha * (F(p) - F(p'))`` with ``F(p) = p**rho`` (the Kim-DeMets power family; ``rho`` = 2 by default:
  little early, where a false stop costs most of a run's gain; the sum over a run that ends at its plan is
  ``run_alpha`` whatever ``rho``; ``trend``'s ``spend_power``, re-examined on tuning data with runs that peak early
  by ``benchmarks/dense_modes.py`` and ``benchmarks/dense_noisy.py``, which kept 2). A run extended past its plan
  keeps being watched: beyond ``p = 1``, ``F(p) = 2 - 1/p`` (continuous at 1, rising, bounded by 2), so an extension spends at most one
  more ``run_alpha`` however long it runs (half of it by twice the planned length). A plan that changes mid-run is
  used from the eval that carries it, for both ``p`` and ``p'``.

It needs no count of evals, so it holds at any eval density. Chosen on tuning data by the issue-47 error-control
study (``benchmarks/design_choice.py``: the ``planned`` design, window a fifth of the planned evals, ``F(p) = p**2``,
``run_alpha`` 0.05, ``rel_drop`` 0.2), here measured in steps rather than in evals (the same on a regular cadence).

:class:`PlannedEvidence` adds the per-example and mean-and-spread modes to it: the same window and spending, with
each mode's own statistic (the paired slope t over the examples' slopes; the slope of the means with each mean's
variance known, a z-test) at its own run level. Their level (0.1) and materiality (none) were chosen on tuning data
by ``benchmarks/dense_modes.py`` (synthetic healthy and hacking runs with per-example scores;
``docs/results/dense-noisy.md``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from ..boundary import is_array, sample_std
from .packed_rows import pack_row, unpack_row
from .pvalues import scipy_module, unchanged

MIN_SECOND_DIFFERENCES = 4
"""Second differences needed before the pooled noise is trusted (before: no test)."""


class ProgressSlope:
    """The state and the test of the progress-window slope (module docstring). Plain data in and out.

    Args:
        run_alpha: The run's false-stop level, strictly between 0 and 1.
        frac: Share of the steps seen so far that the window covers, strictly between 0 and 1.
        min_evals: Fewest evals in a window (and before the first look), >= 3.
        rel_drop: Materiality, a share of the run's rise so far, >= 0 (0: off).
    """

    def __init__(self, run_alpha: float, frac: float, min_evals: int, rel_drop: float) -> None:
        self.run_alpha, self.frac, self.min_evals, self.rel_drop = run_alpha, frac, min_evals, rel_drop
        self.steps: list[int] = []  # the evals of the current window (older ones are dropped)
        self.means: list[float] = []
        self.count = 0  # evals seen
        self.first_step: int | None = None
        self.s0: int | None = None  # the step of the first look (the min_evals-th eval)
        self.d2_sum = 0.0
        self.d2_n = 0
        self.start_level: float | None = None  # the first window's mean
        self.best_level: float | None = None  # the highest window mean so far
        self.last_p: float | None = None

    def add(self, step: int, mean: float) -> None:
        """Take one eval: update the pooled noise, the window and the levels."""
        if len(self.means) >= 2:
            d = mean - 2.0 * self.means[-1] + self.means[-2]
            self.d2_sum += d * d
            self.d2_n += 1
        self.steps.append(step)
        self.means.append(mean)
        self.count += 1
        if self.first_step is None:
            self.first_step = step
        if self.count == self.min_evals:
            self.s0 = step
        while len(self.steps) > self.min_evals and self._stale(self.steps[0], step):  # left for good (steps grow)
            del self.steps[0], self.means[0]
        if self.count >= self.min_evals:
            level = math.fsum(self.means) / len(self.means)
            if self.start_level is None:
                self.start_level = level
            if self.best_level is None or level > self.best_level:
                self.best_level = level

    def _stale(self, first: int, step: int) -> bool:
        """Whether the eval at step ``first`` has left the window of the eval at ``step``: the last ``frac`` of the
        steps seen so far."""
        return first < step * (1.0 - self.frac)

    def look_alpha(self) -> float:
        """The share of ``run_alpha`` that the current look may spend (epochs, module docstring)."""
        assert self.s0 is not None and self.first_step is not None
        s0, s = max(self.s0, 1), max(self.steps[-1], 1)
        r = 1.0 / (1.0 - self.frac)
        j = max(0, math.floor(math.log(s / s0) / math.log(r)))
        interval = (self.steps[-1] - self.first_step) / (self.count - 1)
        # At most floor(L / interval) + 1 evals at a regular interval fall in an epoch of length L (the fractional
        # count would overspend: 5.7% instead of 5% over a run at one eval per step).
        looks = math.floor(s0 * r**j * (r - 1.0) / max(interval, 1e-12)) + 1
        return self.run_alpha / ((j + 1) * (j + 2)) / looks

    def significant(self) -> tuple[bool, float | None]:
        """Whether the window's slope falls significantly at this look, and the slope (None: no test ran)."""
        self.last_p = None
        if self.count < self.min_evals or self.d2_n < MIN_SECOND_DIFFERENCES:
            return False, None
        n = len(self.steps)
        xbar = math.fsum(self.steps) / n
        x = [s - xbar for s in self.steps]
        sxx = math.fsum(v * v for v in x)
        if sxx <= 0.0:
            return False, None
        slope = math.fsum(v * y for v, y in zip(x, self.means)) / sxx
        if slope >= 0.0 or not self._material(slope, x[-1]):
            return False, slope
        sigma = math.sqrt(self.d2_sum / self.d2_n / 6.0)
        if sigma <= 0.0:
            self.last_p = 0.0  # noise-free means that fall: certain evidence
        else:
            t = slope / (sigma / math.sqrt(sxx))
            self.last_p = float(scipy_module("special").stdtr(max(1.0, self.d2_n / 2.0), t))
        return self.last_p < self.look_alpha(), slope

    def _material(self, slope: float, x_last: float) -> bool:
        if self.rel_drop <= 0.0:
            return True
        assert self.best_level is not None and self.start_level is not None
        end = math.fsum(self.means) / len(self.means) + slope * x_last
        rise = self.best_level - self.start_level
        return rise > 0.0 and self.best_level - end >= self.rel_drop * rise

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "means": list(self.means),
            "count": self.count,
            "first_step": self.first_step,
            "s0": self.s0,
            "d2": [self.d2_sum, self.d2_n],
            "levels": [self.start_level, self.best_level],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = [int(s) for s in state["steps"]]
        self.means = [float(m) for m in state["means"]]
        self.count = int(state["count"])
        self.first_step, self.s0 = state["first_step"], state["s0"]
        self.d2_sum, self.d2_n = float(state["d2"][0]), int(state["d2"][1])
        self.start_level, self.best_level = state["levels"]
        self.last_p = None


DEFAULT_SPEND_POWER = 2.0
"""The power ``rho`` of the spending shape ``F(p) = p**rho`` that states written without one were spent by."""


def spent(progress: float, power: float = DEFAULT_SPEND_POWER) -> float:
    """The share of the run's level spent by ``progress`` (:class:`PlannedSlope`): the Kim-DeMets power family
    ``p**power`` up to the planned end (``power`` 1: evenly by progress, Pocock-like; 2: little early, more late),
    ``2 - 1/p`` beyond it, whatever the power (continuous at the plan, where every power has spent 1; an extended run
    spends at most one more level, however long it runs)."""
    if progress > 1.0:
        return 2.0 - 1.0 / progress
    if power == 2.0:
        return progress * progress  # bit for bit what the squared shape always gave
    return progress**power if progress > 0.0 else 0.0


def check_spend_power(value: Any) -> float:
    """``spend_power``: a finite number > 0 (the power ``rho`` of :func:`spent`); a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"spend_power must be a finite number > 0 (the spending shape p**spend_power), got {value!r}")
    return float(value)


class PlannedSlope(ProgressSlope):
    """The progress-window slope test with the run's planned steps known (module docstring): a window of the last
    ``frac`` of planned progress, the level spent by :func:`spent` between looks.

    Args:
        run_alpha, frac, min_evals, rel_drop: As :class:`ProgressSlope`; ``frac`` is a share of the planned steps.
        planned_steps: The run's planned number of steps, >= 1 (:meth:`add` takes the latest one).
        power: The power ``rho`` of the spending shape ``p**rho`` (:func:`spent`), > 0. Kept in the state, so a
            resumed run keeps the shape it started with (a state without one was spent by ``p**2``).
        start_step: The progress already behind the first eval this test sees (0: it sees the run from its start;
            a test created mid-run, when a plan first arrives, starts spending at that eval instead of spending the
            whole run so far on one look).
    """

    def __init__(
        self,
        run_alpha: float,
        frac: float,
        min_evals: int,
        rel_drop: float,
        planned_steps: int,
        start_step: int = 0,
        power: float = DEFAULT_SPEND_POWER,
    ) -> None:
        super().__init__(run_alpha, frac, min_evals, rel_drop)
        self.planned_steps = planned_steps
        self.power = check_spend_power(power)
        self.prev_step = start_step  # the step of the eval before the current one (spending runs from it)
        self.look_level = 0.0  # what the current look may spend

    def add_planned(self, step: int, mean: float, planned_steps: int | None) -> None:
        """Take one eval with the run's latest plan (None: the last one given)."""
        if planned_steps is not None:
            self.planned_steps = planned_steps
        prev = self.steps[-1] if self.steps else self.prev_step
        self.prev_step = prev
        self.add(step, mean)
        p, q = step / self.planned_steps, min(prev, step) / self.planned_steps
        self.look_level = self.run_alpha * max(0.0, spent(p, self.power) - spent(q, self.power))

    def progress(self) -> float:
        """The progress of the last eval, ``step / planned_steps``."""
        return self.steps[-1] / self.planned_steps if self.steps else 0.0

    def _stale(self, first: int, step: int) -> bool:
        return first <= step - self.frac * self.planned_steps

    def look_alpha(self) -> float:
        return self.look_level

    def _material(self, slope: float, x_last: float) -> bool:
        # A run that has not risen (its best window mean is its first) has no gain to lose: a significant fall is
        # material whatever its size (a run that gets worse from its first evals, e.g. a fine-tune that overfits at
        # once, is stopped); otherwise a drop of rel_drop of the rise, as in the anytime test.
        assert self.best_level is not None and self.start_level is not None
        if self.best_level <= self.start_level:
            return True
        return super()._material(slope, x_last)

    def state_dict(self) -> dict[str, Any]:
        # The power only when it is not the squared shape's: states of runs spent by p**2 are as they always were.
        power = [] if self.power == DEFAULT_SPEND_POWER else [self.power]
        return {**super().state_dict(), "planned": [self.planned_steps, self.prev_step, *power]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        planned = state["planned"]
        self.planned_steps, self.prev_step = int(planned[0]), int(planned[1])
        # The shape the run was started with (a state without one: p**2), whatever the detector's parameter says
        # now: a run whose shape changed mid-run could spend more than its level.
        self.power = check_spend_power(planned[2]) if len(planned) > 2 else DEFAULT_SPEND_POWER
        self.look_level = 0.0  # derived per eval; a loaded test answers its next eval


class PlannedEvidence(PlannedSlope):
    """:class:`PlannedSlope`'s window in planned progress and its spending, with the tests of the two richer modes:
    the run's level is bounded per run in every mode, since each look runs one test at the look's share of it.

    Each eval's per-example scores (or None) and its mean's variance from a reported spread, ``std**2 / n`` (or
    None), are kept beside its mean for as long as it is in the window.

    - :meth:`paired` (per-example): the least-squares slope (steps as ``x``) of each example's scores over the
      window, and a one-sided one-sample t-test of "their mean is below zero" (``n - 1`` degrees of freedom): the
      examples' fixed difficulty cancels in a slope, as in ``trend``'s per-look per-example test.
    - :meth:`spread_z` (mean-and-spread): the slope of the means with each mean's variance known,
      ``var(slope) = sum(x_i**2 v_i) / (sum x_i**2)**2``, as a one-sided z-test, as in ``trend``'s per-look
      mean-and-spread test.

    Both test the trailing evals of the window that carry the mode's evidence (the mode's selection guarantees at
    least ``min_evals`` of them once the run has that many), at the look's share of their own run level
    ``evidence_alpha`` (spent by progress as the means' ``run_alpha``), and a stop needs a materiality of
    ``evidence_drop`` (as :meth:`PlannedSlope._material`, on the fitted level of those evals; 0: none). Each look
    runs one test, so a run is stopped falsely with a chance of at most the larger of the two run levels, in
    whichever modes its evals come.

    Args:
        run_alpha, frac, min_evals, rel_drop, planned_steps, start_step: As :class:`PlannedSlope` (the means' test).
        evidence_alpha: The run level of the per-example and mean-and-spread tests, strictly between 0 and 1 (None:
            ``run_alpha``).
        evidence_drop: Their materiality, a share of the run's rise so far, >= 0 (None: ``rel_drop``).
        power: As :class:`PlannedSlope` (one spending shape for every mode).
    """

    def __init__(
        self,
        run_alpha: float,
        frac: float,
        min_evals: int,
        rel_drop: float,
        planned_steps: int,
        start_step: int = 0,
        evidence_alpha: float | None = None,
        evidence_drop: float | None = None,
        power: float = DEFAULT_SPEND_POWER,
    ) -> None:
        super().__init__(run_alpha, frac, min_evals, rel_drop, planned_steps, start_step, power)
        self.evidence_alpha = run_alpha if evidence_alpha is None else evidence_alpha
        self.evidence_drop = rel_drop if evidence_drop is None else evidence_drop
        self.rows: list[Sequence[float] | None] = []  # kept as handed in (the detector's tuples or read-only arrays)
        self.vars: list[float | None] = []

    def evidence_level(self) -> float:
        """What the current look's per-example or mean-and-spread test may spend: its share of ``evidence_alpha``."""
        return self.look_level * self.evidence_alpha / self.run_alpha

    def add_evidence(
        self, step: int, mean: float, planned_steps: int | None, row: Sequence[float] | None, var: float | None
    ) -> None:
        """Take one eval with its per-example scores and its mean's variance (either may be None)."""
        self.rows.append(row)
        self.vars.append(var)
        self.add_planned(step, mean, planned_steps)
        extra = len(self.rows) - len(self.steps)
        if extra > 0:  # the evals that left the window in add()
            del self.rows[:extra], self.vars[:extra]

    @staticmethod
    def _trailing(has: Sequence[bool]) -> int:
        """How many of the window's latest evals in a row have the evidence (``has``: one flag per eval)."""
        k = 0
        for flag in reversed(has):
            if not flag:
                break
            k += 1
        return k

    def _fit(self, k: int) -> tuple[list[float], float, float] | None:
        """The centred steps of the last ``k`` evals, their sum of squares and the slope of their means."""
        if self.count < self.min_evals or k < 3:
            return None
        steps = self.steps[-k:]
        xbar = math.fsum(steps) / k
        x = [s - xbar for s in steps]
        sxx = math.fsum(v * v for v in x)
        if sxx <= 0.0:
            return None
        return x, sxx, math.fsum(v * y for v, y in zip(x, self.means[-k:])) / sxx

    def _material_k(self, k: int, slope: float, x_last: float) -> bool:
        """:meth:`PlannedSlope._material` with ``evidence_drop``, on the fitted level at the last of the last ``k``
        evals."""
        assert self.best_level is not None and self.start_level is not None
        if self.best_level <= self.start_level or self.evidence_drop <= 0.0:
            return True
        end = math.fsum(self.means[-k:]) / k + slope * x_last
        return self.best_level - end >= self.evidence_drop * (self.best_level - self.start_level)

    def paired(self) -> tuple[bool, float | None]:
        """The per-example test at this look (class docstring): significant, and the slope of the means."""
        self.last_p = None
        last = self.rows[-1] if self.rows else None
        if last is None or len(last) < 2:
            return False, None
        size = len(last)
        k = 0  # the trailing evals with scores of this length (_trailing, without a list of flags per look)
        for r in reversed(self.rows):
            if r is None or len(r) != size:
                break
            k += 1
        fit = self._fit(k)
        if fit is None:
            return False, None
        x, sxx, slope = fit
        k = len(x)
        rows = self.rows[-k:]
        scores: np.ndarray
        if all(is_array(r) for r in rows):  # read-only float64 rows (the simulator's): one copy
            scores = np.concatenate(cast("list[np.ndarray]", rows))
        else:  # tuples: read into one array in one pass (np.asarray on tuples spends more on the shape)
            scores = np.fromiter(itertools.chain.from_iterable(rows), np.float64, k * size)  # type: ignore[arg-type]
        slopes = np.asarray(x) @ scores.reshape(k, size) / sxx  # one slope per example
        # np.mean's and np.std's own arithmetic (sums over counts, the squared deviations from the mean), without
        # their per-call overhead: the same numbers.
        total = slopes.sum() / size
        mean = float(total)
        if mean >= 0.0 or not self._material_k(k, slope, x[-1]):
            return False, slope
        dev = slopes - total
        sd = math.sqrt(float((dev * dev).sum() / (size - 1)))
        if sd <= 1e-12 * max(1.0, abs(mean)):
            # Every example falls by the same amount: certain evidence. Rows that did not change at all (a run
            # whose examples score the same at every eval of the window, as discrete scores of a converged policy
            # do) have slopes of round-off only, at steps whose centring is inexact, and are none.
            self.last_p = 1.0 if unchanged(scores.reshape(k, size)) else 0.0
        else:
            t = mean / (sd / math.sqrt(size))
            self.last_p = float(scipy_module("special").stdtr(size - 1, t))
        return self.last_p < self.evidence_level(), slope

    def spread_z(self) -> tuple[bool, float | None]:
        """The mean-and-spread test at this look (class docstring): significant, and the slope of the means. An eval
        with per-example scores but no reported spread has its variance computed from them."""
        self.last_p = None
        fit = self._fit(self._trailing([v is not None or (r is not None and len(r) >= 2) for r, v in self._pairs()]))
        if fit is None:
            return False, None
        x, sxx, slope = fit
        k = len(x)
        if slope >= 0.0 or not self._material_k(k, slope, x[-1]):
            return False, slope
        variances = [self._var(r, v) for r, v in self._pairs()[-k:]]
        var = math.fsum(a * a * b for a, b in zip(x, variances)) / (sxx * sxx)
        if var <= 0.0:
            # Every std is 0: noise-free means that fall, certain evidence; unchanged means are none (round-off).
            self.last_p = 1.0 if unchanged(self.means[-k:]) else 0.0
        else:
            self.last_p = 0.5 * math.erfc(-slope / math.sqrt(var) / math.sqrt(2.0))
        return self.last_p < self.evidence_level(), slope

    def _pairs(self) -> list[tuple[Sequence[float] | None, float | None]]:
        return list(zip(self.rows, self.vars))

    @staticmethod
    def _var(row: Sequence[float] | None, var: float | None) -> float:
        """An eval's mean variance: the reported one, else from its per-example scores (the caller checked one)."""
        if var is not None:
            return var
        assert row is not None
        return sample_std(row) ** 2 / len(row)  # the rule that checks a report's eval_std

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if any(r is not None for r in self.rows) or any(v is not None for v in self.vars):  # else: as before
            # Packed (packed_rows), whether a row came as a tuple or as a read-only array (the simulator's).
            rows = [None if r is None else pack_row(r) for r in self.rows]
            state["evidence"] = {"rows": rows, "vars": list(self.vars)}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        ev = state.get("evidence")
        if ev is None:
            self.rows, self.vars = [None] * len(self.steps), [None] * len(self.steps)
        else:
            self.rows = [
                None if r is None else tuple(unpack_row(r, f"evidence.rows[{i}]")) for i, r in enumerate(ev["rows"])
            ]
            self.vars = [None if v is None else float(v) for v in ev["vars"]]
