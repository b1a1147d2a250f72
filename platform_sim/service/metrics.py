"""Prometheus metrics of the service, in a registry owned by one app instance (no process-global state)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .store import Store

TENANT_TOTALS_TTL_S = 60.0
"""How long the per-tenant totals of ``/metrics`` are reused: a scrape runs the all-tenant summary at most this
often, however often it is scraped."""

# Buckets around the latency target (p99 < 20 ms): fine below 20 ms, coarse above.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class ServiceMetrics:
    """The counters and histograms ``GET /metrics`` exposes.

    Labels never carry tenant names or job ids: the metrics endpoint is for the operator and must not become a side
    channel between tenants, and per-job labels would grow without bound.
    """

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.reports = Counter(
            "evalstop_reports",
            "Eval reports by outcome (accepted, resend, conflict, invalid, "
            "not_found, finished, unavailable, internal_error).",
            ["outcome"],
            registry=r,
        )
        self.decisions = Counter("evalstop_decisions", "Decisions answered, by action.", ["action"], registry=r)
        self.stops = Counter("evalstop_stops", "Jobs the scheduler core stopped.", registry=r)
        self.gpus_freed = Counter(
            "evalstop_gpus_freed", "GPUs of stopped jobs that declared their GPU count.", registry=r
        )
        self.gpu_hours_reclaimed = Counter(
            "evalstop_gpu_hours_reclaimed",
            "Estimated GPU-hours given back by stops: gpus x remaining planned steps x the job's observed seconds "
            "per step (jobs that declared gpus and planned_steps).",
            registry=r,
        )
        self.jobs_registered = Counter("evalstop_jobs_registered", "Jobs registered.", ["job_type"], registry=r)
        self.jobs_finished = Counter("evalstop_jobs_finished", "Jobs marked finished.", registry=r)
        self.auth_failures = Counter(
            "evalstop_auth_failures", "Requests refused for a missing, unknown or revoked token.", registry=r
        )
        self.rate_limited = Counter(
            "evalstop_rate_limited", "Requests refused with 429 by the per-tenant rate limit.", registry=r
        )
        self.report_latency = Histogram(
            "evalstop_report_latency_seconds",
            "Time from a report's arrival to its committed decision.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )


class TenantTotals(Collector):
    """``/metrics`` gauges per tenant: jobs by status and GPU-hours freed, labelled by tenant name.

    Served only to the operator's admin token (``routes/operator.py``): without it ``/metrics`` names no tenant. The
    all-tenant summary behind them is read at most once per ``ttl_s`` and reused in between, so scrapes cannot make
    the store run it over and over.

    Args:
        store: Where the jobs live.
        ttl_s: Seconds one reading is reused.
    """

    def __init__(self, store: Store, ttl_s: float = TENANT_TOTALS_TTL_S) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._read: tuple[float, list[tuple[str, Any]]] | None = None  # (monotonic time, [(name, summary)])

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only (no store call while registering)

    def _totals(self) -> list[tuple[str, Any]]:
        with self._lock:  # one reading at a time: concurrent scrapes wait for it instead of running their own
            if self._read is None or time.monotonic() - self._read[0] >= self.ttl_s:
                names = {t.tenant_id: t.name for t in self.store.list_tenants()}
                rows = [(names.get(i, str(i)), s) for i, s in sorted(self.store.summaries().items())]
                self._read = (time.monotonic(), rows)
            return self._read[1]

    def collect(self) -> Iterator[Any]:
        jobs = GaugeMetricFamily("evalstop_tenant_jobs", "Jobs of each tenant by status.", labels=["tenant", "status"])
        freed = GaugeMetricFamily(
            "evalstop_tenant_gpu_hours_freed",
            "GPU-hours freed by each tenant's stopped jobs (gpus x remaining planned steps x measured step time).",
            labels=["tenant"],
        )
        for name, s in self._totals():
            for status, n in (("running", s.running), ("stopped", s.stopped), ("finished", s.finished)):
                jobs.add_metric([name, status], n)
            freed.add_metric([name], s.gpu_hours_freed)
        yield jobs
        yield freed
