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

from ..sql import JOB_SORTS
from ..store import JobRecord, Store

SORTS = tuple(JOB_SORTS)
"""The list's sort keys (the ``sort`` query parameter); the store sorts (:meth:`Store.iter_sorted_jobs
<platform_sim.service.store.Store.iter_sorted_jobs>`), a page at a time."""


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
    """

    step: int
    score: float
    action: str
    reason: str
    received_at: float


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


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of the job list.

    Args:
        rows: Its jobs, in order.
        total: Jobs matching the filter.
        page: Its number (from 1).
        pages: How many pages there are (at least 1).
    """

    rows: list[JobRow]
    total: int
    page: int
    pages: int


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

    def list_page(
        self,
        tenant_id: int,
        status: str | None,
        sort: str,
        descending: bool,
        page: int,
        per_page: int,
        pace: Callable[[], None],
    ) -> ListPage:
        """One page of the tenant's jobs (``status`` only, if given) sorted by ``sort`` (one of :data:`SORTS`) by
        the store, each with its last score; ``page`` (from 1) past the last is the last. ``pace()`` runs between
        jobs (:mod:`~platform_sim.service.fairness`)."""
        total = self.store.count_jobs(tenant_id, status)
        pages = max(1, -(-total // per_page))
        number = min(page, pages)
        jobs = self.store.iter_sorted_jobs(tenant_id, status, sort, descending, per_page, (number - 1) * per_page)
        rows = []
        for job in jobs:
            pace()
            rows.append(job)
        return ListPage(self.rows(tenant_id, rows, pace), total, number, pages)

    def job(self, tenant_id: int, job_id: str) -> JobRecord:
        """One of the tenant's jobs; raises :class:`~platform_sim.service.store.JobNotFound`."""
        return self.store.get_job(tenant_id, job_id)

    def row(self, job: JobRecord, last_score: float | None = None) -> JobRow:
        """``job`` as a row, with ``last_score`` if read."""
        declines = None if job.last_decision is None else job.last_decision.declines
        return JobRow(job, last_score, declines, job.stop_reason, gpu_hours_freed(job))

    def rows(self, tenant_id: int, jobs: list[JobRecord], pace: Callable[[], None] = lambda: None) -> list[JobRow]:
        """``jobs`` as rows, each with its last score (one indexed read per job: call it for one page of the list)."""
        out = []
        for job in jobs:
            pace()
            out.append(self.row(job, self.last_score(tenant_id, job)))
        return out

    def last_score(self, tenant_id: int, job: JobRecord) -> float | None:
        """The score of ``job``'s last report, or None before any (one indexed read)."""
        last = self.store.list_evals(tenant_id, job.job_id, order="newest", limit=1) if job.n_reports else []
        return last[0].eval_score if last else None

    def history_page(
        self, tenant_id: int, job_id: str, before: int | None, limit: int, pace: Callable[[], None]
    ) -> tuple[list[EvalPoint], bool]:
        """Up to ``limit`` of the job's reports, newest first, with steps below ``before`` (None: from the newest),
        and whether older ones remain. ``pace()`` runs between reports. Raises
        :class:`~platform_sim.service.store.JobNotFound`."""
        points = []
        for r in self.store.iter_evals(tenant_id, job_id, order="newest", limit=limit + 1, cursor=before):
            pace()
            points.append(EvalPoint(r.step, r.eval_score, r.decision.action.value, r.decision.reason, r.received_at))
        return points[:limit], len(points) > limit

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
