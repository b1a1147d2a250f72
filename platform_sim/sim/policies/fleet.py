"""A platform-level choice of stop detector, learned from the fleet's own finished jobs.

Whether a run that has flattened is a healthy plateau or an overoptimized run at its peak is not in that run's own
history when the eval is noisy; it is in the platform's other runs. Where healthy runs keep improving until the end
(the simulator's default workload), a detector that takes flattening for a peak (``shape-sens``) is both fast and
right; where healthy runs plateau (the recorded real runs), only a detector that waits for a real decline
(``shape``) is safe. :class:`FleetDetectorChoice` looks at the runs that finished without being stopped and picks:

- :func:`late_gain` of each such run: the share of its rise made in its last third, ``(c - b) / (c - a)`` with
  ``a, b, c`` the mean eval score of its first, middle and last third (about 0.5 for a run that rises steadily,
  about 0.1 for one that plateaued by mid-run, negative for one that fell);
- while fewer than ``min_runs`` runs have finished, or the median late gain of the last ``window`` ones is below
  ``min_late_gain``: the ``conservative`` spec; otherwise the ``aggressive`` one. A new job's detector is chosen once,
  when it first reports, and kept for the whole run.

Pure data in, a detector spec out; the state is plain JSON (``state_dict``). Used by the ``evalstop-fleet`` stop
policy (:mod:`platform_sim.sim.policies.stop_policies`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from platform_sim.core.checks import check_int, check_prob
from platform_sim.core.detectors import detector_from_spec

#: Evals a finished run needs for its late gain (two per third).
MIN_EVALS_FOR_LATE_GAIN = 6


def late_gain(scores: Sequence[float]) -> float | None:
    """Share of a finished run's rise made in its last third (see the module docstring).

    Returns None with fewer than :data:`MIN_EVALS_FOR_LATE_GAIN` scores, and -1.0 when the last third is not above the
    first (the run did not rise at all; it tells that this fleet's runs can end lower than they started).
    """
    n = len(scores)
    if n < MIN_EVALS_FOR_LATE_GAIN:
        return None
    third = n // 3
    a = math.fsum(scores[:third]) / third
    b = math.fsum(scores[third : n - third]) / (n - 2 * third)
    c = math.fsum(scores[n - third :]) / third
    if not c > a:
        return -1.0
    return (c - b) / (c - a)


@dataclass
class FleetDetectorChoice:
    """Which detector spec a new job gets, from the late gains of the runs that finished unstopped.

    Args:
        conservative: Spec used until the fleet shows that its healthy runs keep rising (and before ``min_runs``
            runs have finished).
        aggressive: Spec used once the median late gain of the last ``window`` finished runs is >= ``min_late_gain``.
        min_late_gain: Threshold on the median late gain, in (0, 1).
        min_runs: Finished runs needed before the choice can leave ``conservative``. Integer >= 1.
        window: How many of the most recent finished runs count. Integer >= ``min_runs``.
    """

    conservative: Mapping[str, Any]
    aggressive: Mapping[str, Any]
    min_late_gain: float = 0.3
    min_runs: int = 8
    window: int = 50
    gains: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Validate and normalize both specs now: a bad one fails when the platform starts, not at a job's first eval.
        self.conservative = detector_from_spec(self.conservative).spec()
        self.aggressive = detector_from_spec(self.aggressive).spec()
        check_prob("min_late_gain", self.min_late_gain)
        check_int("min_runs", self.min_runs, 1)
        check_int("window", self.window, self.min_runs)

    def record(self, scores: Sequence[float]) -> float | None:
        """Take a run that finished without being stopped; returns its late gain (None: too short to count)."""
        gain = late_gain(scores)
        if gain is not None:
            self.gains.append(gain)
            del self.gains[: -self.window]
        return gain

    def median_late_gain(self) -> float | None:
        """Median late gain of the runs that count, or None while fewer than ``min_runs`` have finished."""
        return statistics.median(self.gains) if len(self.gains) >= self.min_runs else None

    def spec(self) -> dict[str, Any]:
        """The detector spec for a job that starts now."""
        median = self.median_late_gain()
        chosen = self.aggressive if median is not None and median >= self.min_late_gain else self.conservative
        return {"name": chosen["name"], "params": dict(chosen["params"])}

    def params(self) -> dict[str, Any]:
        return {
            "conservative": self.conservative,
            "aggressive": self.aggressive,
            "min_late_gain": self.min_late_gain,
            "min_runs": self.min_runs,
            "window": self.window,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"gains": list(self.gains)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.gains = [float(g) for g in state["gains"]][-self.window :]
