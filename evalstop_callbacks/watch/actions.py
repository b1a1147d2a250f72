"""What a stop does: signal the trainer's process, or run the user's command (``ray job stop``, ``scancel``, ...).

Also how the watcher learns that ``--pid`` ended and with what exit status: ``waitpid`` when the process is the
watcher's own child; otherwise, on Linux, the exit status that ``/proc/<pid>/stat`` shows while the process waits to
be reaped by its parent. A process already reaped by another parent has no readable status (None).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

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


def stop_process(pid: int, grace: float) -> str:
    """Send SIGTERM to ``pid``, then SIGKILL if it still runs after ``grace`` seconds; how it ended.

    Returns:
        ``"terminated"`` (it exited within the grace time), ``"killed"`` or ``"already exited"``.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "already exited"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not process_state(pid).alive:
            return "terminated"
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if not process_state(pid).alive:
        return "terminated"
    logger.warning("evalstop watch: pid %d still runs %.1f s after SIGTERM: sending SIGKILL", pid, grace)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "terminated"
    return "killed"


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
