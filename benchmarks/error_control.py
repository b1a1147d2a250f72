"""Error-control designs for the default's trend test, explored outside the core (issue 47, the false-stop rate per run).

The shipped default (``trend``, window 6 evals, alpha 0.01 per eval) tests at every eval: its false-stop rate is per
*look*, so a healthy run evaluated at every step (hundreds of looks) is stopped far more often than one evaluated 20
times, and without per-example scores the noise of a 6-eval window is estimated from 4 residual degrees of freedom.
:class:`ProgressTrend` is the same kind of rule (the mean must be below the best, and the least-squares slope of the
means over a recent window must be significantly negative) with three changes, each a parameter so that
``benchmarks/dense_noisy.py`` can compare them:

- **window in training progress** (``frac``): the window holds the evals of the last ``frac`` of the steps seen so far
  (``window_basis="seen"``) or ``frac`` of the planned evals (``"planned"``), at least ``min_evals`` of them, not a
  fixed number of evals. Denser evals put more points in the same stretch of
  training (a more precise slope), instead of a shorter stretch.
- **pooled noise** (``noise="pooled"``): the standard error of one eval mean is estimated from *all* evals so far, by
  their second differences ``d_i = y_{i+1} - 2 y_i + y_{i-1}`` (``Var d = 6 sigma^2`` for independent noise on a
  locally linear curve; the curve's curvature only adds to it, so the estimate errs high). The slope's z statistic is
  ``slope / (sigma_hat / sqrt(Sxx))``, referred to Student's t with the pooled degrees of freedom (``n_d / 2``, the
  second differences overlap). ``noise="window"`` keeps the default's estimate from the window's residuals.
- **alpha spending over looks** (``spend``), so that ``alpha`` bounds the false-stop rate of a *run*:

  - ``"look"``: every look at ``alpha`` (what the default does; the run's rate grows with the number of looks);
  - ``"planned"``: spent over the N planned looks (``planned_evals``; needs planned steps and the eval interval) by
    ``F(p) = p ** rho``: look ``i`` gets ``alpha * (F(i / N) - F((i - 1) / N))`` (``rho = 1``: Bonferroni,
    ``alpha / N`` each; ``rho = 2``, the pick: little early, where a false stop costs most of a run's gain);
  - ``"epochs"``: anytime, needs no planned length. Steps are cut into geometric epochs ``[s0 r^j, s0 r^(j+1))``
    (``s0``: the step of the first eval, ``r = 1 / (1 - frac)``: one window length); epoch ``j`` gets
    ``alpha_j = alpha / ((j + 1) (j + 2))`` (these sum to ``alpha`` over all ``j``) and each look in it
    ``alpha_j / m_j``, ``m_j`` the looks the epoch holds at the eval interval seen so far. A union bound over every
    look there will ever be, so the run-level rate is at most ``alpha`` whatever the density or the run's length.
  - ``"eprocess"``: anytime by Ville's inequality. A betting e-process on the window's slope z: at each look the
    wealth is multiplied by ``exp(lam * (-z) - lam^2 / 2)`` for ``lam`` from a fixed mixture grid, averaged over the
    grid (a mixture of e-processes is one); the job stops when the wealth passes ``1 / alpha`` and the mean is
    below the best. Overlapping windows make consecutive z's dependent, so the wealth is updated once per
    *disjoint* window (every ``window`` looks); the betting factors are e-values under a standard normal z, which
    the flat stretch of a healthy run gives at worst.

A stop also needs the eval's mean below the best so far and, with ``rel_drop``, a material drop (the window's fitted
level below the best window mean by that share of the rise so far). The pick (``benchmarks/design_choice.py``):
``spend="planned", rho=2, window_basis="planned", frac=0.2, alpha=0.05, rel_drop=0.2``.

All four decide on the means alone (the harness's evidence mode); the per-example mode would change only the
statistic (the paired slopes' t) and not the spending.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from scipy import special

from platform_sim.core.detectors.base import EvidenceDetector

SPENDS: tuple[str, ...] = ("look", "planned", "epochs", "eprocess")
NOISES: tuple[str, ...] = ("pooled", "window")
#: The betting fractions of the ``eprocess`` mixture (a grid over the z-scale drifts worth detecting).
LAMBDAS: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)


class ProgressTrend(EvidenceDetector):
    """A falling-slope test on the means with a window in training progress and alpha spent over the run's looks.

    Args:
        alpha: The run's false-stop budget (``spend="look"``: per look), in (0, 1).
        frac: Share of the steps seen so far that the window covers, in (0, 1).
        min_evals: Fewest evals in a window (>= 3).
        noise: ``"pooled"`` (second differences of every eval so far) or ``"window"`` (the fit's residuals).
        spend: ``"look"``, ``"planned"``, ``"epochs"`` or ``"eprocess"`` (module docstring).
        planned_evals: The run's planned number of evals (``spend="planned"`` only).
        min_pooled: Fewest second differences before the pooled estimate is used (before: no test).
        rel_drop: Materiality: the window's fitted level at its last eval must be below the best window mean so far
            by at least this share of the run's rise so far (best window mean minus the first window's mean); 0: off.
            Scale-free and the same at every density: a drift of a few per cent of the gain is never a stop.
        min_progress: No evidence before this share of the planned steps (a warm-up in training progress, not in
            evals; needs ``planned_steps``); 0: off. Real runs can dip hard early and recover.
        planned_steps: The run's planned number of training steps (``min_progress`` only).
        rho: ``spend="planned"``: the spending function ``F(p) = p ** rho`` over the share ``p = i / N`` of the planned
            looks; look ``i`` gets ``alpha * (F(i / N) - F((i - 1) / N))`` (1: Bonferroni, ``alpha / N`` each; 2: less
            early, where a false stop costs most of a run's gain, more late).
        window_basis: ``"seen"``: the window is ``frac`` of the steps seen so far; ``"planned"``: ``frac`` of the
            planned evals (``planned_evals``), a fixed length from the first look on.
    """

    name: ClassVar[str] = "progress-trend"
    uses_example_scores: ClassVar[bool] = False

    def __init__(
        self,
        alpha: float = 0.05,
        frac: float = 0.3,
        min_evals: int = 6,
        noise: str = "pooled",
        spend: str = "epochs",
        planned_evals: int | None = None,
        min_pooled: int = 4,
        rel_drop: float = 0.0,
        min_progress: float = 0.0,
        planned_steps: int | None = None,
        rho: float = 1.0,
        window_basis: str = "seen",
    ) -> None:
        super().__init__(1, 0)
        if spend not in SPENDS or noise not in NOISES:
            raise ValueError(f"spend must be one of {SPENDS} and noise one of {NOISES}")
        if spend == "planned" and not planned_evals:
            raise ValueError("spend='planned' needs planned_evals")
        self.alpha, self.frac, self.min_evals = alpha, frac, min_evals
        self.noise, self.spend, self.planned_evals, self.min_pooled = noise, spend, planned_evals, min_pooled
        self.rel_drop = rel_drop
        self.rho, self.window_basis = rho, window_basis
        if window_basis == "planned" and not planned_evals:
            raise ValueError("window_basis='planned' needs planned_evals")
        if min_progress > 0 and not planned_steps:
            raise ValueError("min_progress needs planned_steps")
        self.min_progress, self.planned_steps = min_progress, planned_steps
        self.start_level: float | None = None  # the mean of the first window (the run's starting level)
        self.best_level: float | None = None  # the highest window mean so far
        self.steps: list[float] = []
        self.means: list[float] = []
        self.best: float | None = None
        self.d2_sum = 0.0  # running sum of squared second differences (the pooled noise, O(1) per eval)
        self.d2_n = 0
        self.log_wealth = 0.0
        self.wealth_terms = np.zeros(len(LAMBDAS))  # log wealth per betting fraction
        self.last_bet_index = -(10**9)
        self.last_p: float | None = None

    # -- the rule -------------------------------------------------------------------------------------------------
    def _window_start(self) -> int:
        """Index of the first eval in the window: the last ``frac`` of the steps so far, at least ``min_evals``."""
        if self.window_basis == "planned":
            assert self.planned_evals is not None
            return max(0, len(self.steps) - max(self.min_evals, round(self.frac * self.planned_evals)))
        lo = self.steps[-1] * (1.0 - self.frac)
        i = int(np.searchsorted(self.steps, lo, side="left"))
        return max(0, min(i, len(self.steps) - self.min_evals))

    def _look_alpha(self) -> float:
        if self.spend == "look":
            return self.alpha
        if self.spend == "planned":
            assert self.planned_evals is not None
            n, i = float(self.planned_evals), float(min(len(self.steps), self.planned_evals))
            return self.alpha * ((i / n) ** self.rho - ((i - 1.0) / n) ** self.rho)
        # epochs: geometric in steps, one window length per epoch
        # The epochs start at the first look (the min_evals-th eval): no alpha is spent before a test can run.
        s0, s = max(self.steps[self.min_evals - 1], 1.0), max(self.steps[-1], 1.0)
        r = 1.0 / (1.0 - self.frac)
        j = max(0, int(math.floor(math.log(s / s0) / math.log(r))))
        interval = (self.steps[-1] - self.steps[0]) / (len(self.steps) - 1)  # the eval interval seen so far
        looks = max(1.0, s0 * r**j * (r - 1.0) / max(interval, 1e-12))
        return self.alpha / ((j + 1) * (j + 2)) / looks

    def _z(self, i0: int) -> tuple[float, float, float]:
        """The window's slope, its z (or t) statistic and the degrees of freedom of the noise estimate."""
        x = np.asarray(self.steps[i0:], dtype=float)
        y = np.asarray(self.means[i0:], dtype=float)
        x = x - x.mean()
        sxx = float(x @ x)
        slope = float(x @ y) / sxx
        if self.noise == "pooled":
            if self.d2_n < self.min_pooled:
                return slope, 0.0, 1.0
            sigma = math.sqrt(self.d2_sum / self.d2_n / 6.0)
            df = max(1.0, self.d2_n / 2.0)
        else:
            resid = y - y.mean() - slope * x
            df = float(len(y) - 2)
            sigma = math.sqrt(float(resid @ resid) / df) if df > 0 else 0.0
        if sigma <= 0.0:
            return slope, (-math.inf if slope < 0 else 0.0), df
        return slope, slope / (sigma / math.sqrt(sxx)), df

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Any = None
    ) -> bool:
        # Means only: per-example scores and an eval's spread (where the core passes one) are not read.
        self.steps.append(float(step))
        self.means.append(score)
        if len(self.means) >= 3:
            m = self.means
            self.d2_sum += (m[-1] - 2.0 * m[-2] + m[-3]) ** 2
            self.d2_n += 1
        below = self.best is not None and score < self.best
        if self.best is None or score > self.best:
            self.best = score
        self.last_p = None
        if len(self.means) < self.min_evals:
            return False
        if self.min_progress > 0 and step < self.min_progress * (self.planned_steps or 0):
            return False
        i0 = self._window_start()
        level = float(np.mean(self.means[i0:]))
        if self.start_level is None:
            self.start_level = level
        if self.best_level is None or level > self.best_level:
            self.best_level = level
        if self.spend == "eprocess":
            return self._bet(i0, below)
        if not below:
            return False
        slope, z, df = self._z(i0)
        if slope >= 0.0 or z == 0.0 or not self._material(i0, slope):
            return False
        p = 0.0 if z == -math.inf else float(special.stdtr(df, z))
        self.last_p = p
        return p < self._look_alpha()

    def _material(self, i0: int, slope: float) -> bool:
        """The fitted level at the last eval is below the best window mean by ``rel_drop`` of the rise so far."""
        if self.rel_drop <= 0.0:
            return True
        assert self.best_level is not None and self.start_level is not None
        x = np.asarray(self.steps[i0:], dtype=float)
        end = float(np.mean(self.means[i0:])) + slope * (x[-1] - x.mean())
        rise = self.best_level - self.start_level
        return rise > 0.0 and self.best_level - end >= self.rel_drop * rise

    def _bet(self, i0: int, below: bool) -> bool:
        """Ville: bet on the window's -z once per disjoint window; stop when the mixture wealth passes 1/alpha."""
        n = len(self.means)
        if n - self.last_bet_index >= n - i0:  # a window disjoint from the last one bet on
            _, z, df = self._z(i0)
            if z == -math.inf:
                z = -50.0
            # Bet on the Gaussian scale: a t statistic with few df is first mapped to its normal quantile.
            zz = float(special.ndtri(special.stdtr(df, z))) if math.isfinite(z) else z
            zz = max(min(zz, 50.0), -50.0)
            lam = np.asarray(LAMBDAS)
            self.wealth_terms += lam * (-zz) - lam**2 / 2.0
            self.last_bet_index = n
        wealth = float(np.log(np.mean(np.exp(self.wealth_terms))))
        self.log_wealth = wealth
        self.last_p = min(1.0, math.exp(-wealth))
        return below and wealth >= math.log(1.0 / self.alpha) and self._material(i0, self._z(i0)[0])

    # -- the interface ----------------------------------------------------------------------------------------------
    def doubt(self) -> float | None:
        return self.last_p

    def reason(self) -> str:
        return f"progress-trend ({self.spend}, {self.noise} noise) p={self.last_p}"

    def params(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "frac": self.frac,
            "min_evals": self.min_evals,
            "noise": self.noise,
            "spend": self.spend,
            "planned_evals": self.planned_evals,
            "min_pooled": self.min_pooled,
            "rel_drop": self.rel_drop,
            "min_progress": self.min_progress,
            "planned_steps": self.planned_steps,
            "rho": self.rho,
            "window_basis": self.window_basis,
        }

    def _rule_state(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "means": list(self.means),
            "best": self.best,
            "d2": [self.d2_sum, self.d2_n],
            "wealth": [float(v) for v in self.wealth_terms],
            "last_bet_index": self.last_bet_index,
            "levels": [self.start_level, self.best_level],
        }

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self.steps = [float(v) for v in state["steps"]]
        self.means = [float(v) for v in state["means"]]
        self.best = state["best"]
        self.d2_sum, self.d2_n = float(state["d2"][0]), int(state["d2"][1])
        self.wealth_terms = np.asarray(state["wealth"], dtype=float)
        self.last_bet_index = int(state["last_bet_index"])
        self.start_level, self.best_level = state["levels"]
