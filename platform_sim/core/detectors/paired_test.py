"""``paired-test``: a one-sided paired test of the current checkpoint against the best one, on per-example scores."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..boundary import EvidenceMode, InvalidReportError
from ..checks import check_nonneg, check_prob
from .base import EvidenceDetector, Spread
from .pvalues import one_sided_t_p, scipy_module
from .registry import register_detector

PAIRED_TESTS: tuple[str, ...] = ("wilcoxon", "sign", "t")


@register_detector
class PairedTestDetector(EvidenceDetector):
    """A one-sided paired test of the current checkpoint against the best one, on per-example scores.

    The detector keeps the per-example scores of the best checkpoint so far (highest mean, earliest on ties, as the
    monitor's best step). At each later eval it tests "the current checkpoint scores lower than the best one on the
    same examples" with scipy's one-sided test (``wilcoxon``: signed-rank, zero differences dropped; ``sign``: a
    binomial test on the signs of the non-zero differences; ``t``: paired t-test). An eval is *significant* when the
    p-value is below ``alpha`` and the mean is below the best mean by more than ``min_effect``; the job stops after
    ``k`` consecutive significant evals. Because the mean must be below the best one, a score that never falls below
    its best never stops the job, whatever the per-example scores say.

    Without per-example scores at this eval or at the best checkpoint, the eval is judged on the mean: it counts if
    ``score_t < score_{t-1} - min_effect`` (the k-decline rule), with a warning once per detector.

    The best is chosen on noisy means, so it is biased upwards (the winner's curse); a small ``alpha`` and ``k >= 2``
    keep healthy plateaus from being stopped for that reason alone.

    Args:
        test: ``"wilcoxon"``, ``"sign"`` or ``"t"``.
        alpha: Significance level of each test, strictly between 0 and 1.
        min_effect: Minimum drop of the mean below the best mean (score units). Finite, >= 0.
        k: Consecutive significant evals that stop the job. Integer >= 1.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``: real RL
            runs can dip at the very start before they improve. Integer >= 0.
    """

    name: ClassVar[str] = "paired-test"
    uses_example_scores: ClassVar[bool] = True

    def __init__(
        self, test: str = "wilcoxon", alpha: float = 0.01, min_effect: float = 0.0, k: int = 2, warmup: int = 0
    ) -> None:
        super().__init__(k, warmup)
        if test not in PAIRED_TESTS:
            raise ValueError(f"test must be one of {', '.join(PAIRED_TESTS)}, got {test!r}")
        self.test = test
        self.alpha = check_prob("alpha", alpha)
        self.min_effect = check_nonneg("min_effect", min_effect)
        self.best_score: float | None = None
        self.best_scores: list[float] | None = None
        self.prev_score: float | None = None
        self.last_p: float | None = None  # p-value of the last eval's test (None: no test ran)
        self._crit: dict[int, float] = {}  # t critical values by sample size (derived, not state)

    def _p_value(self, diff: np.ndarray) -> float:
        """One-sided p-value of "current < best" from the paired differences ``current - best``."""
        nonzero = diff[diff != 0.0]
        if nonzero.size == 0:  # identical on every example: no evidence of a decline
            return 1.0
        if self.test == "sign":
            return float(
                scipy_module("stats")
                .binomtest(int((nonzero < 0).sum()), int(nonzero.size), 0.5, alternative="greater")
                .pvalue
            )
        if self.test == "wilcoxon":
            p = float(scipy_module("stats").wilcoxon(nonzero, alternative="less").pvalue)
        else:
            if np.ptp(diff) <= 1e-9 * float(np.max(np.abs(diff))):
                # Every example moved by the same amount: zero variance, no t statistic (scipy gives NaN); a uniform
                # drop on every example is the strongest possible evidence.
                return 0.0 if diff[0] < 0 else 1.0
            p = one_sided_t_p(diff, self.alpha, self._crit)
        return 1.0 if not math.isfinite(p) else p

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        per_example = None if scores is None or len(scores) == 0 else np.asarray(scores, dtype=float)
        if per_example is not None and self.best_scores is not None and per_example.size != len(self.best_scores):
            raise InvalidReportError(
                f"eval_scores has {per_example.size} entries but the best checkpoint's had {len(self.best_scores)}; "
                "a paired test needs the same held-out examples at every eval"
            )
        best = self.best_score
        significant = False
        self.last_p = None
        if best is not None:
            if per_example is None or self.best_scores is None:
                self._mode = EvidenceMode.MEANS_ONLY  # a paired test needs both checkpoints' example scores
                self._warn_fallback(
                    "no per-example eval scores"
                    if per_example is None
                    else "the best checkpoint has no per-example eval scores"
                )
                significant = self.prev_score is not None and score < self.prev_score - self.min_effect
            elif score < best - self.min_effect:  # cheap pre-check first: the test runs only on a real drop
                self.last_p = self._p_value(per_example - np.asarray(self.best_scores, dtype=float))
                significant = self.last_p < self.alpha
        if best is None or score > best:
            self.best_score = score
            self.best_scores = None if per_example is None else [float(s) for s in per_example]
        self.prev_score = score
        return significant

    def reason(self) -> str:
        p = "n/a (mean fallback)" if self.last_p is None else f"{self.last_p:.3g}"
        return (
            f"{self.declines} consecutive evals significantly below the best checkpoint "
            f"({self.test} test, p={p}, alpha={self.alpha:g}, k={self.k})"
        )

    def params(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "k": self.k,
            "warmup": self.warmup,
        }

    def _rule_state(self) -> dict[str, Any]:
        return {
            "best_score": self.best_score,
            "best_scores": None if self.best_scores is None else list(self.best_scores),
            "prev_score": self.prev_score,
            "last_p": self.last_p,
        }

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self.best_score = state["best_score"]
        best_scores = state["best_scores"]
        self.best_scores = None if best_scores is None else [float(s) for s in best_scores]
        self.prev_score = state["prev_score"]
        self.last_p = state["last_p"]
