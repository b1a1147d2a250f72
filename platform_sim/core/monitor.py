"""Per-job observed state: validation of the eval stream, best-checkpoint bookkeeping and the stop latch.

:class:`JobMonitor` is what every adapter calls. It enforces the eval stream's rules (finite scores within
:data:`~platform_sim.core.boundary.MAX_ABS_SCORE`, strictly increasing steps, idempotent re-sends, conflicts as
errors), feeds valid evals to the job's detector, keeps the best step (highest score, earliest on ties, among the
evaluations up to the stop), and latches STOP: once a job is stopped every later decision is STOP. A rejected report
never changes the state. With a cadence policy that confirms weak stops, a stop whose doubt is above its ``confirm``
becomes a CONTINUE that asks for the next eval sooner, and the stop is taken there if the detector stops the job again.

**An extra eval is a look, not a point of the job's history** (unless the detector says otherwise). An eval that a
cadence hint asked for (the previous decision named a ``next_eval_step`` and the eval comes before the job's next
regular one) is judged by the detector like any other, and may stop the job; if it does not, the detector forgets it,
and the job waits for its next regular eval (one look per interval, unless a weak stop at the look asks for a second).
So every regular eval is judged on the regular evals alone, as at the fixed cadence, and without ``confirm`` a hint can
only bring a stop sooner, never lose or delay one. Had the detector kept them, a job that keeps asking for sooner
evals on a slow decline would fill a windowed detector's window (``trend``'s last 6 evals) with evals a step apart,
in which a slow fall is invisible, and might never stop: measured on the recorded ``format`` runs
(docs/results/cadence-dense-traces.md). A detector that models the whole curve against the step (``shape``) keeps them
(:attr:`~platform_sim.core.detectors.Detector.keeps_extra_evals`). Which evals were extra follows from the steps and
the decisions alone (:func:`extra_evals`), so a monitor rebuilt from its report rows knows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from .boundary import (
    MAX_ABS_SCORE,
    Action,
    ConflictError,
    Decision,
    EvidenceMode,
    InvalidReportError,
    Report,
    check_finite_score,
    check_finite_score_array,
    check_finite_scores,
    check_job_type,
    check_planned_steps,
    check_step,
    is_array,
)
from .cadence import CadencePolicy, cadence_from_spec
from .detectors import Detector, Spread, detector_from_spec, paper_spec

CONFIRMING = "confirming a stop"
"""How the reason of a CONTINUE decision that asks for a second look at a weak stop begins (``CadencePolicy.confirm``)."""


def _unlabeled(reason: str) -> str:
    """``reason`` without the evidence mode that leads it (:meth:`EvidenceMode.label`), if it names one."""
    mode = EvidenceMode.of_reason(reason)
    return reason if mode is None else reason[len(mode.value) + 2 :]


def extra_evals(steps: Sequence[int], hints: Sequence[int | None]) -> list[bool]:
    """Which evals of a job were extra: asked for by a cadence hint, before the job's next regular eval.

    Args:
        steps: The job's evaluated steps, strictly increasing.
        hints: The ``next_eval_step`` of the decision after each of them (None: no hint); as long as ``steps``.

    Returns:
        Per eval, True when the decision before it named a hint and the eval comes before the next regular one: the
        last regular eval's step plus the regular interval (the largest gap between two consecutive regular evals,
        the first counted from step 0, as :meth:`CadencePolicy.regular_interval`). A job whose client could not
        follow a hint reports its next regular eval, which counts as regular.
    """
    flags: list[bool] = []
    regular: list[int] = []
    for i, step in enumerate(steps):
        interval = CadencePolicy.regular_interval(regular)
        extra = i > 0 and hints[i - 1] is not None and interval is not None and step < regular[-1] + interval
        flags.append(extra)
        if not extra:
            regular.append(step)
    return flags


@dataclass(slots=True)
class JobMonitor:
    """The scheduler's view of one job's evaluations.

    Args:
        job_id: The job's identifier.
        job_type: One of :data:`~platform_sim.core.boundary.JOB_TYPES`.
        detector: The stop detector of this job (default: the paper's k=2 rule, ``paper_spec()``: the core's
            monitor is the paper's; the callback and the service pass the project's default detector explicitly).
        cadence: Optional cadence policy: while the job runs, each decision carries its ``next_eval_step`` hint.
            None (the default): no hints, the job keeps its regular interval.
    """

    job_id: str
    job_type: str = "rlhf"
    detector: Detector = field(default_factory=lambda: detector_from_spec(paper_spec()))
    steps: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    best_step: int | None = None
    best_score: float | None = None
    stopped_at: int | None = None
    stop_reason: str = ""
    cadence: CadencePolicy | None = None

    def __post_init__(self) -> None:
        check_job_type(self.job_type)

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    @property
    def last_decision(self) -> Decision | None:
        return self.decisions[-1] if self.decisions else None

    def observe_report(self, report: Report) -> Decision:
        """Apply a whitelisted report; the report's job must be this job."""
        if report.job_id != self.job_id:
            raise InvalidReportError(f"report for job {report.job_id!r} sent to job {self.job_id!r}")
        if report.job_type != self.job_type:
            raise ConflictError(f"job {self.job_id!r} is of type {self.job_type!r}, report says {report.job_type!r}")
        return self.observe(
            report.step, report.eval_score, report.eval_scores, report.eval_std, report.eval_n, report.planned_steps
        )

    def observe(
        self,
        step: int,
        score: float,
        scores: Sequence[float] | None = None,
        eval_std: float | None = None,
        eval_n: int | None = None,
        planned_steps: int | None = None,
    ) -> Decision:
        """Take the eval of ``step`` and return the decision.

        ``eval_std`` and ``eval_n`` (together, as a :class:`~platform_sim.core.boundary.Report` carries them, and
        checked by its rules) are the spread of the eval's example scores; the detector decides on the richest
        evidence it can use, and the decision's reason begins with that mode
        (:meth:`~platform_sim.core.boundary.EvidenceMode.label`). ``planned_steps`` (a report's, checked by its
        rule: an integer >= 1) is handed to the detector (:meth:`~platform_sim.core.detectors.Detector.plan`) before
        the eval.

        Raises:
            InvalidReportError: ``score`` or one of ``scores`` is not a finite number of magnitude at most
                :data:`~platform_sim.core.boundary.MAX_ABS_SCORE`, or ``step`` is not an integer >= 0; or the
                detector refuses the evaluation (e.g. per-example scores of another length).
            ConflictError: ``step`` was seen with another score, or is older than the last step.

        A rejected report changes nothing. Any other exception comes from the detector (a bug) and may leave the
        detector's state half-updated: the caller must drop this monitor and rebuild it from its last saved state
        (the service's stores do).
        """
        # Fast paths for the common valid case (the simulator calls this ~10^6 times); anything else goes through the
        # full checks, which raise the errors. The range test is false for NaN, +-inf and magnitudes over the bound.
        if type(step) is not int or step < 0:
            step = check_step(step)
        if type(score) is not float or not -MAX_ABS_SCORE <= score <= MAX_ABS_SCORE:
            score = check_finite_score(score)
        if self.steps and step <= self.steps[-1]:
            return self._resend(step, score)
        if scores is not None:
            if is_array(scores):
                # The simulator's rows: a float64 vector checked in two reductions, kept as a read-only array for a
                # detector that takes one (no conversion to Python floats per eval), else a tuple as before.
                row = check_finite_score_array(scores)
                scores = cast("Sequence[float]", row)
                if is_array(row) and not self.detector.takes_score_arrays:
                    scores = tuple(row.tolist())
            else:
                # Same checks as Report: a non-number must be a clear InvalidReportError, not a TypeError from
                # isfinite. (A tuple, what a Report hands on, is none of those: no ABC check per eval.)
                if type(scores) is not tuple and (
                    isinstance(scores, (str, bytes, Mapping)) or not hasattr(scores, "__iter__")
                ):
                    raise InvalidReportError("eval_scores must be a list of numbers")
                scores = check_finite_scores(scores)
            if not len(scores):
                raise InvalidReportError("eval_scores must not be empty when given")
        spread = None
        if eval_std is not None or eval_n is not None:
            # The report's own checks (together, finite, >= 0, n >= 2, agreeing with the scores): one set of rules.
            # (A float64 array of scores is read by Report's check as any sequence is.)
            example_scores = cast("tuple[float, ...] | None", scores)
            checked = Report(self.job_id, self.job_type, step, score, example_scores, eval_std, eval_n)
            assert checked.eval_std is not None and checked.eval_n is not None
            spread = Spread(checked.eval_std, checked.eval_n)
        if planned_steps is not None:
            planned_steps = check_planned_steps(planned_steps)
        forget = not self.detector.keeps_extra_evals and self._next_is_extra(step)
        snapshot = self.detector.state_dict() if forget else None
        self.detector.plan(planned_steps)
        verdict = self.detector.judge(step, score, scores, spread)
        mode = self.detector.mode()
        self.steps.append(step)
        self.scores.append(score)
        # A stopped job's best is the checkpoint that exists: the best among the evaluations up to and including the
        # one that stopped it. Evaluations after the stop (a job that keeps reporting) are answered STOP and never
        # move the best, so best_step always names a checkpoint taken before the stop.
        if self.stopped_at is None and (self.best_score is None or score > self.best_score):
            self.best_step, self.best_score = step, score
        confirm_at = None
        if self.stopped_at is None and verdict.stop:
            if self.cadence is not None and not self._confirming():
                confirm_at = self.cadence.confirm_step(self.steps, self.detector.doubt())
            if confirm_at is None:
                self.stopped_at = step
                self.stop_reason = mode.label(verdict.reason)
        if confirm_at is not None:  # a weak stop: look once more, a share of an interval later, before taking it
            decision = Decision(
                Action.CONTINUE,
                mode.label(f"{CONFIRMING}: {verdict.reason}"),
                self.detector.declines,
                self.best_step,
                self.best_score,
                confirm_at,
            )
        else:
            decision = self._decision(mode, after_look=snapshot is not None)
        self.decisions.append(decision)
        if snapshot is not None and self.stopped_at is None:
            # An extra eval that did not stop the job: the detector forgets it (module docstring), after the decision
            # and its hint were read from it.
            self.detector.load_state_dict(snapshot)
        return decision

    def _next_is_extra(self, step: int) -> bool:
        """Whether an eval at ``step`` (after the last one) is an extra eval (:func:`extra_evals`)."""
        if not self.decisions or self.decisions[-1].next_eval_step is None:
            return False  # the common case, without reading the history
        return extra_evals([*self.steps, step], [*(d.next_eval_step for d in self.decisions), None])[-1]

    def _confirming(self) -> bool:
        """Whether the eval being judged is the second look at a weak stop (the previous decision asked for it): its
        stop is taken whatever its doubt. Read from the stored decisions, so a monitor rebuilt from its state, or a
        service's report rows, knows it too."""
        prev = self.decisions[-1] if self.decisions else None
        return prev is not None and prev.action is Action.CONTINUE and _unlabeled(prev.reason).startswith(CONFIRMING)

    def _resend(self, step: int, score: float) -> Decision:
        # A re-send of a seen step (a client retry after a lost reply) gets the decision it got then; anything else
        # that goes back in time is a conflict, because silently accepting it would change the job's history.
        lo, hi = 0, len(self.steps)
        while lo < hi:  # binary search: steps are strictly increasing
            mid = (lo + hi) // 2
            if self.steps[mid] < step:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.steps) and self.steps[lo] == step:
            if self.scores[lo] == score:
                return self.decisions[lo]
            raise ConflictError(
                f"job {self.job_id!r} already reported step {step} with eval_score {self.scores[lo]!r}, now {score!r}"
            )
        raise ConflictError(
            f"job {self.job_id!r}: step {step} is older than the last reported step {self.steps[-1]}; "
            "steps must strictly increase"
        )

    def _decision(self, mode: EvidenceMode, after_look: bool = False) -> Decision:
        if self.stopped_at is not None:
            # The mode that stopped the job, whatever the eval after the stop carried (a stop reason of an earlier
            # version names none).
            stop_mode = EvidenceMode.of_reason(self.stop_reason)
            why = f"stopped at step {self.stopped_at}: {_unlabeled(self.stop_reason)}"
            return Decision(
                Action.STOP,
                why if stop_mode is None else stop_mode.label(why),
                self.detector.declines,
                self.best_step,
                self.best_score,
            )
        # One look per regular interval: once a look is forgotten, the detector's state, and so the doubt that asked
        # for it, is the regular one again; a second look would ask the same question a step later. (Measured on the
        # dense tune traces: a third of the extra evals for half a step more median delay, docs/results/cadence-dense-traces.md.)
        hint = None
        if self.cadence is not None and not after_look:
            hint = self.cadence.for_history(self.steps, self.scores, self.detector)
        return Decision(
            Action.CONTINUE, mode.label("no stop signal"), self.detector.declines, self.best_step, self.best_score, hint
        )

    # -- persistence ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this monitor, as plain JSON-serializable data (``cadence`` only when set, so
        states of monitors without one are unchanged)."""
        state: dict[str, Any] = {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "detector": self.detector.spec(),
            "detector_state": self.detector.state_dict(),
            "steps": list(self.steps),
            "scores": list(self.scores),
            "decisions": [d.to_dict() for d in self.decisions],
            "best_step": self.best_step,
            "best_score": self.best_score,
            "stopped_at": self.stopped_at,
            "stop_reason": self.stop_reason,
        }
        if self.cadence is not None:
            state["cadence"] = self.cadence.spec()
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> JobMonitor:
        detector = detector_from_spec(state["detector"])
        detector.load_state_dict(state["detector_state"])
        return cls(
            job_id=state["job_id"],
            job_type=state["job_type"],
            detector=detector,
            steps=list(state["steps"]),
            scores=list(state["scores"]),
            decisions=[Decision.from_dict(d) for d in state["decisions"]],
            best_step=state["best_step"],
            best_score=state["best_score"],
            stopped_at=state["stopped_at"],
            stop_reason=state["stop_reason"],
            cadence=cadence_from_spec(state.get("cadence")),
        )
