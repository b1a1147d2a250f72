"""The HTTP scheduler service: validation, tenant auth, persistence, then one call into the scheduler core.

Build it with :func:`create_app` around a :class:`~platform_sim.service.store.Store`; ``evalstop-server serve`` runs it
under uvicorn. The API is versioned under ``/v1``; the OpenAPI spec is at ``/openapi.json``.

The service makes no decision of its own: a report is checked against the whitelist schema, then handed to the store,
which applies :class:`~platform_sim.core.monitor.JobMonitor` inside the job's write transaction and answers the
core's :class:`~platform_sim.core.boundary.Decision` after the commit.
"""

# No `from __future__ import annotations` here: FastAPI resolves the dependency annotations defined inside
# create_app at runtime.
import asyncio
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from platform_sim.core import ConflictError, InvalidReportError, Report, cadence_from_spec, default_spec

from .metrics import ServiceMetrics
from .wire import (
    JOB_ID_PATTERN,
    MAX_EVAL_SCORES,
    CadenceSpec,
    DecisionOut,
    ErrorOut,
    FinishIn,
    JobCreate,
    JobList,
    JobOut,
    ReportIn,
)
from .store import (
    JobExists,
    JobFinished,
    JobNotFound,
    JobRecord,
    Store,
    StoreUnavailable,
    Tenant,
)
from .writer import OperationFailed

logger = logging.getLogger(__name__)

API_VERSION = "v1"
DEFAULT_MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (1 MiB: a report with tens of thousands of per-example scores)."""


class ApiError(Exception):
    """An error answered as ``{"error": code, "message": message}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode()


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length or by counting a streamed body.

    A plain ASGI middleware (not ``BaseHTTPMiddleware``) because it runs on every report and must stay cheap.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[None]]
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        has_length = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                has_length = True
                try:
                    length = int(value)
                except ValueError:
                    await self._refuse(send, 400, "bad_request", "Content-Length is not an integer")
                    return
                if length > self.max_bytes:
                    await self._refuse(
                        send,
                        413,
                        "body_too_large",
                        f"request body of {length} bytes exceeds the limit of {self.max_bytes} bytes",
                    )
                    return
        if not has_length and scope.get("method") in ("POST", "PUT", "PATCH"):
            # A streamed (chunked) body: read it here, counting, and refuse it before the app sees any of it. The
            # app cannot raise the 413 itself: FastAPI turns any error while reading a body into a 400.
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body += message.get("body", b"")
                if len(body) > self.max_bytes:
                    await self._refuse(
                        send, 413, "body_too_large", f"request body exceeds the limit of {self.max_bytes} bytes"
                    )
                    return
                if not message.get("more_body", False):
                    break
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": bytes(body), "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(send: Callable[..., Awaitable[None]], status: int, code: str, message: str) -> None:
        body = _error_body(code, message)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class TenantRateLimit:
    """A token bucket per tenant: ``rate`` tokens per second on average, bursts of up to ``burst``.

    A request costs one token, and a report one more per :data:`RATE_BYTES_PER_TOKEN` bytes of body, so that a tenant
    sending large per-example reports is limited by the work it causes, not by its request count. One tenant that
    sends too much gets 429 with ``Retry-After`` instead of taking the server's time from the others. The buckets
    live in this app instance (one per process); with several replicas each enforces its own.

    Args:
        rate: Tokens per second a tenant may sustain (> 0).
        burst: Tokens a tenant may spend at once after being idle (>= 1). A request that costs more than ``burst``
            takes the whole bucket (so that it can pass at all).
    """

    def __init__(self, rate: float, burst: float) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst = float(rate), float(burst)
        self._buckets: dict[int, tuple[float, float]] = {}  # tenant id -> (tokens, time of last refill)

    def retry_after(self, tenant_id: int, cost: float = 1.0, now: float | None = None) -> float:
        """Take ``cost`` tokens for ``tenant_id``; 0.0 if they were there, else the seconds until they will be."""
        now = time.monotonic() if now is None else now
        cost = min(max(cost, 1.0), self.burst)
        tokens, last = self._buckets.get(tenant_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= cost:
            self._buckets[tenant_id] = (tokens - cost, now)
            return 0.0
        self._buckets[tenant_id] = (tokens, now)
        return (cost - tokens) / self.rate


RATE_BYTES_PER_TOKEN = 2_000
"""A request costs one rate-limit token plus one per this many bytes of body: a small report costs 1, a report of
10,000 per-example scores (about 100 kB) about 51. Chosen with ``benchmarks/bench_noisy_neighbour.py``: large reports
cost the server's single writer (and the disk) far more per byte than small ones cost per request."""

_EVALS_PATH = re.compile(rf"^/{API_VERSION}/jobs/([^/]+)/evals$")
_JOB_ID = re.compile(JOB_ID_PATTERN)

ReportHandler = Callable[[str | None, str, bytes], Awaitable[tuple[int, dict[str, Any], dict[str, str] | None]]]


def _unknown_query_error(names: Sequence[str]) -> ApiError:
    return ApiError(
        422,
        "invalid_request",
        f"invalid request: unknown query parameter(s) {', '.join(sorted(names))} (unknown fields are rejected)",
    )


def _declared_query(dependant: Any) -> set[str]:
    """Query parameter names a route declares, its sub-dependencies included."""
    names = {getattr(f, "alias", None) or f.name for f in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared_query(sub)
    return names


async def _no_unknown_query(request: Request) -> None:
    """Refuse query parameters the route does not declare: the boundary holds for the query string too."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    allowed = _declared_query(dependant) if dependant is not None else set()
    unknown = set(request.query_params) - allowed
    if unknown:
        raise _unknown_query_error(list(unknown))


class ReportFastPath:
    """Serve ``POST /v1/jobs/{job_id}/evals`` without FastAPI's routing, dependency and response machinery.

    The report endpoint is the only hot one (every evaluation of every job); going through FastAPI cost about 40% of
    the server's CPU per report (profiled with py-spy). This middleware runs the same steps as the FastAPI route of
    the same path (which stays for the OpenAPI spec and answers identically): bearer auth, path check, body size
    limit, the :class:`~platform_sim.service.wire.ReportIn` schema (``model_validate_json``), then the shared
    report handler.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], handler: ReportHandler, max_bytes: int) -> None:
        self.app = app
        self.handler = handler
        self.max_bytes = max_bytes

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]], send: Callable[..., Awaitable[None]]
    ) -> None:
        match = _EVALS_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await _send_json(
                    send,
                    413,
                    {"error": "body_too_large", "message": f"request body exceeds the limit of {self.max_bytes} bytes"},
                    {"connection": "close"},
                )
                return
            if not message.get("more_body", False):
                break
        if scope.get("query_string"):  # the route declares no query parameter
            names = [part.split(b"=", 1)[0].decode("latin-1") for part in scope["query_string"].split(b"&") if part]
            error = _unknown_query_error(names or ["?"])
            await _send_json(send, error.status, {"error": error.code, "message": error.message})
            return
        status, payload, headers = await self.handler(authorization, match.group(1), bytes(body))
        await _send_json(send, status, payload, headers)


async def _send_json(
    send: Callable[..., Awaitable[None]], status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _validation_message(errors: Sequence[Any]) -> str:
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        if err.get("type") == "json_invalid":
            # pydantic says "Invalid JSON: <why>"; FastAPI's parser says "JSON decode error" and puts why in ctx.
            msg = str(err.get("msg", ""))
            why = msg if msg.startswith("Invalid JSON") else f"Invalid JSON: {(err.get('ctx') or {}).get('error', msg)}"
            parts.append(f"body: {why}")
        elif err.get("type") == "extra_forbidden":
            parts.append(
                f"{where}: unknown field (unknown fields are rejected: only the whitelisted fields may "
                "cross the information boundary)"
            )
        else:
            # Never echo the input back: it may hold a value that is not JSON (NaN) or that should not be logged.
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _job_out(job: JobRecord) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "job_type": job.job_type,
        "status": job.status,
        "detector": job.detector,
        "cadence": job.cadence if isinstance(job.cadence, dict) else {"name": "fixed", "params": {}},
        "gpus": job.gpus,
        "planned_steps": job.planned_steps,
        "created_at": job.created_at,
        "n_reports": job.n_reports,
        "last_step": job.last_step,
        "last_decision": None if job.last_decision is None else job.last_decision.to_dict(),
        "best_step": job.best_step,
        "best_score": job.best_score,
        "stopped_at": job.stopped_at,
        "finished_at": job.finished_at,
        "finish_reason": job.finish_reason,
    }


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing, unknown or revoked bearer token."},
    413: {"model": ErrorOut, "description": "Request body too large."},
    422: {"model": ErrorOut, "description": "Invalid request (unknown field, bad value, non-finite score)."},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "No such job for this tenant."}}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "Conflicts with the job's state."}
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: {"model": ErrorOut, "description": "Store cannot commit."}}

JobIdPath = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="The job's id.")]


def create_app(
    store: Store,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_store: bool = False,
    token_cache_ttl: float = 1.0,
    fast_path: bool = True,
    max_eval_scores: int = MAX_EVAL_SCORES,
    rate_limit: TenantRateLimit | None = None,
) -> FastAPI:
    """Build the service around ``store``.

    Args:
        store: Where tenants, jobs and reports live.
        max_body_bytes: Largest request body accepted; larger ones get 413.
        close_store: Close ``store`` when the app shuts down (set by the CLI, which owns it).
        token_cache_ttl: Seconds a valid token's tenant is remembered (a revocation takes effect within this time);
            0 looks every token up in the store.
        fast_path: Serve the report endpoint through :class:`ReportFastPath` (same answers, less CPU); False routes
            it through FastAPI (kept for comparison and tests).
        max_eval_scores: Most per-example scores one report may carry; longer lists get 422.
        rate_limit: Per-tenant request rate limit (429 with ``Retry-After`` beyond it), or None for none.
    """
    if max_eval_scores < 1:
        raise ValueError(f"max_eval_scores must be >= 1, got {max_eval_scores}")
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if close_store:
            store.close()

    app = FastAPI(
        title="evalstop scheduler service",
        version="1.0.0",
        description="Stops RLHF and fine-tuning jobs after k consecutive declines of their held-out eval score. "
        "Only whitelisted fields cross the boundary; unknown fields are rejected.",
        lifespan=lifespan,
        dependencies=[Depends(_no_unknown_query)],
    )
    app.state.store = store
    app.state.metrics = metrics
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "message": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # A bug answers 500 for this request alone, as JSON like every other error.
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {"error": "internal_error", "message": "internal error while answering this request"}, status_code=500
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "invalid_request", "message": _validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's only 400 is a body it cannot decode (not UTF-8): the same 422 as any other unreadable body.
            return JSONResponse(
                {
                    "error": "invalid_request",
                    "message": "invalid request: body: Invalid JSON: not UTF-8 (send one UTF-8 JSON object)",
                },
                status_code=422,
            )
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path; a path can have several.
            allowed: set[str] = set()
            for route in app.router.routes:
                match, _ = route.matches({**request.scope, "method": "OPTIONS"})
                if match is not Match.NONE:
                    allowed |= set(getattr(route, "methods", None) or ())
            headers["allow"] = ", ".join(sorted(allowed))
        codes = {404: "not_found", 405: "method_not_allowed"}
        return JSONResponse(
            {"error": codes.get(exc.status_code, "http_error"), "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=headers or None,
        )

    # Valid tokens are remembered for token_cache_ttl seconds: the lookup was a fifth of the server's time per
    # report. A revocation therefore takes effect within that time (1 s by default); unknown tokens are never cached.
    token_cache: dict[str, tuple[Tenant, float]] = {}

    bearer = HTTPBearer(auto_error=False, description="A tenant token from `evalstop-server tenant add NAME`.")

    def authenticate(token: str | None, body_bytes: int = 0) -> Tenant:
        challenge = {"WWW-Authenticate": "Bearer"}
        if not token:
            metrics.auth_failures.inc()
            raise ApiError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'", challenge)
        now = time.monotonic()
        hit = token_cache.get(token)
        if hit is not None and hit[1] > now:
            found: Tenant | None = hit[0]
        else:
            found = store.tenant_for_token(token)
            if found is not None and token_cache_ttl > 0:
                if len(token_cache) >= 10_000:  # bounded: drop everything rather than track recency
                    token_cache.clear()
                token_cache[token] = (found, now + token_cache_ttl)
        if found is None:
            metrics.auth_failures.inc()
            raise ApiError(401, "unauthorized", "invalid or revoked token", challenge)
        if rate_limit is not None:
            wait = rate_limit.retry_after(found.tenant_id, 1.0 + body_bytes // RATE_BYTES_PER_TOKEN)
            if wait > 0:
                metrics.rate_limited.inc()
                raise ApiError(
                    429,
                    "rate_limited",
                    f"too many requests from this tenant (limit {rate_limit.rate:g}/s, "
                    f"burst {rate_limit.burst:g}); retry after {wait:.2f} s",
                    {"Retry-After": str(max(1, math.ceil(wait)))},
                )
        return found

    async def tenant(
        request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> Tenant:
        length = request.headers.get("content-length", "0")
        return authenticate(None if creds is None else creds.credentials, int(length) if length.isdigit() else 0)

    TenantDep = Annotated[Tenant, Depends(tenant)]

    def not_found(job_id: str) -> ApiError:
        # The same answer whether the job does not exist or belongs to another tenant: never leak existence.
        return ApiError(404, "not_found", f"no job {job_id!r} for this tenant")

    async def handle_report(t: Tenant, job_id: str, body: ReportIn) -> dict[str, Any]:
        """The report endpoint's work after auth and schema validation (shared by the route and the fast path)."""
        t0 = time.perf_counter()
        if body.job_id != job_id:
            metrics.reports.labels("invalid").inc()
            raise ApiError(
                422, "invalid_request", f"job_id {body.job_id!r} in the body does not match the path job {job_id!r}"
            )
        if body.eval_scores is not None and len(body.eval_scores) > max_eval_scores:
            metrics.reports.labels("invalid").inc()
            raise ApiError(
                422,
                "invalid_request",
                f"invalid request: eval_scores has {len(body.eval_scores)} entries; "
                f"this server takes at most {max_eval_scores} per report",
            )
        try:
            report = Report(
                job_id=body.job_id,
                job_type=body.job_type,
                step=body.step,
                eval_score=body.eval_score,
                eval_scores=None if body.eval_scores is None else tuple(body.eval_scores),
            )
            outcome = await asyncio.wrap_future(store.submit_report(t.tenant_id, report))
        except InvalidReportError as exc:
            metrics.reports.labels("invalid").inc()
            raise ApiError(422, "invalid_request", str(exc)) from None
        except ConflictError as exc:
            metrics.reports.labels("conflict").inc()
            raise ApiError(409, "conflict", str(exc)) from None
        except JobNotFound:
            metrics.reports.labels("not_found").inc()
            raise not_found(job_id) from None
        except JobFinished as exc:
            metrics.reports.labels("finished").inc()
            raise ApiError(409, "job_finished", str(exc)) from None
        except StoreUnavailable as exc:
            metrics.reports.labels("unavailable").inc()
            raise ApiError(503, "unavailable", str(exc)) from None
        except OperationFailed as exc:  # this report alone failed server-side; nothing of it was stored
            metrics.reports.labels("internal_error").inc()
            raise ApiError(500, "internal_error", str(exc)) from None
        decision = outcome.decision
        metrics.reports.labels("resend" if outcome.resend else "accepted").inc()
        metrics.decisions.labels(decision.action.value).inc()
        if outcome.stopped_now:
            metrics.stops.inc()
            job = store.get_job(t.tenant_id, job_id)
            if job.gpus:
                metrics.gpus_freed.inc(job.gpus)
            metrics.gpu_hours_reclaimed.inc(outcome.gpu_hours_reclaimed)
        metrics.report_latency.observe(time.perf_counter() - t0)
        return decision.to_dict()

    async def fast_report(
        authorization: str | None, job_id: str, raw: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str] | None]:
        try:
            scheme, _, token = (authorization or "").partition(" ")
            t = authenticate(token.strip() if scheme.lower() == "bearer" else None, len(raw))
            if not _JOB_ID.fullmatch(job_id):
                raise ApiError(
                    422,
                    "invalid_request",
                    f"invalid request: path.job_id: String should match pattern '{JOB_ID_PATTERN}'",
                )
            try:
                body = ReportIn.model_validate_json(raw)
            except ValidationError as exc:
                raise ApiError(422, "invalid_request", _validation_message(exc.errors())) from None
            return 200, await handle_report(t, job_id, body), None
        except ApiError as exc:
            return exc.status, {"error": exc.code, "message": exc.message}, exc.headers
        except Exception:  # a bug: a 500 for this request alone, never a dropped connection
            logger.exception("report for job %r failed", job_id)
            return 500, {"error": "internal_error", "message": "internal error while answering this report"}, None

    if fast_path:
        app.add_middleware(ReportFastPath, handler=fast_report, max_bytes=max_body_bytes)

    # -- jobs ------------------------------------------------------------------------------------------------------
    @app.post(
        f"/{API_VERSION}/jobs",
        status_code=201,
        response_model=JobOut,
        tags=["jobs"],
        responses={
            200: {"model": JobOut, "description": "Already registered (idempotent)."},
            **_ERRORS,
            **_CONFLICT,
            **_UNAVAILABLE,
        },
    )
    async def register_job(body: JobCreate, t: TenantDep) -> JSONResponse:
        """Register a job and return it; its ``job_id`` is made up if not given."""
        spec = body.detector.model_dump() if body.detector is not None else None
        raw_cadence = body.cadence.model_dump() if isinstance(body.cadence, CadenceSpec) else body.cadence
        try:
            # Checked here, before the store, so that the message names the field (the store checks it again).
            cadence = cadence_from_spec(raw_cadence)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", f"cadence: {exc}") from None
        record = JobRecord(
            job_id=body.job_id or f"job-{uuid.uuid4().hex[:16]}",
            job_type=body.job_type,
            detector=spec or default_spec(),
            gpus=body.gpus,
            planned_steps=body.planned_steps,
            cadence=None if cadence is None else cadence.spec(),
        )
        try:
            job, created = await anyio.to_thread.run_sync(store.register_job, t.tenant_id, record)
        except JobExists as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        except ValueError as exc:  # unknown detector or bad detector parameter, from the core's registry
            raise ApiError(422, "invalid_request", f"detector: {exc}") from None
        except StoreUnavailable as exc:
            raise ApiError(503, "unavailable", str(exc)) from None
        except OperationFailed as exc:
            raise ApiError(500, "internal_error", str(exc)) from None
        if created:
            metrics.jobs_registered.labels(job.job_type).inc()
        return JSONResponse(_job_out(job), status_code=201 if created else 200)

    @app.get(f"/{API_VERSION}/jobs", response_model=JobList, tags=["jobs"], responses=_ERRORS)
    async def list_jobs(
        t: TenantDep,
        status: Annotated[str | None, Query(pattern="^(running|stopped|finished)$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        after: Annotated[str | None, Query(max_length=128)] = None,
    ) -> JSONResponse:
        """The tenant's jobs, ordered by id (keyset pagination with ``after``)."""
        jobs = store.list_jobs(t.tenant_id, status=status, limit=limit, after=after)
        nxt = jobs[-1].job_id if len(jobs) == limit else None
        return JSONResponse({"jobs": [_job_out(j) for j in jobs], "next_after": nxt})

    @app.get(
        f"/{API_VERSION}/jobs/{{job_id}}", response_model=JobOut, tags=["jobs"], responses={**_ERRORS, **_NOT_FOUND}
    )
    async def get_job(job_id: JobIdPath, t: TenantDep) -> JSONResponse:
        """One of the tenant's jobs (committed state)."""
        try:
            return JSONResponse(_job_out(store.get_job(t.tenant_id, job_id)))
        except JobNotFound:
            raise not_found(job_id) from None

    @app.post(
        f"/{API_VERSION}/jobs/{{job_id}}/evals",
        response_model=DecisionOut,
        tags=["jobs"],
        responses={**_ERRORS, **_NOT_FOUND, **_CONFLICT, **_UNAVAILABLE},
    )
    async def post_eval(job_id: JobIdPath, body: ReportIn, t: TenantDep) -> JSONResponse:
        """Take one evaluation (the whitelisted Report) and answer the scheduler's Decision after it is committed.

        A re-send of a stored step with the same score answers the same decision again; a different score for a
        stored step, or an older step, is a 409. Once a job is stopped every decision is ``stop``.
        """
        return JSONResponse(await handle_report(t, job_id, body))

    @app.post(
        f"/{API_VERSION}/jobs/{{job_id}}/finish",
        response_model=JobOut,
        tags=["jobs"],
        responses={**_ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
    )
    async def finish_job(job_id: JobIdPath, t: TenantDep, body: FinishIn | None = None) -> JSONResponse:
        """Mark the job finished (idempotent: the first reason is kept). It takes no more reports."""
        reason = body.reason if body is not None else "completed"
        try:
            job = await anyio.to_thread.run_sync(store.finish_job, t.tenant_id, job_id, reason)
        except JobNotFound:
            raise not_found(job_id) from None
        except StoreUnavailable as exc:
            raise ApiError(503, "unavailable", str(exc)) from None
        except OperationFailed as exc:
            raise ApiError(500, "internal_error", str(exc)) from None
        if job.finished_now:  # a repeated finish is answered the same but counted once
            metrics.jobs_finished.inc()
        return JSONResponse(_job_out(job))

    # -- operator --------------------------------------------------------------------------------------------------
    @app.get("/healthz", tags=["operator"])
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operator"], responses=_UNAVAILABLE)
    async def readyz() -> JSONResponse:
        """Readiness: the store can read and its writer is alive; otherwise 503 saying why."""
        why = store.not_ready_reason()
        if why is None:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"error": "unavailable", "message": why}, status_code=503)

    @app.get("/metrics", tags=["operator"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus text format."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
