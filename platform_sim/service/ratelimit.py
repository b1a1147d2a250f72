"""The per-tenant rate limit: a token bucket per tenant, charged by the work a request causes."""

from __future__ import annotations

import time
from collections.abc import Hashable

RATE_BYTES_PER_TOKEN = 2_000
"""A request costs one rate-limit token plus one per this many bytes of body: a small report costs 1, a report of
10,000 per-example scores (about 100 kB) about 51. Chosen with ``benchmarks/bench_noisy_neighbour.py``: large reports
cost the server's single writer (and the disk) far more per byte than small ones cost per request."""

READ_ROWS_PER_TOKEN = 100
"""A read costs one more rate-limit token per this many rows it returns (charged after the read, see
:meth:`TenantRateLimit.charge`): a page of 1,000 jobs costs 11 tokens, one job 1. Reads cost the server by the rows
they serialize, not by their (empty) body, as the Kubernetes API server's priority and fairness charges a LIST by its
estimated size."""


class TenantRateLimit:
    """A token bucket per tenant: ``rate`` tokens per second on average, bursts of up to ``burst``.

    A request costs one token, and a report one more per :data:`RATE_BYTES_PER_TOKEN` bytes of body, so that a tenant
    sending large per-example reports is limited by the work it causes, not by its request count; likewise a read
    costs one more per :data:`READ_ROWS_PER_TOKEN` rows it returns (:meth:`charge`). One tenant that
    sends too much gets 429 with ``Retry-After`` instead of taking the server's time from the others. The buckets
    live in this app instance (one per process); with several replicas each enforces its own.

    The key is a tenant id for the API; any hashable key works (the dashboard's sign-in limit keys one by client
    address).

    Args:
        rate: Tokens per second a tenant may sustain (> 0).
        burst: Tokens a tenant may spend at once after being idle (>= 1). A request that costs more than ``burst``
            takes the whole bucket (so that it can pass at all).
    """

    def __init__(self, rate: float, burst: float) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst = float(rate), float(burst)
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # tenant id -> (tokens, time of last refill)

    def retry_after(self, tenant_id: Hashable, cost: float = 1.0, now: float | None = None) -> float:
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

    def charge(self, tenant_id: Hashable, cost: float, now: float | None = None) -> None:
        """Take ``cost`` more tokens for ``tenant_id`` for work already done (a read's rows), without refusing.

        The bucket may go below zero, down to ``-burst`` at most: the tenant's next requests then wait until it has
        refilled, so the work is paid for after the fact.
        """
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(tenant_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        self._buckets[tenant_id] = (max(-self.burst, tokens - max(cost, 0.0)), now)

    def __len__(self) -> int:
        return len(self._buckets)

    def prune(self, now: float | None = None) -> None:
        """Forget the buckets that are full again (a key seen once long ago costs nothing to forget): for a limit
        keyed by something unbounded, such as client addresses."""
        now = time.monotonic() if now is None else now
        full = [k for k, (tokens, last) in self._buckets.items() if tokens + (now - last) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]
