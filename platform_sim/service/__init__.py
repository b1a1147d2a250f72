"""The HTTP scheduler service (``evalstop-server``): thin validation, tenants and persistence around the core.

- ``app``: the FastAPI application (:func:`~platform_sim.service.app.create_app`).
- ``schemas``: the wire schemas (the information boundary; unknown fields are rejected).
- ``store``: the persistence interface; ``sqlite_store`` the default, ``store_postgres`` for several replicas.
- ``metrics``: Prometheus metrics. ``cli``: the ``evalstop-server`` command.

Nothing here is imported by the core; the service needs the ``service`` extra (FastAPI, uvicorn, httpx, pydantic).
"""
