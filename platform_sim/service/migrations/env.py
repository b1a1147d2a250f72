"""Alembic environment of the PostgreSQL store.

Run through :func:`platform_sim.service.postgres_migrations.upgrade_schema` (which every service replica calls on start),
never with a hand-written alembic.ini: the database URL comes from the caller's config. Several replicas may start at
once on one database, so the migration runs under a PostgreSQL advisory lock: the first replica migrates, the others
wait and then find the schema at head.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

# An arbitrary constant shared by every replica: the advisory-lock key that serializes schema migrations.
MIGRATION_LOCK_KEY = 0x65766C73746F70  # "evlstop"


def run_migrations_online() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is None:
        url = config.get_main_option("sqlalchemy.url")
        if url is None:
            raise RuntimeError("the migration environment was given neither a connection nor sqlalchemy.url; "
                               "run migrations through platform_sim.service.postgres_migrations.upgrade_schema")
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.connect() as connection:
            _migrate(connection)
        engine.dispose()
    else:
        _migrate(connection)


def _migrate(connection: sa.Connection) -> None:
    if connection.dialect.name != "postgresql":
        # Only the schema test runs the revisions on SQLite (to compare them with tables.py); no replicas there.
        context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
        return
    connection.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
    connection.commit()
    try:
        context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        connection.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run them against the database")
run_migrations_online()
