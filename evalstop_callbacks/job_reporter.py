"""The callback's job at the scheduler: registered once, one report per evaluation, told when the run ends.

Everything here runs on the main process only; the callback shares what comes back with every rank
(:func:`~evalstop_callbacks.distributed.share_outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import Decision, Report

from .client import BoundaryClient
from .evaluators import EvalResult, checked_result
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
    policy: NonFinitePolicy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = NonFinitePolicy(self.settings.max_non_finite)

    def register(self) -> str:
        """Register the job (once) and return its id."""
        if not self.registered:
            self.job_id, self.registered = self.settings.register(self.client, self.job_id), True
        if self.job_id is None:
            raise RuntimeError("EvalStop: the client returned no job id at registration")
        return self.job_id

    def report(self, step: int, result: object, evaluator: object) -> tuple[EvalResult, Decision] | None:
        """Report the evaluation of ``step`` and return the checked result with the scheduler's decision; None for a
        NaN or inf evaluation, which is not reported (:meth:`skipped` says what every rank records).

        Raises:
            EvaluatorError: ``result`` is not an :class:`EvalResult` (named with the job and the step).
        """
        job_id = self.register()
        if isinstance(result, EvalResult):
            metric = getattr(evaluator, "metric", None) or type(evaluator).__name__
            if not self.policy.check(step, result.score, result.scores, metric=metric):
                return None
        checked = checked_result(result, evaluator, step)
        scores = tuple(checked.scores) if checked.scores else None
        return checked, self.client.report(Report(job_id, self.settings.job_type, step, checked.score, scores))

    def skipped(self, step: int) -> dict[str, Any]:
        """The payload of a NaN or inf evaluation at ``step`` for every rank: what was non-finite, and the stop's
        reason when it was the last one the run may take (else None)."""
        reason = self.policy.reason() if self.policy.exhausted else None
        return {"step": step, "score": None, "non_finite": self.policy.last, "stop_reason": reason}

    def finish(self, reason: str) -> None:
        """Tell the scheduler the run ended (``"stopped"`` or ``"completed"``), if it was ever registered."""
        if self.registered and self.job_id is not None:
            self.client.finish(self.job_id, reason)
