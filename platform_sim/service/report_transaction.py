"""The report transaction both stores run: rebuild the job's monitor from its rows, apply the core, queue the rows.

A store loads a job "for update" its own way (SQLite: under its single writer, from a cache it keeps valid;
PostgreSQL: ``SELECT ... FOR UPDATE`` in every replica), then hands the rows to :func:`load_job_state` and each report
to :func:`apply_report`, which queues the rows to write in a :class:`Writes`; the store writes them and commits. So
the decision of a report is the same whichever store holds the job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from platform_sim.core import Decision, JobMonitor, Report

from . import events
from .sql import Statements
from .store import JobFinished, JobNotFound, ReportOutcome, StoreUnavailable
from .store_actuation import QUEUE_ACTUATION, queue_row


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
    """The arguments of :attr:`~.sql.Statements.insert_report` for an accepted report of job ``key`` (tenant, job id)."""
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
        report.eval_std,
        report.eval_n,
    )


def job_state_row(
    key: tuple[Any, ...], monitor: JobMonitor, n_reports: int, first_step: int | None, first_report_at: float | None
) -> tuple[Any, ...]:
    """The arguments of :attr:`~.sql.Statements.update_job_state` for job ``key`` (tenant, job id) after its reports."""
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
    paired detectors keep a checkpoint's per-example scores there, and a packed score, 10.7 characters of base64,
    is a float of 24 bytes and its 8-byte slot once loaded) and about 200 bytes per step held."""
    return 3 * len(detector_state_json) + 200 * n_steps


SET_GPU_HOURS_FREED = "UPDATE jobs SET gpu_hours_freed = {p} WHERE tenant_id = {p} AND job_id = {p}"
"""Written once per job, by the report that stops it (``{p}``: the driver's placeholder)."""


@dataclass(slots=True)
class Writes:
    """The rows a batch of report transactions writes, written with one ``executemany`` per table at the end.

    Args:
        report_rows: New ``reports`` rows (:attr:`~.sql.Statements.insert_report` arguments).
        job_rows: The last ``jobs`` state update of each job touched (:attr:`~.sql.Statements.update_job_state`).
    """

    report_rows: list[tuple[Any, ...]] = field(default_factory=list)
    job_rows: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)
    event_rows: list[tuple[Any, ...]] = field(default_factory=list)
    freed_rows: list[tuple[Any, ...]] = field(default_factory=list)
    # Jobs stopped in this batch: their stop action is queued in the same commit (a job without a handle gets none).
    actuation_rows: list[tuple[Any, ...]] = field(default_factory=list)

    def flush(self, executemany: Any, stmts: Statements, write_events: Any = None) -> None:
        """Write what was collected with ``executemany(statement, rows)`` and start over.

        Args:
            executemany: The driver's ``executemany``.
            stmts: The store's statements.
            write_events: ``write_events(rows)`` writes the :attr:`event_rows` (and their outbox rows) the store's
                way; None: one ``executemany`` of :data:`~.events.INSERT_EVENT`.
        """
        if self.report_rows:
            executemany(stmts.insert_report, self.report_rows)
            self.report_rows = []
        if self.job_rows:
            executemany(stmts.update_job_state, list(self.job_rows.values()))
            self.job_rows = {}
        if self.freed_rows:
            executemany(SET_GPU_HOURS_FREED.format(p=stmts.ph), self.freed_rows)
            self.freed_rows = []
        if self.actuation_rows:
            executemany(QUEUE_ACTUATION.format(p=stmts.ph), self.actuation_rows)
            self.actuation_rows = []
        if self.event_rows:
            rows, self.event_rows = self.event_rows, []
            if write_events is None:
                executemany(events.INSERT_EVENT.format(p=stmts.ph), rows)
            else:
                write_events(rows)


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
    if report.planned_steps is None and job.planned_steps:
        # The planned steps the job declared at registration: the default detector bounds its false stops per run
        # with them (the wire's report has no such field; the job's row has it).
        report = replace(report, planned_steps=job.planned_steps)
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
    action = decision.action.value
    writes.event_rows.append(
        events.event_row(
            key[0],
            events.REPORT_ACCEPTED,
            key[1],
            now,
            {"step": report.step, "eval_score": report.eval_score, "action": action, "declines": decision.declines},
        )
    )
    reclaimed = 0.0
    if stopped_now:
        reclaimed = gpu_hours_reclaimed(job.gpus, job.planned_steps, first_step, first_at, report.step, now)
        freed = reclaimed if job.gpus and job.planned_steps else None
        writes.freed_rows.append((freed, *key))
        writes.actuation_rows.append(queue_row(key[0], key[1], now))
        writes.event_rows.append(
            events.event_row(key[0], events.JOB_STOPPED, key[1], now, stop_details(job, decision, report.step, freed))
        )
    return ReportOutcome(decision, resend=False, stopped_now=stopped_now, gpu_hours_reclaimed=reclaimed)


def stop_details(job: JobState, decision: Decision, step: int, freed: float | None) -> dict[str, Any]:
    """The details of a ``job.stopped`` event: the job's outcome (what a webhook receiver is told)."""
    return {
        "stop_step": step,
        "reason": decision.reason,
        "best_step": decision.best_step,
        "best_score": decision.best_score,
        "declines": decision.declines,
        "detector": job.monitor.detector.spec(),
        "gpus": job.gpus,
        "planned_steps": job.planned_steps,
        "gpu_hours_freed": freed,
    }
