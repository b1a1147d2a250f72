"""Alembic migrations of the PostgreSQL store's schema (see :mod:`platform_sim.service.store_postgres`)."""
