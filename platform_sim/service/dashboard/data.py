"""What the dashboard's pages read, and the one place where they read it from the store.

The pages never call the store themselves: they get :class:`JobRow`, :class:`EvalPoint`, :class:`Totals` and
:class:`EventRow` from :class:`DashboardData`, so that what the store offers can change in this module alone.
Every call here is blocking; the routes run them off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store import JobRecord, Store

MAX_JOBS = 10_000
"""Most jobs of a tenant the dashboard sorts in memory (the list says when a tenant has more)."""
PAGE_SIZE = 1000
"""Jobs read per store call while listing."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as the list and the job page show it.

    Args:
        job: The job's record.
        last_score: Score of its last accepted report, or None before any (or when not read, see
            :meth:`DashboardData.rows`).
        declines: The detector's evidence count after the last report, or None before any.
        stop_reason: Why the core stopped it, or None while it was not stopped.
        gpu_hours_freed: GPU-hours its stop freed (0 while not stopped), or None when the job never said its GPUs
            or planned steps.
    """

    job: JobRecord
    last_score: float | None
    declines: int | None
    stop_reason: str | None
    gpu_hours_freed: float | None

    @property
    def stop_step(self) -> int | None:
        return self.job.stopped_at


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """One stored report of a job.

    Args:
        step: Its step.
        score: Its eval score.
        action: The decision answered (``continue`` or ``stop``).
        reason: The decision's reason.
        received_at: Unix time it was received.
        std: The report's ``eval_std`` (the spread of its example scores), or None.
        n: The report's ``eval_n``, or None.
    """

    step: int
    score: float
    action: str
    reason: str
    received_at: float
    std: float | None = None
    n: int | None = None


@dataclass(frozen=True, slots=True)
class Totals:
    """A tenant's totals.

    Args:
        running: Jobs running.
        stopped: Jobs the core stopped (and not yet finished).
        finished: Jobs finished.
        gpu_hours_freed: GPU-hours freed by its stops (jobs without an estimate count 0).
    """

    running: int
    stopped: int
    finished: int
    gpu_hours_freed: float


@dataclass(frozen=True, slots=True)
class EventRow:
    """One event of the tenant's audit trail.

    Args:
        event_id: Its id (monotone).
        type: Its type (``job.registered``, ``job.stopped``, ...).
        job_id: The job it is about, or None.
        time: Unix time it happened.
        details: Its details in one line.
    """

    event_id: int
    type: str
    job_id: str | None
    time: float
    details: str


def gpu_hours_freed(job: JobRecord) -> float | None:
    """GPU-hours ``job``'s stop freed (0 while running), or None when the job never said its GPUs or planned steps."""
    return job.gpu_hours_freed


def event_details(details: dict[str, Any]) -> str:
    """An event's details in one line (``key=value``, JSON values)."""
    return ", ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in details.items())


class DashboardData:
    """The dashboard's reads of one store.

    Args:
        store: The service's store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def jobs(self, tenant_id: int, status: str | None = None) -> tuple[list[JobRecord], bool]:
        """The tenant's jobs (``status`` only, if given), :data:`MAX_JOBS` at most, and whether there were more."""
        out: list[JobRecord] = []
        after: str | None = None
        while len(out) < MAX_JOBS:
            page = self.store.list_jobs(tenant_id, status=status, limit=PAGE_SIZE, after=after)
            out.extend(page)
            if len(page) < PAGE_SIZE:
                return out, False
            after = page[-1].job_id
        return out[:MAX_JOBS], True

    def job(self, tenant_id: int, job_id: str) -> JobRecord:
        """One of the tenant's jobs; raises :class:`~platform_sim.service.store.JobNotFound`."""
        return self.store.get_job(tenant_id, job_id)

    def row(self, job: JobRecord, last_score: float | None = None) -> JobRow:
        """``job`` as a row, with ``last_score`` if read."""
        declines = None if job.last_decision is None else job.last_decision.declines
        return JobRow(job, last_score, declines, job.stop_reason, gpu_hours_freed(job))

    def rows(self, tenant_id: int, jobs: list[JobRecord]) -> list[JobRow]:
        """``jobs`` as rows, each with its last score (one indexed read per job: call it for one page of the list)."""
        out = []
        for job in jobs:
            last = self.store.list_evals(tenant_id, job.job_id, order="newest", limit=1) if job.n_reports else []
            out.append(self.row(job, last[0].eval_score if last else None))
        return out

    def history(self, tenant_id: int, job_id: str) -> list[EvalPoint]:
        """The job's stored reports in step order; raises :class:`~platform_sim.service.store.JobNotFound`."""
        return [
            EvalPoint(
                r.step, r.eval_score, r.decision.action.value, r.decision.reason, r.received_at, r.eval_std, r.eval_n
            )
            for r in self.store.reports(tenant_id, job_id)
        ]

    def totals(self, tenant_id: int) -> Totals:
        """The tenant's totals (``GET /v1/summary``)."""
        s = self.store.summary(tenant_id)
        return Totals(s.running, s.stopped, s.finished, s.gpu_hours_freed)

    def events(self, tenant_id: int, limit: int = 10) -> list[EventRow]:
        """The tenant's ``limit`` most recent events, newest first."""
        return [
            EventRow(e.id, e.type, e.job_id, e.time, event_details(e.details))
            for e in self.store.recent_events(tenant_id, limit)
        ]


def _declines(job: JobRecord) -> int | None:
    return None if job.last_decision is None else job.last_decision.declines


SORTS: dict[str, Callable[[JobRecord], Any]] = {
    "job": lambda j: j.job_id,
    "type": lambda j: j.job_type,
    "status": lambda j: j.status,
    "created": lambda j: j.created_at,
    "reports": lambda j: j.n_reports,
    "declines": _declines,
    "best_step": lambda j: j.best_step,
    "best_score": lambda j: j.best_score,
    "stop_step": lambda j: j.stopped_at,
    "gpu_hours": gpu_hours_freed,
}
"""The list's sort keys (the ``sort`` query parameter), each a key of a job's record."""


def sort_jobs(jobs: list[JobRecord], sort: str, descending: bool) -> list[JobRecord]:
    """``jobs`` sorted by the key named ``sort`` (one of :data:`SORTS`), jobs without a value last either way, ties
    by job id.

    Args:
        jobs: The jobs.
        sort: A key of :data:`SORTS`.
        descending: Largest first.
    """
    key = SORTS[sort]
    known = [j for j in jobs if key(j) is not None]
    unknown = sorted((j for j in jobs if key(j) is None), key=lambda j: j.job_id)
    known.sort(key=lambda j: j.job_id)
    known.sort(key=key, reverse=descending)  # stable: equal values stay in id order
    return known + unknown
