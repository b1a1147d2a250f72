"""``k-decline``: the EvalStop paper's rule, stop after ``k`` consecutive declines of the eval score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..checks import check_nonneg
from .base import EvidenceDetector, Spread
from .registry import register_detector


@register_detector
class KDeclineDetector(EvidenceDetector):
    """The EvalStop paper's rule: stop after ``k`` consecutive declines of the eval score.

    A decline at eval t is ``score_t < score_{t-1} - min_delta``; any other eval resets the count to 0. The job stops
    when the count reaches ``k``.

    Args:
        k: Consecutive declines that stop the job (paper: 2). Integer >= 1.
        min_delta: Tolerance: a drop must exceed it to count as a decline (paper: 0). Finite, >= 0.
        warmup: The first ``warmup`` evaluations count no decline (paper: 0, no warm-up). Real RL runs can dip at
            the very start, before the policy improves at all (docs/results/real-trace-replay.md); a warm-up keeps the rule from
            taking that dip for overoptimization. Integer >= 0. Left out of :meth:`params` and the state when 0, so
            specs and states of the paper's rule are unchanged.
    """

    name: ClassVar[str] = "k-decline"

    def __init__(self, k: int = 2, min_delta: float = 0.0, warmup: int = 0) -> None:
        super().__init__(k, warmup)
        self.min_delta = check_nonneg("min_delta", min_delta)
        self.prev_score: float | None = None

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        prev, self.prev_score = self.prev_score, score
        return prev is not None and score < prev - self.min_delta

    def reason(self) -> str:
        return f"{self.declines} consecutive declines (k={self.k}, min_delta={self.min_delta:g})"

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"k": self.k, "min_delta": self.min_delta}
        if self.warmup:
            params["warmup"] = self.warmup
        return params

    def _rule_state(self) -> dict[str, Any]:
        return {"prev_score": self.prev_score}

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self.prev_score = state["prev_score"]

    def _records_seen(self) -> bool:
        return self.warmup > 0  # the paper's rule keeps its original state: {"prev_score", "declines"}

    def _seen_from_state(self, state: Mapping[str, Any]) -> int:
        # States written without a warm-up have no "seen"; past the warm-up is the only safe reading of them.
        return self.warmup if state["prev_score"] is not None else 0
