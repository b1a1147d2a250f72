"""What a stop does: signal the trainer's process, run the user's command (``ray job stop``, ``scancel``, ...), or
end the job through its scheduler's actuator (``--stop-with slurm|ray|kubernetes``, :func:`stop_with_command`).

At a stop the trainer's whole process tree is signalled (:func:`stop_process` says why), and the watch checks
that it is gone before it says so.

Also how the watcher learns that ``--pid`` ended and with what exit status: ``waitpid`` when the process is the
watcher's own child; otherwise, on Linux, the exit status that ``/proc/<pid>/stat`` shows while the process waits to
be reaped by its parent. A process already reaped by another parent has no readable status (None).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..scheduler_handle import detect_handle

logger = logging.getLogger(__name__)

_EXIT_CODE_FIELD = 52  # /proc/<pid>/stat: "exit_code", the status in waitpid's form (Linux >= 3.5; proc(5))


@dataclass(frozen=True)
class ProcessState:
    """Whether a process is alive; once it is not, its exit status if readable.

    Args:
        alive: False once the process exited (a zombie counts as exited).
        exit_code: Its exit code (``128 + N`` for a death by signal N, as a shell reports it), or None while alive
            or when not readable.
    """

    alive: bool
    exit_code: int | None = None


def _shell_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by signal N: -N -> 128 + N


def process_state(pid: int) -> ProcessState:
    """The state of process ``pid`` (see the module docstring for when the exit status is readable)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: look it up
        pass
    else:
        return ProcessState(True) if done == 0 else ProcessState(False, _shell_code(status))
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return ProcessState(False)
    except OSError:  # no /proc (not Linux): ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return ProcessState(False)
        except PermissionError:
            pass
        return ProcessState(True)
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
    if fields and fields[0] in ("Z", "X"):
        index = _EXIT_CODE_FIELD - 3  # fields after the name start at field 3
        code = _shell_code(int(fields[index])) if len(fields) > index else None
        return ProcessState(False, code)
    return ProcessState(True)


@dataclass(frozen=True)
class _Proc:
    """One process of the trainer's tree, named by its pid and its start time (a pid reused later is another)."""

    pid: int
    started: int


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def _proc(pid: int) -> _Proc | None:
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return _Proc(pid, int(fields[19]))  # field 22, starttime


def _children(parents: set[int]) -> dict[int, _Proc]:
    """Every live process whose parent is in ``parents`` (one scan of /proc)."""
    found: dict[int, _Proc] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and len(fields) >= 20 and int(fields[1]) in parents and fields[0] not in ("Z", "X"):
            found[int(entry)] = _Proc(int(entry), int(fields[19]))
    return found


def process_tree(pid: int) -> list[_Proc]:
    """``pid`` and every live descendant of it, parents first (read from ``/proc``; ``pid`` alone elsewhere)."""
    root = _proc(pid)
    tree = {pid: root if root is not None else _Proc(pid, -1)}
    frontier = {pid}
    while frontier:
        found = {p: proc for p, proc in _children(frontier).items() if p not in tree}
        tree.update(found)
        frontier = set(found)
    return list(tree.values())


def _alive(proc: _Proc) -> bool:
    if proc.started < 0:  # no /proc: ask the kernel
        return process_state(proc.pid).alive
    now = _proc(proc.pid)
    if now is None or now.started != proc.started:
        return False
    return process_state(proc.pid).alive  # a zombie has exited (and our own child is reaped here)


def _signal(procs: list[_Proc], signum: int) -> None:
    for proc in procs:
        try:
            os.kill(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _own_group(pid: int) -> int | None:
    """``pid``'s process group when ``pid`` leads one that is not the watcher's own (else None)."""
    try:
        group = os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
    return group if group == pid and group != os.getpgrp() else None


def _wait_gone(tracked: dict[int, _Proc], deadline: float, signum: int) -> list[_Proc]:
    """Wait until every tracked process ended or ``deadline``; a child born meanwhile gets ``signum`` and is tracked
    too. The processes still alive at the end."""
    while True:
        alive = [p for p in tracked.values() if _alive(p)]
        newcomers = [p for p in _children({p.pid for p in alive}).values() if p.pid not in tracked]
        if newcomers:  # e.g. a launcher that restarts a worker it lost
            _signal(newcomers, signum)
            tracked.update((p.pid, p) for p in newcomers)
            alive += newcomers
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_process(pid: int, grace: float, confirm: float = 5.0) -> str:
    """End the trainer: SIGTERM to ``pid`` and every descendant (and to its process group when it leads one of its
    own), SIGKILL to what still runs ``grace`` seconds later; how it ended, checked.

    Why the tree: ``--pid`` is often a launcher, not the trainer: ``bash -c "python train.py; ..."`` (bash dies of
    the SIGTERM and leaves its child running), ``torchrun`` or ``accelerate launch`` (the workers are the launcher's
    children). The tree is read from ``/proc`` before the first signal (a child whose parent died is re-parented
    and could no longer be found), and a child born during the grace period is signalled too. The group adds the
    processes that left the tree but not the group (double-forked helpers) - only when ``pid`` leads a group that is
    not the watcher's, so that a watcher started from the same shell script never signals itself.

    Returns:
        ``"terminated"``, ``"killed after <grace> s"``, ``"already exited"``, or, when something outlived SIGKILL
        by ``confirm`` seconds, ``"still running after SIGKILL: pids ..."``. The count of processes is named when
        the tree held more than one.
    """
    tree = process_tree(pid)
    if not any(_alive(p) for p in tree):
        return "already exited"
    group = _own_group(pid)
    _signal(tree, signal.SIGTERM)
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
    tracked = {p.pid: p for p in tree}
    alive = _wait_gone(tracked, time.monotonic() + grace, signal.SIGTERM)
    many = f" ({len(tracked)} processes: {', '.join(str(p) for p in sorted(tracked))})" if len(tracked) > 1 else ""
    if not alive:
        return f"terminated{many}"
    logger.warning(
        "evalstop watch: %d process(es) still run %.1f s after SIGTERM (pids %s): sending SIGKILL",
        len(alive),
        grace,
        ", ".join(str(p.pid) for p in alive),
    )
    _signal(alive, signal.SIGKILL)
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    left = _wait_gone(tracked, time.monotonic() + confirm, signal.SIGKILL)
    if left:
        return f"still running after SIGKILL: pids {', '.join(str(p.pid) for p in left)}{many}"
    return f"killed after {grace:g} s{many}"


def run_stop_command(command: str, env: Mapping[str, str], timeout: float | None = None) -> int:
    """Run ``command`` through the shell with ``env`` added to the environment; its exit code.

    Args:
        command: The ``--on-stop`` command line.
        env: The decision (``EVALSTOP_STOP_STEP`` and the rest).
        timeout: Seconds to wait for it; None waits as long as it takes.

    Raises:
        subprocess.TimeoutExpired: It ran past ``timeout``.
    """
    logger.info("evalstop watch: running the stop command: %s", command)
    done = subprocess.run(command, shell=True, env={**os.environ, **env}, timeout=timeout, check=False)
    return done.returncode


STOP_WITH = ("slurm", "ray", "kubernetes")
"""The schedulers ``--stop-with`` ends a run on (through :mod:`platform_sim.actuators`)."""


def stop_with_command(kind: str, ref: str | None, options: Sequence[str], environ: Mapping[str, str]) -> str:
    """The ``--on-stop`` command line that ends the run with the ``kind`` actuator (``--stop-with``).

    The actuator runs in a child process (:func:`stop_with_main`), as any ``--on-stop``
    command does: the scheduler client (Ray, Kubernetes) is imported there only, and its exit status is the stop's.

    Args:
        kind: ``slurm``, ``ray`` or ``kubernetes``.
        ref: The job's name on the scheduler (``--stop-handle``), or None to detect it from ``environ``.
        options: The actuator's ``KEY=VALUE`` settings (``--stop-option``).
        environ: Where the handle is detected.

    Raises:
        ValueError: no handle given and none found in ``environ``, or a malformed option.
    """
    if ref is None:
        ref = detect_ref(kind, environ)
        if ref is None:
            raise ValueError(f"--stop-with {kind}: no {kind} job found in the environment; give --stop-handle REF")
    for option in options:
        if "=" not in option or option.startswith("="):
            raise ValueError(f"--stop-option {option!r}: give KEY=VALUE")
    return shlex.join([sys.executable, "-c", _STOP_WITH_MAIN, kind, ref, *options])


_STOP_WITH_MAIN = "import sys; from evalstop_callbacks.watch.actions import stop_with_main; sys.exit(stop_with_main())"


def detect_ref(kind: str, environ: Mapping[str, str]) -> str | None:
    """The ref of this environment's ``kind`` job: :func:`evalstop_callbacks.scheduler_handle.detect_handle` when
    installed, else ``SLURM_JOB_ID`` for Slurm; None when none is found."""
    found = detect_handle(environ)
    if found is None:
        return None
    found_kind, found_ref = found
    return found_ref if found_kind == kind else None


def run_actuator(
    kind: str,
    ref: str,
    options: Mapping[str, str],
    attempts: int = 3,
    backoff_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, list[str]]:
    """Run every phase of stopping job ``ref`` with the ``kind`` actuator, here and now; ``(ok, what was done)``.

    A failed phase is tried again ``attempts`` times in all (after ``backoff_s``, doubled), unless the actuator says
    retrying cannot help. No tenant check: the actuator acts with this process's own credentials on the scheduler.

    Raises:
        ValueError: unknown kind, a missing dependency, refused options, or a malformed ``ref``.
    """
    from platform_sim.actuators import make_actuator

    actuator = make_actuator(kind, options)
    handle = actuator.parse(ref)
    done: list[str] = []
    phase = 0
    while True:
        for attempt in range(1, attempts + 1):
            result = actuator.act(handle, phase)
            done.append(f"{result.action}: {'ok' if result.ok else 'failed'} ({result.detail})")
            if result.ok or not result.retryable or attempt == attempts:
                break
            sleep(backoff_s * 2 ** (attempt - 1))
        if not result.ok:
            return False, done
        if result.next_phase_after_s is None:
            return True, done
        sleep(result.next_phase_after_s)
        phase += 1


def stop_with_main(argv: Sequence[str] | None = None) -> int:
    """The ``--stop-with`` child: arguments ``KIND REF [KEY=VALUE ...]`` (default ``sys.argv[1:]``); exit 0 when the
    job was ended, 1 when the scheduler refused or failed, 2 on bad input. Ray's ``address`` defaults to
    ``$RAY_ADDRESS``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if len(argv) < 2 or argv[0] not in STOP_WITH:
        print(f"usage: stop_with_main {{{','.join(STOP_WITH)}}} REF [KEY=VALUE ...]", file=sys.stderr)
        return 2
    kind, ref = argv[0], argv[1]
    options = dict(o.split("=", 1) for o in argv[2:])
    if kind == "ray" and "address" not in options and os.environ.get("RAY_ADDRESS"):
        options["address"] = os.environ["RAY_ADDRESS"]
    try:
        ok, done = run_actuator(kind, ref, options)
    except ValueError as exc:
        print(f"evalstop watch --stop-with {kind}: error: {exc}", file=sys.stderr)
        return 2
    for line in done:
        print(f"evalstop watch --stop-with {kind}: {line}", file=sys.stderr)
    return 0 if ok else 1
