"""Scheduler look-ups on their own bounded threads, with a cap per tenant.

Registering a scheduler handle asks the scheduler whose job it names (Slurm: a blocking ``squeue`` that may take the
actuator's whole timeout when slurmctld is busy). Run on the threads every route shares, a flood of registrations
from one tenant would hold them all and stall every tenant's reads and reports. So look-ups run here instead: on a
pool of :attr:`SchedulerLookups.total` threads of their own, at most :attr:`SchedulerLookups.per_tenant` of one
tenant at once. A look-up that finds no room is not queued (a queue would only move the wait): it is answered at
once, 429 when the tenant has its share in flight, 503 when the pool is full, both with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import ApiError

T = TypeVar("T")

DEFAULT_TOTAL = 8
"""Scheduler look-ups in flight at once, all tenants together."""

DEFAULT_PER_TENANT = 2
"""Scheduler look-ups of one tenant in flight at once."""


class SchedulerLookups:
    """The look-up pool of one app (see the module docstring). Its counts are touched on the event loop only.

    Args:
        total: Threads of the pool: look-ups in flight at once.
        per_tenant: Look-ups of one tenant in flight at once.
        retry_after_s: The ``Retry-After`` of a refusal (about one look-up's time).
    """

    def __init__(
        self, total: int = DEFAULT_TOTAL, per_tenant: int = DEFAULT_PER_TENANT, retry_after_s: int = 5
    ) -> None:
        if not 1 <= per_tenant <= total:
            raise ValueError(f"scheduler look-ups: need 1 <= per_tenant <= total, got {per_tenant}, {total}")
        self.total, self.per_tenant, self.retry_after_s = total, per_tenant, retry_after_s
        self._pool: ThreadPoolExecutor | None = None  # made on first use
        self._in_flight: Counter[int] = Counter()

    async def run(self, tenant_id: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool for ``tenant_id``.

        Raises:
            ApiError: 429 when the tenant already has ``per_tenant`` look-ups in flight, 503 when the pool is full.
        """
        retry = {"Retry-After": str(self.retry_after_s)}
        if self._in_flight[tenant_id] >= self.per_tenant:
            raise ApiError(
                429,
                "lookups_busy",
                f"this tenant already has {self.per_tenant} scheduler look-ups in flight; retry after "
                f"{self.retry_after_s} s",
                retry,
            )
        if sum(self._in_flight.values()) >= self.total:
            raise ApiError(
                503, "scheduler_busy", f"every scheduler look-up is busy; retry after {self.retry_after_s} s", retry
            )
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.total, thread_name_prefix="evalstop-lookup")
        self._in_flight[tenant_id] += 1
        try:
            future = self._pool.submit(functools.partial(fn, *args))
        except BaseException:
            self._release(tenant_id)
            raise
        # Counted until the look-up itself ends, not the request: a client that hangs up frees no thread.
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, tenant_id))
        return await asyncio.wrap_future(future)

    def _release(self, tenant_id: int) -> None:
        self._in_flight[tenant_id] -= 1
        if self._in_flight[tenant_id] <= 0:
            del self._in_flight[tenant_id]
