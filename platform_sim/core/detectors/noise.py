"""Noise estimates: how large a change of the eval score noise alone makes.

Every eval is a mean over held-out examples, and two checkpoints are scored on the same examples, so the per-example
scores tell the noise of an eval-to-eval difference: the *paired* estimate, from the per-example differences (the
examples' fixed difficulty cancels in them). Without per-example scores the noise of one mean comes from a detector's
``se`` parameter, else from the history of means (:func:`se_from_history`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import EvidenceDetector

#: Evals of history needed before :func:`se_from_history` gives an estimate.
MIN_HISTORY_FOR_SE = 4

# Normal-consistency constant of the median absolute deviation.
_MAD_TO_SD = 1.482602218505602


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


def paired_difference_var(current: Sequence[float] | np.ndarray, previous: Sequence[float]) -> float:
    """Sample variance (ddof=1) of the per-example differences ``current - previous``: the paired noise.

    The standard error of the difference of the two means is ``sqrt(v / n)``, and the noise of one mean from
    checkpoint to checkpoint has variance ``v / (2 n)`` (``n`` examples).

    Args:
        current: Per-example scores of one eval (at least 2).
        previous: Per-example scores of the other eval, on the same examples in the same order.
    """
    return float((np.asarray(current, dtype=float) - np.asarray(previous, dtype=float)).var(ddof=1))


def mean_noise(se: float | None, means: Sequence[float]) -> float | None:
    """Standard error of one eval mean without per-example scores: ``se`` if given, else :func:`se_from_history`."""
    return se if se is not None else se_from_history(means)


class DiffNoiseDetector(EvidenceDetector):
    """An :class:`~platform_sim.core.detectors.base.EvidenceDetector` that needs the noise of an eval-to-eval
    difference: it keeps the mean history (for the fallback estimate) and the previous eval's per-example scores
    and standard error (for the paired and unpaired estimates).

    Args:
        k: Consecutive evals with evidence that stop the job. Integer >= 1.
        warmup: Evals that never count as evidence. Integer >= 0.
        se: Standard error of one eval mean for evals without per-example scores, or None (checked by the caller).
    """

    def __init__(self, k: int, warmup: int, se: float | None) -> None:
        super().__init__(k, warmup)
        self.se = se
        self.prev_scores: list[float] | None = None
        self.prev_se: float | None = None
        self.means: list[float] = []

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
                out = math.sqrt(paired_difference_var(cur, self.prev_scores)) / math.sqrt(cur.size)
            elif cur_se is not None and self.prev_se is not None:
                out = math.sqrt(cur_se * cur_se + self.prev_se * self.prev_se)
            else:
                self._warn_fallback(
                    "no per-example eval scores" if not scores else "fewer than 2 per-example eval scores"
                )
                one = mean_noise(self.se, self.means)
                # Noise unknown (too few evals to estimate it): no evidence either way, so this eval decides nothing.
                out = None if one is None else math.sqrt(2.0) * one
        self.prev_scores = None if cur is None else cur.tolist()
        self.prev_se = cur_se
        return out

    def _noise_state(self) -> dict[str, Any]:
        """The state fields kept here (the subclass adds ``means`` where its format has it)."""
        return {"prev_scores": None if self.prev_scores is None else list(self.prev_scores), "prev_se": self.prev_se}

    def _load_noise_state(self, state: Mapping[str, Any]) -> None:
        self.prev_scores = None if state["prev_scores"] is None else [float(v) for v in state["prev_scores"]]
        self.prev_se = state["prev_se"]
        self.means = [float(m) for m in state["means"]]

    def _records_seen(self) -> bool:
        return False  # one mean per eval seen: the history tells it

    def _seen_from_state(self, state: Mapping[str, Any]) -> int:
        return len(state["means"])
