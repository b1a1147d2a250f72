"""The callback's job at the scheduler: registered once, one report per evaluation, told when the run ends.

Everything here runs on the main process only; the callback shares what comes back with every rank
(:func:`~evalstop_callbacks.distributed.share_outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass

from platform_sim.core import Decision, Report

from .client import BoundaryClient, refuse_non_finite
from .evaluators import EvalResult, EvaluatorError, checked_result
from .settings import CallbackSettings


@dataclass
class JobReporter:
    """Registers the job on first use and turns each evaluation into a whitelisted :class:`Report`.

    Args:
        client: Where decisions come from (the embedded core or a scheduler service).
        settings: The callback's checked arguments (job type, detector and cadence specs).
        job_id: The job's id at the scheduler; None until the client chooses one at registration.
        registered: Whether :meth:`register` has run in this process (a resume registers again: idempotent).
    """

    client: BoundaryClient
    settings: CallbackSettings
    job_id: str | None = None
    registered: bool = False

    def register(self) -> str:
        """Register the job (once) and return its id."""
        if not self.registered:
            self.job_id, self.registered = self.settings.register(self.client, self.job_id), True
        if self.job_id is None:
            raise RuntimeError("EvalStop: the client returned no job id at registration")
        return self.job_id

    def report(self, step: int, result: object, evaluator: object) -> tuple[EvalResult, Decision]:
        """Report the evaluation of ``step`` and return the checked result with the scheduler's decision.

        Raises:
            EvaluatorError: ``result`` is not a finite :class:`EvalResult` (named with the job and the step).
        """
        job_id = self.register()
        if isinstance(result, EvalResult):  # the one non-finite policy: refused, naming the job and step
            refuse_non_finite(job_id, step, result.score, result.scores, EvaluatorError)
        checked = checked_result(result, evaluator, step)
        scores = tuple(checked.scores) if checked.scores else None
        return checked, self.client.report(Report(job_id, self.settings.job_type, step, checked.score, scores))

    def finish(self, reason: str) -> None:
        """Tell the scheduler the run ended (``"stopped"`` or ``"completed"``), if it was ever registered."""
        if self.registered and self.job_id is not None:
            self.client.finish(self.job_id, reason)
