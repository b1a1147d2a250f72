"""The PostgreSQL store's schema versions: Alembic upgrades (``migrations/``) and the check that a database is current.

Kept apart from :mod:`~platform_sim.service.store_postgres` (the store's transactions and connections) because it is
what a deployment runs once per database, and what the schema tests call alone.
"""

from __future__ import annotations

import threading
from pathlib import Path

URL_SCHEMES = ("postgresql://", "postgres://")
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
"""The Alembic script directory of the store's schema."""
_ALEMBIC_LOCK = threading.Lock()


def is_postgres_url(db: str) -> bool:
    """True if ``db`` names a PostgreSQL database rather than a SQLite file path."""
    return isinstance(db, str) and db.startswith(URL_SCHEMES)


def _sqlalchemy_url(url: str) -> str:
    # Alembic goes through SQLAlchemy, whose default PostgreSQL driver is psycopg2; we ship psycopg 3.
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def upgrade_schema(url: str, revision: str = "head") -> str:
    """Bring the database at ``url`` to ``revision`` of the store's schema with Alembic; return the new revision.

    Safe to call from several processes at once (the migration environment takes an advisory lock) and from several
    threads (Alembic's context is process-global, so calls in one process take turns).

    Raises:
        ValueError: the database is at a revision this code does not know (a newer evalstop migrated it).
    """
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", _sqlalchemy_url(url))
    script = ScriptDirectory.from_config(cfg)
    engine = sa.create_engine(_sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with _ALEMBIC_LOCK, engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            if current is not None and current not in {s.revision for s in script.walk_revisions()}:
                raise ValueError(
                    f"database schema is at revision {current!r}, which this evalstop-server does not "
                    f"know (newest known: {script.get_current_head()!r}); upgrade evalstop"
                )
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            return MigrationContext.configure(conn).get_current_revision() or ""
    finally:
        engine.dispose()


def check_schema_at_head(url: str, connect_timeout: float = 10.0) -> None:
    """Raise ValueError unless the database at ``url`` is at the newest revision (for stores opened without
    migrating)."""
    import psycopg
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with psycopg.connect(url, autocommit=True, connect_timeout=int(connect_timeout)) as conn:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
    if row is None or row[0] != head:
        raise ValueError(
            f"database schema is at revision {row[0] if row else None!r}, expected {head!r}: "
            "run the migrations first (evalstop-server serve does it unless told not to)"
        )
