"""A PostgreSQL store, so that several ``evalstop-server`` replicas can serve the same tenants and jobs.

Selected by a database URL (``evalstop-server serve --db postgresql://user@host:5432/dbname``); SQLite stays the
embedded default. The schema is versioned with Alembic (``platform_sim/service/migrations/``) and brought to the
newest revision when a store opens (under an advisory lock, so replicas starting together migrate once).

How replicas stay correct:

- Reports are applied in transactions ``SELECT the job rows ... FOR UPDATE`` → apply
  :class:`~platform_sim.core.monitor.JobMonitor` → ``INSERT`` the report rows, ``UPDATE`` the job rows → ``COMMIT``.
  The row lock serializes concurrent reports for one job wherever they arrive; the decision is answered only after
  the commit, so an acknowledged report is durable (``synchronous_commit`` as the server is configured: ``on`` by
  default).
- No replica trusts memory: the monitor is rebuilt inside the transaction from the locked job row (detector state,
  best step, stop latch) and the report rows it needs (the last one, and the one of the reported step for a
  re-send; all of them for a job registered with a cadence, whose hint reads the whole history), then fed through
  the core's one implementation. That costs two indexed reads per batch (three when the batch holds a job with a
  cadence) and makes the decision identical to a single process applying the same reports in the same order.
- Lost connections (a database restart or failover) are reopened at their next use and the read or transaction run
  once more; writers wait at most ``lock_timeout_s`` for a row lock another replica holds.
- Within a replica, each job is pinned to one of ``workers`` writer threads (hash of tenant and job id), so reports
  for a job are applied in submission order. Each writer applies the reports queued for it together: one
  transaction of four round trips (lock the job rows in key order, so that two replicas' batches cannot deadlock;
  read the report rows; insert; update) and one commit for the whole batch (group commit).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from platform_sim.core import JobMonitor, Report, detector_from_spec

from . import events, report_transaction, sql, store, store_actuation, store_queries
from .postgres_migrations import check_schema_at_head, is_postgres_url, upgrade_schema
from .store import JobNotFound, JobRecord, ReportOutcome, Store, StoredReport, StoreUnavailable
from .tenant_tokens import TenantTokens
from .writer import BatchWriter, Op, Result

logger = logging.getLogger(__name__)

_SQL = sql.statements("%s")
# Errors after which a whole transaction may simply be run again (another replica won a race).
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
_LOCK_TIMEOUT = "55P03"  # lock_not_available: lock_timeout expired
# A batch's events in one round trip, with their outbox rows (RETURNING gives exactly this transaction's new ids).
_WRITE_EVENTS = (
    "WITH e AS (INSERT INTO events (tenant_id, type, job_id, time, details) "
    "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::float8[], %s::text[]) "
    "RETURNING id, tenant_id, type, time) " + events.fanout_sql("e", "%s")
)


def _write_events(cur: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    cur.execute(_WRITE_EVENTS, tuple(list(col) for col in zip(*rows)))


class PostgresStore(store_queries.SharedQueries, store_actuation.ActuationQueries, TenantTokens, Store):
    """A :class:`~platform_sim.service.store.Store` in a PostgreSQL database, shareable by several replicas.

    Args:
        url: libpq URL, ``postgresql://user[:password]@host[:port]/dbname[?sslmode=...]``.
        workers: Writer threads, each with its own connection; jobs are pinned to one by hash.
        readers: Most pooled connections for reads (token checks, ``GET`` requests).
        max_batch: Most queued operations one writer commits in one transaction.
        migrate: Upgrade the schema to the newest revision on open (default). With False the store only checks
            that the schema is at the newest revision, for operators who run migrations as a separate step.
        connect_timeout: Seconds to wait for a connection.
        retries: Times a transaction is run again after a deadlock or serialization failure.
        lock_timeout_s: Longest wait for a job's row lock held by another replica; then the reports waiting for it
            fail as :class:`StoreUnavailable` (503, re-sent by the client) instead of hanging.
    """

    def __init__(
        self,
        url: str,
        *,
        workers: int = 4,
        readers: int = 8,
        max_batch: int = 64,
        migrate: bool = True,
        connect_timeout: float = 10.0,
        retries: int = 5,
        lock_timeout_s: float = 10.0,
    ) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"not a PostgreSQL URL (must start with postgresql://): {url!r}")
        for name, value in (("workers", workers), ("readers", readers), ("max_batch", max_batch)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        import psycopg  # the optional extra `postgres`; imported here so that SQLite users never need it

        self._psycopg = psycopg
        if not lock_timeout_s > 0:
            raise ValueError(f"lock_timeout_s must be > 0, got {lock_timeout_s}")
        self.lock_timeout_s = lock_timeout_s
        self.url = url
        self.workers = workers
        self.max_batch = max_batch
        self.connect_timeout = connect_timeout
        self.retries = retries
        self._closed = False
        import sqlalchemy.exc

        try:
            if migrate:
                upgrade_schema(url)
            else:
                check_schema_at_head(url, connect_timeout)
        except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
            # libpq's messages span lines ("Is the server running...?"); operators get one line.
            orig = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {' '.join(str(orig).split())}") from None
        self._readers: queue.LifoQueue[Any] = queue.LifoQueue()
        self._reader_slots = threading.BoundedSemaphore(readers)
        self._all_conns: list[Any] = []
        self._conns_lock = threading.Lock()
        self._wconns: list[Any] = [None] * workers  # each writer thread's connection, (re)opened by _transact
        self._batch_writer = BatchWriter("evalstop-pg-writer", workers, max_batch, self._transact)

    # -- connections -------------------------------------------------------------------------------------------
    def _connect(self, autocommit: bool) -> Any:
        try:
            conn = self._psycopg.connect(self.url, autocommit=autocommit, connect_timeout=int(self.connect_timeout))
        except self._psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {' '.join(str(exc).split())}") from exc
        if not autocommit:
            # A writer never waits on a row lock forever: if another replica holds a job's row (a stuck or paused
            # process), the reports fail as 503 after lock_timeout and the client re-sends them; and a session
            # left idle inside a transaction is ended by the server so that its locks go free.
            conn.execute(f"SET lock_timeout = '{int(self.lock_timeout_s * 1000)}ms'")
            conn.execute("SET idle_in_transaction_session_timeout = '30s'")
            conn.commit()
        with self._conns_lock:
            self._all_conns.append(conn)
        return conn

    def _discard(self, conn: Any) -> None:
        with self._conns_lock:
            if conn in self._all_conns:
                self._all_conns.remove(conn)
        try:
            conn.close()
        except Exception:  # closing a broken connection: nothing left to save
            pass

    @contextmanager
    def _reader(self) -> Iterator[Any]:
        """A pooled autocommit connection: every read sees the latest commit of any replica."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        self._reader_slots.acquire()
        conn = None
        try:
            try:
                conn = self._readers.get_nowait()
            except queue.Empty:
                conn = self._connect(autocommit=True)
            try:
                yield conn
            except self._psycopg.OperationalError as exc:
                self._discard(conn)
                conn = None
                raise StoreUnavailable(f"PostgreSQL read failed: {exc}") from exc
        finally:
            if conn is not None:
                if conn.closed or self._closed:
                    self._discard(conn)
                else:
                    self._readers.put(conn)
            self._reader_slots.release()

    def _read(self, fn: Callable[[Any], Any], retry: bool = True) -> Any:
        """``fn(conn)`` on a pooled reader connection. A pooled connection can have died since its last use (the
        database restarted): the read is then tried once more on a new connection (reads are idempotent)."""
        try:
            with self._reader() as conn:
                return fn(conn)
        except StoreUnavailable:
            if not retry or self._closed:
                raise
        with self._reader() as conn:
            return fn(conn)

    # -- writer threads ------------------------------------------------------------------------------------------
    def _shard(self, tenant_id: int, job_id: str) -> int:
        return zlib.crc32(f"{tenant_id}/{job_id}".encode()) % self.workers

    def _submit(self, shard: int, key: tuple[Any, ...], op: Callable[[Any], Any] | Report) -> Future[Any]:
        """Queue ``op`` (a :class:`Report`, or a function of a cursor) on writer ``shard`` for the job ``key``."""
        return self._batch_writer.submit(shard, key, op)

    def _apply(self, cur: Any, ops: Sequence[Op]) -> list[Result]:
        """Apply ``ops`` in submission order in the open transaction: consecutive reports together
        (:meth:`_apply_reports`), any other operation (register, finish) alone."""
        results: list[Result] = []
        i = 0
        while i < len(ops):
            if isinstance(ops[i].payload, Report):
                j = i
                while j < len(ops) and isinstance(ops[j].payload, Report):
                    j += 1
                results += self._apply_reports(cur, ops[i:j])
                i = j
                continue
            try:
                results.append((ops[i].payload(cur), None))
            except self._psycopg.Error:
                raise  # the transaction is aborted: a database failure, handled by _transact
            except Exception as exc:  # the writer decides (domain error: answered; anything else: isolated)
                results.append((None, exc))
            i += 1
        return results

    def _transact(self, shard: int, ops: Sequence[Op], commit_if: Callable[[Sequence[Result]], bool]) -> list[Result]:
        """One transaction over ``ops`` on writer ``shard``'s connection (the writer's :data:`~.writer.Transact`).

        Deadlocks and serialization failures are retried; a lost connection is reopened and the transaction run
        once more. That is safe even if the lost transaction had committed: reports applied again are re-sends of
        stored steps and get their stored decisions, registering and finishing are idempotent. A database that
        cannot be reached, or a lock another replica holds past ``lock_timeout_s``, raises
        :class:`StoreUnavailable` for the whole batch."""
        pg = self._psycopg
        reconnected = False
        attempt = 0
        while True:
            conn = self._wconns[shard]
            try:
                if conn is None or conn.closed:
                    conn = self._wconns[shard] = self._connect(autocommit=False)
                with conn.transaction():
                    with conn.cursor() as cur:
                        results = self._apply(cur, ops)
                    if not commit_if(results):
                        raise pg.Rollback()  # leaves the block, rolled back, without an error
                return results
            except pg.Error as exc:
                sqlstate = getattr(exc, "sqlstate", None)
                if sqlstate in _RETRY_SQLSTATES and attempt < self.retries:
                    attempt += 1
                    logger.info("postgres transaction retried after %s (attempt %d)", sqlstate, attempt)
                    time.sleep(0.001 * 2**attempt)
                    continue
                lost = conn is None or conn.closed or conn.broken  # not a lock timeout: that connection is fine
                if lost:
                    if conn is not None:
                        self._discard(conn)
                    self._wconns[shard] = None
                    if not reconnected and not self._closed:
                        reconnected = True
                        logger.warning("postgres connection lost (%s); reconnecting", " ".join(str(exc).split()))
                        continue
                    raise StoreUnavailable(f"the database could not commit: {' '.join(str(exc).split())}") from exc
                if sqlstate == _LOCK_TIMEOUT:
                    raise StoreUnavailable(
                        f"lock timeout: a job row stayed locked by another replica for more than "
                        f"{self.lock_timeout_s:g} s; send the report again"
                    ) from exc
                raise

    def _apply_reports(self, cur: Any, items: Sequence[Op]) -> list[Result]:
        """Apply reports (several jobs, possibly several per job, in submission order) in the open transaction.

        Four round trips whatever the batch size (five when a job of the batch has a cadence: its report rows are
        read whole): lock the job rows, read the report rows the monitors need, insert the new report rows, update
        the job rows.
        """
        keys = sorted({op.key for op in items})
        # The row locks, taken in key order (ORDER BY sits under the locking step), so that two replicas' batches
        # never wait on each other in a cycle. The lock is taken alone: after waiting, PostgreSQL re-reads the locked
        # row but would join other tables from the statement's older snapshot (READ COMMITTED), so the report rows
        # are read by the next statement, which sees everything committed before the locks were granted.
        rows = cur.execute(
            f"SELECT tenant_id, job_id, {report_transaction.JOB_STATE_COLUMNS} "
            "FROM jobs WHERE (tenant_id, job_id) IN (SELECT * FROM unnest(%s::bigint[], %s::text[])) "
            "ORDER BY tenant_id, job_id FOR UPDATE",
            ([k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
        jobs = {(r[0], r[1]): r[2:] for r in rows}
        # A monitor needs, besides the detector state, only the report rows that a re-send could be compared with:
        # the one at each reported step (if stored) and the last one (for "steps must increase"). A job with a
        # cadence needs all of them: its policy reads the whole history (the regular interval, the scores' noise).
        full = sorted(key for key, job in jobs.items() if job[14] is not None)  # cadence
        want: set[tuple[int, str, int]] = set()
        for op in items:
            job = jobs.get(op.key)
            if job is not None and job[14] is None and job[13] is not None:  # no cadence; last_step
                want.update({(*op.key, job[13]), (*op.key, op.payload.step)})
        stored: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        if full:
            for r in cur.execute(
                f"SELECT tenant_id, job_id, {report_transaction.REPORT_STATE_COLUMNS} "
                "FROM reports WHERE (tenant_id, job_id) IN (SELECT * FROM unnest(%s::bigint[], %s::text[])) "
                "ORDER BY 1, 2, 3",
                ([k[0] for k in full], [k[1] for k in full]),
            ).fetchall():
                stored.setdefault((r[0], r[1]), []).append(r[2:])
        if want:
            w = sorted(want)
            for r in cur.execute(
                f"SELECT tenant_id, job_id, {report_transaction.REPORT_STATE_COLUMNS} "
                "FROM reports WHERE (tenant_id, job_id, step) IN "
                "(SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[])) ORDER BY 1, 2, 3",
                ([x[0] for x in w], [x[1] for x in w], [x[2] for x in w]),
            ).fetchall():
                stored.setdefault((r[0], r[1]), []).append(r[2:])
        states: dict[tuple[Any, ...], report_transaction.JobState] = {}
        writes = report_transaction.Writes()
        results: list[Result] = []
        for op in items:
            key = op.key
            try:
                job_state = states.get(key)
                if job_state is None:
                    row = jobs.get(key)
                    job_state = states[key] = report_transaction.load_job_state(
                        key[1], row, stored.get(key, []), complete=row is not None and row[14] is not None
                    )
                results.append((report_transaction.apply_report(key, job_state, op.payload, writes), None))
            except Exception as exc:  # the writer decides (domain error: answered; anything else: isolated)
                results.append((None, exc))
        writes.flush(cur.executemany, _SQL, lambda rows: _write_events(cur, rows))
        return results

    # -- tenants -------------------------------------------------------------------------------------------------
    def add_tenant(self, name: str) -> tuple[store.Tenant, str]:
        token = store.new_token()
        now = time.time()
        with self._reader() as conn, conn.transaction():  # not retried: a lost reply after the commit reads "exists"
            row = conn.execute(
                _SQL.insert_tenant + " ON CONFLICT (name) DO NOTHING RETURNING tenant_id",
                (name, store.hash_token(token), now),
            ).fetchone()
            if row is not None:
                store_queries.record(conn, "%s", int(row[0]), events.TENANT_ADDED, None, now, {"name": name})
        if row is None:
            raise store.TenantExists(f"tenant {name!r} already exists")
        return store.Tenant(int(row[0]), name, now, None), token

    def list_tenants(self) -> list[store.Tenant]:
        rows = self._read(lambda conn: conn.execute(_SQL.list_tenants).fetchall())
        return [store.Tenant(*row) for row in rows]

    def revoke_tenant(self, name: str) -> store.Tenant:
        now = time.time()

        def revoke(conn: Any) -> Any:
            with conn.transaction():
                old = conn.execute("SELECT revoked_at FROM tenants WHERE name = %s FOR UPDATE", (name,)).fetchone()
                row = conn.execute(  # idempotent (COALESCE): safe to run twice
                    "UPDATE tenants SET revoked_at = COALESCE(revoked_at, %s) WHERE name = %s "
                    "RETURNING tenant_id, name, created_at, revoked_at",
                    (now, name),
                ).fetchone()
                if row is not None and old[0] is None:
                    store_queries.record(conn, "%s", int(row[0]), events.TENANT_REVOKED, None, now, {"name": name})
                return row

        row = self._read(revoke)
        if row is None:
            raise store.TenantNotFound(f"no tenant named {name!r}")
        return store.Tenant(*row)

    def tenant_for_token(self, token: str) -> store.Tenant | None:
        # Not cached here: the HTTP app already remembers valid tokens for its token_cache_ttl (1 s), so a revocation
        # reaches every replica within that time; a second cache in the store would only lengthen it.
        digest = store.hash_token(token)
        row = self._read(lambda conn: conn.execute(_SQL.tenant_by_token, (digest,)).fetchone())
        if row is None or row[3] is not None:
            return None
        return store.Tenant(*row)

    # -- jobs ----------------------------------------------------------------------------------------------------
    def register_job(self, tenant_id: int, record: JobRecord) -> tuple[JobRecord, bool]:
        # Validates the specs and normalizes them (defaults filled in) so that equal detectors (cadences) compare equal.
        detector = detector_from_spec(record.detector)
        spec = detector.spec()
        cadence = sql.normalized_cadence(record.cadence)
        state = JobMonitor(job_id=record.job_id, job_type=record.job_type, detector=detector).state_dict()

        def op(cur: Any) -> tuple[JobRecord, bool]:
            now = time.time()
            cur.execute(
                _SQL.insert_job + " ON CONFLICT (tenant_id, job_id) DO NOTHING",
                sql.insert_job_args(tenant_id, record, spec, state["detector_state"], now, cadence),
            )
            if cur.rowcount == 1:
                job = sql.new_job_record(record, spec, now, cadence)
                details = store_queries.job_details(job)
                store_queries.record(cur, "%s", tenant_id, events.JOB_REGISTERED, job.job_id, now, details)
                return job, True
            existing = sql.job_from_row(cur.execute(_SQL.job_by_key, (tenant_id, record.job_id)).fetchone())
            sql.check_same_registration(existing, record, spec, cadence)
            return existing, False

        return self._submit(self._shard(tenant_id, record.job_id), (tenant_id, record.job_id), op).result()

    def get_job(self, tenant_id: int, job_id: str) -> JobRecord:
        row = self._read(lambda conn: conn.execute(_SQL.job_by_key, (tenant_id, job_id)).fetchone())
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return sql.job_from_row(row)

    def submit_report(self, tenant_id: int, report: Report) -> Future[ReportOutcome]:
        key = (tenant_id, report.job_id)
        # Queued as data, not as a closure: the writer applies consecutive reports together (_apply_reports).
        return self._submit(self._shard(*key), key, report)

    def finish_job(self, tenant_id: int, job_id: str, reason: str) -> JobRecord:
        def op(cur: Any) -> bool:
            now = time.time()
            cur.execute(_SQL.finish_job, (now, reason, tenant_id, job_id))
            changed = cur.rowcount == 1
            if not changed and cur.execute(_SQL.job_exists, (tenant_id, job_id)).fetchone() is None:
                raise JobNotFound(f"no job {job_id!r}")
            if changed:
                store_queries.record_finish(cur, "%s", tenant_id, job_id, reason, now)
            return changed

        # Through the job's writer, so that a finish sent after a report is applied after it.
        now = self._submit(self._shard(tenant_id, job_id), (tenant_id, job_id), op).result()
        job = self.get_job(tenant_id, job_id)
        job.finished_now = now
        return job

    def reports(self, tenant_id: int, job_id: str) -> list[StoredReport]:
        def read(conn: Any) -> list[tuple[Any, ...]]:
            if conn.execute(_SQL.job_exists, (tenant_id, job_id)).fetchone() is None:
                raise JobNotFound(f"no job {job_id!r}")
            return conn.execute(_SQL.stored_reports, (tenant_id, job_id)).fetchall()

        return [sql.stored_report_from_row(r) for r in self._read(read)]

    # -- history, summary, events, webhooks: store_queries.SharedQueries on these two primitives ------------------
    _ph = "%s"
    _skip_locked = True

    def _on_reader(self, fn: Callable[[Any], Any]) -> Any:
        return self._read(fn)

    def _rows(self, query: str, args: Sequence[Any]) -> Iterator[Any]:
        # psycopg receives the whole result at execute (the interpreter lock let go while it waits), so the rows are
        # read at once, with the retry of a dead pooled connection, and converted one by one as they are consumed.
        return iter(self._read(lambda conn: conn.execute(query, args).fetchall()))

    def _on_writer(self, fn: Callable[[Any], Any], webhooks_changed: bool = False) -> Any:
        return self._submit(0, ("webhooks",), fn).result()

    # -- operations ----------------------------------------------------------------------------------------------
    def ready(self) -> bool:
        if self._closed or not self._batch_writer.alive:
            return False
        try:
            self._read(lambda conn: conn.execute("SELECT 1 FROM alembic_version").fetchone())
        except (StoreUnavailable, self._psycopg.Error):
            return False
        return True

    def write_problem(self) -> str | None:
        row = self._read(
            lambda conn: conn.execute(
                "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')"
            ).fetchone()
        )
        if row[0] or row[1] == "on":
            return "the database is read-only (a standby, or default_transaction_read_only is on)"
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._batch_writer.close()
        with self._conns_lock:
            conns, self._all_conns = list(self._all_conns), []
        for conn in conns:
            try:
                conn.close()
            except Exception:  # closing at shutdown: nothing left to save
                pass
