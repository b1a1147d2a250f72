"""The Slurm actuator: ends (or requeues) a stopped job through Slurm's own commands.

A stop is two phases, as a Slurm operator would do it by hand:

- phase 0: ``scancel --signal=TERM --full <id>``: SIGTERM to the batch script and every step, so a trainer that
  handles it (the EvalStop callback does) can write its last checkpoint and exit on its own;
- phase 1, ``grace_s`` later: ``scancel <id>``: Slurm ends whatever is left (SIGTERM, then SIGKILL after the
  cluster's ``KillWait``).

With ``requeue=True`` the stop is the single phase ``scontrol requeue <id>``: the job goes back to the queue (for
sites that rerun a job from its best checkpoint with other settings) and its slots are freed at once.

Phase 0 first reads the job's state with ``squeue``: a job that is already finished or unknown to Slurm counts as
stopped (``ok=True``; the goal, free slots, holds) and is never requeued (Slurm would run a finished job again); a
job still pending has no process to signal, so it is cancelled at once in that one phase.
A command that fails, hangs past ``timeout_s`` or is missing comes back as ``ok=False`` with the reason and
``retryable=True``; the caller retries with backoff and never blocks on it.

Whose job a handle names is read from ``squeue -o %u|%a`` (the job's Unix user and its account): this needs no
accounting database (slurmdbd), and the tenant may name the job if ``user:<user>`` or ``account:<account>`` is one
of its owners for ``"slurm"``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .base import ActionResult, HandleError, HandleRefused, SchedulerHandle, TenantScope

logger = logging.getLogger(__name__)

#: A batch job id, or one task of a job array (``1234_5``).
_JOB_ID = re.compile(r"[1-9][0-9]*(_[0-9]+)?")

#: What Slurm answers (on stderr, often with exit status 0) for a job that is gone: unknown id, or finished.
_GONE = ("invalid job id", "already completing or completed", "job has already finished", "no longer exist")

#: Slurm job states after which the job holds no slots and will not run again by itself. COMPLETING counts: the job
#: is ending (perhaps from our own earlier phase, whose result a crash lost), and requeueing it would run it again.
_FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

#: The options :func:`build` accepts, all strings as the service's configuration holds them.
OPTIONS = ("grace_s", "requeue", "timeout_s", "scancel", "scontrol", "squeue", "slurm_conf")


class SchedulerUnavailable(RuntimeError):
    """Slurm could not be asked (``squeue`` failed, hung or is missing): not the handle's fault, try again later."""


@dataclass(frozen=True)
class _Run:
    """What one command did: ``error`` is set when it could not run to its end (missing, timed out)."""

    returncode: int
    out: str
    err: str
    error: str = ""


class SlurmActuator:
    """Acts on a Slurm cluster through ``scancel``, ``scontrol`` and ``squeue``.

    Args:
        grace_s: Seconds between the SIGTERM of phase 0 and the ``scancel`` of phase 1: the time a job has to save
            and exit on its own.
        requeue: Stop by ``scontrol requeue`` (one phase) instead of cancelling.
        timeout_s: How long one command may run; past it the command's process group is killed and the phase
            fails, retryable.
        scancel: The ``scancel`` command (a name looked up on ``PATH`` or a path).
        scontrol: The ``scontrol`` command.
        squeue: The ``squeue`` command.
        slurm_conf: The cluster's ``slurm.conf`` (sets ``SLURM_CONF`` for the commands); ``None`` leaves the
            environment's.

    Raises:
        ValueError: for a negative ``grace_s`` or a non-positive ``timeout_s``.
    """

    kind: str = "slurm"

    def __init__(
        self,
        *,
        grace_s: float = 30.0,
        requeue: bool = False,
        timeout_s: float = 10.0,
        scancel: str = "scancel",
        scontrol: str = "scontrol",
        squeue: str = "squeue",
        slurm_conf: str | None = None,
    ) -> None:
        if not grace_s >= 0:
            raise ValueError(f"slurm actuator: grace_s must be >= 0, got {grace_s}")
        if not timeout_s > 0:
            raise ValueError(f"slurm actuator: timeout_s must be > 0, got {timeout_s}")
        self.grace_s = float(grace_s)
        self.requeue = requeue
        self.timeout_s = float(timeout_s)
        self.scancel = scancel
        self.scontrol = scontrol
        self.squeue = squeue
        self.slurm_conf = slurm_conf

    def __repr__(self) -> str:
        return (
            f"SlurmActuator(grace_s={self.grace_s}, requeue={self.requeue}, timeout_s={self.timeout_s}, "
            f"scancel={self.scancel!r}, scontrol={self.scontrol!r}, squeue={self.squeue!r})"
        )

    # -- registration ---------------------------------------------------------------------------------------

    def parse(self, ref: str) -> SchedulerHandle:
        """The handle of Slurm job ``ref`` (``"1234"`` or an array task ``"1234_5"``), checked for syntax only.

        Raises:
            HandleError: for anything else (empty, not digits, a step id like ``1234.0``, a het-job ``1234+0``).
        """
        if not isinstance(ref, str) or not _JOB_ID.fullmatch(ref):
            raise HandleError(f"slurm job id must look like 1234 or 1234_5 (an array task), got {ref!r}")
        return SchedulerHandle("slurm", ref)

    def authorize(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """Check that ``handle``'s job exists and its user or account is one of ``scope``'s owners for ``"slurm"``.

        The owners are written ``user:NAME`` (the job's Unix user) or ``account:NAME`` (its Slurm account), as
        ``evalstop-server tenant scope --slurm-user/--slurm-account`` stores them. A tenant with no Slurm owner is
        refused before Slurm is asked, and a refusal never names the job's owner: the answer tells a tenant nothing
        about other users' jobs.

        Raises:
            HandleError: the handle is malformed or not a Slurm one, or Slurm does not know the job (never
                submitted, or finished longer ago than the cluster's ``MinJobAge``).
            HandleRefused: the tenant has no Slurm scope, or the job belongs to a user and account it may not name.
            SchedulerUnavailable: ``squeue`` failed, hung or is missing: the job cannot be checked now (the service
                answers 503, and the client may try again).
        """
        owners = self._owners_of(handle, scope)
        found = self._job_owners(handle.ref)
        if found is None:
            raise HandleError(f"slurm job {handle.ref} is unknown to the cluster")
        _match(handle.ref, found, owners)

    def check_owner(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """:meth:`authorize` again, right before a phase acts, except that a job Slurm no longer knows passes (the
        phase finds it gone). Raises :class:`HandleRefused` when the job's user and account are not the tenant's
        now (a reset of slurmctld's state, ``FirstJobId``, a wrap at ``MaxJobId``, or the scope taken away)."""
        owners = self._owners_of(handle, scope)
        found = self._job_owners(handle.ref)
        if found is not None:
            _match(handle.ref, found, owners)

    def _owners_of(self, handle: SchedulerHandle, scope: TenantScope) -> frozenset[str]:
        self._check(handle)
        owners = scope.owners(self.kind)
        if not owners:
            raise HandleRefused("the operator gave this tenant no Slurm user or account (tenant scope --slurm-*)")
        return owners

    def _job_owners(self, ref: str) -> list[tuple[str, str]] | None:
        """``(user, account)`` of each line ``squeue`` shows for job ``ref`` (one per array task); None when Slurm
        does not know the job. Raises :class:`SchedulerUnavailable` when ``squeue`` cannot answer."""
        run = self._run([self.squeue, "--noheader", "--states=all", f"--jobs={ref}", "--format=%u|%a"])
        if run.error:
            raise SchedulerUnavailable(f"cannot check slurm job {ref}: {run.error}")
        if _gone(run.err) or (run.returncode == 0 and not run.out.strip()):
            return None
        if run.returncode != 0:
            detail = _first_line(run.err) or f"exit status {run.returncode}"
            raise SchedulerUnavailable(f"cannot check slurm job {ref}: {detail}")
        out = []
        for line in run.out.splitlines():
            user, _, account = line.strip().partition("|")
            out.append((user, account))
        return out

    # -- stopping -------------------------------------------------------------------------------------------

    def act(self, handle: SchedulerHandle, phase: int) -> ActionResult:
        """Run phase ``phase`` of stopping ``handle``'s job (see the module's docstring); never raises for faults.

        Args:
            handle: A handle from :meth:`parse`.
            phase: 0 (TERM, or the requeue), then 1 (``scancel``) after ``next_phase_after_s``.

        Returns:
            ``ok=True`` when the command succeeded or the job was already gone; otherwise ``ok=False`` with the
            command's error, retryable. A phase this actuator does not have is ``ok=False``, not retryable.
        """
        self._check(handle)
        if phase != 0 and (self.requeue or phase != 1):
            what = "requeue has only phase 0" if self.requeue else "a slurm stop has phases 0 and 1"
            return ActionResult(False, f"slurm phase {phase} of {handle.ref}", what, retryable=False)
        if phase == 1:
            return self._phase([self.scancel, handle.ref], next_after=None)
        # Phase 0 looks at the job first: a finished job must not be requeued (Slurm would run it again), and a
        # pending one has no process to signal (Slurm answers "can not be altered now"), so it is just cancelled.
        state, error = self._state(handle.ref)
        if error:
            logger.warning("slurm actuator: squeue %s: %s", handle.ref, error)
            return ActionResult(False, f"squeue --jobs={handle.ref}", error, retryable=True)
        if state is None or state in _FINISHED:
            return ActionResult(True, f"squeue --jobs={handle.ref}", f"job already gone: {state or 'unknown to slurm'}")
        if self.requeue:
            return self._phase([self.scontrol, "requeue", handle.ref], next_after=None)
        if state == "PENDING":
            return self._phase([self.scancel, handle.ref], next_after=None)
        result = self._phase([self.scancel, "--signal=TERM", "--full", handle.ref], next_after=self.grace_s)
        if result.ok and result.detail.startswith("job already gone"):
            # It ended between the look and the signal: phase 1 would only find the same.
            return ActionResult(True, result.action, result.detail)
        return result

    def _phase(self, argv: Sequence[str], next_after: float | None) -> ActionResult:
        # What is recorded goes to the tenant's events and handle view: the command's name, never the operator's
        # path to it, and never Slurm's own messages (they go to the server log).
        action = _shown(argv)
        run = self._run(argv)
        if run.error:
            logger.warning("slurm actuator: %s: %s", " ".join(argv), run.error)
            return ActionResult(False, action, _public(argv, run.error), retryable=True)
        if _gone(run.err):
            return ActionResult(True, action, "job already gone")
        if run.returncode != 0 or "error" in run.err.lower():
            logger.warning("slurm actuator: %s failed: %s", " ".join(argv), _first_line(run.err))
            detail = f"{_shown(argv[:1])} failed (exit status {run.returncode}); its message is in the server log"
            return ActionResult(False, action, detail, retryable=True)
        return ActionResult(True, action, "done", next_phase_after_s=next_after)

    # -- plumbing -------------------------------------------------------------------------------------------

    def _state(self, ref: str) -> tuple[str | None, str]:
        """The job's Slurm state (``None``: unknown to Slurm) and an error when ``squeue`` could not answer.

        For an array job with several tasks the most alive state counts: one running task makes it running.
        """
        run = self._run([self.squeue, "--noheader", "--states=all", f"--jobs={ref}", "--format=%T"])
        if run.error:
            return None, _public([self.squeue], run.error)
        if _gone(run.err):
            return None, ""
        if run.returncode != 0:
            logger.warning("slurm actuator: squeue %s failed: %s", ref, _first_line(run.err))
            return None, f"squeue failed (exit status {run.returncode}); its message is in the server log"
        states = {line.strip() for line in run.out.splitlines() if line.strip()}
        if not states:
            return None, ""
        alive = states - _FINISHED
        if alive - {"PENDING"}:
            return sorted(alive - {"PENDING"})[0], ""
        return ("PENDING" if alive else sorted(states)[0]), ""

    def _check(self, handle: SchedulerHandle) -> None:
        if handle.kind != self.kind:
            raise HandleError(f"not a slurm handle: kind {handle.kind!r}")
        self.parse(handle.ref)

    def _run(self, argv: Sequence[str]) -> _Run:
        """Run ``argv`` with the timeout; a missing or hanging command is an ``error``, never an exception."""
        env = None
        if self.slurm_conf is not None:
            env = {**os.environ, "SLURM_CONF": self.slurm_conf}
        try:
            # A session of its own, so a timeout kills the whole process group: a wrapper script's children would
            # otherwise hold the pipes open and the wait would hang past the timeout.
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
            )
        except FileNotFoundError:
            return _Run(-1, "", "", f"{argv[0]}: command not found")
        except OSError as exc:
            return _Run(-1, "", "", f"{argv[0]}: cannot run: {exc}")
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return _Run(-1, "", "", f"{argv[0]}: timed out after {self.timeout_s:g} s")
        return _Run(proc.returncode, out, err)


def _match(ref: str, found: list[tuple[str, str]], owners: frozenset[str]) -> None:
    """Every line (one per array task) must be the tenant's: one foreign task refuses the whole handle. The
    message names no owner (who runs a job that is not the tenant's is none of its business)."""
    for user, account in found:
        if f"user:{user}" not in owners and f"account:{account}" not in owners:
            raise HandleRefused(f"slurm job {ref} is not one of this tenant's (its slurm users and accounts)")


def _gone(stderr: str) -> bool:
    low = stderr.lower()
    return any(marker in low for marker in _GONE)


def _shown(argv: Sequence[str]) -> str:
    """``argv`` as a tenant may see it: the command by its name alone."""
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


def _public(argv: Sequence[str], error: str) -> str:
    """A run's own error (not found, timed out, cannot run) as a tenant may see it: the command by its name alone,
    never the operator's path to it."""
    return error.replace(argv[0], os.path.basename(argv[0]))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def build(options: Mapping[str, str]) -> SlurmActuator:
    """A :class:`SlurmActuator` from the service's string options.

    Args:
        options: Any of ``grace_s`` and ``timeout_s`` (seconds), ``requeue`` (``true``/``false``, also
            ``1``/``0``, ``yes``/``no``), ``scancel``, ``scontrol``, ``squeue`` (commands) and ``slurm_conf``
            (a path).

    Raises:
        ValueError: naming an unknown option or a value that does not parse.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"slurm actuator: unknown option {unknown[0]!r} (known: {', '.join(OPTIONS)})")
    kwargs: dict[str, object] = {}
    for key in ("grace_s", "timeout_s"):
        if key in options:
            try:
                kwargs[key] = float(options[key])
            except ValueError:
                raise ValueError(f"slurm actuator: {key} must be a number of seconds, got {options[key]!r}") from None
    if "requeue" in options:
        value = options["requeue"].strip().lower()
        if value not in _TRUE | _FALSE:
            raise ValueError(f"slurm actuator: requeue must be true or false, got {options['requeue']!r}")
        kwargs["requeue"] = value in _TRUE
    for key in ("scancel", "scontrol", "squeue", "slurm_conf"):
        if key in options:
            if not options[key].strip():
                raise ValueError(f"slurm actuator: {key} must not be empty")
            kwargs[key] = options[key]
    return SlurmActuator(**kwargs)  # type: ignore[arg-type]
