"""The default store: one SQLite file in WAL mode, one writer thread with group commit.

Durability: every write goes through a single writer thread that takes the queued operations, applies each in one
``BEGIN IMMEDIATE`` transaction and commits once for the whole batch (group commit). With ``synchronous=FULL`` (the
default) the commit fsyncs the WAL, so a report whose future resolved survives ``kill -9`` of the service and a power
loss; ``synchronous=NORMAL`` survives ``kill -9`` (the WAL frames reach the OS before COMMIT returns) but not an OS
crash, and is offered only as an explicit choice.

The scheduler core's state of a job is stored as the core's own state dict split in two: the scalar part (detector
spec and state, best step, stop latch) in the ``jobs`` row and the lists (steps, scores, decisions) as one ``reports``
row per accepted step. Loading a job rebuilds the exact :class:`~platform_sim.core.monitor.JobMonitor` with
``JobMonitor.from_state_dict``, so a restart gives the same decisions.

Each report is one logical transaction "load the job for update, apply the core, write the report row and the job
row". The writer keeps recently used monitors in memory. At the start of every batch, under the write lock, it reads
``PRAGMA data_version``, which changes only when another connection committed; if it did (the CLI, a second service
process on the same file), the cached monitors are dropped and rebuilt from the database, so the core is never
applied to stale state. A networked store does the same with ``SELECT ... FOR UPDATE`` (``store_postgres.py``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from platform_sim.core import JobMonitor, Report, detector_from_spec

from . import db_health, events, report_transaction, sql, store_actuation, store_queries, tables
from .store import (
    JobNotFound,
    JobRecord,
    ReportOutcome,
    Store,
    StoredReport,
    StoreUnavailable,
    Tenant,
    TenantExists,
    TenantNotFound,
    hash_token,
    new_token,
)
from .tenant_tokens import TenantTokens
from .writer import BatchWriter, Op, Result

logger = logging.getLogger(__name__)

SCHEMA_VERSION = tables.SCHEMA_VERSION
_SCHEMA = tables.sqlite_ddl()  # the one description of the tables (tables.py), pinned to the Alembic head by a test

_SQL = sql.statements("?")
_INSERT_EVENT = events.INSERT_EVENT.format(p="?")
_FANOUT = events.fanout_sql("events", "?")

READ_BATCH = 64
"""Rows a page's read steps through at once (:meth:`SQLiteStore._rows`)."""


class _Txn:
    """One write transaction of the writer thread.

    Report rows and job-state updates are collected (:class:`~.report_transaction.Writes`) and written with two ``executemany``
    calls per batch: every ``sqlite3`` call releases and re-takes the GIL, and with the event loop busy in the other
    thread each re-take can wait a whole switch interval, so per-statement writes made the writer the bottleneck
    (measured).
    """

    def __init__(self, conn: sqlite3.Connection, hooked: Callable[[], set[str]] = set) -> None:
        self.conn = conn
        self.writes = report_transaction.Writes()
        self.hooked = hooked

    def flush(self) -> None:
        """Write what was collected (before any statement that reads or writes the same rows directly)."""
        self.writes.flush(self.conn.executemany, _SQL, self._write_events)

    def _write_events(self, rows: list[tuple[Any, ...]]) -> None:
        """The batch's events with one ``executemany``; then, only when a webhook wants one of their types, their
        outbox rows. Under the single writer's write lock the new rows hold the ids up to ``last_insert_rowid()``."""
        self.conn.executemany(_INSERT_EVENT, rows)
        wanted = self.hooked()
        if wanted and any(row[1] in wanted for row in rows):
            last = self.conn.execute("SELECT last_insert_rowid()").fetchone()[0]
            self.conn.execute(_FANOUT, (int(last) - len(rows),))

    def run(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """``fn(conn)`` after flushing what the batch queued (so that event ids follow the operations' order)."""
        self.flush()
        return fn(self.conn)


class SQLiteStore(store_queries.SharedQueries, store_actuation.ActuationQueries, TenantTokens, Store):
    """A :class:`~platform_sim.service.store.Store` in one SQLite file.

    Args:
        path: Database file; created with its schema if missing. Its directory must exist.
        synchronous: ``"FULL"`` (default: fsync at every commit, acknowledged reports survive power loss) or
            ``"NORMAL"`` (survives a killed process, not an OS crash).
        max_batch: Most operations committed together by the writer thread (group commit).
        busy_timeout_ms: How long a connection waits for another process's write lock before failing.
        cache_jobs: Most job monitors kept in memory by the writer (least recently used ones are dropped).
        cache_bytes: Approximate memory budget of those monitors (:func:`~.report_transaction.monitor_size`); least recently used
            ones are dropped beyond it, so a few jobs with huge per-example reports cannot hold the memory of
            thousands of ordinary ones. A dropped job is rebuilt from the database at its next report.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        max_batch: int = 256,
        busy_timeout_ms: int = 5000,
        cache_jobs: int = 10_000,
        cache_bytes: int = 256 << 20,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.path = os.fspath(path)
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise ValueError(f"database directory {parent!r} does not exist")
        self.synchronous = synchronous
        self.max_batch = max_batch
        self.busy_timeout_ms = busy_timeout_ms
        self.cache_jobs = cache_jobs
        self.cache_bytes = cache_bytes
        self._cache_size = 0  # writer thread only: sum of the cached JobState.size
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._batch_writer = BatchWriter("evalstop-sqlite-writer", 1, max_batch, self._transact, self._forget)
        self._wconn: sqlite3.Connection | None = None  # writer thread only
        self._closed = False
        self._cache: OrderedDict[tuple[int, str], report_transaction.JobState] = OrderedDict()  # writer thread only
        self._data_version: int | None = None  # writer thread only
        self._hooked: set[str] | None = None  # writer thread only: event types some webhook wants (None: unknown)
        self._init_schema()
        self._header = db_health.HeaderWatch(self.path)  # see its docstring: held open until close()

    # -- connections -------------------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_ms / 1000
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys=ON")
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection (WAL readers see the last commit and never block the writer)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            conn = self._local.conn = self._connect()
        return conn

    def _init_schema(self) -> None:
        conn = self._connect()
        try:
            # executescript commits on its own; every statement is IF NOT EXISTS, so concurrent openers are safe.
            conn.executescript(_SCHEMA)
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise ValueError(
                    f"database {self.path!r} has schema version {row[0]}, newer than this "
                    f"evalstop-server ({SCHEMA_VERSION}); upgrade evalstop"
                )
            elif int(row[0]) < SCHEMA_VERSION:
                # A file of an older version: its tables lack the columns added since (CREATE TABLE IF NOT EXISTS
                # above left them as they were). Added in this one transaction, under the write lock, after reading
                # the version in it: of several processes opening the file at once, exactly one upgrades it.
                for statement in tables.sqlite_upgrade(int(row[0])):
                    conn.execute(statement)
                conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
                logger.info("database %s upgraded from schema version %s to %d", self.path, row[0], SCHEMA_VERSION)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            with self._conns_lock:
                self._conns.remove(conn)
            conn.close()

    # -- the writer thread ---------------------------------------------------------------------------------------
    def _submit(self, op: Callable[[_Txn], Any], key: Any = None) -> Future[Any]:
        return self._batch_writer.submit(0, key, op)

    def _forget(self, keys: Sequence[Any] | None) -> None:
        """Drop cached monitors that may be ahead of the database (writer thread only)."""
        if keys is None:
            self._cache.clear()
            self._cache_size = 0
        else:
            for key in keys:
                self._uncache(key)

    def _uncache(self, key: Any) -> None:
        job = self._cache.pop(key, None)
        if job is not None:
            self._cache_size -= job.size

    def _trim_cache(self) -> None:
        while len(self._cache) > 1 and (len(self._cache) > self.cache_jobs or self._cache_size > self.cache_bytes):
            _, job = self._cache.popitem(last=False)
            self._cache_size -= job.size

    def _transact(self, shard: int, ops: Sequence[Op], commit_if: Callable[[Sequence[Result]], bool]) -> list[Result]:
        """One ``BEGIN IMMEDIATE`` transaction over ``ops`` (the writer's :data:`~.writer.Transact`)."""
        if self._wconn is None:
            self._wconn = self._connect()
        conn = self._wconn
        txn = _Txn(conn, self._webhook_types)
        try:
            conn.execute("BEGIN IMMEDIATE")
            damaged = self._header.problem()  # cached pages would otherwise write on regardless
            if damaged is not None:
                raise StoreUnavailable(damaged)
            # data_version changes only when another connection (the CLI, another process) committed since this
            # one last looked: then the cached monitors may be stale and are dropped. Checked under the write lock,
            # so nobody can commit between the check and our COMMIT.
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                self._forget(None)
                self._hooked = None  # another connection may have added or removed a webhook
                self._data_version = version
            results: list[Result] = []
            for op in ops:
                try:
                    results.append((op.payload(txn), None))
                except sqlite3.Error:
                    raise  # the database refused a statement: a database failure, the writer's to handle
                except Exception as exc:  # the writer decides (domain error: answered; anything else: isolated)
                    results.append((None, exc))
            if commit_if(results):
                txn.flush()
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
            return results
        except BaseException:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    # -- tenants -------------------------------------------------------------------------------------------------
    def add_tenant(self, name: str) -> tuple[Tenant, str]:
        token = new_token()

        def op(txn: _Txn) -> Tenant:
            conn = txn.conn
            if conn.execute("SELECT 1 FROM tenants WHERE name = ?", (name,)).fetchone():
                raise TenantExists(f"tenant {name!r} already exists")
            now = time.time()
            cur = conn.execute(_SQL.insert_tenant, (name, hash_token(token), now))
            tenant = Tenant(int(cur.lastrowid or 0), name, now, None)
            txn.run(
                lambda c: store_queries.record(c, "?", tenant.tenant_id, events.TENANT_ADDED, None, now, {"name": name})
            )
            return tenant

        return self._submit(op, ("tenant", name)).result(), token

    def list_tenants(self) -> list[Tenant]:
        rows = self._reader().execute(_SQL.list_tenants).fetchall()
        return [Tenant(*row) for row in rows]

    def revoke_tenant(self, name: str) -> Tenant:
        def op(txn: _Txn) -> Tenant:
            conn = txn.conn
            row = conn.execute(
                "SELECT tenant_id, created_at, revoked_at FROM tenants WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise TenantNotFound(f"no tenant named {name!r}")
            revoked_at = row[2] if row[2] is not None else time.time()
            conn.execute("UPDATE tenants SET revoked_at = ? WHERE tenant_id = ?", (revoked_at, row[0]))
            if row[2] is None:
                details = {"name": name}
                txn.run(
                    lambda c: store_queries.record(c, "?", row[0], events.TENANT_REVOKED, None, revoked_at, details)
                )
            return Tenant(row[0], name, row[1], revoked_at)

        return self._submit(op, ("tenant", name)).result()

    def tenant_for_token(self, token: str) -> Tenant | None:
        row = self._reader().execute(_SQL.tenant_by_token, (hash_token(token),)).fetchone()
        if row is None or row[3] is not None:
            return None
        return Tenant(*row)

    # -- jobs ----------------------------------------------------------------------------------------------------
    def register_job(self, tenant_id: int, record: JobRecord) -> tuple[JobRecord, bool]:
        # Validates the specs and normalizes them (defaults filled in) so that equal detectors (cadences) compare equal.
        detector = detector_from_spec(record.detector)
        spec = detector.spec()
        cadence = sql.normalized_cadence(record.cadence)
        monitor = JobMonitor(job_id=record.job_id, job_type=record.job_type, detector=detector)
        state = monitor.state_dict()

        def op(txn: _Txn) -> tuple[JobRecord, bool]:
            txn.flush()
            conn = txn.conn
            row = conn.execute(_SQL.job_by_key, (tenant_id, record.job_id)).fetchone()
            if row is not None:
                existing = sql.job_from_row(row)
                sql.check_same_registration(existing, record, spec, cadence)
                return existing, False
            now = time.time()
            args = sql.insert_job_args(tenant_id, record, spec, state["detector_state"], now, cadence)
            conn.execute(_SQL.insert_job, args)
            job = sql.new_job_record(record, spec, now, cadence)
            store_queries.record(
                conn, "?", tenant_id, events.JOB_REGISTERED, job.job_id, now, store_queries.job_details(job)
            )
            return job, True

        return self._submit(op, (tenant_id, record.job_id)).result()

    def get_job(self, tenant_id: int, job_id: str) -> JobRecord:
        row = self._reader().execute(_SQL.job_by_key, (tenant_id, job_id)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return sql.job_from_row(row)

    def _load_for_update(self, txn: _Txn, key: tuple[int, str]) -> report_transaction.JobState:
        """The job's state, valid inside the current write transaction (see ``_transact`` for the cache)."""
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        txn.flush()  # the rows below must include what this batch already applied
        conn = txn.conn
        row = conn.execute(
            f"SELECT {report_transaction.JOB_STATE_COLUMNS} FROM jobs WHERE tenant_id = ? AND job_id = ?", key
        ).fetchone()
        reps = (
            []
            if row is None
            else conn.execute(
                f"SELECT {report_transaction.REPORT_STATE_COLUMNS} FROM reports WHERE tenant_id = ? AND job_id = ? ORDER BY step",
                key,
            ).fetchall()
        )
        cached = report_transaction.load_job_state(key[1], row, reps, complete=True)
        self._cache[key] = cached
        self._cache_size += cached.size
        return cached

    def submit_report(self, tenant_id: int, report: Report) -> Future[ReportOutcome]:
        key = (tenant_id, report.job_id)

        def op(txn: _Txn) -> ReportOutcome:
            job = self._load_for_update(txn, key)
            before = job.size
            outcome = report_transaction.apply_report(key, job, report, txn.writes)
            self._cache_size += job.size - before
            self._trim_cache()  # least recent first: the job just used stays
            return outcome

        return self._submit(op, key)

    def finish_job(self, tenant_id: int, job_id: str, reason: str) -> JobRecord:
        def op(txn: _Txn) -> bool:
            txn.flush()
            now = time.time()
            cur = txn.conn.execute(_SQL.finish_job, (now, reason, tenant_id, job_id))
            if cur.rowcount == 0 and txn.conn.execute(_SQL.job_exists, (tenant_id, job_id)).fetchone() is None:
                raise JobNotFound(f"no job {job_id!r}")
            self._uncache((tenant_id, job_id))  # reloaded (and refused as finished) on the next report
            if cur.rowcount == 1:
                store_queries.record_finish(txn.conn, "?", tenant_id, job_id, reason, now)
            return cur.rowcount == 1

        now = self._submit(op, (tenant_id, job_id)).result()
        job = self.get_job(tenant_id, job_id)
        job.finished_now = now
        return job

    def reports(self, tenant_id: int, job_id: str) -> list[StoredReport]:
        conn = self._reader()
        if conn.execute(_SQL.job_exists, (tenant_id, job_id)).fetchone() is None:
            raise JobNotFound(f"no job {job_id!r}")
        rows = conn.execute(_SQL.stored_reports, (tenant_id, job_id)).fetchall()
        return [sql.stored_report_from_row(r) for r in rows]

    # -- history, summary, events, webhooks: store_queries.SharedQueries on these two primitives ------------------
    _ph = "?"

    def _on_reader(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self._reader())

    def _rows(self, query: str, args: Sequence[Any]) -> Iterator[Any]:
        # On the consuming thread's reader connection, READ_BATCH rows at a time, not row by row: sqlite3 lets go of
        # the interpreter lock around every step and takes it back at once, and CPython asks the holder to hand the
        # lock over only after a waiting thread saw it not change hands for a whole switch interval. Read row by
        # row, the event loop waited out whole 1,000-row pages (stalls of 10-30 ms, measured); read in batches, those
        # stalls were gone (docs/benchmarks-service.md, fairness).
        cur = self._reader().execute(query, args)
        try:
            while batch := cur.fetchmany(READ_BATCH):
                yield from batch
        finally:
            cur.close()

    def _on_writer(self, fn: Callable[[Any], Any], webhooks_changed: bool = False) -> Any:
        def op(txn: _Txn) -> Any:
            out = txn.run(fn)
            if webhooks_changed:
                self._hooked = None
            return out

        return self._submit(op, ("webhooks",) if webhooks_changed else ("events",)).result()

    def _webhook_types(self) -> set[str]:
        """Event types some webhook wants (writer thread only; reloaded after any other connection's commit)."""
        if self._hooked is None:
            assert self._wconn is not None
            rows = self._wconn.execute("SELECT events FROM webhooks").fetchall()
            self._hooked = {kind for (types,) in rows for kind in types.split(",")}
        return self._hooked

    # -- operations ----------------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        if self._closed:
            return "the store is closed"
        if not self._batch_writer.alive:
            return "the store's writer thread stopped"
        try:
            self._reader().execute("SELECT 1 FROM meta LIMIT 1").fetchone()
        except sqlite3.Error as exc:
            return f"the database cannot be read: {exc}"
        # Ready means writes can succeed: the file is still a database, and its write lock can be taken.
        return self._header.problem() or db_health.lock_problem(self.path)

    def write_problem(self) -> str | None:
        # A write that changes nothing, rolled back: refused on a read-only file or mount, a full or locked database.
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")
            conn.execute("ROLLBACK")
            return None
        except sqlite3.Error as exc:
            return f"the database cannot be written: {exc}"
        finally:
            with self._conns_lock:
                self._conns.remove(conn)
            conn.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._batch_writer.close()
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._conns.clear()
        self._header.close()
