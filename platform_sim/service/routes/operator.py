"""The operator's routes: liveness, readiness and the Prometheus metrics (no tenant token).

``/metrics`` without a token has the process's own counters only, which name no tenant; the per-tenant totals
(:class:`~platform_sim.service.metrics.TenantTotals`) come only with the operator's admin token
(``Authorization: Bearer <admin token>``, ``serve --admin-token-file``).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import hmac
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..deps import BEARER, ServiceContext
from ..errors import UNAVAILABLE
from ..metrics import TenantTotals
from . import Routes


def add_routes(app: FastAPI, ctx: ServiceContext, admin_token: str | None = None) -> None:
    """Add the operator routes, around ``ctx``, to ``app`` (``admin_token``: the one that also reads the
    per-tenant totals of ``/metrics``; None: nobody reads them)."""
    api = Routes(app, "", ["operator"])
    per_tenant = CollectorRegistry(auto_describe=True)
    per_tenant.register(TenantTotals(ctx.store))

    def is_admin(creds: HTTPAuthorizationCredentials | None) -> bool:
        token = None if creds is None else creds.credentials
        return (
            admin_token is not None and token is not None and hmac.compare_digest(token.encode(), admin_token.encode())
        )

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @api.get("/readyz", responses=UNAVAILABLE)
    async def readyz() -> JSONResponse:
        """Readiness: writes can succeed (the store reads, its writer is alive, and with SQLite the file is still a
        database whose write lock can be taken now); otherwise 503 saying why."""
        why = await ctx.call(ctx.store.not_ready_reason)  # it may wait for the write lock: off the event loop
        if why is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"error": "unavailable", "message": why}, status_code=503)

    @api.get("/metrics", response_class=Response)
    async def prometheus(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> Response:
        """Prometheus text format: the process's counters; with the admin token also each tenant's totals."""
        text = generate_latest(ctx.metrics.registry)
        if is_admin(creds):  # the store is read (at most once a minute): off the event loop
            text += await ctx.call(generate_latest, per_tenant)
        return Response(text, media_type=CONTENT_TYPE_LATEST)
