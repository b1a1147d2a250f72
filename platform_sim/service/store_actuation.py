"""The actuators' part of both stores: tenant scopes, scheduler handles and the durable outbox of stop actions.

Written once for SQLite and PostgreSQL, like :mod:`~platform_sim.service.store_queries`: each function takes a DB-API
connection or cursor and the driver's placeholder, and :class:`ActuationQueries` (a mixin placed before ``Store``)
runs them through the store's reader and writer.

The outbox (``actuations``) holds one row per stopped job that has a scheduler handle. The row is written in the
transaction that commits the stop decision (:data:`QUEUE_ACTUATION`, queued by
:func:`~platform_sim.service.report_transaction.apply_report`), or in the one that registers the handle of a job
already stopped, so that a committed stop always has its action: a ``kill -9`` between the decision and the action
loses nothing. The actuate worker (:mod:`~platform_sim.service.actuate`) claims due rows for a lease
(``next_attempt_at`` moves to the lease's end and ``claims`` grows by one), runs one phase of the stop and records
the outcome only while the row still holds its claim, in one transaction with its event. A phase recorded as
succeeded is never run again; a phase interrupted by a crash before its outcome was recorded runs again after the
lease (the actuators treat "the job is already gone" as success, so that rerun is harmless).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from platform_sim.actuators.base import ActionResult, SchedulerHandle, TenantScope

from . import events
from .store import HandleConflict, JobNotFound

PENDING, DONE, GIVEN_UP = "pending", "done", "given_up"

QUEUE_ACTUATION = (
    "INSERT INTO actuations (tenant_id, job_id, kind, ref, next_attempt_at, created_at, updated_at) "
    "SELECT tenant_id, job_id, kind, ref, {p}, {p}, {p} FROM scheduler_handles WHERE tenant_id = {p} AND job_id = {p} "
    "ON CONFLICT (tenant_id, job_id) DO NOTHING"
)
"""Queue the stop action of a job that has a handle (none otherwise; at most one per job), from
:func:`queue_row`. ``{p}``: the driver's placeholder."""

_ACTUATION_COLUMNS = "action_id, tenant_id, job_id, kind, ref, state, phase, attempts, claims, next_attempt_at, "
_ACTUATION_COLUMNS += "created_at, updated_at, last_action, last_detail"


@dataclass(frozen=True, slots=True)
class Actuation:
    """One row of the outbox of stop actions.

    Args:
        action_id: The row.
        tenant_id: Whose job.
        job_id: The job.
        handle: Its scheduler handle.
        state: ``pending``, ``done`` or ``given_up``.
        phase: The phase to run next (pending) or the last one run (done, given up).
        attempts: Failed attempts of that phase so far.
        claims: How many times a worker claimed the row (the fence of :func:`finish`).
        next_attempt_at: When it is due (pending; while claimed: the lease's end).
        created_at: When the stop queued it.
        updated_at: Its last change.
        last_action: What the last attempt ran, or None.
        last_detail: The scheduler's answer or the failure's reason of the last attempt, or None.
    """

    action_id: int
    tenant_id: int
    job_id: str
    handle: SchedulerHandle
    state: str
    phase: int
    attempts: int
    claims: int
    next_attempt_at: float
    created_at: float
    updated_at: float
    last_action: str | None = None
    last_detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The action as ``GET /v1/jobs/{id}/scheduler-handle`` shows it."""
        return {
            "state": self.state,
            "phase": self.phase,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at if self.state == PENDING else None,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "last_action": self.last_action,
            "last_detail": self.last_detail,
        }


@dataclass(frozen=True, slots=True)
class HandleRecord:
    """A job's registered scheduler handle and, once the job stopped, its stop action.

    Args:
        job_id: The job.
        handle: Which scheduler runs it and its name there.
        registered_at: When it was registered.
        actuation: The stop action, or None while the job has not stopped.
    """

    job_id: str
    handle: SchedulerHandle
    registered_at: float
    actuation: Actuation | None = None

    def to_json(self) -> dict[str, Any]:
        """The handle as the API answers it."""
        return {
            "job_id": self.job_id,
            "kind": self.handle.kind,
            "ref": self.handle.ref,
            "registered_at": self.registered_at,
            "actuation": None if self.actuation is None else self.actuation.to_json(),
        }


def queue_row(tenant_id: int, job_id: str, now: float) -> tuple[Any, ...]:
    """The arguments of :data:`QUEUE_ACTUATION` for a job stopped at ``now``."""
    return (now, now, now, tenant_id, job_id)


def _actuation(row: Sequence[Any]) -> Actuation:
    return Actuation(
        int(row[0]),
        int(row[1]),
        row[2],
        SchedulerHandle(row[3], row[4]),
        row[5],
        int(row[6]),
        int(row[7]),
        int(row[8]),
        float(row[9]),
        float(row[10]),
        float(row[11]),
        row[12],
        row[13],
    )


# -- tenant scopes -------------------------------------------------------------------------------------------------
def tenant_scope(conn: Any, p: str, tenant_id: int, name: str = "") -> TenantScope:
    """The tenant's :class:`~platform_sim.actuators.base.TenantScope` (empty when the operator configured none)."""
    rows = conn.execute(f"SELECT kind, owner FROM tenant_scopes WHERE tenant_id = {p}", (tenant_id,)).fetchall()
    allowed: dict[str, set[str]] = {}
    for kind, owner in rows:
        allowed.setdefault(kind, set()).add(owner)
    return TenantScope(name, {k: frozenset(v) for k, v in allowed.items()})


def add_scope(conn: Any, p: str, tenant_id: int, entries: Iterable[tuple[str, str]]) -> None:
    """Allow the tenant the ``(kind, owner)`` entries (already allowed ones are kept)."""
    for kind, owner in entries:
        conn.execute(
            f"INSERT INTO tenant_scopes (tenant_id, kind, owner) VALUES ({p}, {p}, {p}) ON CONFLICT DO NOTHING",
            (tenant_id, kind, owner),
        )


def remove_scope(conn: Any, p: str, tenant_id: int, entries: Iterable[tuple[str, str]] | None) -> int:
    """Remove the ``(kind, owner)`` entries (None: all of the tenant's); returns how many rows went."""
    if entries is None:
        return int(conn.execute(f"DELETE FROM tenant_scopes WHERE tenant_id = {p}", (tenant_id,)).rowcount)
    n = 0
    for kind, owner in entries:
        cur = conn.execute(
            f"DELETE FROM tenant_scopes WHERE tenant_id = {p} AND kind = {p} AND owner = {p}", (tenant_id, kind, owner)
        )
        n += int(cur.rowcount)
    return n


# -- handles -------------------------------------------------------------------------------------------------------
def handle_record(conn: Any, p: str, tenant_id: int, job_id: str) -> HandleRecord | None:
    """The job's handle with its action, or None when it registered none."""
    row = conn.execute(
        f"SELECT kind, ref, registered_at FROM scheduler_handles WHERE tenant_id = {p} AND job_id = {p}",
        (tenant_id, job_id),
    ).fetchone()
    if row is None:
        return None
    act = conn.execute(
        f"SELECT {_ACTUATION_COLUMNS} FROM actuations WHERE tenant_id = {p} AND job_id = {p}", (tenant_id, job_id)
    ).fetchone()
    return HandleRecord(
        job_id, SchedulerHandle(row[0], row[1]), float(row[2]), None if act is None else _actuation(act)
    )


def register_handle(
    conn: Any, p: str, tenant_id: int, job_id: str, handle: SchedulerHandle, now: float
) -> tuple[HandleRecord, bool]:
    """Store the job's handle inside the caller's write transaction; ``(record, created)``.

    The same handle again is answered as stored (``created=False``); another one raises :class:`HandleConflict`. A
    job already stopped gets its stop action queued here, in this transaction. On PostgreSQL the job row is locked
    first (the report that stops the job locks it too), so that of a registration and a stop committed at the same
    time, whichever commits second sees the other and the action is queued once.

    Raises:
        JobNotFound: the tenant holds no such job.
        HandleConflict: the job registered another handle, or another service job not yet finished holds this one.
    """
    lock = " FOR UPDATE" if p == "%s" else ""
    job = conn.execute(
        f"SELECT stopped_at FROM jobs WHERE tenant_id = {p} AND job_id = {p}{lock}", (tenant_id, job_id)
    ).fetchone()
    if job is None:
        raise JobNotFound(f"no job {job_id!r}")
    existing = handle_record(conn, p, tenant_id, job_id)
    if existing is not None:
        if existing.handle != handle:
            raise HandleConflict(conflict_message(job_id, existing.handle))
        return existing, False
    _check_unclaimed(conn, p, handle)
    conn.execute(
        f"INSERT INTO scheduler_handles (tenant_id, job_id, kind, ref, registered_at) VALUES ({p}, {p}, {p}, {p}, {p})",
        (tenant_id, job_id, handle.kind, handle.ref, now),
    )
    if job[0] is not None:  # stopped before its handle came: act now
        conn.execute(QUEUE_ACTUATION.format(p=p), queue_row(tenant_id, job_id, now))
    record = handle_record(conn, p, tenant_id, job_id)
    assert record is not None
    return record, True


def _check_unclaimed(conn: Any, p: str, handle: SchedulerHandle) -> None:
    """Raise :class:`HandleConflict` when a service job not yet finished (any tenant's) holds ``handle``: one
    scheduler job is the handle of one service job, so that two stops cannot act on it twice and a second tenant in
    an overlapping scope cannot attach its own job to another's. A finished job's handle is free again (schedulers
    reuse ids). No unique index (a schema change): on PostgreSQL a transaction-scoped advisory lock on the handle makes
    concurrent registrations of it take turns; SQLite's single writer does the same by itself."""
    if p == "%s":
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"evalstop-handle {handle.kind} {handle.ref}",))
    taken = conn.execute(
        "SELECT 1 FROM scheduler_handles h JOIN jobs j ON j.tenant_id = h.tenant_id AND j.job_id = h.job_id "
        f"WHERE h.kind = {p} AND h.ref = {p} AND j.finished_at IS NULL LIMIT 1",
        (handle.kind, handle.ref),
    ).fetchone()
    if taken is not None:  # whose is not said: it may be another tenant's
        raise HandleConflict(
            f"the {handle.kind} job {handle.ref!r} is already the handle of another service job "
            "(one scheduler job, one service job)"
        )


def conflict_message(job_id: str, handle: SchedulerHandle) -> str:
    """The message of :class:`HandleConflict` for job ``job_id`` holding ``handle``."""
    return f"job {job_id!r} already registered the {handle.kind} handle {handle.ref!r}; a handle is registered once"


# -- the outbox ----------------------------------------------------------------------------------------------------
def list_actuations(conn: Any, p: str, tenant_id: int | None = None) -> list[Actuation]:
    """Every action (of one tenant, or all) in id order."""
    where, args = ("", ()) if tenant_id is None else (f" WHERE tenant_id = {p}", (tenant_id,))
    rows = conn.execute(f"SELECT {_ACTUATION_COLUMNS} FROM actuations{where} ORDER BY action_id", args).fetchall()
    return [_actuation(r) for r in rows]


def due(conn: Any, p: str, now: float, limit: int, skip_locked: bool = False) -> list[Actuation]:
    """Pending actions due at ``now``, oldest due first (``skip_locked``: replicas claim different rows)."""
    lock = " FOR UPDATE SKIP LOCKED" if skip_locked else ""
    rows = conn.execute(
        f"SELECT {_ACTUATION_COLUMNS} FROM actuations WHERE state = 'pending' AND next_attempt_at <= {p} "
        f"ORDER BY next_attempt_at, action_id LIMIT {p}{lock}",
        (now, limit),
    ).fetchall()
    return [_actuation(r) for r in rows]


def claim(conn: Any, p: str, now: float, lease_s: float, limit: int, skip_locked: bool = False) -> list[Actuation]:
    """Claim the due actions for ``lease_s`` seconds and append their ``actuation.started`` events (inside the
    caller's write transaction); the claimed rows as claimed (``claims`` counted, ``next_attempt_at`` the lease)."""
    out = []
    for a in due(conn, p, now, limit, skip_locked):
        conn.execute(
            f"UPDATE actuations SET next_attempt_at = {p}, claims = claims + 1, updated_at = {p} WHERE action_id = {p}",
            (now + lease_s, now, a.action_id),
        )
        claimed = Actuation(
            a.action_id,
            a.tenant_id,
            a.job_id,
            a.handle,
            a.state,
            a.phase,
            a.attempts,
            a.claims + 1,
            now + lease_s,
            a.created_at,
            now,
            a.last_action,
            a.last_detail,
        )
        details = {**_base_details(claimed), "attempt": claimed.attempts + 1}
        conn.execute(
            events.INSERT_EVENT.format(p=p),
            events.event_row(a.tenant_id, events.ACTUATION_STARTED, a.job_id, now, details),
        )
        out.append(claimed)
    return out


def _base_details(a: Actuation) -> dict[str, Any]:
    return {"action_id": a.action_id, "kind": a.handle.kind, "ref": a.handle.ref, "phase": a.phase}


def finish(conn: Any, p: str, a: Actuation, result: ActionResult, retry_at: float | None, now: float) -> bool:
    """Record the outcome of one attempt of claimed action ``a`` with its event, inside the caller's write transaction.

    On success the next phase is scheduled ``result.next_phase_after_s`` from now (its attempts start at 0), or the
    action is done. On failure the attempt is counted and the phase is due again at ``retry_at``, or, with None, the
    action is given up (``actuation.failed``, then ``actuation.given_up``).

    Returns:
        False, recording nothing, when the row no longer holds this claim (the lease ran out and another worker
        claimed it, or it is no longer pending).
    """
    attempt = a.attempts + 1
    details: dict[str, Any] = {
        **_base_details(a),
        "attempt": attempt,
        "action": result.action,
        "detail": result.detail,
    }
    kinds = []
    if result.ok:
        after = result.next_phase_after_s
        if after is None:
            state, phase, attempts, next_at = DONE, a.phase, attempt, now
        else:
            state, phase, attempts, next_at = PENDING, a.phase + 1, 0, now + max(0.0, float(after))
            details["next_phase_at"] = next_at
        kinds.append(events.ACTUATION_SUCCEEDED)
    else:
        details["retryable"] = result.retryable
        details["next_attempt_at"] = retry_at
        state = PENDING if retry_at is not None else GIVEN_UP
        phase, attempts, next_at = a.phase, attempt, retry_at if retry_at is not None else now
        kinds.append(events.ACTUATION_FAILED)
        if retry_at is None:
            kinds.append(events.ACTUATION_GIVEN_UP)
    cur = conn.execute(
        f"UPDATE actuations SET state = {p}, phase = {p}, attempts = {p}, next_attempt_at = {p}, updated_at = {p}, "
        f"last_action = {p}, last_detail = {p} WHERE action_id = {p} AND claims = {p} AND state = 'pending'",
        (state, phase, attempts, next_at, now, result.action, result.detail, a.action_id, a.claims),
    )
    if cur.rowcount != 1:
        return False
    for kind in kinds:
        conn.execute(events.INSERT_EVENT.format(p=p), events.event_row(a.tenant_id, kind, a.job_id, now, details))
    return True


class ActuationQueries:
    """The actuator methods of both stores (a mixin placed before ``Store``, beside
    :class:`~platform_sim.service.store_queries.SharedQueries`, whose primitives it uses)."""

    _ph: str = "?"
    _skip_locked: bool = False

    def _on_reader(self, fn: Callable[[Any], Any]) -> Any:
        raise NotImplementedError

    def _on_writer(self, fn: Callable[[Any], Any], webhooks_changed: bool = False) -> Any:
        raise NotImplementedError

    def tenant_scope(self, tenant_id: int, name: str = "") -> TenantScope:
        """What the tenant may name on each scheduler (``name``: the tenant's name, carried in the answer)."""
        return self._on_reader(lambda c: tenant_scope(c, self._ph, tenant_id, name))  # type: ignore[no-any-return]

    def add_tenant_scope(self, tenant_id: int, entries: Iterable[tuple[str, str]]) -> TenantScope:
        """Allow the tenant the ``(kind, owner)`` entries; its scope after."""
        items = list(entries)

        def op(c: Any) -> TenantScope:
            add_scope(c, self._ph, tenant_id, items)
            return tenant_scope(c, self._ph, tenant_id)

        return self._on_writer(op)  # type: ignore[no-any-return]

    def remove_tenant_scope(self, tenant_id: int, entries: Iterable[tuple[str, str]] | None = None) -> int:
        """Remove the ``(kind, owner)`` entries (None: all); how many were there."""
        items = None if entries is None else list(entries)
        return int(self._on_writer(lambda c: remove_scope(c, self._ph, tenant_id, items)))

    def register_handle(self, tenant_id: int, job_id: str, handle: SchedulerHandle) -> tuple[HandleRecord, bool]:
        """:func:`register_handle` in a write transaction."""
        return self._on_writer(  # type: ignore[no-any-return]
            lambda c: register_handle(c, self._ph, tenant_id, job_id, handle, time.time())
        )

    def scheduler_handle(self, tenant_id: int, job_id: str) -> HandleRecord | None:
        """The job's handle and action, or None (no handle). Raises :class:`JobNotFound` for an unknown job."""

        def read(c: Any) -> HandleRecord | None:
            exists = c.execute(
                f"SELECT 1 FROM jobs WHERE tenant_id = {self._ph} AND job_id = {self._ph}", (tenant_id, job_id)
            ).fetchone()
            if exists is None:
                raise JobNotFound(f"no job {job_id!r}")
            return handle_record(c, self._ph, tenant_id, job_id)

        return self._on_reader(read)  # type: ignore[no-any-return]

    def list_actuations(self, tenant_id: int | None = None) -> list[Actuation]:
        """Every stop action (of one tenant, or all) in id order."""
        return self._on_reader(lambda c: list_actuations(c, self._ph, tenant_id))  # type: ignore[no-any-return]

    def claim_actuations(self, now: float, lease_s: float, limit: int = 16) -> list[Actuation]:
        """Claim up to ``limit`` due actions for ``lease_s`` seconds (see :func:`claim`)."""
        if not self._on_reader(lambda c: due(c, self._ph, now, 1)):  # the common case, without a write transaction
            return []
        return self._on_writer(  # type: ignore[no-any-return]
            lambda c: claim(c, self._ph, now, lease_s, limit, self._skip_locked)
        )

    def finish_actuation(self, action: Actuation, result: ActionResult, retry_at: float | None, now: float) -> bool:
        """Record one attempt's outcome (see :func:`finish`); False when the claim was lost."""
        return bool(self._on_writer(lambda c: finish(c, self._ph, action, result, retry_at, now)))
