"""The one non-finite policy of the trainer side: what a NaN or infinite eval score does to a run.

Every entry point (the callback, ``evalstop watch``, the verl adapter, the Axolotl and LLaMA-Factory integrations)
holds one :class:`NonFinitePolicy` per job and asks it about each evaluation before anything reaches a client:

- a finite evaluation goes on to the scheduler as usual (and ends a run of non-finite ones);
- a non-finite one (a NaN or inf mean, or a NaN or inf per-example score) is recorded by the caller (history, result,
  trace), warned about with its step and metric, and neither sent to the scheduler nor decided on;
- ``max_consecutive`` non-finite evaluations in a row (default 3) end the run gracefully: the caller stops it as at a
  decline, with the best checkpoint kept (and restored where the entry point restores), and :meth:`reason` names the
  broken evaluation.

Why not refuse at once, nor skip silently: one NaN is often a transient fault of the evaluation (a judge that timed
out, an empty batch) and refusing it ended runs that had days left; skipping it silently left a run whose evaluation
broke for good going on unwatched. A few in a row mean the evaluation is broken: the run is ended with its best
weights, which is the safe state EvalStop exists to reach. The scheduler core and the service never see a non-finite
score (the core refuses one, the service answers 422): the clients never send one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONSECUTIVE = 3
"""How many non-finite evaluations in a row end a run by default."""


def non_finite(score: Any, scores: Sequence[Any] | None = None) -> str | None:
    """What is non-finite in one evaluation, in words (``"eval score nan"``), or None if it is finite.

    Args:
        score: The mean eval score.
        scores: Per-example scores, or None.
    """
    if isinstance(score, (int, float)) and not isinstance(score, bool) and not math.isfinite(score):
        return f"eval score {float(score)}"
    if scores is not None:
        for i, v in enumerate(scores):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                return f"per-example score {float(v)} (example {i})"
    return None


def check_max_consecutive(value: Any, key: str = "max_non_finite") -> int:
    """``value`` if it is an integer >= 1, else ValueError naming ``key`` in one line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return value


@dataclass
class NonFinitePolicy:
    """One job's count of non-finite evaluations in a row, and what the next one means.

    Args:
        max_consecutive: How many non-finite evaluations in a row end the run (>= 1).
        where: Who applies it, for the warnings (``"EvalStop"``, ``"evalstop watch"``).

    Attributes:
        consecutive: Non-finite evaluations since the last finite one.
        steps: Every step whose evaluation was non-finite, in order.
        last: What was non-finite at the last one (``"eval score nan"``), or None.
        metric: The metric named at the last one, or None.
    """

    max_consecutive: int = DEFAULT_MAX_CONSECUTIVE
    where: str = "EvalStop"
    consecutive: int = 0
    steps: list[int] = field(default_factory=list)
    last: str | None = None
    metric: str | None = None

    def __post_init__(self) -> None:
        check_max_consecutive(self.max_consecutive)

    def check(self, step: int, score: Any, scores: Sequence[Any] | None = None, metric: str | None = None) -> bool:
        """Take one evaluation; True if it is finite (report it), False if it is not (record it, do not report it).

        A non-finite one is warned about with its step and metric; :attr:`exhausted` then says whether it was the
        last one the run may take.
        """
        what = non_finite(score, scores)
        if what is None:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.steps.append(step)
        self.last, self.metric = what, metric
        named = f" of {metric}" if metric else ""
        if self.exhausted:
            logger.warning(
                "%s: non-finite %s%s at step %d, %d in a row: the evaluation is broken; ending the run with the best "
                "checkpoint",
                self.where,
                what,
                named,
                step,
                self.consecutive,
            )
        else:
            logger.warning(
                "%s: non-finite %s%s at step %d: not reported, not decided on (%d of %d in a row end the run)",
                self.where,
                what,
                named,
                step,
                self.consecutive,
                self.max_consecutive,
            )
        return False

    @property
    def exhausted(self) -> bool:
        """Whether the run must end: ``max_consecutive`` non-finite evaluations in a row."""
        return self.consecutive >= self.max_consecutive

    def reason(self, metric: str | None = None) -> str:
        """The stop's reason, naming the broken evaluation (call it once :attr:`exhausted`; ``metric`` defaults to
        the one named at the last check)."""
        metric = metric or self.metric
        named = f" of {metric}" if metric else ""
        steps = ", ".join(str(s) for s in self.steps[-self.consecutive :])
        return (
            f"non-finite evaluation: {self.consecutive} non-finite evaluations{named} in a row (steps {steps}; "
            f"last: {self.last}): the evaluation is broken, the run ends with its best checkpoint"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"consecutive": self.consecutive, "steps": list(self.steps), "last": self.last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = int(state.get("consecutive", 0))
        self.steps = [int(s) for s in state.get("steps", [])]
        self.last = state.get("last")
