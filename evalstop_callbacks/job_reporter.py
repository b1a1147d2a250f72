"""The callback's job at the scheduler: registered once, one report per evaluation, told when the run ends.

Everything here runs on the main process only; the callback shares what comes back with every rank
(:func:`~evalstop_callbacks.distributed.share_outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import Decision, EvidenceMode

from .client import BoundaryClient, make_report
from .evaluators import EvalResult, EvaluatorError, checked_result
from .nonfinite import NonFinitePolicy
from .settings import CallbackSettings


@dataclass
class JobReporter:
    """Registers the job on first use and turns each evaluation into a whitelisted :class:`Report`.

    Args:
        client: Where decisions come from (the embedded core or a scheduler service).
        settings: The callback's checked arguments (job type, detector and cadence specs).
        job_id: The job's id at the scheduler; None until the client chooses one at registration.
        registered: Whether :meth:`register` has run in this process (a resume registers again: idempotent).
        policy: The one non-finite policy (:mod:`~evalstop_callbacks.nonfinite`): its count of NaN or inf
            evaluations in a row, from ``settings.max_non_finite``.
    """

    client: BoundaryClient
    settings: CallbackSettings
    job_id: str | None = None
    registered: bool = False
    #: The evidence the last report carried (per-example scores, a mean with its spread, or the mean alone).
    last_mode: EvidenceMode | None = None
    policy: NonFinitePolicy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = NonFinitePolicy(self.settings.max_non_finite)

    def register(self, planned_steps: int | None = None) -> str:
        """Register the job (once), with the run's planned steps when known, and return its id."""
        if not self.registered:
            self.job_id, self.registered = self.settings.register(self.client, self.job_id, planned_steps), True
        if self.job_id is None:
            raise RuntimeError("EvalStop: the client returned no job id at registration")
        return self.job_id

    def report(
        self, step: int, result: object, evaluator: object, planned_steps: int | None = None
    ) -> tuple[EvalResult, Decision] | None:
        """Report the evaluation of ``step`` and return the checked result with the scheduler's decision; None for a
        NaN or inf evaluation, which is not reported (:meth:`skipped` says what every rank records).

        The report carries the result's spread (``EvalResult.std``/``n``: ``eval_std``/``eval_n``) when it has one,
        and the run's ``planned_steps`` (the trainer's ``max_steps``; None or 0: unknown), with which the default
        detector bounds its false stops per run rather than per eval.

        Raises:
            EvaluatorError: ``result`` is not a finite :class:`EvalResult`, or its spread is not finite (named with
                the job and the step).
            InvalidReportError: Its spread breaks the report's rules (``std`` without ``n``, ``n`` < 2, ...).
        """
        job_id = self.register()
        if isinstance(result, EvalResult):
            metric = getattr(evaluator, "metric", None) or type(evaluator).__name__
            if not self.policy.check(step, result.score, result.scores, metric=metric):
                return None
        checked = checked_result(result, evaluator, step)
        scores = tuple(checked.scores) if checked.scores else None
        job_type = self.settings.job_type
        report = make_report(
            job_id, job_type, step, checked.score, scores, EvaluatorError, checked.std, checked.n, planned_steps
        )
        self.last_mode = report.mode
        return checked, self.client.report(report)

    def payload(self, step: int, checked: EvalResult, decision: Decision, hint_allowed: bool) -> dict[str, Any]:
        """What the main process shares with every rank after a report (plain data): the step, the score, the
        decision, whether its cadence hint may be followed, and the evidence mode of the history entry: the one the
        decision's reason names, else the one the report carried (a scheduler whose reasons name none)."""
        named = EvidenceMode.of_reason(decision.reason)
        mode = named if named is not None else self.last_mode
        return {
            "step": step,
            "score": checked.score,
            "decision": decision.to_dict(),
            "hint_allowed": hint_allowed,
            "mode": None if mode is None else mode.value,
        }

    def skipped(self, step: int) -> dict[str, Any]:
        """The payload of a NaN or inf evaluation at ``step`` for every rank: what was non-finite, and the stop's
        reason when it was the last one the run may take (else None)."""
        reason = self.policy.reason() if self.policy.exhausted else None
        return {"step": step, "score": None, "non_finite": self.policy.last, "stop_reason": reason}

    def finish(self, reason: str) -> None:
        """Tell the scheduler the run ended (``"stopped"`` or ``"completed"``), if it was ever registered."""
        if self.registered and self.job_id is not None:
            self.client.finish(self.job_id, reason)
