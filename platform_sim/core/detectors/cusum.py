"""``cusum``: a one-sided CUSUM on the eval-to-eval drops of the mean score (a streaming change-point detector)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..checks import check_nonneg, check_optional_nonneg
from .base import Spread
from .noise import DiffNoiseDetector
from .registry import register_detector


@register_detector
class CusumDetector(DiffNoiseDetector):
    """A one-sided CUSUM on the eval-to-eval drops of the mean score.

    With ``d_t = score_{t-1} - score_t`` (a drop is positive) and ``s`` the pooled noise of one eval mean (the root
    mean square of ``SE_diff / sqrt(2)`` over the evals so far, ``SE_diff`` as in
    :class:`~platform_sim.core.detectors.KDeclineSEDetector`), the statistic is
    ``S_t = max(0, S_{t-1} + d_t - slack * s)`` and the job stops when ``S_t > threshold * s + min_delta``. The drops
    telescope, so ``S_t`` is the fall from a recent high minus ``slack * s`` per eval since: a steady decline builds
    it up, noise around a plateau mostly does not. A score that never falls keeps ``S`` at 0 and never stops. The
    evidence count (``declines``) is the number of consecutive evals with ``S`` above zero.

    Args:
        slack: Allowance per eval, in standard errors: drops smaller than this on average never add up. Finite, >= 0.
        threshold: Alarm level in standard errors. Finite, >= 0.
        min_delta: Absolute floor added to the alarm level (score units); keeps noise-free plateaus from stopping on
            rounding-sized drops. Finite, >= 0.
        se: Standard error of one eval mean when evals have no per-example scores. None: estimate it from the
            history of means (:func:`~platform_sim.core.detectors.noise.se_from_history`). Finite, >= 0.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "cusum"
    uses_example_scores: ClassVar[bool] = True

    def __init__(
        self,
        slack: float = 0.5,
        threshold: float = 4.0,
        min_delta: float = 0.0,
        se: float | None = None,
        warmup: int = 0,
    ) -> None:
        # The stop is the alarm below, not k evals in a row; k=1 only satisfies the base.
        super().__init__(1, warmup, check_optional_nonneg("se", se))
        self.slack = check_nonneg("slack", slack)
        self.threshold = check_nonneg("threshold", threshold)
        self.min_delta = check_nonneg("min_delta", min_delta)
        self.stat = 0.0
        self.var_sum = 0.0
        self.var_count = 0
        self._alarm = False  # the statistic is above the alarm level at this eval (derived, not state)

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        diff_se = self._diff_se(scores)
        self._alarm = False
        if diff_se is not None:
            self.var_sum += diff_se * diff_se / 2.0
            self.var_count += 1
            pooled = math.sqrt(self.var_sum / self.var_count)
            if counts:  # drops into the first `warmup` evals are not accumulated
                self.stat = max(0.0, self.stat + (self.means[-1] - score) - self.slack * pooled)
            self._alarm = self.stat > self.threshold * pooled + self.min_delta
        self.means.append(score)
        return self.stat > 0.0

    def _fires(self) -> bool:
        return self._alarm

    def reason(self) -> str:
        return (
            f"CUSUM of drops {self.stat:.4g} above {self.threshold:g} standard errors "
            f"(slack {self.slack:g}, min_delta {self.min_delta:g})"
        )

    def params(self) -> dict[str, Any]:
        return {
            "slack": self.slack,
            "threshold": self.threshold,
            "min_delta": self.min_delta,
            "se": self.se,
            "warmup": self.warmup,
        }

    def _rule_state(self) -> dict[str, Any]:
        return {
            **self._noise_state(),
            "stat": self.stat,
            "var_sum": self.var_sum,
            "var_count": self.var_count,
            "means": list(self.means),
        }

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self._load_noise_state(state)
        self.stat = float(state["stat"])
        self.var_sum = float(state["var_sum"])
        self.var_count = int(state["var_count"])
