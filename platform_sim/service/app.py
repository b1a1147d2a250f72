"""The HTTP scheduler service: validation, tenant auth, persistence, then one call into the scheduler core.

Build it with :func:`create_app` around a :class:`~platform_sim.service.store.Store`; ``evalstop-server serve`` runs it
under uvicorn. The API is versioned under ``/v1``; the OpenAPI spec is at ``/openapi.json``.

The service makes no decision of its own: a report is checked against the whitelist schema, then handed to the store,
which applies :class:`~platform_sim.core.monitor.JobMonitor` inside the job's write transaction and answers the
core's :class:`~platform_sim.core.boundary.Decision` after the commit.

Where things are: the routes in :mod:`.routes` (one module per group), what they share (the store, metrics, tenant
auth) in :mod:`.deps`, the errors and their handlers in :mod:`.errors`, the body limit and the report fast path (plain
ASGI) in :mod:`.asgi`, the rate limit in :mod:`.ratelimit`, how big reads share the server in :mod:`.fairness`, the
wire models in :mod:`.wire`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from platform_sim.actuators.base import Actuator

from .actuate import ActuateSettings, ActuationWorker
from .asgi import BodyLimitMiddleware, ReportFastPath
from .dashboard.sessions import SignInSettings
from .deps import ServiceContext
from .errors import ApiError, install_error_handlers, no_unknown_query
from .fairness import CountForeground
from .metrics import ServiceMetrics
from .quotas import JobQuotas
from .ratelimit import RATE_BYTES_PER_TOKEN, TenantRateLimit
from .routes import API_VERSION, actuation, history, jobs, operator, reports
from .routes import dashboard as dashboard_routes
from .store import Store
from .webhooks import DeliveryWorker, WebhookSettings
from .wire import MAX_EVAL_SCORES

__all__ = [
    "API_VERSION",
    "DEFAULT_MAX_BODY_BYTES",
    "RATE_BYTES_PER_TOKEN",
    "ApiError",
    "JobQuotas",
    "TenantRateLimit",
    "create_app",
]

#: What ``/openapi.json`` and ``/docs`` say the service does. It names the default detector's rule (kept in step with
#: ``default_spec()`` by tests/test_service_api.py) and how the paper's rule is asked for.
APP_DESCRIPTION = (
    "Stops RLHF and fine-tuning jobs whose held-out eval score has started to decline. A job registered without a "
    "detector runs the project's default, `trend`: a one-sided test that the score has been falling (on the slopes "
    "of the per-example scores when reports carry them, else on the means, with their spread when reported); the "
    "first significant eval below the best score so far stops the job, and every decision names the best step. With "
    "the job's registered `planned_steps` it tests the last fifth of the planned steps (at least 6 evals), its level "
    "spent by progress, so false stops are bounded per run; without them it is `trend` (window 6, alpha 0.01, k 1), "
    "a test of the last 6 evals at every eval (per look), so a job reported more often is stopped more often. The "
    "paper's rule, a stop at the 2nd consecutive decline, is asked for by name: "
    '`{"name": "k-decline", "params": {"k": 2}}`. Only whitelisted fields cross the boundary; unknown fields are '
    "rejected."
)

DEFAULT_MAX_BODY_BYTES = 1 << 20
"""Largest request body accepted (1 MiB: a report with tens of thousands of per-example scores)."""


def create_app(
    store: Store,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    close_store: bool = False,
    token_cache_ttl: float = 1.0,
    fast_path: bool = True,
    max_eval_scores: int = MAX_EVAL_SCORES,
    rate_limit: TenantRateLimit | None = None,
    admin_token: str | None = None,
    webhooks: WebhookSettings | None = None,
    quotas: JobQuotas | None = None,
    actuators: Mapping[str, Actuator] | None = None,
    actuate: ActuateSettings | None = None,
    api_docs: bool = False,
    sign_in: SignInSettings | None = None,
) -> FastAPI:
    """Build the service around ``store``.

    Args:
        store: Where tenants, jobs and reports live.
        max_body_bytes: Largest request body accepted; larger ones get 413.
        close_store: Close ``store`` when the app shuts down (set by the CLI, which owns it).
        token_cache_ttl: Seconds a valid token's tenant is remembered (a revocation takes effect within this time);
            0 looks every token up in the store.
        fast_path: Serve the report endpoint through :class:`~platform_sim.service.asgi.ReportFastPath` (same
            answers, less CPU); False routes it through FastAPI (kept for comparison and tests).
        max_eval_scores: Most per-example scores one report may carry; longer lists get 422.
        rate_limit: Per-tenant request rate limit (429 with ``Retry-After`` beyond it), or None for none.
        admin_token: The operator's token that reads every tenant's events (``GET /v1/events``) and the per-tenant
            totals of ``/metrics``, or None.
        webhooks: Run the background worker (webhook delivery from the outbox, event retention) with these
            settings while the app runs; None: no worker (the CLI always runs one).
        quotas: Per-tenant job quotas (429 for a registration beyond them), or None for none.
        actuators: The scheduler actuators by kind, which check the handles jobs register
            (``PUT /v1/jobs/{id}/scheduler-handle``; a kind not here is refused with 422); None: none.
        actuate: Run the actuate worker (:mod:`~platform_sim.service.actuate`) on a thread while the app runs, with
            these settings and ``actuators``; None: no worker here (``evalstop-server actuate`` runs one apart).
        api_docs: Serve ``/docs`` and ``/redoc``. Off by default: FastAPI's pages load their scripts and styles from
            a CDN, unpinned, on the dashboard's origin (and the service may run offline); ``/openapi.json`` is
            always served.
        sign_in: The dashboard's sign-in bounds (sessions per tenant, sign-ins a minute); None: the defaults.
    """
    if max_eval_scores < 1:
        raise ValueError(f"max_eval_scores must be >= 1, got {max_eval_scores}")
    ctx = ServiceContext(store, ServiceMetrics(), max_eval_scores, token_cache_ttl, rate_limit, quotas)

    worker = None if webhooks is None else DeliveryWorker(store, webhooks)
    actuate_worker = None if actuate is None else ActuationWorker(store, actuators or {}, actuate)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if worker is not None:
            worker.start()
        if actuate_worker is not None:
            actuate_worker.start()
        yield
        if actuate_worker is not None:
            actuate_worker.stop()
        if worker is not None:
            worker.stop()
        if close_store:
            store.close()

    app = FastAPI(
        title="evalstop scheduler service",
        version="1.0.0",
        description=APP_DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(no_unknown_query)],
        docs_url="/docs" if api_docs else None,
        redoc_url="/redoc" if api_docs else None,
    )
    app.state.context = ctx
    app.state.store = store
    app.state.metrics = ctx.metrics
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    install_error_handlers(app)
    report_work = reports.Reports(ctx)
    if fast_path:
        app.add_middleware(ReportFastPath, handler=report_work.fast, max_bytes=max_body_bytes, path=reports.EVALS_PATH)
    # Added last, so outermost: every request, the fast path's too, is foreground while served (fairness.py).
    app.add_middleware(CountForeground, gate=ctx.gate)
    jobs.add_routes(app, ctx)
    reports.add_routes(app, report_work)
    operator.add_routes(app, ctx, admin_token)
    history.add_routes(app, ctx, admin_token)
    dashboard_routes.add_routes(app, ctx, sign_in)
    actuation.add_routes(app, ctx, actuators or {})
    return app
