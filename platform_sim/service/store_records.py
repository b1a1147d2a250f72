"""The records the service's store reads and writes: tenants, jobs, report outcomes, events, webhooks and their
deliveries (plain dataclasses; :mod:`~platform_sim.service.store` holds the interface that persists them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import Decision, EvidenceMode, spec_plan_matters


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant of the service.

    Args:
        tenant_id: Internal numeric id (never shown to other tenants).
        name: Operator-chosen unique name.
        created_at: Unix time of creation.
        revoked_at: Unix time of revocation, or None while the token is valid.
    """

    tenant_id: int
    name: str
    created_at: float
    revoked_at: float | None = None


@dataclass(slots=True)
class JobRecord:
    """What the service knows about one job (the scheduler core's state lives in the store next to it).

    Args:
        job_id: The job's id, unique within its tenant.
        job_type: One of the core's job types.
        detector: The detector spec ``{"name": ..., "params": {...}}`` the job was registered with.
        gpus: GPUs the job declared, if any (for the GPU-hours-reclaimed metric).
        planned_steps: Planned training steps, if declared (for the GPU-hours-reclaimed estimate).
        created_at: Unix time of registration.
        n_reports: Number of accepted (distinct-step) reports.
        last_step: Step of the last accepted report.
        last_decision: The decision answered to the last accepted report.
        best_step: Step with the highest score so far.
        best_score: That score.
        stopped_at: Step at which the core stopped the job, if it did.
        finished_at: Unix time of the ``finish`` call, if any.
        finish_reason: The reason given to ``finish``.
        cadence: The cadence spec ``{"name": "adaptive", "params": {...}}`` the job was registered with, or None
            for the fixed cadence (no hints). A registration may give any spec the core's ``cadence_from_spec``
            takes; the store keeps the policy's normalized spec.
        finished_now: True only in the answer of the ``finish`` call that finished the job (not stored; a repeated
            finish answers False, so that metrics count each job once).
        stop_reason: The core's reason for the stop (the stopping decision's ``reason``), or None while not stopped.
        gpu_hours_freed: GPU-hours the stop gave back: ``gpus`` times the remaining planned steps at the job's
            measured step rate (server receive times of its first and its stopping report), 0.0 for a job that
            declared both and was not stopped, None when the job never said its ``gpus`` or ``planned_steps``.
    """

    job_id: str
    job_type: str
    detector: dict[str, Any]
    gpus: int | None = None
    planned_steps: int | None = None
    created_at: float = 0.0
    n_reports: int = 0
    last_step: int | None = None
    last_decision: Decision | None = None
    best_step: int | None = None
    best_score: float | None = None
    stopped_at: int | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    cadence: str | dict[str, Any] | None = None
    finished_now: bool = False
    stop_reason: str | None = None
    gpu_hours_freed: float | None = None

    @property
    def status(self) -> str:
        if self.finished_at is not None:
            return "finished"
        if self.stopped_at is not None:
            return "stopped"
        return "running"

    @property
    def mode(self) -> EvidenceMode | None:
        """The evidence the job's detector decided on at its last report, as the reason names it
        (:meth:`EvidenceMode.of_reason <platform_sim.core.EvidenceMode.of_reason>`): a stopped job's from the
        detector's stop reason (the stop decision's reason leads with the step it stopped at), a running job's from
        its last decision; None before the first report or when the reason names no mode."""
        if self.stop_reason:
            return EvidenceMode.of_reason(self.stop_reason)
        return None if self.last_decision is None else EvidenceMode.of_reason(self.last_decision.reason)

    @property
    def per_run_bound(self) -> bool | None:
        """Whether the job's detector bounds its false stops over the whole run: True with the job's planned steps,
        False without them (it then tests every report on its own, per look), None for a detector whose decisions do
        not depend on a plan (:attr:`Detector.plan_matters <platform_sim.core.Detector.plan_matters>`, read from the
        stored spec without building the detector: a listing asks it of every job)."""
        if not spec_plan_matters(self.detector):
            return None
        return self.planned_steps is not None


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """The result of one committed report.

    Args:
        decision: The core's decision (for a re-send: the decision given the first time).
        resend: True if the step was already stored with the same score (nothing new was written).
        stopped_now: True if this report made the core stop the job.
        gpu_hours_reclaimed: Estimated GPU-hours given back by this stop (0 unless ``stopped_now`` and the job
            declared ``gpus`` and ``planned_steps``).
    """

    decision: Decision
    resend: bool = False
    stopped_now: bool = False
    gpu_hours_reclaimed: float = 0.0


@dataclass(frozen=True, slots=True)
class StoredReport:
    """One stored report row (for audits and tests: every acknowledged report is here)."""

    step: int
    eval_score: float
    eval_scores: tuple[float, ...] | None
    decision: Decision
    received_at: float = field(default=0.0)
    eval_std: float | None = None
    eval_n: int | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the append-only audit trail (``events`` table), written in the transaction of what it records.

    Args:
        id: Monotone id (a later event has a larger id); the ``after`` cursor of :meth:`Store.list_events`.
        type: One of :data:`platform_sim.service.events.EVENT_TYPES` (``job.registered``, ``report.accepted``,
            ``job.stopped``, ``job.finished``, ``tenant.added``, ``tenant.revoked``, ``webhook.delivered``,
            ``webhook.failed``, ``actuation.started``, ``actuation.succeeded``, ``actuation.failed``,
            ``actuation.given_up``).
        tenant_id: The tenant it concerns.
        job_id: The job it concerns, or None (tenant events).
        time: Unix time (server clock) of the transaction that wrote it.
        details: The event's details (see ``docs/service.md``), a JSON object.
    """

    id: int
    type: str
    tenant_id: int
    job_id: str | None
    time: float
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TenantSummary:
    """A tenant's totals (``GET /v1/summary``).

    Args:
        running: Jobs neither stopped nor finished.
        stopped: Jobs the scheduler stopped and that are not marked finished.
        finished: Jobs marked finished (stopped before or not).
        stopped_total: Jobs the scheduler ever stopped (finished or not).
        gpu_hours_freed: Sum of the jobs' :attr:`JobRecord.gpu_hours_freed` (jobs without an estimate count 0).
    """

    running: int = 0
    stopped: int = 0
    finished: int = 0
    stopped_total: int = 0
    gpu_hours_freed: float = 0.0


@dataclass(frozen=True, slots=True)
class Webhook:
    """A tenant's webhook endpoint (``evalstop-server webhook add``).

    Args:
        webhook_id: Its id (``webhook remove ID``).
        tenant_id: Whose events it receives (only that tenant's).
        url: Where the events are POSTed.
        events: The event types it receives (full names, e.g. ``("job.stopped", "job.finished")``).
        created_at: Unix time of creation.
        secret: The HMAC-SHA256 signing key. Stored in plain text: the server must sign with it, so it cannot be
            kept hashed like a token; shown once by ``webhook add`` and never listed.
    """

    webhook_id: int
    tenant_id: int
    url: str
    events: tuple[str, ...]
    created_at: float
    secret: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One pending webhook delivery claimed from the outbox (``webhook_outbox`` row, its webhook and its event).

    Args:
        outbox_id: The outbox row.
        attempts: Attempts made before this one.
        webhook: The endpoint (with its secret, to sign).
        event: The event to deliver.
    """

    outbox_id: int
    attempts: int
    webhook: Webhook
    event: Event
