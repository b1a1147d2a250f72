"""``/v1/jobs/{job_id}/scheduler-handle``: a job names the scheduler job it runs as, so that its stop ends it there.

``PUT`` registers the handle once, after the server's actuator of that kind checked it: its syntax (400 when
malformed), that the job exists on the scheduler (404 when not) and that it belongs to the tenant's scope as the
operator configured it (``evalstop-server tenant scope``; 403 when not). A kind the server has no actuator for is
422. The scheduler is asked on threads of its own, a few per tenant (:mod:`~platform_sim.service.lookups`): beyond
them 429 (this tenant) or 503 (all), never a wait on the threads other routes need. ``GET`` reads the handle back with the state of the job's stop action (none before the job stopped).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import logging
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from platform_sim.actuators.base import Actuator, HandleError, HandleRefused

from ..deps import ServiceContext
from ..errors import CONFLICT, ERRORS, NOT_FOUND, UNAVAILABLE, ApiError, ErrorOut, not_found, store_error
from ..lookups import SchedulerLookups
from ..store import JobNotFound, Tenant
from ..store_actuation import conflict_message
from ..wire import JobIdPath
from . import PREFIX

logger = logging.getLogger(__name__)

HANDLE_PATH = "/jobs/{job_id}/scheduler-handle"


class HandleIn(BaseModel):
    """The scheduler job a service job runs as."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=32, examples=["slurm", "kubernetes", "ray"])
    ref: str = Field(
        min_length=1,
        max_length=512,
        description="The job's name on that scheduler: Slurm job id, Kubernetes namespace/kind/name, Ray submission id.",
        examples=["1234"],
    )


class ActuationOut(BaseModel):
    """The state of a job's stop action on its scheduler."""

    state: str = Field(description="pending, done or given_up")
    phase: int
    attempts: int
    next_attempt_at: float | None
    created_at: float
    updated_at: float
    last_action: str | None
    last_detail: str | None


class HandleOut(BaseModel):
    """A job's registered scheduler handle and its stop action (null until the job stopped)."""

    job_id: str
    kind: str
    ref: str
    registered_at: float
    actuation: ActuationOut | None


def add_routes(
    app: FastAPI, ctx: ServiceContext, actuators: Mapping[str, Actuator], lookups: SchedulerLookups | None = None
) -> None:
    """Add the scheduler-handle routes, around ``ctx`` and the server's ``actuators`` (by kind), to ``app``; the
    scheduler is asked on ``lookups`` (default: a :class:`SchedulerLookups` of its default size)."""
    TenantDep = Annotated[Tenant, Depends(ctx.tenant)]
    store = ctx.store
    lookups = lookups or SchedulerLookups()
    path = PREFIX + HANDLE_PATH

    @app.put(
        path,
        tags=["jobs"],
        status_code=201,
        response_model=HandleOut,
        responses={
            200: {"model": HandleOut, "description": "The same handle was registered before (idempotent)."},
            400: {"model": ErrorOut, "description": "The ref is malformed for its scheduler."},
            403: {"model": ErrorOut, "description": "The scheduler job is not in the tenant's scope."},
            429: {"model": ErrorOut, "description": "The tenant has its share of scheduler look-ups in flight."},
            **ERRORS,
            **NOT_FOUND,
            **CONFLICT,
            **UNAVAILABLE,
        },
    )
    async def put_handle(job_id: JobIdPath, body: HandleIn, t: TenantDep) -> JSONResponse:
        """Register the job's scheduler handle (once), checked by the server's actuator of its kind.

        When the job stops, the service ends the scheduler job through that actuator (a job already stopped has its
        action queued now). 404 names either the service job or the scheduler job, whichever is unknown."""
        actuator = actuators.get(body.kind)
        if actuator is None:
            configured = ", ".join(sorted(actuators)) or "none"
            raise ApiError(
                422, "unknown_kind", f"kind {body.kind!r}: this server has no such actuator (configured: {configured})"
            )
        try:
            existing = await ctx.call(store.scheduler_handle, t.tenant_id, job_id)
        except JobNotFound:
            raise not_found(job_id) from None
        try:
            handle = actuator.parse(body.ref)
        except HandleError as exc:
            raise ApiError(400, "malformed_handle", f"ref {body.ref!r}: {exc}") from None
        if existing is not None:  # sent once: a retry is answered as stored, another handle refused, unasked
            if existing.handle != handle:
                raise ApiError(409, "conflict", conflict_message(job_id, existing.handle))
            return JSONResponse(existing.to_json(), status_code=200)
        scope = await ctx.call(store.tenant_scope, t.tenant_id, t.name)
        if not scope.owners(handle.kind):  # refused before the scheduler is asked: nothing learnt about its jobs
            raise ApiError(
                403,
                "forbidden_handle",
                f"{handle.kind} job {handle.ref!r}: the operator gave this tenant no {handle.kind} scope "
                "(evalstop-server tenant scope)",
            )
        try:  # never on the shared threads: a slow scheduler must not stall other routes (lookups.py)
            await lookups.run(t.tenant_id, actuator.authorize, handle, scope)
        except ApiError:  # no room for the look-up: 429/503 as the pool answered
            raise
        except HandleRefused as exc:
            raise ApiError(403, "forbidden_handle", f"{handle.kind} job {handle.ref!r}: {exc}") from None
        except HandleError as exc:
            raise ApiError(404, "unknown_handle", f"{handle.kind} job {handle.ref!r}: {exc}") from None
        except Exception as exc:  # the scheduler cannot be asked now: the client may send it again
            # Why goes to the server log only: it may hold the scheduler's own messages and the operator's paths.
            logger.warning("authorizing %s handle %r failed: %s", handle.kind, handle.ref, exc)
            raise ApiError(
                503,
                "scheduler_unavailable",
                f"the {handle.kind} scheduler could not be asked now; try again later",
                {"Retry-After": "5"},
            ) from None
        try:
            record, created = await ctx.call(store.register_handle, t.tenant_id, job_id, handle)
        except Exception as exc:
            api_error = store_error(exc, job_id)
            if api_error is None:
                raise
            raise api_error from None
        return JSONResponse(record.to_json(), status_code=201 if created else 200)

    @app.get(path, tags=["jobs"], response_model=HandleOut, responses={**ERRORS, **NOT_FOUND})
    async def get_handle(job_id: JobIdPath, t: TenantDep) -> JSONResponse:
        """The job's scheduler handle and the state of its stop action; 404 when the job registered none."""
        try:
            record = await ctx.call(store.scheduler_handle, t.tenant_id, job_id)
        except JobNotFound:
            raise not_found(job_id) from None
        if record is None:
            raise ApiError(404, "no_handle", f"job {job_id!r} registered no scheduler handle")
        return JSONResponse(record.to_json())
