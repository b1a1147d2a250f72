"""SQL and row conversions shared by the SQLite and PostgreSQL stores.

Both stores keep the same tables (``tenants``, ``jobs``, ``reports``) with the same columns, so the statements that do
not depend on a store's concurrency design (reads, plain inserts and updates) and the conversions between rows and
:class:`~platform_sim.service.store.JobRecord` / :class:`~platform_sim.core.Decision` live here once. The two drivers
differ in their placeholder style (``sqlite3``: ``?``, ``psycopg``: ``%s``): :func:`statements` renders every
statement for one of them. What differs by design (SQLite's single writer with group commit, PostgreSQL's row locks
and ``ON CONFLICT``) stays in each store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from platform_sim.core import Action, Decision, cadence_from_spec

from .store import JobExists, JobRecord, StoredReport

# The columns of a job listing: the job row and its last report's decision (LEFT JOIN: None before the first report).
JOB_COLUMNS = (
    "j.job_id, j.job_type, j.detector, j.gpus, j.planned_steps, j.created_at, j.n_reports, j.last_step, "
    "j.best_step, j.best_score, j.stopped_at, j.finished_at, j.finish_reason, j.cadence, "
    "r.action, r.reason, r.declines, r.best_step, r.best_score, r.next_eval_step, "
    # The outcome (issue 32): the core's stop reason and the GPU-hours the stop freed.
    "j.stop_reason, j.gpu_hours_freed"
)
JOB_FROM = (
    "FROM jobs j LEFT JOIN reports r ON r.tenant_id = j.tenant_id AND r.job_id = j.job_id AND r.step = j.last_step"
)
TENANT_COLUMNS = "tenant_id, name, created_at, revoked_at"
STORED_REPORT_COLUMNS = (
    "step, eval_score, eval_scores, action, reason, declines, best_step, best_score, received_at, next_eval_step"
)

_STATUS_WHERE = {
    "finished": "j.finished_at IS NOT NULL",
    "stopped": "j.finished_at IS NULL AND j.stopped_at IS NOT NULL",
    "running": "j.finished_at IS NULL AND j.stopped_at IS NULL",
}


@dataclass(frozen=True, slots=True)
class Statements:
    """The shared statements rendered for one driver's placeholder style.

    Args:
        ph: The placeholder, ``"?"`` (sqlite3) or ``"%s"`` (psycopg).
        job_by_key: One job with its last decision (:data:`JOB_COLUMNS`), by ``(tenant_id, job_id)``.
        job_exists: ``SELECT 1`` of a job, by ``(tenant_id, job_id)``.
        insert_tenant: A new tenant, from ``(name, token_hash, created_at)``.
        list_tenants: All tenants (:data:`TENANT_COLUMNS`) in id order.
        tenant_by_token: The tenant (:data:`TENANT_COLUMNS`) holding a token hash.
        insert_job: A new job, from :func:`insert_job_args` (PostgreSQL appends its ``ON CONFLICT`` clause).
        insert_report: A report row, from :func:`report_row`.
        update_job_state: A job's scheduler state after reports, from :func:`job_state_row`.
        finish_job: Mark a job finished unless it already is (one row changed: it was finished now), from
            ``(finished_at, reason, tenant_id, job_id)``.
        stored_reports: A job's report rows (:data:`STORED_REPORT_COLUMNS`) in step order, by
            ``(tenant_id, job_id)``.
    """

    ph: str
    job_by_key: str
    job_exists: str
    insert_tenant: str
    list_tenants: str
    tenant_by_token: str
    insert_job: str
    insert_report: str
    update_job_state: str
    finish_job: str
    stored_reports: str


def statements(ph: str) -> Statements:
    """Render the shared statements with placeholder ``ph`` (``"?"`` or ``"%s"``)."""
    if ph not in ("?", "%s"):
        raise ValueError(f"placeholder must be '?' or '%s', got {ph!r}")
    p = ph
    return Statements(
        ph=p,
        job_by_key=f"SELECT {JOB_COLUMNS} {JOB_FROM} WHERE j.tenant_id = {p} AND j.job_id = {p}",
        job_exists=f"SELECT 1 FROM jobs WHERE tenant_id = {p} AND job_id = {p}",
        insert_tenant=f"INSERT INTO tenants (name, token_hash, created_at) VALUES ({p}, {p}, {p})",
        list_tenants=f"SELECT {TENANT_COLUMNS} FROM tenants ORDER BY tenant_id",
        tenant_by_token=f"SELECT {TENANT_COLUMNS} FROM tenants WHERE token_hash = {p}",
        insert_job=(
            "INSERT INTO jobs (tenant_id, job_id, job_type, detector, detector_state, gpus, planned_steps, "
            f"created_at, cadence, stop_reason) VALUES ({', '.join([p] * 9)}, '')"
        ),
        insert_report=(
            "INSERT INTO reports (tenant_id, job_id, step, eval_score, eval_scores, action, reason, declines, "
            f"best_step, best_score, received_at, next_eval_step) VALUES ({', '.join([p] * 12)})"
        ),
        update_job_state=(
            f"UPDATE jobs SET detector_state = {p}, n_reports = {p}, first_step = {p}, first_report_at = {p}, "
            f"last_step = {p}, best_step = {p}, best_score = {p}, stopped_at = {p}, stop_reason = {p} "
            f"WHERE tenant_id = {p} AND job_id = {p}"
        ),
        finish_job=(
            f"UPDATE jobs SET finished_at = {p}, finish_reason = {p} "
            f"WHERE tenant_id = {p} AND job_id = {p} AND finished_at IS NULL"
        ),
        stored_reports=(
            f"SELECT {STORED_REPORT_COLUMNS} FROM reports WHERE tenant_id = {p} AND job_id = {p} ORDER BY step"
        ),
    )


JOB_SORTS = {
    "job": "j.job_id",
    "type": "j.job_type",
    "status": "CASE WHEN j.finished_at IS NOT NULL THEN 'finished' WHEN j.stopped_at IS NOT NULL THEN 'stopped' "
    "ELSE 'running' END",
    "created": "j.created_at",
    "reports": "j.n_reports",
    "declines": "r.declines",
    "best_step": "j.best_step",
    "best_score": "j.best_score",
    "stop_step": "j.stopped_at",
    # As job_from_row: 0 for a job that declared its GPUs and planned steps and was not stopped.
    "gpu_hours": "CASE WHEN j.stopped_at IS NOT NULL OR COALESCE(j.gpus, 0) = 0 OR COALESCE(j.planned_steps, 0) = 0 "
    "THEN j.gpu_hours_freed ELSE 0.0 END",
}
"""The sort keys of :func:`sorted_jobs_query` (the dashboard's list), each as the SQL of a job listing's value."""


def _status_where(status: str | None) -> list[str]:
    if status is None:
        return []
    if status not in _STATUS_WHERE:
        raise ValueError(f"status must be running, stopped or finished, got {status!r}")
    return [_STATUS_WHERE[status]]


def sorted_jobs_query(
    ph: str, tenant_id: int, status: str | None, sort: str, descending: bool, limit: int, offset: int
) -> tuple[str, list[Any]]:
    """The statement and arguments of :meth:`Store.sorted_jobs <platform_sim.service.store.Store.sorted_jobs>`:
    the tenant's jobs ordered by ``sort`` (a key of :data:`JOB_SORTS`), jobs without a value last in either order,
    ties by job id; ``limit`` rows from ``offset``. The database sorts (a bounded top-N sort), not Python.

    Raises:
        ValueError: an unknown ``sort`` or ``status``, a negative ``offset``.
    """
    if sort not in JOB_SORTS:
        raise ValueError(f"sort must be one of {', '.join(JOB_SORTS)}, got {sort!r}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    key = JOB_SORTS[sort]
    where = " AND ".join([f"j.tenant_id = {ph}", *_status_where(status)])
    order = f"CASE WHEN {key} IS NULL THEN 1 ELSE 0 END, {key} {'DESC' if descending else 'ASC'}, j.job_id"
    query = f"SELECT {JOB_COLUMNS} {JOB_FROM} WHERE {where} ORDER BY {order} LIMIT {ph} OFFSET {ph}"
    return query, [tenant_id, int(limit), int(offset)]


def count_jobs_query(ph: str, tenant_id: int, status: str | None) -> tuple[str, list[Any]]:
    """The statement and arguments of :meth:`Store.count_jobs <platform_sim.service.store.Store.count_jobs>`."""
    where = " AND ".join([f"j.tenant_id = {ph}", *_status_where(status)])
    return f"SELECT COUNT(*) FROM jobs j WHERE {where}", [tenant_id]


def list_jobs_query(
    ph: str, tenant_id: int, status: str | None, limit: int, after: str | None
) -> tuple[str, list[Any]]:
    """The statement and arguments of :meth:`Store.list_jobs <platform_sim.service.store.Store.list_jobs>`.

    Args:
        ph: The driver's placeholder (``"?"`` or ``"%s"``).
        tenant_id: Whose jobs.
        status: ``"running"``, ``"stopped"``, ``"finished"`` or None for all.
        limit: Most rows.
        after: Only job ids greater than this (keyset pagination), or None.

    Raises:
        ValueError: ``status`` is not one of the three (checked before any query runs).
    """
    where = [f"j.tenant_id = {ph}"]
    args: list[Any] = [tenant_id]
    if after is not None:
        where.append(f"j.job_id > {ph}")
        args.append(after)
    if status is not None:
        if status not in _STATUS_WHERE:
            raise ValueError(f"status must be running, stopped or finished, got {status!r}")
        where.append(_STATUS_WHERE[status])
    args.append(int(limit))
    return f"SELECT {JOB_COLUMNS} {JOB_FROM} WHERE {' AND '.join(where)} ORDER BY j.job_id LIMIT {ph}", args


def decision_from_row(
    action: str,
    reason: str,
    declines: int,
    best_step: int | None,
    best_score: float | None,
    next_eval_step: int | None = None,
) -> Decision:
    """The :class:`~platform_sim.core.Decision` stored in a report row's decision columns."""
    return Decision(Action(action), reason, declines, best_step, best_score, next_eval_step)


def normalized_cadence(spec: Any) -> dict[str, Any] | None:
    """A job's cadence spec as stored: the policy's own spec (defaults filled in, so that equal cadences compare
    equal), or None for the fixed cadence (``None``, ``"fixed"`` or ``{"name": "fixed"}``).

    Raises:
        ValueError: The core's :func:`~platform_sim.core.cadence.cadence_from_spec` refuses the spec.
    """
    policy = cadence_from_spec(spec)
    return None if policy is None else policy.spec()


def job_from_row(row: Sequence[Any]) -> JobRecord:
    """The :class:`~platform_sim.service.store.JobRecord` of a row selected with :data:`JOB_COLUMNS`."""
    (
        job_id,
        job_type,
        detector,
        gpus,
        planned_steps,
        created_at,
        n_reports,
        last_step,
        best_step,
        best_score,
        stopped_at,
        finished_at,
        finish_reason,
        cadence,
        r_action,
        r_reason,
        r_declines,
        r_best_step,
        r_best_score,
        r_next_eval_step,
        stop_reason,
        gpu_hours_freed,
    ) = row
    last = (
        None
        if r_action is None
        else decision_from_row(r_action, r_reason, r_declines, r_best_step, r_best_score, r_next_eval_step)
    )
    return JobRecord(
        job_id=job_id,
        job_type=job_type,
        detector=json.loads(detector),
        gpus=gpus,
        planned_steps=planned_steps,
        created_at=created_at,
        n_reports=n_reports,
        last_step=last_step,
        last_decision=last,
        best_step=best_step,
        best_score=best_score,
        stopped_at=stopped_at,
        finished_at=finished_at,
        finish_reason=finish_reason,
        cadence=None if cadence is None else json.loads(cadence),
        stop_reason=stop_reason if stopped_at is not None else None,
        gpu_hours_freed=gpu_hours_freed if stopped_at is not None or not (gpus and planned_steps) else 0.0,
    )


def stored_report_from_row(row: Sequence[Any]) -> StoredReport:
    """The :class:`~platform_sim.service.store.StoredReport` of a row selected with :data:`STORED_REPORT_COLUMNS`."""
    return StoredReport(
        row[0],
        row[1],
        None if row[2] is None else tuple(json.loads(row[2])),
        decision_from_row(row[3], row[4], row[5], row[6], row[7], row[9]),
        row[8],
    )


def check_same_registration(
    existing: JobRecord, record: JobRecord, spec: dict[str, Any], cadence: dict[str, Any] | None
) -> None:
    """Raise :class:`~platform_sim.service.store.JobExists` unless a repeated registration matches the stored job.

    Args:
        existing: The stored job.
        record: The registration request.
        spec: The request's normalized detector spec.
        cadence: The request's normalized cadence spec (:func:`normalized_cadence`; None: fixed).
    """
    if (existing.job_type, existing.detector, existing.gpus, existing.cadence) != (
        record.job_type,
        spec,
        record.gpus,
        cadence,
    ):
        raise JobExists(
            f"job {record.job_id!r} is already registered with job_type={existing.job_type!r}, "
            f"detector={json.dumps(existing.detector)}, gpus={existing.gpus}, "
            f"cadence={json.dumps(existing.cadence or 'fixed')}"
        )


def insert_job_args(
    tenant_id: int,
    record: JobRecord,
    spec: dict[str, Any],
    detector_state: Any,
    now: float,
    cadence: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """The arguments of :attr:`Statements.insert_job` for a new job (``cadence``: its normalized cadence spec,
    None for the fixed cadence)."""
    return (
        tenant_id,
        record.job_id,
        record.job_type,
        json.dumps(spec),
        json.dumps(detector_state),
        record.gpus,
        record.planned_steps,
        now,
        None if cadence is None else json.dumps(cadence),
    )


def new_job_record(
    record: JobRecord, spec: dict[str, Any], now: float, cadence: dict[str, Any] | None = None
) -> JobRecord:
    """The record answered for a job just registered (no reports yet)."""
    return JobRecord(
        job_id=record.job_id,
        job_type=record.job_type,
        detector=spec,
        gpus=record.gpus,
        planned_steps=record.planned_steps,
        created_at=now,
        cadence=cadence,
    )
