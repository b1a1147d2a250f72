"""When the callback evaluates: its cadence, the scheduler's cadence hints and the budget that limits them.

The cadence is resolved at train start (:func:`resolve_cadence`): every ``N`` optimizer steps, every epoch, or
whenever the trainer evaluates (trainer metrics). :class:`EvalSchedule` then answers "is this step due", follows a
decision's ``next_eval_step`` hint when the :class:`~platform_sim.core.EvalBudget` leaves room, and keeps the clock
(evaluator seconds and wall seconds, continued across a resume) that the budget's time share is measured with.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from platform_sim.core import Decision, EvalBudget

from .evaluators import Evaluator

logger = logging.getLogger(__name__)

NO_CADENCE = (
    "EvalStopCallback has no cadence: pass eval_steps=N (or 'epoch'), or set the trainer's "
    "eval_strategy to 'steps' or 'epoch'"
)


def strategy(value: Any) -> str:
    """A trainer's ``eval_strategy`` (an enum or a string) as its string, ``"no"`` when unset."""
    return str(getattr(value, "value", value) or "no")


def check_has_cadence(eval_steps: int | str | None, args: Any) -> None:
    """Raise when neither ``eval_steps`` nor the trainer's ``eval_strategy`` gives a cadence.

    Args:
        eval_steps: The callback's ``eval_steps`` argument.
        args: The trainer's ``TrainingArguments``.
    """
    if eval_steps is None and strategy(getattr(args, "eval_strategy", "no")) == "no":
        raise ValueError(NO_CADENCE)


def resolve_cadence(eval_steps: int | str | None, evaluator: Evaluator, args: Any, state: Any) -> tuple[str, int]:
    """The cadence as ``(kind, interval)``: ``("steps", N)``, ``("epoch", 0)`` or ``("trainer", 0)``.

    Args:
        eval_steps: The callback's ``eval_steps`` argument (it wins over the trainer's).
        evaluator: The resolved evaluator; one reading trainer metrics follows the trainer's own evaluations.
        args: The trainer's ``TrainingArguments``.
        state: The ``TrainerState`` (its ``eval_steps`` is the resolved one, fractions included).
    """
    if isinstance(eval_steps, int):
        return ("steps", eval_steps)
    if eval_steps == "epoch":
        return ("epoch", 0)
    kind = strategy(getattr(args, "eval_strategy", "no"))
    if evaluator.uses_trainer_metrics:
        return ("trainer", 0)  # every evaluation the trainer makes on its own schedule
    if kind == "epoch":
        return ("epoch", 0)
    n = getattr(state, "eval_steps", None) or getattr(args, "eval_steps", None)
    if kind != "steps" or not n:
        raise ValueError(NO_CADENCE)
    return ("steps", int(n))


class EvalSchedule:
    """Which steps are evaluated: the regular interval plus the hinted steps the budget allows.

    Args:
        budget: The limits on hinted evaluations (count and share of time).

    Attributes:
        cadence: ``(kind, interval)`` from :func:`resolve_cadence` (set at train start).
        last_eval_step: Step of the last evaluation applied, or None.
        hinted_step: The step a followed hint asks to evaluate, or None.
        extra_eval_steps: Steps of the evaluations made at a hint.
        eval_seconds: Evaluator seconds of each evaluation on this process.
        wall_offset, eval_offset: Wall and evaluator seconds of the run before a resume.
    """

    def __init__(self, budget: EvalBudget) -> None:
        self.budget = budget
        self.cadence: tuple[str, int] = ("steps", 0)
        self.last_eval_step: int | None = None
        self.hinted_step: int | None = None
        self.extra_eval_steps: list[int] = []
        self.eval_seconds: list[float] = []
        self.epoch_eval_at: int | None = None  # an epoch end asked the trainer to evaluate at this step
        self.wall_offset = 0.0
        self.eval_offset = 0.0
        self._t0 = time.perf_counter()

    def saved(self) -> dict[str, Any]:
        """The schedule's part of :class:`~evalstop_callbacks.state.CallbackState`."""
        return {
            "last_eval_step": self.last_eval_step,
            "extra_eval_steps": list(self.extra_eval_steps),
            "hinted_step": self.hinted_step,
            "wall_s": self.wall(),
            "eval_s": self.eval_time(),
        }

    def resume(self, saved: Any) -> None:
        """Continue the schedule of a resumed checkpoint (a :class:`~evalstop_callbacks.state.CallbackState`)."""
        self.last_eval_step = saved.last_eval_step
        self.hinted_step = saved.hinted_step
        self.extra_eval_steps = saved.extra_eval_steps
        self.wall_offset = saved.wall_s
        self.eval_offset = saved.eval_s

    def start_clock(self) -> None:
        """Training (re)starts now: wall time counts from here, on top of :attr:`wall_offset`."""
        self._t0 = time.perf_counter()

    def wall(self) -> float:
        """Wall seconds of the run so far (resumes included)."""
        return self.wall_offset + (time.perf_counter() - self._t0)

    def eval_time(self) -> float:
        """Evaluator seconds of the run so far (resumes included)."""
        return self.eval_offset + math.fsum(self.eval_seconds)

    def due(self, step: int, max_steps: int, any_step: bool = False) -> bool:
        """Whether ``step`` is evaluated: on the cadence, at the last step, or at a followed hint (``any_step``: every
        step after the last evaluation, as at an epoch end)."""
        if self.last_eval_step is not None and step <= self.last_eval_step:
            return False
        if any_step:
            return step > 0
        last = bool(max_steps) and step >= max_steps
        return step > 0 and (step % self.cadence[1] == 0 or last or step == self.hinted_step)

    def metrics_due(self, step: int, max_steps: int, eval_on_start: bool) -> bool:
        """Whether the trainer's evaluation at ``step`` is one to report (trainer metrics): step 0's baseline, every
        one on the trainer's own cadence, the one an epoch end asked for, or one due on a steps cadence."""
        if self.last_eval_step is not None and step <= self.last_eval_step:
            return False
        kind = self.cadence[0]
        return (
            (step == 0 and eval_on_start)
            or kind == "trainer"
            or self.epoch_eval_at == step
            or (kind == "steps" and self.due(step, max_steps))
        )

    def hint_allowed(self, step: int) -> bool:
        """Whether the budget leaves room for one more hinted evaluation after the one of ``step`` (counted as extra
        when it was hinted). Measured times: the main process decides and shares the answer with every rank."""
        extra = len(self.extra_eval_steps) + (step == self.hinted_step)
        return self.budget.allows(extra, self.eval_time(), self.wall())

    def record(self, step: int) -> bool:
        """``step`` was evaluated; returns whether it was a hinted (extra) evaluation."""
        self.last_eval_step = step
        extra = step == self.hinted_step
        if extra:
            self.extra_eval_steps.append(step)
        return extra

    def take_hint(self, step: int, decision: Decision, max_steps: int, allowed: bool = True) -> None:
        """Follow the decision's cadence hint if it is sooner than the next regular evaluation and ``allowed`` (the
        main process's :meth:`hint_allowed`, shared with every rank)."""
        self.hinted_step = None
        hint = decision.next_eval_step
        interval = self.cadence[1] if self.cadence[0] == "steps" else 0
        if hint is None or not interval or decision.should_stop:
            return
        if not allowed:
            logger.debug("EvalStop: hint to evaluate at step %s not followed: the eval budget is spent", hint)
            return
        next_regular = (step // interval + 1) * interval
        if max_steps:
            next_regular = min(next_regular, max_steps)
        if step < hint < next_regular:
            self.hinted_step = hint
