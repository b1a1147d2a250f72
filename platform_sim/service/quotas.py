"""Per-tenant job quotas: how many jobs a tenant may hold, and how many of them may be running at once."""

from __future__ import annotations

from dataclasses import dataclass

from .store import TenantSummary


@dataclass(frozen=True, slots=True)
class JobQuotas:
    """The most jobs one tenant may register (``--max-jobs-per-tenant``) and keep running
    (``--max-running-jobs-per-tenant``); a registration beyond either gets 429 with :meth:`refusal`'s message.

    The count is read before the registration is written, so concurrent registrations of one tenant may pass the
    limit by as many as are in flight at that moment (the writer is one thread: in practice by none or one).
    Re-registering an existing job (idempotent) is never refused.

    Args:
        max_jobs: Most jobs per tenant, finished ones included (None: no limit).
        max_running: Most jobs per tenant neither stopped nor finished (None: no limit).
    """

    max_jobs: int | None = None
    max_running: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("max_jobs", self.max_jobs), ("max_running", self.max_running)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")

    @property
    def active(self) -> bool:
        """Whether any limit is set (else registrations skip the count)."""
        return self.max_jobs is not None or self.max_running is not None

    def refusal(self, summary: TenantSummary) -> str | None:
        """Why a new job of the tenant whose totals are ``summary`` is refused, or None if it may be registered."""
        total = summary.running + summary.stopped + summary.finished
        if self.max_jobs is not None and total >= self.max_jobs:
            return (
                f"job quota reached: this tenant has {total} jobs and may register at most {self.max_jobs} "
                "(the server's --max-jobs-per-tenant); ask the operator to raise it"
            )
        if self.max_running is not None and summary.running >= self.max_running:
            return (
                f"running-job quota reached: this tenant has {summary.running} running jobs and may run at most "
                f"{self.max_running} at once (the server's --max-running-jobs-per-tenant); finish one first "
                "(POST /v1/jobs/{job_id}/finish)"
            )
        return None
