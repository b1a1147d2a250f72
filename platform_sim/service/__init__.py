"""The HTTP scheduler service (``evalstop-server``): thin validation, tenants and persistence around the core.

- ``app``: the app factory (:func:`~platform_sim.service.app.create_app`), which assembles ``routes/`` (one module
  per group of routes) around ``deps`` (what the routes share: store, metrics, tenant auth), ``errors`` (one JSON
  error shape and its handlers), ``asgi`` (body limit, report fast path) and ``ratelimit``.
- ``wire``: the HTTP request and response models (the information boundary; unknown fields are rejected).
- ``store``: the persistence interface; ``store_sqlite`` the default, ``store_postgres`` for several replicas;
  ``tables`` the database tables both hold, ``sql`` their shared statements and rows, ``report_transaction`` the
  report transaction both run, ``writer`` their batching writer threads.
- ``metrics``: Prometheus metrics. ``cli``: the ``evalstop-server`` command.

Nothing here is imported by the core; the service needs the ``service`` extra (FastAPI, uvicorn, httpx, pydantic).
"""
