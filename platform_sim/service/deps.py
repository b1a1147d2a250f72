"""What every route shares: the store, the metrics, tenant authentication (with its token cache and the rate limit)
and the job's JSON form. One :class:`ServiceContext` per app; the route modules take it as their only argument.
"""

# No `from __future__ import annotations`: FastAPI reads the dependency's annotations at runtime.
import asyncio
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .errors import ApiError
from .fairness import BULK_READ_THREADS, ForegroundGate, Pacer
from .metrics import ServiceMetrics
from .quotas import JobQuotas
from .ratelimit import RATE_BYTES_PER_TOKEN, READ_ROWS_PER_TOKEN, TenantRateLimit
from .store import JobRecord, Store, Tenant

BEARER = HTTPBearer(auto_error=False, description="A tenant token from `evalstop-server tenant add NAME`.")
"""The bearer scheme of the OpenAPI spec (``HTTPBearer``); it holds no state."""

T = TypeVar("T")

TOKEN_CACHE_MAX = 10_000
"""Most tokens remembered; beyond it the cache is emptied (simpler than tracking recency, and rare)."""


@dataclass
class ServiceContext:
    """The shared dependencies of one app.

    Args:
        store: Where tenants, jobs and reports live.
        metrics: The app's Prometheus metrics.
        max_eval_scores: Most per-example scores one report may carry.
        token_cache_ttl: Seconds a valid token's tenant is remembered (0: every request asks the store).
        rate_limit: Per-tenant rate limit, or None.
        quotas: Per-tenant job quotas (429 beyond them), or None.
    """

    store: Store
    metrics: ServiceMetrics
    max_eval_scores: int
    token_cache_ttl: float = 1.0
    rate_limit: TenantRateLimit | None = None
    quotas: JobQuotas | None = None
    # Valid tokens are remembered for token_cache_ttl seconds: the lookup was a fifth of the server's time per
    # report. A revocation therefore takes effect within that time (1 s by default); unknown tokens are never cached.
    _tokens: dict[str, tuple[Tenant, float]] = field(default_factory=dict, repr=False)
    # Foreground requests in progress (counted by fairness.CountForeground), which pages give way to.
    gate: ForegroundGate = field(default_factory=ForegroundGate, repr=False)
    # One lock per caller that has read a page (bounded by the tenants; None: the admin token), and the limit of
    # pages rendered at once (made on first use: an anyio limiter needs the running event loop).
    _turns: dict[int | None, asyncio.Lock] = field(default_factory=dict, repr=False)
    _bulk_threads: anyio.CapacityLimiter | None = field(default=None, repr=False)

    async def bulk_read(self, tenant: Tenant | None, render: Callable[[Pacer], tuple[int, bytes]]) -> bytes:
        """Serve one page of a listing by the rules of :mod:`~platform_sim.service.fairness`: ``render(pace)`` runs
        on a worker thread once the caller's earlier pages are done, out of the foreground count, and returns
        ``(rows, body)``; it calls ``pace()`` between rows. The rows are then charged to the tenant's rate limit
        (:meth:`charge_rows`).

        Args:
            tenant: The caller, or None for the operator's admin token (its own turn, nothing charged).
            render: Reads and renders the page.
        """
        key = None if tenant is None else tenant.tenant_id
        if key not in self._turns:
            self._turns[key] = asyncio.Lock()
        if self._bulk_threads is None:
            self._bulk_threads = anyio.CapacityLimiter(BULK_READ_THREADS)
        with self.gate.background():
            async with self._turns[key]:
                rows, body = await anyio.to_thread.run_sync(
                    lambda: render(self.gate.pacer()), limiter=self._bulk_threads
                )
        if tenant is not None:
            self.charge_rows(tenant, rows)
        return body

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (a blocking store call) on a worker thread, off the event loop."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def authenticate(self, token: str | None, body_bytes: int = 0) -> Tenant:
        """The active tenant holding ``token``, charged to the rate limit for a request of ``body_bytes``; it may
        call the store, so call it on a worker thread (``await ctx.call(ctx.authenticate, ...)``) or use
        :meth:`authenticate_async` on the event loop.

        Raises:
            ApiError: 401 (no token, unknown or revoked), 429 (over the tenant's rate, with ``Retry-After``).
        """
        hit = self._cached(token)
        return self._admit(token, self._lookup(token) if hit is None else hit, body_bytes)

    async def authenticate_async(self, token: str | None, body_bytes: int = 0) -> Tenant:
        """:meth:`authenticate` for the event loop: a cached token is answered without leaving it (the report
        path's common case); on a miss the store lookup runs on a worker thread (:meth:`call`), so that a slow
        database never stalls other requests."""
        hit = self._cached(token)
        return self._admit(token, await self.call(self._lookup, token) if hit is None else hit, body_bytes)

    def _cached(self, token: str | None) -> Tenant | None:
        """The tenant remembered for ``token``, or None (not remembered, expired, or no token)."""
        hit = self._tokens.get(token) if token else None
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def _lookup(self, token: str | None) -> Tenant | None:
        """The store's tenant for ``token`` (a blocking read), remembered for ``token_cache_ttl`` if valid."""
        if not token:
            return None
        found = self.store.tenant_for_token(token)
        if found is not None and self.token_cache_ttl > 0:
            if len(self._tokens) >= TOKEN_CACHE_MAX:
                self._tokens.clear()
            self._tokens[token] = (found, time.monotonic() + self.token_cache_ttl)
        return found

    def _admit(self, token: str | None, found: Tenant | None, body_bytes: int) -> Tenant:
        """``found`` if the request may pass: else 401 (no token, no tenant) or 429 (over the tenant's rate)."""
        challenge = {"WWW-Authenticate": "Bearer"}
        if not token:
            self.metrics.auth_failures.inc()
            raise ApiError(401, "unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'", challenge)
        if found is None:
            self.metrics.auth_failures.inc()
            raise ApiError(401, "unauthorized", "invalid or revoked token", challenge)
        limit = self.rate_limit
        if limit is not None:
            wait = limit.retry_after(found.tenant_id, 1.0 + body_bytes // RATE_BYTES_PER_TOKEN)
            if wait > 0:
                self.metrics.rate_limited.inc()
                raise ApiError(
                    429,
                    "rate_limited",
                    f"too many requests from this tenant (limit {limit.rate:g}/s, "
                    f"burst {limit.burst:g}); retry after {wait:.2f} s",
                    {"Retry-After": str(max(1, math.ceil(wait)))},
                )
        return found

    def charge_rows(self, tenant: Tenant, rows: int) -> None:
        """Charge ``tenant``'s rate limit for a read that returned ``rows`` rows: one token per
        :data:`~platform_sim.service.ratelimit.READ_ROWS_PER_TOKEN` rows, on top of the request's one token taken by
        :meth:`authenticate`. Charged after the read (its size is known only then), so the bucket may go into debt
        and the tenant's next requests wait for it to refill: a 1,000-job page costs 11 tokens, as much as 11 small
        requests. Does nothing without a rate limit.
        """
        if self.rate_limit is not None and rows > 0:
            self.rate_limit.charge(tenant.tenant_id, rows / READ_ROWS_PER_TOKEN)

    async def tenant(
        self, request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
    ) -> Tenant:
        """The FastAPI dependency of every authenticated route: the request's tenant (see :meth:`authenticate`)."""
        length = request.headers.get("content-length", "0")
        return await self.authenticate_async(
            None if creds is None else creds.credentials, int(length) if length.isdigit() else 0
        )


def job_out(job: JobRecord) -> dict[str, Any]:
    """A job as its tenant sees it (:class:`~platform_sim.service.wire.JobOut`)."""
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
        "stop_reason": job.stop_reason,
        "gpu_hours_freed": job.gpu_hours_freed,
        "mode": None if job.mode is None else job.mode.value,
        "per_run_bound": job.per_run_bound,
    }
