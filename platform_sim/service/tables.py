"""The stores' schema, described once: the tables, columns, keys and constraints both stores hold.

The SQLite store creates its tables from :data:`TABLES` (:func:`sqlite_ddl`). The PostgreSQL store's schema is made
by its Alembic revisions (``migrations/versions/``), which are history and never import this module (a revision must
keep doing what it did when it was written). ``tests/test_service_schema.py`` pins that the two agree: the SQLite
schema equals the one the Alembic head creates, compared column by column (name, type class, nullability, default),
with the same primary keys, unique constraints and foreign keys. A schema change is therefore made in two places in
one commit, here and as a new Alembic revision, and the test says when they differ.

Types are named by class, not by dialect: ``int`` (SQLite INTEGER; PostgreSQL INTEGER), ``bigint`` (INTEGER;
BIGINT), ``real`` (REAL; DOUBLE PRECISION), ``text`` (TEXT; TEXT).

Upgrades: a column added after the first version names the version that added it (``Column.since``) and is appended
at the end of its table (where ``ALTER TABLE ... ADD COLUMN`` puts it, so that an upgraded file and a new one have the
same columns in the same order). It must be nullable or have a default, so that rows written before it stay valid.
The SQLite store brings an older file up to :data:`SCHEMA_VERSION` with :func:`sqlite_upgrade`; PostgreSQL with the
Alembic revision of the same change.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 5
"""The SQLite file's schema version (``meta.schema_version``); a file with a newer one is refused, an older one is
upgraded when a store opens it. Version 2 added each job's cadence (``jobs.cadence``) and the cadence hint of each
answered decision (``reports.next_eval_step``). Version 3 (Alembic ``0003_events``) added the GPU-hours a stop freed
(``jobs.gpu_hours_freed``), the audit trail (``events``) and the webhooks with their outbox (``webhooks``,
``webhook_outbox``). Version 4 (Alembic ``0004_actuators``) added what the service may do on the cluster
schedulers: each tenant's scopes (``tenant_scopes``), each job's scheduler handle (``scheduler_handles``) and the
durable outbox of stop actions (``actuations``). Version 5 (Alembic ``0005_spread``) added each report's spread
(``reports.eval_std``, ``reports.eval_n``)."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column.

    Args:
        name: Column name.
        kind: ``int``, ``bigint``, ``real`` or ``text``.
        nullable: Whether NULL is allowed.
        default: A literal SQL default (``"0"``, ``"''"``), or None.
        since: The schema version that added the column (1: there from the start).
    """

    name: str
    kind: str
    nullable: bool = True
    default: str | None = None
    since: int = 1


@dataclass(frozen=True, slots=True)
class Table:
    """One table.

    Args:
        name: Table name.
        columns: Its columns in order.
        primary_key: The primary key's columns.
        unique: Column sets with a unique constraint.
        foreign_keys: ``(columns, referred table, referred columns)``.
        identity: The primary-key column the database numbers itself (SQLite ``INTEGER PRIMARY KEY``, PostgreSQL
            ``IDENTITY``), or None.
    """

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    unique: tuple[tuple[str, ...], ...] = ()
    foreign_keys: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = ()
    identity: str | None = None


def _c(name: str, kind: str, nullable: bool = True, default: str | None = None, since: int = 1) -> Column:
    return Column(name, kind, nullable, default, since)


TABLES: tuple[Table, ...] = (
    Table(
        "tenants",
        (
            _c("tenant_id", "bigint", False),
            _c("name", "text", False),
            _c("token_hash", "text", False),
            _c("created_at", "real", False),
            _c("revoked_at", "real"),
        ),
        primary_key=("tenant_id",),
        unique=(("name",), ("token_hash",)),
        identity="tenant_id",
    ),
    Table(
        "jobs",
        (
            _c("tenant_id", "bigint", False),
            _c("job_id", "text", False),
            _c("job_type", "text", False),
            # JSON as text: the core's state dicts round-trip exactly through json.dumps/loads.
            _c("detector", "text", False),
            _c("detector_state", "text", False),
            _c("gpus", "int"),
            _c("planned_steps", "bigint"),
            _c("created_at", "real", False),
            _c("n_reports", "int", False, "0"),
            _c("first_step", "bigint"),
            _c("first_report_at", "real"),
            _c("last_step", "bigint"),
            _c("best_step", "bigint"),
            _c("best_score", "real"),
            _c("stopped_at", "bigint"),
            _c("stop_reason", "text", False, "''"),
            _c("finished_at", "real"),
            _c("finish_reason", "text"),
            # The cadence spec as JSON (CadencePolicy.spec()); NULL: the fixed cadence, no hints (every job before v2).
            _c("cadence", "text", since=2),
            # Written when the core stops the job: gpus x remaining planned steps x measured seconds per step / 3600
            # (NULL: not stopped, or the job never said its gpus or planned steps).
            _c("gpu_hours_freed", "real", since=3),
        ),
        primary_key=("tenant_id", "job_id"),
        foreign_keys=((("tenant_id",), "tenants", ("tenant_id",)),),
    ),
    Table(
        "reports",
        (
            _c("tenant_id", "bigint", False),
            _c("job_id", "text", False),
            _c("step", "bigint", False),
            _c("eval_score", "real", False),
            _c("eval_scores", "text"),
            # The decision answered to this report (a re-send of the step gets it again).
            _c("action", "text", False),
            _c("reason", "text", False),
            _c("declines", "int", False),
            _c("best_step", "bigint"),
            _c("best_score", "real"),
            _c("received_at", "real", False),
            # The decision's cadence hint (NULL: none), so that a re-send is answered the same decision.
            _c("next_eval_step", "bigint", since=2),
            # The report's spread (eval_std, eval_n; NULL: none): the history shows it.
            _c("eval_std", "real", since=5),
            _c("eval_n", "bigint", since=5),
        ),
        primary_key=("tenant_id", "job_id", "step"),
        foreign_keys=((("tenant_id", "job_id"), "jobs", ("tenant_id", "job_id")),),
    ),
    # The audit trail: append-only, one row per thing that happened, written in the transaction of that thing.
    # No foreign keys: an event outlives what it names (a removed webhook) and is pruned only by retention.
    Table(
        "events",
        (
            _c("id", "bigint", False, since=3),
            _c("tenant_id", "bigint", False, since=3),
            _c("type", "text", False, since=3),
            _c("job_id", "text", since=3),
            _c("time", "real", False, since=3),
            _c("details", "text", False, "'{}'", since=3),
        ),
        primary_key=("id",),
        identity="id",
    ),
    Table(
        "webhooks",
        (
            _c("webhook_id", "bigint", False, since=3),
            _c("tenant_id", "bigint", False, since=3),
            _c("url", "text", False, since=3),
            # Comma-separated event types it receives (full names, e.g. "job.stopped,job.finished").
            _c("events", "text", False, since=3),
            # The HMAC key, in plain text: the server signs with it (a hash could not sign).
            _c("secret", "text", False, since=3),
            _c("created_at", "real", False, since=3),
        ),
        primary_key=("webhook_id",),
        foreign_keys=((("tenant_id",), "tenants", ("tenant_id",)),),
        identity="webhook_id",
    ),
    # The durable outbox: one row per (webhook, event) still to deliver, written in the event's transaction and
    # deleted when delivered (or given up); next_attempt_at is also the claim lease of a delivery in flight.
    Table(
        "webhook_outbox",
        (
            _c("outbox_id", "bigint", False, since=3),
            _c("webhook_id", "bigint", False, since=3),
            _c("event_id", "bigint", False, since=3),
            _c("attempts", "int", False, "0", since=3),
            _c("next_attempt_at", "real", False, since=3),
        ),
        primary_key=("outbox_id",),
        unique=(("webhook_id", "event_id"),),
        foreign_keys=((("webhook_id",), "webhooks", ("webhook_id",)),),
        identity="outbox_id",
    ),
    # What each tenant may name on each scheduler (the operator's `tenant scope`): one row per (kind, owner); the
    # owner's syntax is the actuator's (Slurm "account:A" or "user:U", a Kubernetes namespace, a Ray prefix).
    Table(
        "tenant_scopes",
        (
            _c("tenant_id", "bigint", False, since=4),
            _c("kind", "text", False, since=4),
            _c("owner", "text", False, since=4),
        ),
        primary_key=("tenant_id", "kind", "owner"),
        foreign_keys=((("tenant_id",), "tenants", ("tenant_id",)),),
    ),
    # The scheduler handle a job registered (PUT /v1/jobs/{id}/scheduler-handle), authorized when it was stored.
    Table(
        "scheduler_handles",
        (
            _c("tenant_id", "bigint", False, since=4),
            _c("job_id", "text", False, since=4),
            _c("kind", "text", False, since=4),
            _c("ref", "text", False, since=4),
            _c("registered_at", "real", False, since=4),
        ),
        primary_key=("tenant_id", "job_id"),
        foreign_keys=((("tenant_id", "job_id"), "jobs", ("tenant_id", "job_id")),),
    ),
    # The durable outbox of stop actions: one row per stopped job with a handle, written in the transaction of the
    # stop decision (or of the handle's registration, for a job already stopped) and kept as the action's record.
    # state: pending (next_attempt_at is when it is due, or the claim lease while a worker runs it), done, given_up.
    # claims counts the claims: a worker records its attempt only while the row still holds its claim (a worker
    # whose lease ran out cannot overwrite the one that took over).
    Table(
        "actuations",
        (
            _c("action_id", "bigint", False, since=4),
            _c("tenant_id", "bigint", False, since=4),
            _c("job_id", "text", False, since=4),
            _c("kind", "text", False, since=4),
            _c("ref", "text", False, since=4),
            _c("state", "text", False, "'pending'", since=4),
            _c("phase", "int", False, "0", since=4),
            _c("attempts", "int", False, "0", since=4),
            _c("claims", "int", False, "0", since=4),
            _c("next_attempt_at", "real", False, since=4),
            _c("created_at", "real", False, since=4),
            _c("updated_at", "real", False, since=4),
            _c("last_action", "text", since=4),
            _c("last_detail", "text", since=4),
        ),
        primary_key=("action_id",),
        unique=(("tenant_id", "job_id"),),
        identity="action_id",
    ),
)
"""The tables of both stores."""

INDEXES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # GET /v1/events reads one tenant's events in id order.
    ("events_tenant_id", "events", ("tenant_id", "id")),
    # The actuate worker looks for due pending actions.
    ("actuations_due", "actuations", ("state", "next_attempt_at")),
)
"""Secondary indexes ``(name, table, columns)`` (the Alembic revision that adds a table creates its indexes too)."""

_SQLITE_TYPES = {"int": "INTEGER", "bigint": "INTEGER", "real": "REAL", "text": "TEXT"}


def _sqlite_column(table: Table, col: Column) -> str:
    line = f"{col.name} {_SQLITE_TYPES[col.kind]}"
    if not col.nullable:
        line += " NOT NULL"
    if col.name == table.identity:
        line += " PRIMARY KEY"
    if col.default is not None:
        line += f" DEFAULT {col.default}"
    return line


def sqlite_upgrade(version: int) -> list[str]:
    """The statements that bring a SQLite file from schema ``version`` to :data:`SCHEMA_VERSION`: one ``ALTER TABLE
    ... ADD COLUMN`` per column added since, in table and column order (tables added since are made by
    :func:`sqlite_ddl`, which creates whatever is missing).

    Raises:
        ValueError: ``version`` is not between 1 and :data:`SCHEMA_VERSION`.
    """
    if not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(f"schema version must be between 1 and {SCHEMA_VERSION}, got {version}")
    out = []
    for table in TABLES:
        if all(col.since > version for col in table.columns):
            continue  # a table added since: sqlite_ddl creates it whole
        for col in table.columns:
            if col.since > version:
                if not col.nullable and col.default is None:
                    raise ValueError(f"column {table.name}.{col.name} is added later but is NOT NULL without default")
                out.append(f"ALTER TABLE {table.name} ADD COLUMN {_sqlite_column(table, col)}")
    return out


def sqlite_ddl() -> str:
    """The SQLite schema script (every statement ``IF NOT EXISTS``, so concurrent openers are safe).

    A table with a numbered key uses ``INTEGER PRIMARY KEY`` (the rowid); the others are ``WITHOUT ROWID`` (their
    primary key is the table's order, which is how every query reads them).
    """
    out = ["CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"]
    for table in TABLES:
        lines = [f"    {_sqlite_column(table, col)}" for col in table.columns]
        if table.identity is None:
            lines.append(f"    PRIMARY KEY ({', '.join(table.primary_key)})")
        lines += [f"    UNIQUE ({', '.join(cols)})" for cols in table.unique]
        lines += [
            f"    FOREIGN KEY ({', '.join(cols)}) REFERENCES {ref}({', '.join(ref_cols)})"
            for cols, ref, ref_cols in table.foreign_keys
        ]
        suffix = "" if table.identity is not None else " WITHOUT ROWID"
        out.append(f"CREATE TABLE IF NOT EXISTS {table.name} (\n" + ",\n".join(lines) + f"\n){suffix};")
    out += [f"CREATE INDEX IF NOT EXISTS {name} ON {table}({', '.join(cols)});" for name, table, cols in INDEXES]
    return "\n".join(out) + "\n"
