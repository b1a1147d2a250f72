"""One schema: the SQLite store's tables (built from ``platform_sim/service/tables.py``) equal the Alembic head's.

The Alembic revisions are run on a SQLite file here (and on PostgreSQL in the ``postgres``-marked test), then both
schemas are read back with SQLAlchemy's inspector and compared column by column, key by key.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sa = pytest.importorskip("sqlalchemy", reason="the postgres extra (sqlalchemy, alembic) is not installed")
pytest.importorskip("alembic", reason="the postgres extra (sqlalchemy, alembic) is not installed")

from platform_sim.service import tables  # noqa: E402
from platform_sim.service.store_sqlite import SQLiteStore  # noqa: E402


def _kind_declared(type_: Any) -> str:
    """The schema kind of a type as declared (Alembic on SQLite keeps BIGINT, INTEGER, FLOAT, TEXT)."""
    name = str(type_).upper()
    if "BIGINT" in name:
        return "bigint"
    if "INT" in name:
        return "int"
    if any(t in name for t in ("FLOA", "REAL", "DOUB")):
        return "real"
    if "TEXT" in name or "CHAR" in name:
        return "text"
    raise AssertionError(f"unexpected column type {name}")


def _affinity(kind: str) -> str:
    """SQLite's type affinity of a kind: int and bigint are both INTEGER there."""
    return {"bigint": "int"}.get(kind, kind)


def _reflect(engine: Any, kind: Callable[[Any], str]) -> dict[str, Any]:
    insp = sa.inspect(engine)
    out: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) - {"meta", "alembic_version"}):
        default = lambda d: None if d is None else str(d).split("::")[0].strip("'")  # noqa: E731 - 0, '0', ''::text
        out[table] = {
            "columns": [
                (c["name"], kind(c["type"]), bool(c["nullable"]), default(c.get("default")))
                for c in insp.get_columns(table)
            ],
            "primary_key": tuple(insp.get_pk_constraint(table)["constrained_columns"]),
            "unique": sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(table)),
            "foreign_keys": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                for f in insp.get_foreign_keys(table)
            ),
        }
    return out


def _spec(kind: Callable[[str], str] = lambda k: k) -> dict[str, Any]:
    return {
        t.name: {
            "columns": [
                (c.name, kind(c.kind), c.nullable, None if c.default is None else c.default.strip("'"))
                for c in t.columns
            ],
            "primary_key": t.primary_key,
            "unique": sorted(t.unique),
            "foreign_keys": sorted(t.foreign_keys),
        }
        for t in sorted(tables.TABLES, key=lambda t: t.name)
    }


def _alembic_upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    from platform_sim.service.postgres_migrations import MIGRATIONS_DIR

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()


def test_sqlite_schema_equals_the_alembic_heads(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "store.db").close()
    _alembic_upgrade(f"sqlite:///{tmp_path / 'alembic.db'}")
    store = _reflect(sa.create_engine(f"sqlite:///{tmp_path / 'store.db'}"), lambda t: _affinity(_kind_declared(t)))
    alembic = _reflect(sa.create_engine(f"sqlite:///{tmp_path / 'alembic.db'}"), _kind_declared)
    assert store == _spec(_affinity)  # the SQLite store makes what tables.py describes
    assert alembic == _spec()  # ... and so does the Alembic head, down to int versus bigint
    assert {t: v["foreign_keys"] for t, v in store.items()} == {t: v["foreign_keys"] for t, v in alembic.items()}


def test_an_upgraded_version_1_file_has_the_schema_of_a_new_one(tmp_path: Path) -> None:
    # A file written at schema version 1 (before cadences), upgraded by opening it with today's store: the columns
    # added since are appended where a new file has them, so the two files' schemas are the same.
    import sqlite3

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.executescript((Path(__file__).parent / "data" / "service_db_v1.sql").read_text())
    conn.close()
    before = _reflect(sa.create_engine(f"sqlite:///{old}"), lambda t: _affinity(_kind_declared(t)))
    assert "cadence" not in [c[0] for c in before["jobs"]["columns"]]
    SQLiteStore(old).close()
    SQLiteStore(old).close()  # a second open finds it at the current version: nothing more to do
    SQLiteStore(tmp_path / "new.db").close()
    upgraded = _reflect(sa.create_engine(f"sqlite:///{old}"), lambda t: _affinity(_kind_declared(t)))
    assert upgraded == _reflect(
        sa.create_engine(f"sqlite:///{tmp_path / 'new.db'}"), lambda t: _affinity(_kind_declared(t))
    )
    assert upgraded == _spec(_affinity)
    assert tables.sqlite_upgrade(tables.SCHEMA_VERSION) == []
    with pytest.raises(ValueError, match="schema version must be between 1 and"):
        tables.sqlite_upgrade(0)


@pytest.mark.postgres
def test_postgres_schema_equals_schema_py() -> None:
    psycopg = pytest.importorskip("psycopg")
    base = os.environ.get("EVALSTOP_PG_URL")
    if not base:
        pytest.skip("no PostgreSQL server (set EVALSTOP_PG_URL or run tests/pg.sh)")
    name = f"evalstop_schema_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    url = base.rsplit("/", 1)[0] + "/" + name
    try:
        from platform_sim.service.postgres_migrations import _sqlalchemy_url, upgrade_schema

        upgrade_schema(url)
        engine = sa.create_engine(_sqlalchemy_url(url), poolclass=sa.pool.NullPool)
        try:
            assert _reflect(engine, _kind_declared) == _spec()
        finally:
            engine.dispose()
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
