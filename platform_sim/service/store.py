"""The service's persistence interface: tenants, jobs and their evaluation reports.

The HTTP layer talks to a :class:`Store` only. :class:`~platform_sim.service.store_sqlite.SQLiteStore` is the default
(one file, one process). The interface is shaped so that a networked database can replace it for several service
replicas: every state change of a job is one transaction "load the job's state for update, apply the scheduler core,
write the new state and the report row, commit", and the decision is answered only after that commit.
:meth:`Store.submit_report` returns a future so that a store may batch several such transactions into one commit
(group commit) or run them on a pool of connections.
"""

from __future__ import annotations

import abc
import hashlib
import secrets
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

from platform_sim.core import Report

from .store_records import (
    Delivery as Delivery,
)
from .store_records import (
    Event as Event,
)
from .store_records import (
    JobRecord as JobRecord,
)
from .store_records import (
    ReportOutcome as ReportOutcome,
)
from .store_records import (
    StoredReport as StoredReport,
)
from .store_records import (  # re-exported: callers import the records from here, beside the interface
    Tenant as Tenant,
)
from .store_records import (
    TenantSummary as TenantSummary,
)
from .store_records import (
    Webhook as Webhook,
)

TOKEN_PREFIX = "es_"


def new_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe, with a recognizable prefix (for secret scanners)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token.

    A plain SHA-256 is enough here (no salt, no slow KDF): tokens are 256-bit random strings, not passwords, so there
    is nothing to brute-force, and a fast hash lets every request be authenticated with one indexed lookup.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class StoreError(Exception):
    """Base class of store errors that map to a client-visible HTTP status."""


class JobNotFound(StoreError):
    """No job with this id for this tenant (whether or not another tenant has one: never leak that)."""


class JobExists(StoreError):
    """Registration of a job id that the tenant already holds with another type, detector, GPU count or cadence."""


class JobFinished(StoreError):
    """A report for a job that was marked finished."""


class TenantExists(StoreError):
    """``tenant add`` with a name that is already taken."""


class TenantNotFound(StoreError):
    """``tenant revoke`` of an unknown name."""


class TenantRevoked(StoreError):
    """``tenant rotate`` of a revoked tenant (``tenant restore`` gives it a token again)."""


class WebhookNotFound(StoreError):
    """``webhook remove`` of an unknown id."""


class HandleConflict(StoreError):
    """A job that already registered another scheduler handle (a handle is sent once and never changed)."""


class StoreUnavailable(StoreError):
    """The store cannot commit (disk full, database locked for too long, shutting down)."""


class Store(abc.ABC):
    """Persistence of tenants, jobs and reports.

    Implementations must guarantee: a future returned by :meth:`submit_report` resolves only after the report (and
    the job state it produced) is durably committed; reports for one job are applied one at a time, in submission
    order, by :class:`~platform_sim.core.monitor.JobMonitor`; a rejected report changes nothing.
    """

    # -- tenants (operator CLI) ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_tenant(self, name: str) -> tuple[Tenant, str]:
        """Create a tenant and return it with its new plaintext token (only its hash is stored)."""

    @abc.abstractmethod
    def list_tenants(self) -> list[Tenant]:
        """All tenants, revoked ones included."""

    @abc.abstractmethod
    def revoke_tenant(self, name: str) -> Tenant:
        """Revoke a tenant's token; its requests are refused from then on. Raises :class:`TenantNotFound`."""

    @abc.abstractmethod
    def rotate_tenant(self, name: str) -> tuple[Tenant, str]:
        """Give an active tenant a new token (returned in plaintext) and make its old one invalid. Raises
        :class:`TenantNotFound`, or :class:`TenantRevoked` for a revoked tenant."""

    @abc.abstractmethod
    def restore_tenant(self, name: str) -> tuple[Tenant, str]:
        """Make a tenant active again (revoked or not) with a new token (returned in plaintext), so that its jobs
        are reachable again; the old token stays invalid. Raises :class:`TenantNotFound`."""

    @abc.abstractmethod
    def tenant_for_token(self, token: str) -> Tenant | None:
        """The active tenant holding ``token``, or None (unknown or revoked)."""

    # -- jobs ----------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def register_job(self, tenant_id: int, record: JobRecord) -> tuple[JobRecord, bool]:
        """Register a job; returns ``(record, created)``.

        Registering an id the tenant already holds with the same type, detector, GPU count and cadence returns the
        stored record with ``created=False`` (a retried or resumed registration); anything else raises :class:`JobExists`.
        """

    @abc.abstractmethod
    def get_job(self, tenant_id: int, job_id: str) -> JobRecord:
        """The tenant's job; raises :class:`JobNotFound`."""

    def list_jobs(
        self, tenant_id: int, status: str | None = None, limit: int = 100, after: str | None = None
    ) -> list[JobRecord]:
        """The tenant's jobs ordered by id, ``limit`` at most, ids greater than ``after`` (keyset pagination).

        Raises:
            ValueError: ``status`` is not ``running``, ``stopped`` or ``finished``.
        """
        return list(self.iter_jobs(tenant_id, status, limit, after))

    @abc.abstractmethod
    def iter_jobs(
        self, tenant_id: int, status: str | None = None, limit: int = 100, after: str | None = None
    ) -> Iterator[JobRecord]:
        """:meth:`list_jobs` one job at a time, each made as its row is read: for a big page rendered as it is read
        (the service's listings, :mod:`~platform_sim.service.fairness`). The arguments are checked at the call;
        consume it on one thread (a store may read on that thread's connection), and to the end or close it."""

    @abc.abstractmethod
    def iter_sorted_jobs(
        self, tenant_id: int, status: str | None, sort: str, descending: bool, limit: int, offset: int = 0
    ) -> Iterator[JobRecord]:
        """The tenant's jobs ordered by ``sort`` (a key of :data:`~platform_sim.service.sql.JOB_SORTS`: ``job``,
        ``type``, ``status``, ``created``, ``reports``, ``declines``, ``best_step``, ``best_score``, ``stop_step``,
        ``gpu_hours``), jobs without a value last in either order, ties by id; ``limit`` of them from ``offset``, read
        as :meth:`iter_jobs`. The database sorts: the dashboard's list, a page at a time.

        Raises:
            ValueError: an unknown ``sort`` or ``status``, a negative ``offset`` (at the call).
        """

    @abc.abstractmethod
    def count_jobs(self, tenant_id: int, status: str | None = None) -> int:
        """How many jobs the tenant holds (``status`` only, if given)."""

    @abc.abstractmethod
    def submit_report(self, tenant_id: int, report: Report) -> Future[ReportOutcome]:
        """Apply one report through the core and commit it; the future resolves after the commit.

        The future raises :class:`JobNotFound`, :class:`JobFinished`, the core's ``ConflictError`` or
        ``InvalidReportError``, or :class:`StoreUnavailable`.
        """

    @abc.abstractmethod
    def finish_job(self, tenant_id: int, job_id: str, reason: str) -> JobRecord:
        """Mark the job finished (idempotent); raises :class:`JobNotFound`."""

    @abc.abstractmethod
    def reports(self, tenant_id: int, job_id: str) -> list[StoredReport]:
        """All stored reports of a job in step order; raises :class:`JobNotFound`."""

    # -- history, outcome, summary (issue 32) --------------------------------------------------------------------
    def list_evals(
        self, tenant_id: int, job_id: str, *, order: str = "newest", limit: int = 100, cursor: int | None = None
    ) -> list[StoredReport]:
        """A page of the job's stored reports (each with its decision and ``received_at``).

        Args:
            tenant_id: Whose job.
            job_id: The job.
            order: ``"newest"`` (highest step first: steps strictly increase, so this is the receive order reversed)
                or ``"step"`` (lowest step first).
            limit: Most rows.
            cursor: Keyset cursor: the last step of the previous page (rows strictly past it in ``order``), or None.

        Raises:
            JobNotFound: the tenant holds no such job. ValueError: ``order`` is neither of the two.
        """
        return list(self.iter_evals(tenant_id, job_id, order=order, limit=limit, cursor=cursor))

    @abc.abstractmethod
    def iter_evals(
        self, tenant_id: int, job_id: str, *, order: str = "newest", limit: int = 100, cursor: int | None = None
    ) -> Iterator[StoredReport]:
        """:meth:`list_evals` one report at a time, as :meth:`iter_jobs` (the job is looked up at the call)."""

    @abc.abstractmethod
    def summary(self, tenant_id: int) -> TenantSummary:
        """The tenant's totals: jobs running, stopped and finished, and the GPU-hours freed by its stops."""

    @abc.abstractmethod
    def summaries(self) -> dict[int, TenantSummary]:
        """Every tenant's :meth:`summary` by tenant id (one query; for ``/metrics``). Tenants without jobs are absent."""

    # -- the audit trail ---------------------------------------------------------------------------------------
    def list_events(self, tenant_id: int | None, after: int = 0, limit: int = 100) -> list[Event]:
        """Events with ``id > after`` in id order, ``limit`` at most.

        Args:
            tenant_id: Only this tenant's events, or None for every tenant's (operators: admin token, CLI).
            after: The last id already read (0: from the oldest kept).
            limit: Most rows.
        """
        return list(self.iter_events(tenant_id, after, limit))

    @abc.abstractmethod
    def iter_events(self, tenant_id: int | None, after: int = 0, limit: int = 100) -> Iterator[Event]:
        """:meth:`list_events` one event at a time, as :meth:`iter_jobs`."""

    @abc.abstractmethod
    def prune_events(self, older_than: float, batch: int = 10_000) -> int:
        """Delete events written before Unix time ``older_than`` (the retention setting); returns how many.

        Never deletes the newest event (so that ids stay monotone: SQLite numbers a new row after the largest one
        left) nor one with a pending webhook delivery. Deletes in transactions of ``batch`` rows at most, so that
        reports never wait long behind it.
        """

    # -- webhooks ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_webhook(self, tenant_id: int, url: str, events: tuple[str, ...]) -> Webhook:
        """Create a webhook for the tenant's events of the given types; the answer holds its new secret."""

    @abc.abstractmethod
    def list_webhooks(self, tenant_id: int | None = None) -> list[Webhook]:
        """Webhooks (of one tenant, or all) in id order, with their secrets (the CLI never prints them)."""

    @abc.abstractmethod
    def remove_webhook(self, webhook_id: int) -> Webhook:
        """Delete a webhook and its pending deliveries; raises :class:`WebhookNotFound`."""

    @abc.abstractmethod
    def claim_deliveries(
        self,
        now: float,
        lease_s: float,
        limit: int = 16,
        per_tenant: int | None = None,
        in_flight: Mapping[int, int] | None = None,
    ) -> list[Delivery]:
        """Claim up to ``limit`` outbox rows due at ``now`` (oldest first) for ``lease_s`` seconds: they are not
        claimed again before the lease ends, so a delivery interrupted by a crash is retried after it (at least
        once). With ``per_tenant``, each tenant gets at most that many minus its deliveries ``in_flight`` (tenant
        id -> count), the tenant waiting longest first, so that one tenant's backlog never holds another's back."""

    @abc.abstractmethod
    def finish_delivery(
        self, delivery: Delivery, ok: bool, detail: dict[str, Any], retry_at: float | None, now: float
    ) -> None:
        """Record an attempt in one transaction: on success delete the outbox row and append ``webhook.delivered``;
        on failure append ``webhook.failed`` and either schedule the next attempt at ``retry_at`` or, with None, drop
        the row (given up). ``detail`` goes into the event's details (status, error, attempt)."""

    # -- actuators (store_actuation.ActuationQueries implements these for both stores) ---------------------------
    def tenant_scope(self, tenant_id: int, name: str = "") -> Any:
        """What the tenant may name on each scheduler: a :class:`~platform_sim.actuators.base.TenantScope`."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def add_tenant_scope(self, tenant_id: int, entries: Any) -> Any:
        """Allow the tenant the ``(kind, owner)`` entries; returns its scope after."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def remove_tenant_scope(self, tenant_id: int, entries: Any = None) -> int:
        """Remove the ``(kind, owner)`` entries (None: all of the tenant's); returns how many were there."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def register_handle(self, tenant_id: int, job_id: str, handle: Any) -> tuple[Any, bool]:
        """Store a job's scheduler handle (once); ``(HandleRecord, created)``. Raises :class:`JobNotFound` or
        :class:`~platform_sim.service.store_actuation.HandleConflict`. A job already stopped gets its action queued."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def scheduler_handle(self, tenant_id: int, job_id: str) -> Any:
        """The job's :class:`~platform_sim.service.store_actuation.HandleRecord`, or None; raises :class:`JobNotFound`."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def list_actuations(self, tenant_id: int | None = None) -> list[Any]:
        """Every stop action (of one tenant, or all) in id order."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def claim_actuations(self, now: float, lease_s: float, limit: int = 16) -> list[Any]:
        """Claim up to ``limit`` due stop actions for ``lease_s`` seconds, each with its ``actuation.started`` event."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    def finish_actuation(self, action: Any, result: Any, retry_at: float | None, now: float) -> bool:
        """Record an attempt's outcome with its events; False (nothing recorded) when the claim was lost."""
        raise NotImplementedError(f"{type(self).__name__} has no actuator support")

    # -- the dashboard -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def recent_events(self, tenant_id: int, limit: int = 20) -> list[Event]:
        """The tenant's ``limit`` newest events, newest first (the dashboard's "recent events")."""

    # -- operations ----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def ready(self) -> bool:
        """True if the store can serve reads and commit writes now."""

    def not_ready_reason(self) -> str | None:
        """Why :meth:`ready` is False (for ``/readyz``), or None when ready."""
        return None if self.ready() else "the store is not ready"

    def write_problem(self) -> str | None:
        """Why this store cannot commit writes (checked once at start by ``serve``), or None if it can."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Flush pending writes and release connections."""
