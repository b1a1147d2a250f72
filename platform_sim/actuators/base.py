"""The one interface every scheduler actuator implements (Slurm, Kubernetes, Ray).

An actuator turns a stop decision into an action on the cluster scheduler that runs the job, so a stopped job's
GPUs go back to the queue even when the job does not cooperate. It is library code without policy: the service (or
``evalstop watch``) decides *when*; the actuator only knows *how* for one scheduler, and *whose* job a handle names.

A stop may take several phases (Slurm: ``scancel --signal=TERM --full``, then a plain ``scancel`` after a grace
period). :meth:`Actuator.act` runs one phase and says whether another follows and after how long; the caller
persists that, so a restart resumes at the right phase and runs each phase once.

Scheduler faults (a command that fails, hangs or is missing; an API server that refuses) never raise from
:meth:`Actuator.act`: they come back as an :class:`ActionResult` with ``ok=False`` and the reason, and ``retryable``
says whether trying again can help. Only a malformed or foreign handle raises, and only from :meth:`Actuator.parse`
and :meth:`Actuator.authorize`, which run at registration so the tenant gets a clear 4xx, and from
:meth:`Actuator.check_owner`, which the caller runs right before every phase: ownership is checked again against the
scheduler's answer then, and a job that is no longer the tenant's is not acted on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class HandleError(ValueError):
    """A scheduler handle that cannot be used: malformed, unknown to the scheduler, or not the tenant's to name."""


class HandleRefused(HandleError):
    """The handle names a job the tenant may not act on (another user's, account's or namespace's)."""


@dataclass(frozen=True)
class SchedulerHandle:
    """Which scheduler runs a job and the job's name there.

    Args:
        kind: The scheduler: ``"slurm"``, ``"kubernetes"`` or ``"ray"`` (the actuator's :attr:`Actuator.kind`).
        ref: The job's name in that scheduler, in the actuator's syntax (Slurm: the job id, e.g. ``"1234"``;
            Kubernetes: ``"namespace/kind/name"``; Ray: the submission id). Checked by :meth:`Actuator.parse`.
    """

    kind: str
    ref: str


@dataclass(frozen=True)
class TenantScope:
    """What one tenant may name on each scheduler, as its operator configured it.

    Args:
        tenant: The tenant's name in the service.
        allowed: Per scheduler kind, the owners whose jobs the tenant may act on; each actuator reads its own entry
            (Slurm: accounts or users; Kubernetes: namespaces; Ray: submission-id prefixes). A kind missing here
            means the tenant may name no job of that scheduler.
    """

    tenant: str
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def owners(self, kind: str) -> frozenset[str]:
        """The owners the tenant may name on scheduler ``kind`` (empty: none)."""
        return self.allowed.get(kind, frozenset())


@dataclass(frozen=True)
class ActionResult:
    """What one phase of a stop did.

    Args:
        ok: The phase did what it should (or found the job already gone, which is as good).
        action: What was run, for the event log (e.g. ``"scancel --signal=TERM --full 1234"``).
        detail: The scheduler's answer or the failure's reason, one line.
        retryable: For a failure: trying the same phase again can help (a timeout, a missing API server), as
            opposed to a permanent refusal.
        next_phase_after_s: Seconds after which the next phase should run; ``None`` when the stop is complete.
    """

    ok: bool
    action: str
    detail: str = ""
    retryable: bool = True
    next_phase_after_s: float | None = None


class Actuator(Protocol):
    """Acts on one scheduler. Implementations hold only configuration (command paths, timeouts, API clients)."""

    kind: str

    def parse(self, ref: str) -> SchedulerHandle:
        """The handle ``ref`` names, checked for syntax only; raises :class:`HandleError` naming the problem."""
        ...

    def authorize(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """Raise :class:`HandleRefused` unless the job exists and belongs to one of ``scope``'s owners for this kind."""
        ...

    def check_owner(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """Check, right before a phase acts, that the job is still one ``scope`` may name: the scheduler's answer
        now, by the same rule as :meth:`authorize` (a job id can come to name another user's job after a scheduler
        reset or a wrap of its ids; the operator can take a scope away). A job the scheduler no longer knows passes
        (the phase finds it gone and does nothing).

        Raises:
            HandleRefused: the job is not the tenant's to act on now: act on nothing.
            Exception: the scheduler could not be asked (retry later).
        """
        ...

    def act(self, handle: SchedulerHandle, phase: int) -> ActionResult:
        """Run phase ``phase`` (0 first) of stopping the job; never raises for scheduler faults."""
        ...
