"""``/v1/jobs``: register a job, list the tenant's jobs, read one, finish one."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse, Response

from platform_sim.core import cadence_from_spec, default_spec

from ..deps import ServiceContext, job_out
from ..errors import CONFLICT, ERRORS, NOT_FOUND, UNAVAILABLE, ApiError, not_found, store_error
from ..fairness import Pacer, json_page, render_rows
from ..store import JobNotFound, JobRecord, Tenant
from ..wire import CadenceSpec, DetectorSpec, FinishIn, JobCreate, JobIdPath, JobList, JobOut
from . import JSON, PREFIX, Routes


def add_routes(app: FastAPI, ctx: ServiceContext) -> None:
    """Add the job routes, around ``ctx``, to ``app``."""
    TenantDep = Annotated[Tenant, Depends(ctx.tenant)]
    store, metrics = ctx.store, ctx.metrics
    api = Routes(app, PREFIX, ["jobs"])

    @api.post(
        "/jobs",
        status_code=201,
        response_model=JobOut,
        responses={
            200: {"model": JobOut, "description": "Already registered (idempotent)."},
            **ERRORS,
            **CONFLICT,
            **UNAVAILABLE,
        },
    )
    async def register_job(body: JobCreate, t: TenantDep) -> JSONResponse:
        """Register a job and return it; its ``job_id`` is made up if not given.

        The answer's ``detector`` is the full spec the job runs (the default detector's when none was given, every
        parameter filled in), so that a client can run exactly that spec on its side.
        """
        raw_cadence = body.cadence.model_dump() if isinstance(body.cadence, CadenceSpec) else body.cadence
        try:
            # Checked here, before the store, so that the message names the field (the store checks it again).
            cadence = cadence_from_spec(raw_cadence)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"cadence: {exc}") from None
        record = JobRecord(
            job_id=body.job_id or f"job-{uuid.uuid4().hex[:16]}",
            job_type=body.job_type,
            detector=_detector_spec(body.detector),
            gpus=body.gpus,
            planned_steps=body.planned_steps,
            cadence=None if cadence is None else cadence.spec(),
        )
        if ctx.quotas is not None and ctx.quotas.active:
            await _check_quota(ctx, t, record.job_id)
        try:
            job, created = await ctx.call(store.register_job, t.tenant_id, record)
        except Exception as exc:
            api_error = store_error(exc, record.job_id)
            if api_error is not None:
                raise api_error from None
            if isinstance(exc, ValueError):  # unknown detector or bad detector parameter, from the core's registry
                raise ApiError(422, "invalid_request", f"detector: {exc}") from None
            raise
        if created:
            metrics.jobs_registered.labels(job.job_type).inc()
        return JSONResponse(job_out(job), status_code=201 if created else 200)

    @api.get("/jobs", response_model=JobList, responses=ERRORS)
    async def list_jobs(
        t: TenantDep,
        status: Annotated[str | None, Query(pattern="^(running|stopped|finished)$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: Annotated[str | None, Query(max_length=128)] = None,
    ) -> Response:
        """The tenant's jobs, ordered by id (keyset pagination with ``after``).

        A tenant's pages are served one at a time and give way to other requests while they are rendered; with a
        rate limit, a page costs one token plus one per 100 jobs it returns (charged after the read).
        """

        def render(pace: Pacer) -> tuple[int, bytes]:
            rows = render_rows(store.iter_jobs(t.tenant_id, status, limit, after), job_out, pace)
            nxt = rows.last.job_id if rows.last is not None and len(rows.parts) == limit else None
            return len(rows.parts), json_page({}, "jobs", rows.parts, {"next_after": nxt})

        return Response(await ctx.bulk_read(t, render), media_type=JSON)

    @api.get("/jobs/{job_id}", response_model=JobOut, responses={**ERRORS, **NOT_FOUND})
    async def get_job(job_id: JobIdPath, t: TenantDep) -> JSONResponse:
        """One of the tenant's jobs (committed state)."""
        try:
            return JSONResponse(job_out(await ctx.call(store.get_job, t.tenant_id, job_id)))
        except JobNotFound:
            raise not_found(job_id) from None

    @api.post("/jobs/{job_id}/finish", response_model=JobOut, responses={**ERRORS, **NOT_FOUND, **UNAVAILABLE})
    async def finish_job(job_id: JobIdPath, t: TenantDep, body: FinishIn | None = None) -> JSONResponse:
        """Mark the job finished (idempotent: the first reason is kept). It takes no more reports."""
        reason = body.reason if body is not None else "completed"
        try:
            job = await ctx.call(store.finish_job, t.tenant_id, job_id, reason)
        except Exception as exc:
            api_error = store_error(exc, job_id)
            if api_error is None:
                raise
            raise api_error from None
        if job.finished_now:  # a repeated finish is answered the same but counted once
            metrics.jobs_finished.inc()
        return JSONResponse(job_out(job))


async def _check_quota(ctx: ServiceContext, tenant: Tenant, job_id: str) -> None:
    """Refuse a new job beyond the tenant's quotas with 429 (an existing job's idempotent re-registration passes)."""
    assert ctx.quotas is not None
    why = ctx.quotas.refusal(await ctx.call(ctx.store.summary, tenant.tenant_id))
    if why is None:
        return
    try:
        await ctx.call(ctx.store.get_job, tenant.tenant_id, job_id)
    except JobNotFound:
        raise ApiError(429, "quota_exceeded", why) from None


def _detector_spec(given: DetectorSpec | None) -> dict[str, Any]:
    """The spec a registration asks for: the default detector (``default_spec()``) when none is given or it names
    none, with the given params merged over the default's; else the given spec as it is."""
    if given is None:
        return default_spec()
    if given.name is None:
        spec = default_spec()
        spec["params"].update(given.params)
        return spec
    return given.model_dump()
