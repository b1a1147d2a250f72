"""The audit trail's event types and rows: what each store appends, in the transaction of what it records.

Every state change a tenant or operator may ask about later is one row of the append-only ``events`` table:
``job.registered``, ``report.accepted``, ``job.stopped``, ``job.finished``, ``tenant.added``, ``tenant.revoked``,
``webhook.delivered`` and ``webhook.failed``, and the actuate worker's ``actuation.started``, ``actuation.succeeded``,
``actuation.failed`` and ``actuation.given_up``. A store builds the row with :func:`event_row` inside the same write
transaction as the change (so an event exists if and only if its change was committed) and writes it with
:data:`INSERT_EVENT` (one prepared statement, batched with ``executemany`` on the report path).

Webhooks subscribe to a subset of the types (:data:`WEBHOOK_EVENTS`, by their short names ``stop``, ``finish``,
``register``, ``report``); the store's fan-out (:func:`fanout_sql`) copies each matching new event into the durable
outbox in that same transaction. The webhook events themselves are never delivered by webhook (no loops).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .store import Event

JOB_REGISTERED = "job.registered"
REPORT_ACCEPTED = "report.accepted"
JOB_STOPPED = "job.stopped"
JOB_FINISHED = "job.finished"
TENANT_ADDED = "tenant.added"
TENANT_REVOKED = "tenant.revoked"
WEBHOOK_DELIVERED = "webhook.delivered"
WEBHOOK_FAILED = "webhook.failed"
# The actuate worker's record of each stop action it runs on a scheduler (store_actuation.py).
ACTUATION_STARTED = "actuation.started"
ACTUATION_SUCCEEDED = "actuation.succeeded"
ACTUATION_FAILED = "actuation.failed"
ACTUATION_GIVEN_UP = "actuation.given_up"

EVENT_TYPES = (
    JOB_REGISTERED,
    REPORT_ACCEPTED,
    JOB_STOPPED,
    JOB_FINISHED,
    TENANT_ADDED,
    TENANT_REVOKED,
    WEBHOOK_DELIVERED,
    WEBHOOK_FAILED,
    ACTUATION_STARTED,
    ACTUATION_SUCCEEDED,
    ACTUATION_FAILED,
    ACTUATION_GIVEN_UP,
)
"""Every event type, in the order of a job's life."""

WEBHOOK_EVENTS = {"stop": JOB_STOPPED, "finish": JOB_FINISHED, "register": JOB_REGISTERED, "report": REPORT_ACCEPTED}
"""The short names ``webhook add --events`` takes, and the event type each stands for."""
DEFAULT_WEBHOOK_EVENTS = ("stop", "finish")

EVENT_COLUMNS = "id, type, tenant_id, job_id, time, details"
"""The columns :func:`event_from_row` reads, in its order."""
INSERT_EVENT = "INSERT INTO events (tenant_id, type, job_id, time, details) VALUES ({p}, {p}, {p}, {p}, {p})"
"""The event insert (``{p}``: the driver's placeholder), from :func:`event_row`."""


def webhook_types(names: Sequence[str]) -> tuple[str, ...]:
    """The event types of ``webhook add --events`` short names (or full type names), deduplicated, in order.

    Raises:
        ValueError: a name that is neither (the message lists the valid ones).
    """
    full = set(WEBHOOK_EVENTS.values())
    out: list[str] = []
    for name in names:
        name = name.strip()
        kind = WEBHOOK_EVENTS.get(name, name if name in full else None)
        if kind is None:
            raise ValueError(f"unknown webhook event {name!r}: choose from {', '.join(WEBHOOK_EVENTS)}")
        if kind not in out:
            out.append(kind)
    if not out:
        raise ValueError(f"no webhook event given: choose from {', '.join(WEBHOOK_EVENTS)}")
    return tuple(out)


def event_row(tenant_id: int, kind: str, job_id: str | None, now: float, details: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of :data:`INSERT_EVENT` for one event.

    Args:
        tenant_id: The tenant it concerns.
        kind: One of :data:`EVENT_TYPES`.
        job_id: The job it concerns, or None.
        now: The transaction's Unix time.
        details: Its details (JSON-serializable; compact JSON is stored).
    """
    return (tenant_id, kind, job_id, now, json.dumps(details, separators=(",", ":")))


def event_from_row(row: Sequence[Any]) -> Event:
    """The :class:`~platform_sim.service.store.Event` of a row selected with :data:`EVENT_COLUMNS`."""
    return Event(int(row[0]), row[1], int(row[2]), row[3], float(row[4]), json.loads(row[5]))


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API answers it (``GET /v1/events``, the webhook body's ``event``)."""
    return {"id": event.id, "type": event.type, "job_id": event.job_id, "time": event.time, "details": event.details}


def fanout_sql(events_source: str, p: str) -> str:
    """The statement that copies new events into the outbox of every webhook of their tenant subscribed to their type.

    Args:
        events_source: Where the new events are: ``"events"`` with an ``id > {p}`` filter appended by the caller
            (SQLite), or a CTE name (PostgreSQL's ``INSERT ... RETURNING``).
        p: The driver's placeholder, for ``id > p`` (unused when ``events_source`` is a CTE).
    """
    where = f" AND e.id > {p}" if events_source == "events" else ""
    pct = "%%" if p == "%s" else "%"  # psycopg reads a lone % as a placeholder
    return (
        "INSERT INTO webhook_outbox (webhook_id, event_id, attempts, next_attempt_at) "
        f"SELECT w.webhook_id, e.id, 0, e.time FROM {events_source} e JOIN webhooks w ON w.tenant_id = e.tenant_id "
        f"WHERE (',' || w.events || ',') LIKE ('{pct},' || e.type || ',{pct}'){where}"
    )
