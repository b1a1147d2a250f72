"""``POST /v1/jobs/{job_id}/evals``: take one evaluation, answer the scheduler's decision after the commit.

One parser and one code path for what a report means: :func:`parse_report` checks the path's job id and the raw
body (the :class:`~platform_sim.service.wire.ReportIn` whitelist) and :meth:`Reports.handle` does the rest (the
server's limits, the core's decision, the metrics). Both ways in call the two of them, so they answer the same
statuses with the same messages: the FastAPI route (which also gives the OpenAPI spec and serves when the fast path
is off) and :meth:`Reports.fast`, the handler of the ASGI fast path (:class:`~platform_sim.service.asgi.ReportFastPath`).
The fast path stays because FastAPI's routing, dependency and response machinery cost a large share of the server's
CPU per report (``benchmarks/bench_service.py --fastapi-route``; figures in docs/benchmarks-service.md), and the report
endpoint is the only hot one.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from platform_sim.core import ConflictError, InvalidReportError, Report

from ..deps import ServiceContext
from ..errors import CONFLICT, ERRORS, NOT_FOUND, UNAVAILABLE, ApiError, store_error, validation_message
from ..store import JobFinished, JobNotFound, StoreUnavailable, Tenant
from ..wire import JOB_ID_PATTERN, DecisionOut, ReportIn
from ..writer import OperationFailed
from . import PREFIX, Routes

logger = logging.getLogger(__name__)

EVALS_PATH = re.compile(rf"^{PREFIX}/jobs/([^/]+)/evals$")
"""The report path, as the fast path matches it (the job id is group 1)."""
_JOB_ID = re.compile(JOB_ID_PATTERN)

# The `reports` metric's outcome label of each error a report can meet.
_OUTCOMES: tuple[tuple[type[Exception], str], ...] = (
    (InvalidReportError, "invalid"),
    (ConflictError, "conflict"),
    (JobNotFound, "not_found"),
    (JobFinished, "finished"),
    (StoreUnavailable, "unavailable"),
    (OperationFailed, "internal_error"),
)


def parse_report(job_id: str, raw: bytes) -> ReportIn:
    """The one validation of a report request, for both ways in: the path's job id, then the raw JSON body.

    Args:
        job_id: The ``{job_id}`` of the path, as sent (not yet checked).
        raw: The request body.

    Returns:
        The body as the whitelisted :class:`~platform_sim.service.wire.ReportIn`.

    Raises:
        ApiError: 422 ``invalid_request``, naming the path's bad job id, or every problem of the body (bad JSON, an
            unknown field, a missing or ill-typed field, a non-finite score) without echoing the input.
    """
    if not _JOB_ID.fullmatch(job_id):
        raise ApiError(
            422, "invalid_request", f"invalid request: path.job_id: String should match pattern '{JOB_ID_PATTERN}'"
        )
    try:
        return ReportIn.model_validate_json(raw)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", validation_message(exc.errors())) from None


@dataclass
class Reports:
    """The report endpoint's work, shared by its two parsers.

    Args:
        ctx: The app's shared dependencies.
    """

    ctx: ServiceContext

    async def handle(self, t: Tenant, job_id: str, body: ReportIn) -> dict[str, Any]:
        """The report's work after auth and schema validation: the server's checks, the store, the metrics.

        Returns:
            The decision as JSON.

        Raises:
            ApiError: 422 (path and body disagree, too many per-example scores, a report the core refuses), 409
                (a conflict with the stored history, a finished job), 404, 503, 500 (this report alone failed).
        """
        t0 = time.perf_counter()
        metrics, store = self.ctx.metrics, self.ctx.store
        if body.job_id != job_id:
            metrics.reports.labels("invalid").inc()
            raise ApiError(
                422, "invalid_request", f"job_id {body.job_id!r} in the body does not match the path job {job_id!r}"
            )
        if body.eval_scores is not None and len(body.eval_scores) > self.ctx.max_eval_scores:
            metrics.reports.labels("invalid").inc()
            raise ApiError(
                422,
                "invalid_request",
                f"invalid request: eval_scores has {len(body.eval_scores)} entries; "
                f"this server takes at most {self.ctx.max_eval_scores} per report",
            )
        try:
            report = Report(
                job_id=body.job_id,
                job_type=body.job_type,
                step=body.step,
                eval_score=body.eval_score,
                eval_scores=None if body.eval_scores is None else tuple(body.eval_scores),
                eval_std=body.eval_std,
                eval_n=body.eval_n,
            )
            outcome = await asyncio.wrap_future(store.submit_report(t.tenant_id, report))
        except Exception as exc:
            label = next((name for kind, name in _OUTCOMES if isinstance(exc, kind)), None)
            if label is None:
                raise
            metrics.reports.labels(label).inc()
            if isinstance(exc, InvalidReportError):
                raise ApiError(422, "invalid_request", str(exc)) from None
            if isinstance(exc, ConflictError):
                raise ApiError(409, "conflict", str(exc)) from None
            raise store_error(exc, job_id) or exc from None
        decision = outcome.decision
        metrics.reports.labels("resend" if outcome.resend else "accepted").inc()
        metrics.decisions.labels(decision.action.value).inc()
        if outcome.stopped_now:
            metrics.stops.inc()
            job = await self.ctx.call(store.get_job, t.tenant_id, job_id)
            if job.gpus:
                metrics.gpus_freed.inc(job.gpus)
            metrics.gpu_hours_reclaimed.inc(outcome.gpu_hours_reclaimed)
        metrics.report_latency.observe(time.perf_counter() - t0)
        return decision.to_dict()

    async def fast(
        self, authorization: str | None, job_id: str, raw: bytes
    ) -> tuple[int, dict[str, Any], dict[str, str] | None]:
        """The fast path's handler (:data:`~platform_sim.service.asgi.ReportHandler`): parse, then :meth:`handle`.

        Args:
            authorization: The request's ``Authorization`` header, or None.
            job_id: The job id of the path (not yet checked).
            raw: The request body.
        """
        try:
            scheme, _, token = (authorization or "").partition(" ")
            t = await self.ctx.authenticate_async(token.strip() if scheme.lower() == "bearer" else None, len(raw))
            return 200, await self.handle(t, job_id, parse_report(job_id, raw)), None
        except ApiError as exc:
            return exc.status, exc.body(), exc.headers
        except Exception:  # a bug: a 500 for this request alone, never a dropped connection
            logger.exception("report for job %r failed", job_id)
            return 500, {"error": "internal_error", "message": "internal error while answering this report"}, None


# The route reads its body itself (parse_report), so FastAPI does not see the model: the spec names it here.
_REPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ReportIn"}}},
    }
}


def add_routes(app: FastAPI, reports: Reports) -> None:
    """Add the report route, around ``reports``, to ``app`` (served by FastAPI when the fast path is off, and in the
    OpenAPI spec)."""
    TenantDep = Annotated[Tenant, Depends(reports.ctx.tenant)]
    api = Routes(app, PREFIX, ["jobs"])
    # Documented, not enforced by FastAPI: parse_report checks it, with the fast path's message.
    JobId = Annotated[str, Path(description="The job's id.", json_schema_extra={"pattern": JOB_ID_PATTERN})]

    @api.post(
        "/jobs/{job_id}/evals",
        response_model=DecisionOut,
        responses={**ERRORS, **NOT_FOUND, **CONFLICT, **UNAVAILABLE},
        openapi_extra=_REPORT_BODY,
    )
    async def post_eval(job_id: JobId, request: Request, t: TenantDep) -> JSONResponse:
        """Take one evaluation (the whitelisted Report) and answer the scheduler's Decision after it is committed.

        A re-send of a stored step with the same score answers the same decision again; a different score for a
        stored step, or an older step, is a 409. Once a job is stopped every decision is ``stop``.
        """
        body = parse_report(job_id, await request.body())
        return JSONResponse(await reports.handle(t, job_id, body))

    openapi = app.openapi

    def openapi_with_report_body() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = openapi()
            spec.setdefault("components", {}).setdefault("schemas", {})["ReportIn"] = ReportIn.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
        return app.openapi_schema  # type: ignore[return-value]  # set by openapi() above

    app.openapi = openapi_with_report_body  # type: ignore[method-assign]
