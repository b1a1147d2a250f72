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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .pvalues import scipy_module

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
        lo = step * (1.0 - self.frac)
        while len(self.steps) > self.min_evals and self.steps[0] < lo:  # left the window for good (steps grow)
            del self.steps[0], self.means[0]
        if self.count >= self.min_evals:
            level = math.fsum(self.means) / len(self.means)
            if self.start_level is None:
                self.start_level = level
            if self.best_level is None or level > self.best_level:
                self.best_level = level

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
