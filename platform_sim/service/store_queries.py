"""The history, summary, audit-trail and webhook queries, written once for both stores.

Each function takes a DB-API connection or cursor (``sqlite3`` or ``psycopg``: anything with ``execute(sql,
args)`` returning a cursor) and the driver's placeholder (``"?"`` or ``"%s"``). The stores call them on a reader
connection (reads) or inside one of their write transactions (writes), so what a write records (its event, its
outbox rows) commits with it. The paged reads (a job's evals, the events) are statements instead
(:func:`evals_query`, :func:`events_query`), which a store runs with :meth:`SharedQueries._rows` and reads as it goes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from . import events, sql
from .events import EVENT_COLUMNS, event_from_row, event_row
from .store import Delivery, Event, JobNotFound, JobRecord, StoredReport, TenantSummary, Webhook, WebhookNotFound

WEBHOOK_COLUMNS = "webhook_id, tenant_id, url, events, created_at, secret"

_ORDERS = {"newest": ("<", "DESC"), "step": (">", "ASC")}


def _webhook(row: Any) -> Webhook:
    return Webhook(int(row[0]), int(row[1]), row[2], tuple(row[3].split(",")), float(row[4]), row[5])


def evals_query(
    p: str, tenant_id: int, job_id: str, order: str, limit: int, cursor: int | None
) -> tuple[str, list[Any]]:
    """The statement and arguments of :meth:`Store.iter_evals <platform_sim.service.store.Store.iter_evals>`
    (rows of :data:`~platform_sim.service.sql.STORED_REPORT_COLUMNS`).

    Raises:
        ValueError: ``order`` is neither ``newest`` nor ``step``.
    """
    if order not in _ORDERS:
        raise ValueError(f"order must be newest or step, got {order!r}")
    cmp, direction = _ORDERS[order]
    where, args = f"tenant_id = {p} AND job_id = {p}", [tenant_id, job_id]
    if cursor is not None:
        where += f" AND step {cmp} {p}"
        args.append(int(cursor))
    args.append(int(limit))
    return f"SELECT {sql.STORED_REPORT_COLUMNS} FROM reports WHERE {where} ORDER BY step {direction} LIMIT {p}", args


# One row per tenant: the three statuses as in sql._STATUS_WHERE, stops ever, and the GPU-hours freed.
_SUMMARY = (
    "SELECT tenant_id, "
    "SUM(CASE WHEN finished_at IS NULL AND stopped_at IS NULL THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN finished_at IS NULL AND stopped_at IS NOT NULL THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN finished_at IS NOT NULL THEN 1 ELSE 0 END), "
    "SUM(CASE WHEN stopped_at IS NOT NULL THEN 1 ELSE 0 END), "
    "COALESCE(SUM(gpu_hours_freed), 0) FROM jobs"
)


def _summary(row: Any) -> TenantSummary:
    return TenantSummary(int(row[1] or 0), int(row[2] or 0), int(row[3] or 0), int(row[4] or 0), float(row[5] or 0))


def summary(conn: Any, p: str, tenant_id: int) -> TenantSummary:
    """:meth:`Store.summary <platform_sim.service.store.Store.summary>` on ``conn``."""
    row = conn.execute(f"{_SUMMARY} WHERE tenant_id = {p} GROUP BY tenant_id", (tenant_id,)).fetchone()
    return TenantSummary() if row is None else _summary(row)


def summaries(conn: Any) -> dict[int, TenantSummary]:
    """:meth:`Store.summaries <platform_sim.service.store.Store.summaries>` on ``conn``."""
    return {int(r[0]): _summary(r) for r in conn.execute(f"{_SUMMARY} GROUP BY tenant_id").fetchall()}


def events_query(p: str, tenant_id: int | None, after: int, limit: int) -> tuple[str, list[Any]]:
    """The statement and arguments of :meth:`Store.iter_events <platform_sim.service.store.Store.iter_events>`
    (rows of :data:`~platform_sim.service.events.EVENT_COLUMNS`)."""
    where, args = f"id > {p}", [int(after)]
    if tenant_id is not None:
        where = f"tenant_id = {p} AND " + where
        args.insert(0, tenant_id)
    return f"SELECT {EVENT_COLUMNS} FROM events WHERE {where} ORDER BY id LIMIT {p}", [*args, int(limit)]


def record(
    conn: Any, p: str, tenant_id: int, kind: str, job_id: str | None, now: float, details: dict[str, Any]
) -> None:
    """Append one event on ``conn`` (inside the caller's transaction), with its outbox rows if a webhook wants it."""
    row = conn.execute(
        events.INSERT_EVENT.format(p=p) + " RETURNING id", event_row(tenant_id, kind, job_id, now, details)
    ).fetchone()
    if kind in events.WEBHOOK_EVENTS.values():
        conn.execute(events.fanout_sql("events", p), (int(row[0]) - 1,))


def job_details(job: JobRecord) -> dict[str, Any]:
    """The details of a ``job.registered`` event."""
    return {
        "job_type": job.job_type,
        "detector": job.detector,
        "cadence": job.cadence,
        "gpus": job.gpus,
        "planned_steps": job.planned_steps,
    }


def record_finish(conn: Any, p: str, tenant_id: int, job_id: str, reason: str, now: float) -> None:
    """Append the ``job.finished`` event of a job just marked finished, with its outcome (inside that transaction)."""
    row = conn.execute(
        "SELECT stopped_at, stop_reason, best_step, best_score, detector, gpus, planned_steps, gpu_hours_freed, "
        f"n_reports, last_step FROM jobs WHERE tenant_id = {p} AND job_id = {p}",
        (tenant_id, job_id),
    ).fetchone()
    stopped_at, stop_reason, best_step, best_score, detector, gpus, planned, freed, n_reports, last_step = row
    if stopped_at is None and gpus and planned:
        freed = 0.0  # declared, never stopped: nothing freed
    details = {
        "reason": reason,
        "stopped": stopped_at is not None,
        "stop_step": stopped_at,
        "stop_reason": stop_reason if stopped_at is not None else None,
        "best_step": best_step,
        "best_score": best_score,
        "detector": json.loads(detector),
        "n_reports": n_reports,
        "last_step": last_step,
        "gpu_hours_freed": freed,
    }
    record(conn, p, tenant_id, events.JOB_FINISHED, job_id, now, details)


def prune_bounds(conn: Any, p: str, older_than: float) -> int | None:
    """The id below which events may be pruned: the first event at or after ``older_than``, or the newest one
    (never pruned, so that ids stay monotone); None when there is nothing to prune. Read outside the write
    transaction: it scans the oldest events (ids and times rise together)."""
    row = conn.execute(f"SELECT id FROM events WHERE time >= {p} ORDER BY id LIMIT 1", (older_than,)).fetchone()
    newest = conn.execute("SELECT max(id) FROM events").fetchone()[0]
    if newest is None:
        return None
    return int(newest) if row is None else min(int(row[0]), int(newest))


def prune_batch(conn: Any, p: str, below: int, batch: int) -> int:
    """Delete up to ``batch`` of the oldest events with ``id < below`` and no pending delivery; returns how many."""
    cur = conn.execute(
        f"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id < {p} AND id NOT IN "
        f"(SELECT event_id FROM webhook_outbox) ORDER BY id LIMIT {p})",
        (below, batch),
    )
    return int(cur.rowcount)


def add_webhook(conn: Any, p: str, tenant_id: int, url: str, types: tuple[str, ...], now: float) -> Webhook:
    """Insert a webhook with a fresh secret (256 random bits) and return it."""
    secret = "whsec_" + secrets.token_urlsafe(32)
    row = conn.execute(
        f"INSERT INTO webhooks (tenant_id, url, events, secret, created_at) VALUES ({p}, {p}, {p}, {p}, {p}) "
        "RETURNING webhook_id",
        (tenant_id, url, ",".join(types), secret, now),
    ).fetchone()
    return Webhook(int(row[0]), tenant_id, url, types, now, secret)


def list_webhooks(conn: Any, p: str, tenant_id: int | None) -> list[Webhook]:
    """Webhooks of one tenant (or all) in id order."""
    where, args = ("", ()) if tenant_id is None else (f" WHERE tenant_id = {p}", (tenant_id,))
    rows = conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhooks{where} ORDER BY webhook_id", args).fetchall()
    return [_webhook(r) for r in rows]


def remove_webhook(conn: Any, p: str, webhook_id: int) -> Webhook:
    """Delete a webhook and its pending deliveries; raises :class:`WebhookNotFound`."""
    row = conn.execute(f"SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE webhook_id = {p}", (webhook_id,)).fetchone()
    if row is None:
        raise WebhookNotFound(f"no webhook {webhook_id}")
    conn.execute(f"DELETE FROM webhook_outbox WHERE webhook_id = {p}", (webhook_id,))
    conn.execute(f"DELETE FROM webhooks WHERE webhook_id = {p}", (webhook_id,))
    return _webhook(row)


_DELIVERY_COLUMNS = (
    f"o.outbox_id, o.attempts, {', '.join('w.' + c.strip() for c in WEBHOOK_COLUMNS.split(','))}, "
    f"{', '.join('e.' + c.strip() for c in EVENT_COLUMNS.split(','))}"
)
_DELIVERY_FROM = (
    "FROM webhook_outbox o JOIN webhooks w ON w.webhook_id = o.webhook_id JOIN events e ON e.id = o.event_id"
)


def due(
    conn: Any, p: str, now: float, limit: int, skip_locked: bool = False, tenant_id: int | None = None
) -> list[Delivery]:
    """Outbox rows due at ``now`` (of one tenant's webhooks, or all), oldest first (``skip_locked``: PostgreSQL's
    ``FOR UPDATE SKIP LOCKED``, so that replicas claim different rows)."""
    lock = " FOR UPDATE OF o SKIP LOCKED" if skip_locked else ""
    whose, args = ("", (now, limit)) if tenant_id is None else (f" AND w.tenant_id = {p}", (now, tenant_id, limit))
    rows = conn.execute(
        f"SELECT {_DELIVERY_COLUMNS} {_DELIVERY_FROM} WHERE o.next_attempt_at <= {p}{whose} "
        f"ORDER BY o.next_attempt_at, o.outbox_id LIMIT {p}{lock}",
        args,
    ).fetchall()
    return [Delivery(int(r[0]), int(r[1]), _webhook(r[2:8]), event_from_row(r[8:14])) for r in rows]


def _due_tenants(conn: Any, p: str, now: float, limit: int) -> list[int]:
    """The tenants with due outbox rows, the one waiting longest first."""
    rows = conn.execute(
        "SELECT w.tenant_id FROM webhook_outbox o JOIN webhooks w ON w.webhook_id = o.webhook_id "
        f"WHERE o.next_attempt_at <= {p} GROUP BY w.tenant_id ORDER BY MIN(o.next_attempt_at), w.tenant_id LIMIT {p}",
        (now, limit),
    ).fetchall()
    return [int(r[0]) for r in rows]


def _fair_due(
    conn: Any, p: str, now: float, limit: int, skip_locked: bool, per_tenant: int, in_flight: Mapping[int, int]
) -> list[Delivery]:
    """Up to ``limit`` due rows, at most ``per_tenant`` minus its ``in_flight`` of each tenant, the tenant waiting
    longest first: one tenant's backlog or slow endpoint never keeps another's rows from being claimed."""
    found: list[Delivery] = []
    full = sum(1 for n in in_flight.values() if n >= per_tenant)
    for tenant_id in _due_tenants(conn, p, now, limit + full):
        take = min(per_tenant - in_flight.get(tenant_id, 0), limit - len(found))
        if take > 0:
            found += due(conn, p, now, take, skip_locked, tenant_id)
        if len(found) >= limit:
            break
    return found


def claim(
    conn: Any,
    p: str,
    now: float,
    lease_s: float,
    limit: int,
    skip_locked: bool = False,
    per_tenant: int | None = None,
    in_flight: Mapping[int, int] | None = None,
) -> list[Delivery]:
    """Claim the due rows for ``lease_s`` seconds (inside the caller's write transaction); with ``per_tenant``, by
    :func:`_fair_due`."""
    if per_tenant is None:
        found = due(conn, p, now, limit, skip_locked)
    else:
        found = _fair_due(conn, p, now, limit, skip_locked, per_tenant, in_flight or {})
    for d in found:
        conn.execute(
            f"UPDATE webhook_outbox SET next_attempt_at = {p} WHERE outbox_id = {p}", (now + lease_s, d.outbox_id)
        )
    return found


def finish_delivery(
    conn: Any, p: str, delivery: Delivery, ok: bool, detail: dict[str, Any], retry_at: float | None, now: float
) -> None:
    """:meth:`Store.finish_delivery <platform_sim.service.store.Store.finish_delivery>` inside the caller's write
    transaction."""
    attempt = delivery.attempts + 1
    if ok or retry_at is None:
        conn.execute(f"DELETE FROM webhook_outbox WHERE outbox_id = {p}", (delivery.outbox_id,))
    else:
        conn.execute(
            f"UPDATE webhook_outbox SET attempts = {p}, next_attempt_at = {p} WHERE outbox_id = {p}",
            (attempt, retry_at, delivery.outbox_id),
        )
    details = {
        "webhook_id": delivery.webhook.webhook_id,
        "event_id": delivery.event.id,
        "event_type": delivery.event.type,
        "attempt": attempt,
        **detail,
    }
    if not ok:
        details["next_attempt_at"] = retry_at  # None: given up
    kind = events.WEBHOOK_DELIVERED if ok else events.WEBHOOK_FAILED
    conn.execute(
        events.INSERT_EVENT.format(p=p),
        event_row(delivery.webhook.tenant_id, kind, delivery.event.job_id, now, details),
    )


class SharedQueries:
    """The history, summary, audit-trail and webhook methods of :class:`~platform_sim.service.store.Store`, for a
    store that provides :meth:`_on_reader`, :meth:`_on_writer` and :attr:`_ph` (a mixin placed before ``Store``)."""

    _ph: str = "?"
    _skip_locked: bool = False  # PostgreSQL: replicas claim different outbox rows

    def _on_reader(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(conn)`` on a read connection that sees the last commit."""
        raise NotImplementedError

    def _rows(self, query: str, args: Sequence[Any]) -> Iterator[Any]:
        """The rows of a read, as it reads them (see :meth:`Store.iter_jobs
        <platform_sim.service.store.Store.iter_jobs>`)."""
        raise NotImplementedError

    def _on_writer(self, fn: Callable[[Any], Any], webhooks_changed: bool = False) -> Any:
        """``fn(conn)`` inside one of the store's write transactions (committed before this returns); its result.
        ``webhooks_changed``: ``fn`` adds or removes a webhook."""
        raise NotImplementedError

    def iter_jobs(
        self, tenant_id: int, status: str | None = None, limit: int = 100, after: str | None = None
    ) -> Iterator[JobRecord]:
        rows = self._rows(*sql.list_jobs_query(self._ph, tenant_id, status, limit, after))
        return (sql.job_from_row(r) for r in rows)

    def iter_sorted_jobs(
        self, tenant_id: int, status: str | None, sort: str, descending: bool, limit: int, offset: int = 0
    ) -> Iterator[JobRecord]:
        rows = self._rows(*sql.sorted_jobs_query(self._ph, tenant_id, status, sort, descending, limit, offset))
        return (sql.job_from_row(r) for r in rows)

    def count_jobs(self, tenant_id: int, status: str | None = None) -> int:
        query, args = sql.count_jobs_query(self._ph, tenant_id, status)
        return int(self._on_reader(lambda c: c.execute(query, args).fetchone()[0]))

    def iter_evals(
        self, tenant_id: int, job_id: str, *, order: str = "newest", limit: int = 100, cursor: int | None = None
    ) -> Iterator[StoredReport]:
        query, args = evals_query(self._ph, tenant_id, job_id, order, limit, cursor)
        exists = sql.statements(self._ph).job_exists
        if self._on_reader(lambda c: c.execute(exists, (tenant_id, job_id)).fetchone()) is None:
            raise JobNotFound(f"no job {job_id!r}")
        return (sql.stored_report_from_row(r) for r in self._rows(query, args))

    def summary(self, tenant_id: int) -> TenantSummary:
        return self._on_reader(lambda c: summary(c, self._ph, tenant_id))  # type: ignore[no-any-return]

    def summaries(self) -> dict[int, TenantSummary]:
        return self._on_reader(summaries)  # type: ignore[no-any-return]

    def iter_events(self, tenant_id: int | None, after: int = 0, limit: int = 100) -> Iterator[Event]:
        return (event_from_row(r) for r in self._rows(*events_query(self._ph, tenant_id, after, limit)))

    def prune_events(self, older_than: float, batch: int = 10_000) -> int:
        below = self._on_reader(lambda c: prune_bounds(c, self._ph, older_than))
        total = 0
        while below is not None:
            n = int(self._on_writer(lambda c: prune_batch(c, self._ph, below, batch)))
            total += n
            if n < batch:
                break
        return total

    def add_webhook(self, tenant_id: int, url: str, events: tuple[str, ...]) -> Webhook:
        return self._on_writer(lambda c: add_webhook(c, self._ph, tenant_id, url, events, time.time()), True)  # type: ignore[no-any-return]

    def list_webhooks(self, tenant_id: int | None = None) -> list[Webhook]:
        return self._on_reader(lambda c: list_webhooks(c, self._ph, tenant_id))  # type: ignore[no-any-return]

    def remove_webhook(self, webhook_id: int) -> Webhook:
        return self._on_writer(lambda c: remove_webhook(c, self._ph, webhook_id), True)  # type: ignore[no-any-return]

    def claim_deliveries(
        self,
        now: float,
        lease_s: float,
        limit: int = 16,
        per_tenant: int | None = None,
        in_flight: Mapping[int, int] | None = None,
    ) -> list[Delivery]:
        if limit < 1 or not self._on_reader(lambda c: due(c, self._ph, now, 1)):  # the common case: no write
            return []
        return self._on_writer(  # type: ignore[no-any-return]
            lambda c: claim(c, self._ph, now, lease_s, limit, self._skip_locked, per_tenant, in_flight)
        )

    def finish_delivery(
        self, delivery: Delivery, ok: bool, detail: dict[str, Any], retry_at: float | None, now: float
    ) -> None:
        self._on_writer(lambda c: finish_delivery(c, self._ph, delivery, ok, detail, retry_at, now))

    def recent_events(self, tenant_id: int, limit: int = 20) -> list[Event]:
        return self._on_reader(lambda c: recent_events(c, self._ph, tenant_id, limit))  # type: ignore[no-any-return]


def recent_events(conn: Any, p: str, tenant_id: int, limit: int) -> list[Event]:
    """:meth:`Store.recent_events <platform_sim.service.store.Store.recent_events>` on ``conn`` (the dashboard's;
    a backward walk of the ``(tenant_id, id)`` index)."""
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant_id = {p} ORDER BY id DESC LIMIT {p}", (tenant_id, int(limit))
    ).fetchall()
    return [event_from_row(r) for r in rows]
