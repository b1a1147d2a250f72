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
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import Action, Decision, JobMonitor, Report, cadence_from_spec

from .store import JobExists, JobFinished, JobNotFound, JobRecord, ReportOutcome, StoredReport, StoreUnavailable

# The columns of a job listing: the job row and its last report's decision (LEFT JOIN: None before the first report).
JOB_COLUMNS = (
    "j.job_id, j.job_type, j.detector, j.gpus, j.planned_steps, j.created_at, j.n_reports, j.last_step, "
    "j.best_step, j.best_score, j.stopped_at, j.finished_at, j.finish_reason, j.cadence, "
    "r.action, r.reason, r.declines, r.best_step, r.best_score, r.next_eval_step"
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


def monitor_state(
    job_id: str,
    job_type: str,
    detector: str,
    detector_state: str,
    reps: Sequence[Sequence[Any]],
    best_step: int | None,
    best_score: float | None,
    stopped_at: int | None,
    stop_reason: str,
    cadence: str | None = None,
) -> dict[str, Any]:
    """The :meth:`JobMonitor.from_state_dict <platform_sim.core.monitor.JobMonitor.from_state_dict>` input of a job.

    Args:
        job_id: The job's id.
        job_type: The ``jobs.job_type`` column.
        detector: The ``jobs.detector`` column (JSON).
        detector_state: The ``jobs.detector_state`` column (JSON).
        reps: Report rows ``(step, eval_score, action, reason, declines, best_step, best_score, next_eval_step)``
            in step order.
        best_step: The ``jobs.best_step`` column.
        best_score: The ``jobs.best_score`` column.
        stopped_at: The ``jobs.stopped_at`` column.
        stop_reason: The ``jobs.stop_reason`` column.
        cadence: The ``jobs.cadence`` column (JSON; None: the fixed cadence).
    """
    state: dict[str, Any] = {
        "job_id": job_id,
        "job_type": job_type,
        "detector": json.loads(detector),
        "detector_state": json.loads(detector_state),
        "steps": [r[0] for r in reps],
        "scores": [r[1] for r in reps],
        "decisions": [
            {
                "action": r[2],
                "reason": r[3],
                "declines": r[4],
                "best_step": r[5],
                "best_score": r[6],
                "next_eval_step": r[7],
            }
            for r in reps
        ],
        "best_step": best_step,
        "best_score": best_score,
        "stopped_at": stopped_at,
        "stop_reason": stop_reason,
    }
    if cadence is not None:
        state["cadence"] = json.loads(cadence)
    return state


def report_row(key: tuple[Any, ...], report: Report, decision: Decision, now: float) -> tuple[Any, ...]:
    """The arguments of :attr:`Statements.insert_report` for an accepted report of job ``key`` (tenant, job id)."""
    return (
        *key,
        report.step,
        report.eval_score,
        None if report.eval_scores is None else json.dumps(list(report.eval_scores)),
        decision.action.value,
        decision.reason,
        decision.declines,
        decision.best_step,
        decision.best_score,
        now,
        decision.next_eval_step,
    )


def job_state_row(
    key: tuple[Any, ...], monitor: JobMonitor, n_reports: int, first_step: int | None, first_report_at: float | None
) -> tuple[Any, ...]:
    """The arguments of :attr:`Statements.update_job_state` for job ``key`` (tenant, job id) after its reports."""
    return (
        json.dumps(monitor.detector.state_dict()),
        n_reports,
        first_step,
        first_report_at,
        monitor.steps[-1],
        monitor.best_step,
        monitor.best_score,
        monitor.stopped_at,
        monitor.stop_reason,
        *key,
    )


MAX_RECLAIM_HOURS = 24.0 * 30
"""Most hours one stop is credited per GPU (30 days): a job's claims (GPUs, planned steps) are its own and unchecked,
so the estimate is bounded; with at most 65,536 GPUs one stop adds at most about 4.7e7 GPU-hours."""


def gpu_hours_reclaimed(
    gpus: int | None,
    planned_steps: int | None,
    first_step: int | None,
    first_report_at: float | None,
    step: int,
    now: float,
) -> float:
    """Estimated GPU-hours given back by stopping a job at ``step``: its remaining planned steps at the job's own
    observed pace (server clock), at most :data:`MAX_RECLAIM_HOURS` per GPU; 0 when the job did not declare ``gpus``
    and ``planned_steps`` or no pace is known.

    Args:
        gpus: GPUs the job declared.
        planned_steps: Planned training steps the job declared.
        first_step: Step of the job's first accepted report.
        first_report_at: Server time of that report.
        step: The step at which the job stopped.
        now: Server time of the stopping report.
    """
    if not (gpus and planned_steps) or first_step is None or first_report_at is None or step <= first_step:
        return 0.0
    sec_per_step = (now - first_report_at) / (step - first_step)
    hours_left = min(max(0, planned_steps - step) * sec_per_step / 3600.0, MAX_RECLAIM_HOURS)
    return gpus * hours_left


# -- the report transaction, shared by both stores ----------------------------------------------------------------

JOB_STATE_COLUMNS = (
    "job_type, detector, detector_state, best_step, best_score, stopped_at, stop_reason, n_reports, finished_at, "
    "gpus, planned_steps, first_step, first_report_at, last_step, cadence"
)
"""The ``jobs`` columns a report needs, in the order :func:`load_job_state` takes them."""
REPORT_STATE_COLUMNS = "step, eval_score, action, reason, declines, best_step, best_score, next_eval_step"
"""The ``reports`` columns a monitor is rebuilt from, in the order :func:`monitor_state` takes them."""


@dataclass(slots=True)
class JobState:
    """A job as a report transaction sees it: the core's monitor and the job columns the transaction updates.

    Args:
        monitor: The scheduler core's monitor, rebuilt from the rows (all of them, or only those a re-send can be
            compared with; see :func:`load_job_state`).
        gpus: The declared GPU count (for the GPU-hours-reclaimed estimate).
        planned_steps: The declared planned steps.
        first_step: Step of the first accepted report, if any.
        first_report_at: Server time of that report.
        n_reports: Accepted reports so far (the monitor may hold fewer steps than this).
        size: Approximate bytes the monitor holds in memory (:func:`monitor_size`), for a cache's budget.
    """

    monitor: JobMonitor
    gpus: int | None
    planned_steps: int | None
    first_step: int | None
    first_report_at: float | None
    n_reports: int
    size: int = 0


def monitor_size(detector_state_json: str, n_steps: int) -> int:
    """Approximate memory of a monitor: its detector state (about three times its JSON text as Python objects; the
    paired detectors keep a checkpoint's per-example scores there) and about 200 bytes per step held."""
    return 3 * len(detector_state_json) + 200 * n_steps


@dataclass(slots=True)
class Writes:
    """The rows a batch of report transactions writes, written with one ``executemany`` per table at the end.

    Args:
        report_rows: New ``reports`` rows (:attr:`Statements.insert_report` arguments).
        job_rows: The last ``jobs`` state update of each job touched (:attr:`Statements.update_job_state`).
    """

    report_rows: list[tuple[Any, ...]] = field(default_factory=list)
    job_rows: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)

    def flush(self, executemany: Any, stmts: Statements) -> None:
        """Write what was collected with ``executemany(statement, rows)`` and start over."""
        if self.report_rows:
            executemany(stmts.insert_report, self.report_rows)
            self.report_rows = []
        if self.job_rows:
            executemany(stmts.update_job_state, list(self.job_rows.values()))
            self.job_rows = {}


def load_job_state(job_id: str, row: Sequence[Any] | None, reps: Sequence[Sequence[Any]], complete: bool) -> JobState:
    """Rebuild a job's :class:`JobState` from its row (:data:`JOB_STATE_COLUMNS`) and report rows.

    Args:
        job_id: The job's id.
        row: The job row, or None when there is none.
        reps: Report rows (:data:`REPORT_STATE_COLUMNS`) in step order: all of them (``complete``), or at least the
            last one and the one of each step a re-send in this transaction may name. A job with a cadence needs all
            of them: its policy reads the whole history (the regular interval, the noise of the scores).
        complete: Whether ``reps`` holds every report of the job (checked against ``n_reports``).

    Raises:
        JobNotFound: no row.
        JobFinished: the job was marked finished.
        StoreUnavailable: the rows contradict each other (a report row is missing).
    """
    if row is None:
        raise JobNotFound(f"no job {job_id!r}")
    (
        job_type,
        detector,
        detector_state,
        best_step,
        best_score,
        stopped_at,
        stop_reason,
        n_reports,
        finished_at,
        gpus,
        planned_steps,
        first_step,
        first_report_at,
        last_step,
        cadence,
    ) = row
    if finished_at is not None:
        raise JobFinished(f"job {job_id!r} is finished; it takes no more reports")
    if cadence is not None and not complete:
        raise ValueError(f"job {job_id!r} has a cadence: its state is rebuilt from all of its report rows only")
    if complete and len(reps) != n_reports:
        raise StoreUnavailable(f"job {job_id!r} is inconsistent: {n_reports} reports counted, {len(reps)} stored")
    if not complete and last_step is not None and (not reps or reps[-1][0] != last_step):
        raise StoreUnavailable(f"job {job_id!r} is inconsistent: its last report (step {last_step}) is missing")
    state = monitor_state(
        job_id,
        job_type,
        detector,
        detector_state,
        reps,
        best_step=best_step,
        best_score=best_score,
        stopped_at=stopped_at,
        stop_reason=stop_reason,
        cadence=cadence,
    )
    return JobState(
        JobMonitor.from_state_dict(state),
        gpus,
        planned_steps,
        first_step,
        first_report_at,
        n_reports,
        monitor_size(detector_state, len(reps)),
    )


def apply_report(key: tuple[Any, ...], job: JobState, report: Report, writes: Writes) -> ReportOutcome:
    """The report transaction's work between loading the job and committing: apply the core, queue the rows.

    Args:
        key: ``(tenant_id, job_id)``.
        job: The job, loaded for update in the open transaction; changed in place.
        report: The whitelisted report.
        writes: Where the new report row and the job's state update go (nothing is queued when this raises, and
            nothing for a re-send).

    Raises:
        The core's ``InvalidReportError`` or ``ConflictError`` (nothing changed), or whatever the job's detector
        raises (its state is then undefined: the caller must drop ``job``).
    """
    monitor = job.monitor
    n_before = len(monitor.steps)
    was_stopped = monitor.stopped
    decision = monitor.observe_report(report)  # the core's one implementation
    if len(monitor.steps) == n_before:
        return ReportOutcome(decision, resend=True)
    now = time.time()
    first_step, first_at = (job.first_step, job.first_report_at) if job.first_step is not None else (report.step, now)
    # Both rows are built before either is queued: an error here leaves nothing of this report behind.
    report_args = report_row(key, report, decision, now)
    job_args = job_state_row(key, monitor, job.n_reports + 1, first_step, first_at)
    writes.report_rows.append(report_args)
    writes.job_rows[key] = job_args
    job.n_reports += 1
    job.first_step, job.first_report_at = first_step, first_at
    job.size = monitor_size(job_args[0], len(monitor.steps))
    stopped_now = monitor.stopped and not was_stopped
    reclaimed = 0.0
    if stopped_now:
        reclaimed = gpu_hours_reclaimed(job.gpus, job.planned_steps, first_step, first_at, report.step, now)
    return ReportOutcome(decision, resend=False, stopped_now=stopped_now, gpu_hours_reclaimed=reclaimed)
