"""The actuate worker: runs the stop actions of the durable outbox on the schedulers, with leases and retries.

A stop decision of a job that registered a scheduler handle queues one ``actuations`` row in the decision's own
transaction (:mod:`~platform_sim.service.store_actuation`). This worker, as ``evalstop-server actuate`` or as a
thread of ``evalstop-server serve --actuate``, claims due rows for a lease, runs one phase of the stop with the
kind's :class:`~platform_sim.actuators.base.Actuator` and records the outcome: ``actuation.started`` when claimed,
``actuation.succeeded`` or ``actuation.failed`` (with what was run and the scheduler's answer) when done, then the
next phase, a retry after ``backoff_s * 2**(n-1)`` seconds (at most ``backoff_max_s``), or, after ``max_attempts``
failures or a failure that cannot be retried, ``actuation.given_up``. The report path never waits on it: a report
only writes the row.

A worker killed at any point loses nothing: a row it claimed becomes due again when its lease ends, and the next
worker runs the phase whose outcome was not recorded (a phase recorded as succeeded is never run again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from platform_sim.actuators import Actuator, ActuatorUnavailable, make_actuator
from platform_sim.actuators.base import ActionResult, HandleRefused

from .store import Store
from .store_actuation import Actuation

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ActuateSettings:
    """How the worker claims and retries stop actions (``evalstop-server actuate`` / ``serve --actuate`` flags).

    Args:
        lease_s: How long a claimed action is not claimed again: longer than one phase can take (the actuators
            bound their scheduler calls by their own timeouts, 30 s at most by default).
        backoff_s: Delay before the first retry of a failed phase; doubled after each further failure.
        backoff_max_s: The cap of that doubling.
        max_attempts: Failed attempts of one phase before the action is given up.
        poll_s: How often the worker looks for due actions.
        concurrency: Actions run at once.
    """

    lease_s: float = 120.0
    backoff_s: float = 2.0
    backoff_max_s: float = 300.0
    max_attempts: int = 10
    poll_s: float = 0.5
    concurrency: int = 4

    def __post_init__(self) -> None:
        for name in ("lease_s", "backoff_s", "backoff_max_s", "poll_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if self.max_attempts < 1 or self.concurrency < 1:
            raise ValueError(f"max_attempts and concurrency must be >= 1, got {self.max_attempts}, {self.concurrency}")

    def retry_at(self, attempt: int, now: float, retryable: bool = True) -> float | None:
        """When to try a phase again after its failed attempt number ``attempt`` (1-based), or None to give up."""
        if not retryable or attempt >= self.max_attempts:
            return None
        return now + min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))


def parse_actuators(kinds: Iterable[str], options: Iterable[str]) -> dict[str, Actuator]:
    """The actuators of ``--actuator KIND`` (repeatable) and ``--actuator-option [KIND.]KEY=VALUE`` flags.

    An option without ``KIND.`` goes to the only actuator named; with several actuators each option must name its
    kind (``ray.address=http://127.0.0.1:8265``).

    Raises:
        ValueError: a malformed option, an option for a kind not named, or an actuator that cannot be built (the
            message names the flag and the reason).
    """
    names = list(dict.fromkeys(kinds))
    per_kind: dict[str, dict[str, str]] = {k: {} for k in names}
    for raw in options:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise ValueError(f"--actuator-option {raw!r}: give KEY=VALUE or KIND.KEY=VALUE")
        kind, dot, name = key.partition(".")
        if not dot:
            if len(names) != 1:
                raise ValueError(
                    f"--actuator-option {raw!r}: with {len(names)} actuators name the kind (KIND.KEY=VALUE)"
                    if names
                    else f"--actuator-option {raw!r}: no --actuator given"
                )
            kind, name = names[0], key
        if kind not in per_kind:
            raise ValueError(f"--actuator-option {raw!r}: no --actuator {kind} given")
        per_kind[kind][name] = value
    out: dict[str, Actuator] = {}
    for kind in names:
        try:
            out[kind] = make_actuator(kind, per_kind[kind])
        except ActuatorUnavailable as exc:
            raise ValueError(f"--actuator {kind}: {exc}") from None
    return out


class ActuationWorker:
    """Drains the outbox of stop actions (see the module docstring).

    Args:
        store: The store the outbox lives in.
        actuators: The actuator of each scheduler kind this worker may act on. An action of another kind fails
            (retried, so that a worker restarted with that actuator configured still runs it).
        settings: Lease and retry schedule.
    """

    def __init__(self, store: Store, actuators: Mapping[str, Actuator], settings: ActuateSettings) -> None:
        self.store = store
        self.actuators = dict(actuators)
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run :meth:`run_forever` on a daemon thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run_forever, name="evalstop-actuate", daemon=True)
            self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        """Ask the loop to end and wait at most ``wait_s`` for it. An action still in flight is not lost: its row
        stays claimed and is run again after its lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)

    def run_forever(self) -> None:
        """Claim and run due actions every ``poll_s`` until :meth:`stop`."""
        with ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="evalstop-actuator") as pool:
            while not self._stop.is_set():
                try:
                    self.run_once(pool)
                except Exception:  # the store is unavailable for a moment, or a bug: never lose the loop
                    logger.exception("actuate round failed; retrying")
                self._stop.wait(self.settings.poll_s)

    def run_once(self, pool: ThreadPoolExecutor | None = None) -> int:
        """One round: claim the due actions and run one phase of each; returns how many were run."""
        batch = self.store.claim_actuations(time.time(), self.settings.lease_s, limit=4 * self.settings.concurrency)
        if pool is None:
            for a in batch:
                self._run(a)
        else:
            list(pool.map(self._run, batch))
        return len(batch)

    def _owner_refusal(self, actuator: Actuator, action: Actuation) -> ActionResult | None:
        """None when the job is still the tenant's to act on, by the scheduler's answer now; else the failed result
        that acts on nothing: given up with the reason when the owner changed (or the operator took the scope
        away), retried when the scheduler could not say."""
        what = f"owner check of {action.handle.kind} job {action.handle.ref}"
        try:
            actuator.check_owner(action.handle, self.store.tenant_scope(action.tenant_id))
        except HandleRefused as exc:
            logger.warning("actuation %d: not acted on: %s", action.action_id, exc)
            return ActionResult(False, what, f"not acted on: {exc}", retryable=False)
        except Exception as exc:
            logger.warning("actuation %d: the owner could not be checked: %s", action.action_id, exc)
            return ActionResult(False, what, "the scheduler could not say whose the job is now; retrying")
        return None

    def _act(self, actuator: Actuator, action: Actuation) -> ActionResult:
        try:
            return actuator.act(action.handle, action.phase)
        except Exception as exc:  # the interface says act never raises; a bug must not lose the action
            logger.exception("actuator %s raised on %s", action.handle.kind, action.handle.ref)
            return ActionResult(False, f"{action.handle.kind} {action.handle.ref}", f"{type(exc).__name__}: {exc}")

    def _run(self, action: Actuation) -> None:
        actuator = self.actuators.get(action.handle.kind)
        if actuator is None:
            result = ActionResult(
                False,
                f"{action.handle.kind} {action.handle.ref}",
                f"no {action.handle.kind} actuator is configured on this worker (--actuator {action.handle.kind})",
            )
        else:
            result = self._owner_refusal(actuator, action) or self._act(actuator, action)
        now = time.time()
        retry_at = None if result.ok else self.settings.retry_at(action.attempts + 1, now, result.retryable)
        level = logging.INFO if result.ok else logging.WARNING
        logger.log(
            level,
            "actuation %d (%s %s, phase %d): %s: %s %s",
            action.action_id,
            action.handle.kind,
            action.handle.ref,
            action.phase,
            "ok" if result.ok else "failed",
            result.action,
            result.detail,
        )
        if not self.store.finish_actuation(action, result, retry_at, now):
            logger.warning("actuation %d: the lease ran out before its outcome was recorded", action.action_id)
