"""The stores' schema, described once: the tables, columns, keys and constraints both stores hold.

The SQLite store creates its tables from :data:`TABLES` (:func:`sqlite_ddl`). The PostgreSQL store's schema is made
by its Alembic revisions (``migrations/versions/``), which are history and never import this module (a revision must
keep doing what it did when it was written). ``tests/test_service_schema.py`` pins that the two agree: the SQLite
schema equals the one the Alembic head creates, compared column by column (name, type class, nullability, default),
with the same primary keys, unique constraints and foreign keys. A schema change is therefore made in two places in
one commit, here and as a new Alembic revision, and the test says when they differ.

Types are named by class, not by dialect: ``int`` (SQLite INTEGER; PostgreSQL INTEGER), ``bigint`` (INTEGER;
BIGINT), ``real`` (REAL; DOUBLE PRECISION), ``text`` (TEXT; TEXT).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1
"""The SQLite file's schema version (``meta.schema_version``); a file with a newer one is refused."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column.

    Args:
        name: Column name.
        kind: ``int``, ``bigint``, ``real`` or ``text``.
        nullable: Whether NULL is allowed.
        default: A literal SQL default (``"0"``, ``"''"``), or None.
    """

    name: str
    kind: str
    nullable: bool = True
    default: str | None = None


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


def _c(name: str, kind: str, nullable: bool = True, default: str | None = None) -> Column:
    return Column(name, kind, nullable, default)


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
        ),
        primary_key=("tenant_id", "job_id", "step"),
        foreign_keys=((("tenant_id", "job_id"), "jobs", ("tenant_id", "job_id")),),
    ),
)
"""The tables of both stores."""

_SQLITE_TYPES = {"int": "INTEGER", "bigint": "INTEGER", "real": "REAL", "text": "TEXT"}


def sqlite_ddl() -> str:
    """The SQLite schema script (every statement ``IF NOT EXISTS``, so concurrent openers are safe).

    A table with a numbered key uses ``INTEGER PRIMARY KEY`` (the rowid); the others are ``WITHOUT ROWID`` (their
    primary key is the table's order, which is how every query reads them).
    """
    out = ["CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"]
    for table in TABLES:
        lines = []
        for col in table.columns:
            line = f"    {col.name} {_SQLITE_TYPES[col.kind]}"
            if not col.nullable:
                line += " NOT NULL"
            if col.name == table.identity:
                line += " PRIMARY KEY"
            if col.default is not None:
                line += f" DEFAULT {col.default}"
            lines.append(line)
        if table.identity is None:
            lines.append(f"    PRIMARY KEY ({', '.join(table.primary_key)})")
        lines += [f"    UNIQUE ({', '.join(cols)})" for cols in table.unique]
        lines += [
            f"    FOREIGN KEY ({', '.join(cols)}) REFERENCES {ref}({', '.join(ref_cols)})"
            for cols, ref, ref_cols in table.foreign_keys
        ]
        suffix = "" if table.identity is not None else " WITHOUT ROWID"
        out.append(f"CREATE TABLE IF NOT EXISTS {table.name} (\n" + ",\n".join(lines) + f"\n){suffix};")
    return "\n".join(out) + "\n"
