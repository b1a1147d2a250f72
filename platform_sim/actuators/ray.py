"""The Ray Jobs actuator: ends a stopped job's Ray job with ``JobSubmissionClient.stop_job``.

A handle's ref is the Ray job's **submission id** (what ``ray job submit --submission-id`` set, or the
``raysubmit_...`` id Ray made up). Authorization is by prefix: the operator gives each tenant one or more
submission-id prefixes (``evalstop-server tenant scope acme --ray-prefix acme-``), and a tenant may name a job only
when it exists on the cluster and its submission id starts with one of them at a word's end (:func:`covers`:
``acme`` covers ``acme-7``, not ``acmecorp-7``). A prefix rather than the job's
``metadata``: anyone who can submit to the cluster can write any metadata, while a naming rule is something the
operator can enforce at submission (and read in ``ray job list``). A driver's job id (``02000000``) is refused:
only submitted jobs can be stopped through the job API.

Stopping takes two phases. Phase 0 asks the job server to stop the job (Ray sends SIGTERM to the entrypoint, then
SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``, 3 s by default). Phase 1, ``confirm_s`` later, checks that the job
reached a terminal status, and asks again (a failed, retried phase) when it did not. A job already finished, or no
longer known to the cluster, counts as stopped.

Options (``--actuator-option``): ``address`` (required: the job API, e.g. ``http://127.0.0.1:8265``), ``timeout_s``
(longest wait for one call, default 10), ``confirm_s`` (default 5).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .base import ActionResult, HandleError, HandleRefused, SchedulerHandle, TenantScope

KIND = "ray"
SUBMISSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
T = TypeVar("T")


class _Timeout(Exception):
    pass


SEPARATORS = "-_.:"
"""The characters that end a prefix's word: ``acme`` covers ``acme-run-7``, never ``acmecorp-run-7``."""


def covers(prefix: str, ref: str) -> bool:
    """Whether a tenant's submission-id ``prefix`` covers ``ref``: ``ref`` starts with it at a word's end (the
    prefix ends with a separator, or the character after it in ``ref`` is one, or ``ref`` is the prefix itself).
    So ``acme`` covers ``acme-1`` and ``acme.x``, not ``acmecorp-1``; ``acme-`` covers ``acme-1`` only."""
    if not prefix or not ref.startswith(prefix):
        return False
    return prefix[-1] in SEPARATORS or len(ref) == len(prefix) or ref[len(prefix)] in SEPARATORS


def overlaps(a: str, b: str) -> bool:
    """Whether some submission id would be covered by both prefixes ``a`` and ``b`` (two tenants could name it)."""
    return covers(a, b) or covers(b, a) or (a.rstrip(SEPARATORS) == b.rstrip(SEPARATORS) != "")


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _unknown(exc: BaseException) -> bool:
    """Whether the job server answered that the job does not exist (its RuntimeError says so, with a 404)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("does not exist" in text or "404" in text)


@dataclass(frozen=True)
class RayActuator:
    """Stops Ray jobs through the job API of one cluster.

    Args:
        address: The job API (the dashboard), ``http://host:port``.
        timeout_s: Longest wait for one call to the job API (the client has no timeout of its own; a call past it
            is abandoned on its thread and counted as a failed, retried attempt).
        confirm_s: Seconds between the stop request and the check that the job ended.
    """

    address: str
    timeout_s: float = 10.0
    confirm_s: float = 5.0
    kind: str = KIND

    def __post_init__(self) -> None:
        if not self.address.startswith(("http://", "https://")):
            raise ValueError(f"address {self.address!r}: give the job API's http:// or https:// URL")
        for name in ("timeout_s", "confirm_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")

    def _call(self, fn: Callable[[Any], T]) -> T:
        """``fn(client)`` with a fresh client, bounded by ``timeout_s`` (raises what it raised, or :class:`_Timeout`)."""
        from ray.job_submission import JobSubmissionClient

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(JobSubmissionClient(self.address))
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="evalstop-ray-call", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise _Timeout(f"the Ray job API at {self.address} did not answer within {self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    def parse(self, ref: str) -> SchedulerHandle:
        """A submission id: letters, digits and ``._:-``, 128 characters at most."""
        if not SUBMISSION_ID.fullmatch(ref):
            raise HandleError("a Ray submission id is 1-128 letters, digits or '._:-', starting with a letter or digit")
        return SchedulerHandle(KIND, ref)

    def authorize(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """The job must start with one of the tenant's ``ray`` prefixes and exist on the cluster as a submitted job."""
        self.check_owner(handle, scope)
        try:
            info = self._call(lambda c: c.get_job_info(handle.ref))
        except Exception as exc:
            if _unknown(exc):
                raise HandleError(f"no such job on the Ray cluster at {self.address}") from None
            raise  # cannot ask the cluster now: not the handle's fault (the service answers 503)
        if getattr(info, "submission_id", None) != handle.ref:
            raise HandleError("not a submitted Ray job (give its submission id, not a driver's job id)")

    def check_owner(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """The submission id (its owner, fixed in the handle) must start with one of the tenant's ``ray`` prefixes;
        asks nothing of the cluster, so a tenant without one is refused before the cluster is asked."""
        prefixes = scope.owners(KIND)
        if not prefixes:
            raise HandleRefused("the operator gave this tenant no Ray submission-id prefix (tenant scope --ray-prefix)")
        if not any(covers(p, handle.ref) for p in prefixes):
            raise HandleRefused(
                f"the submission id does not start with one of this tenant's prefixes ({len(prefixes)})"
            )

    def act(self, handle: SchedulerHandle, phase: int) -> ActionResult:
        """Phase 0: ``stop_job``; phase 1: check that the job ended (and ask again when it did not)."""
        what = f"ray stop_job {handle.ref} at {self.address}"
        try:
            if phase == 0:
                stopped = self._call(lambda c: c.stop_job(handle.ref))
                if not stopped:
                    return ActionResult(True, what, "the job had already ended")
                return ActionResult(True, what, "stop requested", next_phase_after_s=self.confirm_s)
            status = str(self._call(lambda c: c.get_job_status(handle.ref))).rsplit(".", 1)[-1]
            check = f"ray get_job_status {handle.ref} at {self.address}"
            if status in TERMINAL:
                return ActionResult(True, check, f"the job is {status}")
            self._call(lambda c: c.stop_job(handle.ref))
            return ActionResult(False, check, f"the job is still {status} after its stop; asked again")
        except Exception as exc:
            if _unknown(exc):
                return ActionResult(True, what, "the cluster no longer knows the job (already gone)")
            return ActionResult(False, what, _one_line(exc), retryable=True)


def build(options: Mapping[str, str]) -> RayActuator:
    """The actuator of the ``--actuator-option`` values ``address``, ``timeout_s`` and ``confirm_s``.

    Raises:
        ValueError: ``address`` missing, an unknown key, or a value that is not a positive number.
    """
    known = {"address", "timeout_s", "confirm_s"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}: the ray actuator takes {', '.join(sorted(known))}")
    if "address" not in options:
        raise ValueError("give address=http://HOST:PORT (the Ray job API)")
    import ray.job_submission  # noqa: F401  - fail at start, not at the first stop, when ray is missing

    numbers = {"timeout_s": 10.0, "confirm_s": 5.0}
    for key in numbers:
        if key in options:
            try:
                numbers[key] = float(options[key])
            except ValueError:
                raise ValueError(f"{key}={options[key]!r}: not a number") from None
    return RayActuator(options["address"], timeout_s=numbers["timeout_s"], confirm_s=numbers["confirm_s"])
