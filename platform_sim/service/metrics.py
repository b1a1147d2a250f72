"""Prometheus metrics of the service, in a registry owned by one app instance (no process-global state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

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
