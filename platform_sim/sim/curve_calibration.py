"""RLHF curve shapes fitted on recorded traces, as a distribution the workload draws from (:class:`CurveCalibration`).

The fitting is in :mod:`platform_sim.sim.curve_fit`; this module holds only what a workload needs to draw curves from a
calibration (plain, picklable, JSON-serializable data and its smoothed bootstrap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

SMOOTHING = 0.5
"""Kernel bandwidth of :meth:`CurveCalibration.draw` as a multiple of Silverman's rule (0: plain resampling)."""


@dataclass(frozen=True)
class CurveDraws:
    """Per-job draws of a calibration (one entry per job; the workload uses the hacking or the healthy ones).

    Args:
        peak, decline, drop, hack_noise: Hacking shape and per-eval noise / gain.
        plateau_share, healthy_noise: Healthy shape and per-eval noise / gain.
    """

    peak: np.ndarray
    decline: np.ndarray
    drop: np.ndarray
    hack_noise: np.ndarray
    plateau_share: np.ndarray
    healthy_noise: np.ndarray


def _logit(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 1e-4, 1 - 1e-4)
    return np.log(x / (1 - x))


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _log(x: np.ndarray, floor: float) -> np.ndarray:
    return np.log(np.maximum(x, floor))


@dataclass(frozen=True)
class CurveCalibration:
    """Distributions of RLHF curve shapes fitted on recorded traces (plain, picklable, JSON-serializable).

    Args:
        hacking: ``(peak, decline, drop, noise)`` of each fitted hacking trace.
        healthy: ``(plateau_share, noise)`` of each fitted healthy trace.
        hack_share: Share of hacking traces among the fitted ones (the corpus's hack rate; the workload's hack rate
            stays ``WorkloadConfig.hack_rate``).
        split: ``tune`` (only tune-split traces were fitted) or ``all`` (the traces carry no split: all were used).
        traces: Names of the fitted traces.
        smoothing: Kernel bandwidth of :meth:`draw` as a multiple of Silverman's rule (0: plain resampling).
    """

    hacking: tuple[tuple[float, float, float, float], ...]
    healthy: tuple[tuple[float, float], ...]
    hack_share: float
    split: str
    traces: tuple[str, ...] = ()
    smoothing: float = SMOOTHING

    def __post_init__(self) -> None:
        if not self.hacking or not self.healthy:
            raise ValueError(
                f"a curve calibration needs at least one hacking and one healthy trace; got "
                f"{len(self.hacking)} hacking and {len(self.healthy)} healthy"
            )
        for peak, decline, drop, noise in self.hacking:
            if not (0 < peak < 1 and decline >= 0 and drop >= 0 and noise >= 0):
                raise ValueError(
                    f"bad hacking entry (peak, decline, drop, noise) = "
                    f"{(peak, decline, drop, noise)}: need 0 < peak < 1 and the rest >= 0"
                )
        for share, noise in self.healthy:
            if not (0 < share < 1 and noise >= 0):
                raise ValueError(
                    f"bad healthy entry (plateau_share, noise) = {(share, noise)}: "
                    "need 0 < plateau_share < 1 and noise >= 0"
                )
        if not (0.0 <= self.hack_share <= 1.0):
            raise ValueError(f"hack_share must be in [0, 1], got {self.hack_share}")
        if self.split not in ("tune", "all"):
            raise ValueError(f"split must be 'tune' or 'all', got {self.split!r}")
        if not (self.smoothing >= 0 and math.isfinite(self.smoothing)):
            raise ValueError(f"smoothing must be a finite number >= 0, got {self.smoothing}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "hacking": [list(h) for h in self.hacking],
            "healthy": [list(h) for h in self.healthy],
            "hack_share": self.hack_share,
            "split": self.split,
            "traces": list(self.traces),
            "smoothing": self.smoothing,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CurveCalibration:
        return cls(
            hacking=tuple(tuple(float(v) for v in h) for h in data["hacking"]),  # type: ignore[misc]
            healthy=tuple(tuple(float(v) for v in h) for h in data["healthy"]),  # type: ignore[misc]
            hack_share=float(data["hack_share"]),
            split=str(data["split"]),
            traces=tuple(data.get("traces", ())),
            smoothing=float(data.get("smoothing", SMOOTHING)),
        )

    def summary(self) -> dict[str, Any]:
        """Medians and ranges of the fitted parameters (for reports)."""
        h, g = np.array(self.hacking), np.array(self.healthy)

        def stats(col: np.ndarray) -> dict[str, float]:
            return {"median": float(np.median(col)), "min": float(col.min()), "max": float(col.max())}

        return {
            "hacking_traces": len(h),
            "healthy_traces": len(g),
            "hack_share": self.hack_share,
            "split": self.split,
            "peak": stats(h[:, 0]),
            "decline": stats(h[:, 1]),
            "drop": stats(h[:, 2]),
            "hacking_noise": stats(h[:, 3]),
            "plateau_share": stats(g[:, 0]),
            "healthy_noise": stats(g[:, 1]),
        }

    def draw(self, rng: np.random.Generator, n: int) -> CurveDraws:
        """``n`` draws of both kinds of shape (smoothed bootstrap; a fixed number of draws for any ``n``'s mix).

        Args:
            rng: The generator to draw from.
            n: Number of draws of each kind.
        """
        hack = np.array(self.hacking, dtype=float)
        healthy = np.array(self.healthy, dtype=float)
        th = np.column_stack(
            [_logit(hack[:, 0]), _log(hack[:, 1], 1e-3), _log(hack[:, 2], 1e-3), _log(hack[:, 3], 1e-4)]
        )
        tg = np.column_stack([_logit(healthy[:, 0]), _log(healthy[:, 1], 1e-4)])
        pick_h = rng.integers(len(hack), size=n)
        pick_g = rng.integers(len(healthy), size=n)
        z = rng.standard_normal((n, 6))

        def bandwidth(t: np.ndarray) -> np.ndarray:
            if len(t) < 2:
                return np.zeros(t.shape[1])
            return self.smoothing * 1.06 * t.std(axis=0, ddof=1) * len(t) ** -0.2

        xh = th[pick_h] + z[:, :4] * bandwidth(th)
        xg = tg[pick_g] + z[:, 4:] * bandwidth(tg)
        # A drawn peak stays strictly inside the run, so that every hacking curve has a decline to see.
        peak = np.clip(_expit(xh[:, 0]), 0.02, 0.95)
        return CurveDraws(
            peak=peak,
            decline=np.exp(xh[:, 1]),
            drop=np.exp(xh[:, 2]),
            hack_noise=np.exp(xh[:, 3]),
            plateau_share=np.clip(_expit(xg[:, 0]), 0.01, 0.99),
            healthy_noise=np.exp(xg[:, 1]),
        )
