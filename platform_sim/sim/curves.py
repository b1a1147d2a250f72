"""True (noise-free) per-job curves: the eval score and the training loss as functions of progress in [0, 1].

A :class:`Curve` is the small interface the simulator needs from a job's ground truth: ``value(progress)`` and, by
default derived from it, ``values(grid)`` and :meth:`Curve.peak` (the noise-free peak over the eval grid, earliest on
ties). Synthetic curves live here; curves built from recorded traces (``evalstop-sim replay``) implement the same
interface, e.g. with :class:`TabulatedCurve`.

Shapes (docs/design.md section 5; the parameter ranges are drawn in :mod:`platform_sim.sim.workload`):

- :class:`SaturatingCurve`: ``s0 + gain * (1 - exp(-p / tau)) / (1 - exp(-1 / tau))``; LoRA (small tau: converges
  early) and healthy RLHF (large tau: keeps improving, mildly saturating).
- :class:`PlateauCurve`: saturating gain that reaches its top at ``p_plateau`` and stays flat (DPO's small plateau).
- :class:`GaoHackingCurve`: Gao et al.'s RL form ``R(d) = d (a - b ln d)``, written with ``x = d / d_peak`` as
  ``s0 + height * x (1 - ln x)``, where ``x = (p / p_peak) ** gamma``. ``gamma = 1`` is d linear in progress; the
  default ``gamma = 2`` (d grows faster as the policy starts to exploit) gives the fast post-peak collapse seen in real
  TRL runs (docs/results/real-traces.md). Clipped at 0, the floor of the 0-1 score scale.
- :class:`RiseCurve`: the saturating form written by the *share of its rise made by progress 0.5* (0.5: linear; near
  1: the rise is done early and the second half is a plateau; below 0.5: convex). ``SaturatingCurve(tau)`` is
  ``RiseCurve`` with ``kappa = 1 / tau``. Healthy RLHF runs of the real-calibrated workload
  (:mod:`platform_sim.sim.curve_fit`).
- :class:`PeakDeclineCurve`: rise to a peak at ``p_peak`` (quadratic, flat at the top), then a linear decline by
  ``decline`` gains per unit of progress until it has given back ``drop`` gains, then flat; clipped at 0. Hacking RLHF
  runs of the real-calibrated workload: the shape fitted to recorded traces.
- :class:`ExpLossCurve`: training loss ``l_inf + (l0 - l_inf) exp(-p / tau)``, falling monotonically for every job,
  hacking ones included.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Curve(ABC):
    """A noise-free function of progress ``p`` in [0, 1]."""

    @abstractmethod
    def value(self, progress: float) -> float:
        """The true value at ``progress``."""

    def values(self, grid: np.ndarray) -> np.ndarray:
        """The true values on ``grid`` (a 1-D array of progress points). Subclasses vectorize this."""
        return np.array([self.value(float(p)) for p in grid], dtype=float)

    def peak(self, grid: np.ndarray) -> tuple[int, float, float]:
        """``(index, progress, value)`` of the highest value on ``grid``, the earliest on ties."""
        vals = self.values(grid)
        i = int(np.argmax(vals))  # argmax returns the first maximum: ties go to the earliest eval
        return i, float(grid[i]), float(vals[i])

    def params(self) -> dict[str, float]:
        return {k: float(v) for k, v in vars(self).items() if isinstance(v, (int, float))}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:.4g}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class SaturatingCurve(Curve):
    """``s0 + gain * (1 - exp(-p/tau)) / (1 - exp(-1/tau))``: rises by ``gain`` over the run, strictly increasing."""

    def __init__(self, s0: float, gain: float, tau: float) -> None:
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.s0, self.gain, self.tau = float(s0), float(gain), float(tau)
        self._norm = 1.0 - math.exp(-1.0 / self.tau)

    def value(self, progress: float) -> float:
        return self.s0 + self.gain * (1.0 - math.exp(-progress / self.tau)) / self._norm

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.s0, self.gain, self.tau, grid)

    @staticmethod
    def batch(s0: Any, gain: Any, tau: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once: parameters broadcast against ``grid`` (e.g. shape (n, 1) vs (m,))."""
        return s0 + gain * (1.0 - np.exp(-np.asarray(grid) / tau)) / (1.0 - np.exp(-1.0 / tau))


class PlateauCurve(Curve):
    """Saturating rise by ``gain`` up to ``p_plateau``, then exactly flat (its peak is where the plateau starts)."""

    def __init__(self, s0: float, gain: float, tau: float, p_plateau: float) -> None:
        if tau <= 0 or not (0 < p_plateau <= 1):
            raise ValueError(f"need tau > 0 and 0 < p_plateau <= 1, got tau={tau}, p_plateau={p_plateau}")
        self.s0, self.gain, self.tau, self.p_plateau = float(s0), float(gain), float(tau), float(p_plateau)
        self._norm = 1.0 - math.exp(-self.p_plateau / self.tau)

    def value(self, progress: float) -> float:
        p = min(progress, self.p_plateau)
        return self.s0 + self.gain * (1.0 - math.exp(-p / self.tau)) / self._norm

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.s0, self.gain, self.tau, self.p_plateau, grid)

    @staticmethod
    def batch(s0: Any, gain: Any, tau: Any, p_plateau: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once (parameters broadcast against ``grid``)."""
        p = np.minimum(np.asarray(grid), p_plateau)
        return s0 + gain * (1.0 - np.exp(-p / tau)) / (1.0 - np.exp(-p_plateau / tau))


class GaoHackingCurve(Curve):
    """Reward overoptimization: ``s0 + height * x (1 - ln x)`` with ``x = (p / p_peak) ** gamma``, clipped at 0.

    Args:
        s0: Score at progress 0.
        height: Rise from ``s0`` to the peak.
        p_peak: Progress of the true peak, in (0, 1].
        gamma: How fast ``d`` grows with progress (1: linear; larger: steeper decline after the peak).
    """

    def __init__(self, s0: float, height: float, p_peak: float, gamma: float = 2.0) -> None:
        if not (0 < p_peak <= 1) or gamma <= 0 or height <= 0:
            raise ValueError(f"need 0 < p_peak <= 1, gamma > 0, height > 0; got {p_peak}, {gamma}, {height}")
        self.s0, self.height, self.p_peak, self.gamma = float(s0), float(height), float(p_peak), float(gamma)

    def value(self, progress: float) -> float:
        if progress <= 0:
            return max(self.s0, 0.0)
        x = (progress / self.p_peak) ** self.gamma
        return max(self.s0 + self.height * x * (1.0 - math.log(x)), 0.0)

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.s0, self.height, self.p_peak, self.gamma, grid)

    @staticmethod
    def batch(s0: Any, height: Any, p_peak: Any, gamma: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once (parameters broadcast against ``grid``)."""
        g = np.asarray(grid, dtype=float)
        x = np.maximum((np.maximum(g, 0.0) / p_peak) ** gamma, 1e-300)  # log(0) guard at p = 0
        out = s0 + height * x * (1.0 - np.log(x))
        out = np.where(g <= 0, s0, out)
        return np.maximum(out, 0.0)


def share_to_kappa(share: Any) -> Any:
    """The rate ``kappa`` of :class:`RiseCurve` whose rise is ``share`` done by progress 0.5: ``2 logit(share)``."""
    share = np.asarray(share, dtype=float)
    return 2.0 * np.log(share / (1.0 - share))


class RiseCurve(Curve):
    """``s0 + gain * (1 - exp(-kappa p)) / (1 - exp(-kappa))`` with ``kappa = 2 logit(share)`` (linear at share 0.5).

    Args:
        s0: Score at progress 0.
        gain: Rise over the whole run (> 0).
        share: Share of the rise made by progress 0.5, in (0, 1) (the curve's plateau share).
    """

    def __init__(self, s0: float, gain: float, share: float) -> None:
        if not (0.0 < share < 1.0) or gain <= 0:
            raise ValueError(f"need 0 < share < 1 and gain > 0, got share={share}, gain={gain}")
        self.s0, self.gain, self.share = float(s0), float(gain), float(share)

    def value(self, progress: float) -> float:
        return float(self.values(np.array([progress]))[0])

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.s0, self.gain, self.share, grid)

    @staticmethod
    def shape(kappa: Any, grid: Any) -> np.ndarray:
        """The rise's share done by each progress point for rate ``kappa`` (broadcast), exact at ``kappa = 0``."""
        k = np.asarray(kappa, dtype=float)
        g = np.asarray(grid, dtype=float)
        small = np.abs(k) < 1e-9
        safe = np.where(small, 1.0, k)  # keeps the unused branch finite at kappa = 0
        return np.where(small, g, np.expm1(-safe * g) / np.expm1(-safe))

    @staticmethod
    def batch(s0: Any, gain: Any, share: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once (parameters broadcast against ``grid``)."""
        return s0 + gain * RiseCurve.shape(share_to_kappa(share), grid)


class PeakDeclineCurve(Curve):
    """Rise to a peak, then a linear decline that levels off: the hacking shape fitted to recorded traces.

    With ``u = p / p_peak``: ``s0 + gain * (1 - (1 - u)^2)`` up to the peak (``s0 + gain`` at ``p_peak``, flat there),
    then ``s0 + gain * (1 - min(decline * (p - p_peak), drop))``; clipped at 0, the floor of the 0-1 score scale.

    Args:
        s0: Score at progress 0.
        gain: Rise from ``s0`` to the peak (> 0).
        p_peak: Progress of the true peak, in (0, 1].
        decline: Post-peak decline in gains per unit of progress (>= 0).
        drop: Total decline in gains after which the curve stays flat (>= 0).
    """

    def __init__(self, s0: float, gain: float, p_peak: float, decline: float, drop: float) -> None:
        if not (0 < p_peak <= 1) or gain <= 0 or decline < 0 or drop < 0:
            raise ValueError(
                f"need 0 < p_peak <= 1, gain > 0, decline >= 0, drop >= 0; got p_peak={p_peak}, "
                f"gain={gain}, decline={decline}, drop={drop}"
            )
        self.s0, self.gain, self.p_peak = float(s0), float(gain), float(p_peak)
        self.decline, self.drop = float(decline), float(drop)

    def value(self, progress: float) -> float:
        return float(self.values(np.array([progress]))[0])

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.s0, self.gain, self.p_peak, self.decline, self.drop, grid)

    @staticmethod
    def shape(p_peak: Any, decline: Any, drop: Any, grid: Any) -> np.ndarray:
        """The curve in gains above ``s0`` (1 at the peak), unclipped; parameters broadcast against ``grid``."""
        g = np.asarray(grid, dtype=float)
        u = np.minimum(g / p_peak, 1.0)
        after = np.minimum(decline * np.maximum(g - p_peak, 0.0), drop)
        return 1.0 - (1.0 - u) ** 2 - after

    @staticmethod
    def batch(s0: Any, gain: Any, p_peak: Any, decline: Any, drop: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once (parameters broadcast against ``grid``), clipped at 0."""
        return np.maximum(s0 + gain * PeakDeclineCurve.shape(p_peak, decline, drop, grid), 0.0)


class ExpLossCurve(Curve):
    """Training loss ``l_inf + (l0 - l_inf) * exp(-p / tau)``: monotonically falling for ``l0 > l_inf``."""

    def __init__(self, l0: float, l_inf: float, tau: float) -> None:
        if tau <= 0 or l0 < l_inf:
            raise ValueError(f"need tau > 0 and l0 >= l_inf, got tau={tau}, l0={l0}, l_inf={l_inf}")
        self.l0, self.l_inf, self.tau = float(l0), float(l_inf), float(tau)

    def value(self, progress: float) -> float:
        return self.l_inf + (self.l0 - self.l_inf) * math.exp(-progress / self.tau)

    def values(self, grid: np.ndarray) -> np.ndarray:
        return self.batch(self.l0, self.l_inf, self.tau, grid)

    @staticmethod
    def batch(l0: Any, l_inf: Any, tau: Any, grid: np.ndarray) -> np.ndarray:
        """Values for many curves at once (parameters broadcast against ``grid``)."""
        return l_inf + (l0 - l_inf) * np.exp(-np.asarray(grid, dtype=float) / tau)


class TabulatedCurve(Curve):
    """Piecewise-linear interpolation of measured points (e.g. a recorded trace's eval scores by progress).

    Args:
        progress: Increasing progress points in [0, 1].
        values: The value at each point; held constant outside the measured range.
    """

    def __init__(self, progress: Sequence[float], values: Sequence[float]) -> None:
        xs, ys = np.asarray(progress, dtype=float), np.asarray(values, dtype=float)
        if xs.ndim != 1 or xs.shape != ys.shape or len(xs) == 0:
            raise ValueError("progress and values must be 1-D sequences of the same non-zero length")
        if np.any(np.diff(xs) <= 0):
            raise ValueError("progress points must strictly increase")
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
            raise ValueError("progress and values must be finite")
        self.xs, self.ys = xs, ys

    def value(self, progress: float) -> float:
        return float(np.interp(progress, self.xs, self.ys))

    def values(self, grid: np.ndarray) -> np.ndarray:
        return np.interp(np.asarray(grid, dtype=float), self.xs, self.ys)

    def params(self) -> dict[str, float]:
        return {"points": float(len(self.xs))}


def eval_grid(n_evals: int) -> np.ndarray:
    """Progress points of ``n_evals`` evenly spaced evals, the last at 1.0 (20 evals: every 5%)."""
    if n_evals < 1:
        raise ValueError(f"n_evals must be >= 1, got {n_evals}")
    return np.arange(1, n_evals + 1, dtype=float) / n_evals
