"""The operator's routes: liveness, readiness and the Prometheus metrics (no tenant token)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import ServiceContext
from ..errors import UNAVAILABLE
from . import Routes


def add_routes(app: FastAPI, ctx: ServiceContext) -> None:
    """Add the operator routes, around ``ctx``, to ``app``."""
    api = Routes(app, "", ["operator"])

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
    async def prometheus() -> Response:
        """Prometheus text format."""
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
