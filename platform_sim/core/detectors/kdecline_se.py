"""``k-decline-se``: k-decline where a drop counts only beyond ``z`` standard errors of the eval-to-eval difference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..checks import check_nonneg, check_optional_nonneg
from .base import Spread
from .noise import DiffNoiseDetector
from .registry import register_detector


@register_detector
class KDeclineSEDetector(DiffNoiseDetector):
    """The paper's k-decline rule with a tolerance relative to the standard error of the eval-to-eval difference.

    A decline at eval t is ``score_t < score_{t-1} - max(min_delta, z * SE_diff)``, where ``SE_diff`` is the standard
    error of ``score_t - score_{t-1}``: from the paired per-example differences when both evals carry per-example
    scores on the same examples, otherwise as described in
    :meth:`~platform_sim.core.detectors.noise.DiffNoiseDetector._diff_se`. Any other eval resets the count; ``k``
    consecutive declines stop the job. With ``z=0`` it is exactly
    :class:`~platform_sim.core.detectors.KDeclineDetector`.

    Args:
        k: Consecutive declines that stop the job. Integer >= 1.
        z: Tolerance in standard errors of the difference of two evals. Finite, >= 0.
        min_delta: Absolute floor of the tolerance (same units as the score). Finite, >= 0.
        se: Standard error of one eval mean to use when evals have no per-example scores. None: estimate it from
            the history of means (:func:`~platform_sim.core.detectors.noise.se_from_history`). Finite, >= 0.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "k-decline-se"
    uses_example_scores: ClassVar[bool] = True

    def __init__(
        self, k: int = 2, z: float = 1.0, min_delta: float = 0.0, se: float | None = None, warmup: int = 0
    ) -> None:
        super().__init__(k, warmup, check_optional_nonneg("se", se))
        self.z = check_nonneg("z", z)
        self.min_delta = check_nonneg("min_delta", min_delta)
        self.last_tolerance = 0.0  # the tolerance of the last eval that had a noise estimate (for the reason)

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        diff_se = self._diff_se(scores)
        evidence = False
        if diff_se is not None:  # None at the first eval and while the noise is unknown: no evidence
            self.last_tolerance = max(self.min_delta, self.z * diff_se)
            evidence = score < self.means[-1] - self.last_tolerance
        self.means.append(score)
        return evidence

    def reason(self) -> str:
        return (
            f"{self.declines} consecutive declines beyond {self.z:g} standard errors "
            f"(k={self.k}, tolerance {self.last_tolerance:.4g})"
        )

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "z": self.z, "min_delta": self.min_delta, "se": self.se, "warmup": self.warmup}

    def _rule_state(self) -> dict[str, Any]:
        return {**self._noise_state(), "means": list(self.means), "last_tolerance": self.last_tolerance}

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self._load_noise_state(state)
        self.last_tolerance = float(state["last_tolerance"])
