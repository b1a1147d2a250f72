"""What a tenant (or the operator) reads back: a job's eval history, the tenant's totals, the audit trail.

``GET /v1/jobs/{job_id}/evals`` (the reports posted to the same path, paginated), ``GET /v1/summary`` (jobs running,
stopped and finished, GPU-hours freed) and ``GET /v1/events`` (the audit trail after a cursor). Every route answers
the tenant's own rows only; another tenant's job is the same 404 as a missing one. ``/v1/events`` also takes the
operator's admin token (``evalstop-server serve --admin-token-file``), which reads every tenant's events and nothing
else.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import hmac
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from ..deps import BEARER, ServiceContext
from ..errors import ERRORS, NOT_FOUND, not_found
from ..events import event_json
from ..fairness import Pacer, json_page, render_rows
from ..store import Event, JobNotFound, StoredReport, Tenant
from ..wire import EvalList, EventList, JobIdPath, SummaryOut
from . import JSON, PREFIX, Routes

MAX_PAGE = 1000
"""Most rows one page of evals or events holds."""


def eval_json(report: StoredReport) -> dict[str, Any]:
    """One stored report as ``GET /v1/jobs/{id}/evals`` answers it."""
    return {
        "step": report.step,
        "eval_score": report.eval_score,
        "n_eval_scores": None if report.eval_scores is None else len(report.eval_scores),
        "decision": report.decision.to_dict(),
        "received_at": report.received_at,
    }


def add_routes(app: FastAPI, ctx: ServiceContext, admin_token: str | None = None) -> None:
    """Add the history, summary and events routes, around ``ctx``, to ``app``.

    Args:
        app: The app.
        ctx: Its shared dependencies.
        admin_token: The operator's token for ``GET /v1/events`` across tenants, or None (no admin access).
    """
    TenantDep = Annotated[Tenant, Depends(ctx.tenant)]
    store = ctx.store
    api = Routes(app, PREFIX, ["history"])

    async def reader(
        request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
    ) -> Tenant | None:
        """The events route's caller: None for the admin token, else the tenant (401 as on every route)."""
        token = None if creds is None else creds.credentials
        if admin_token is not None and token is not None and hmac.compare_digest(token.encode(), admin_token.encode()):
            return None
        return await ctx.tenant(request, creds)

    @api.get("/jobs/{job_id}/evals", response_model=EvalList, responses={**ERRORS, **NOT_FOUND})
    async def list_evals(
        job_id: JobIdPath,
        t: TenantDep,
        order: Annotated[Literal["newest", "step"], Query(description="newest first, or by step")] = "newest",
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[int | None, Query(ge=0, le=2**62, description="next_cursor of the previous page")] = None,
    ) -> Response:
        """The job's reports (as posted to this path), each with its decision and the time it was received.

        Served as ``GET /v1/jobs`` is: a tenant's pages one at a time, giving way to other requests, and with a rate
        limit one more token per 100 reports returned."""

        def render(pace: Pacer) -> tuple[int, bytes]:
            reports = store.iter_evals(t.tenant_id, job_id, order=order, limit=limit, cursor=cursor)
            rows = render_rows(reports, eval_json, pace)
            nxt = rows.last.step if rows.last is not None and len(rows.parts) == limit else None
            head = {"job_id": job_id, "order": order}
            return len(rows.parts), json_page(head, "evals", rows.parts, {"next_cursor": nxt})

        try:
            return Response(await ctx.bulk_read(t, render), media_type=JSON)
        except JobNotFound:
            raise not_found(job_id) from None

    @api.get("/summary", response_model=SummaryOut, responses=ERRORS)
    async def summary(t: TenantDep) -> JSONResponse:
        """The tenant's totals: jobs running, stopped and finished, and the GPU-hours its stops freed."""
        s = await ctx.call(store.summary, t.tenant_id)
        return JSONResponse(
            {
                "running": s.running,
                "stopped": s.stopped,
                "finished": s.finished,
                "stopped_total": s.stopped_total,
                "gpu_hours_freed": s.gpu_hours_freed,
            }
        )

    @api.get("/events", response_model=EventList, responses=ERRORS)
    async def list_events(
        caller: Annotated[Tenant | None, Depends(reader)],
        after: Annotated[int, Query(ge=0, le=2**62, description="the last event id already read")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> Response:
        """The audit trail after ``after``, oldest first: the tenant's own events (with the admin token: every
        tenant's, each with its ``tenant``). Pass ``next_after`` back as ``after`` to follow it.

        Served as ``GET /v1/jobs`` is: a caller's pages one at a time, giving way to other requests, and with a rate
        limit one more token per 100 events returned."""

        def render(pace: Pacer) -> tuple[int, bytes]:
            # The operator's page names each event's tenant.
            names = None if caller is not None else {t.tenant_id: t.name for t in store.list_tenants()}

            def to_json(e: Event) -> dict[str, Any]:
                out = event_json(e)
                if names is not None:
                    out["tenant"] = names.get(e.tenant_id)
                return out

            rows = render_rows(
                store.iter_events(None if caller is None else caller.tenant_id, after, limit), to_json, pace
            )
            nxt = after if rows.last is None else rows.last.id
            return len(rows.parts), json_page({}, "events", rows.parts, {"next_after": nxt})

        return Response(await ctx.bulk_read(caller, render), media_type=JSON)
