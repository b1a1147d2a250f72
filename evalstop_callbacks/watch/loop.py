"""``evalstop watch``'s loop around a :class:`~evalstop_callbacks.watch.watcher.Watcher`: poll with backoff until a
stop, the end of ``--pid`` or ``--timeout``; then act, write the result and pick the exit code."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .actions import process_state, run_stop_command, stop_process
from .follow import Backoff
from .records import WatchError
from .watcher import Watcher, WatchResult

logger = logging.getLogger(__name__)


@dataclass
class StopPlan:
    """What to do at a stop, and when to give up.

    Args:
        pid: The trainer's process: SIGTERM at a stop (then SIGKILL after ``grace``); its end ends the watch.
        on_stop: A shell command run at a stop with the decision in its environment (instead of ``pid``).
        grace: Seconds between SIGTERM and SIGKILL.
        timeout: Seconds without a new evaluation of the metric (counted from the start until the first one) after
            which the watch ends; None: follow until a stop or the end of ``pid``.
        backoff: The poll interval.
        warn_after: Seconds after which a log that does not exist, or a metric the log has not shown, is warned
            about (again); the metric is also warned about as soon as other evaluation series were logged at
            :data:`MISSING_AFTER_EVAL_STEPS` steps.
    """

    pid: int | None = None
    on_stop: str | None = None
    grace: float = 30.0
    timeout: float | None = None
    backoff: Backoff | None = None
    warn_after: float = 120.0


MISSING_AFTER_EVAL_STEPS = 2
"""After how many steps with other evaluation series (``val``, ``eval``, ``test`` in the name) and no ``--metric``
the watch warns that the metric has not appeared: a typo shows at the second evaluation, not at the run's end."""


@dataclass
class Outcome:
    """How the watch ended: its result, the exit code of the command and a line saying why.

    ``error`` is set when the watch never decided on anything (no log, or no ``--metric`` in it): the command prints
    it as its one-line error, and the exit code is 2.
    """

    result: WatchResult
    exit_code: int
    message: str
    error: str | None = None


class _Missing:
    """Says plainly, early and again after a while, that the log or the metric is not there yet."""

    def __init__(self, watcher: Watcher, warn_after: float) -> None:
        self.watcher, self.warn_after = watcher, warn_after
        self.started = self.said_at = time.monotonic()
        self.said: str | None = None
        if not watcher.log.exists():
            self._say("log", f"{watcher.log} does not exist yet: waiting for the trainer to create it")

    def _say(self, what: str, text: str) -> None:
        logger.warning("evalstop watch: %s", text)
        self.said, self.said_at = what, time.monotonic()

    def check(self) -> None:
        w = self.watcher
        if w.selector.chosen is not None:
            return
        overdue = time.monotonic() - self.said_at >= self.warn_after
        if w.source is None:
            if overdue:
                waited = time.monotonic() - self.started
                self._say("log", f"{w.log} still does not exist after {waited:.0f} s: is it the path the run writes?")
            return
        early = self.said != "metric" and w.selector.eval_steps_seen() >= MISSING_AFTER_EVAL_STEPS
        if early or (overdue and w.selector.seen):
            self._say("metric", f"--metric {w.selector.pattern!r} has not appeared in {w.log}; {w.selector.hint()}")


def never_decided(watcher: Watcher, after: str = "") -> str | None:
    """Why the watch decided on nothing (one line; ``after`` says how long it waited), or None when it saw the
    metric."""
    if watcher.selector.chosen is not None:
        return None
    if watcher.source is None:
        return f"the log {watcher.log} never appeared{after}: nothing was watched (check the path the run writes)"
    return f"--metric {watcher.selector.pattern!r} never appeared in {watcher.log}{after}; {watcher.selector.hint()}"


def stop_env(result: WatchResult, result_file: Path | None) -> dict[str, str]:
    """The decision as ``--on-stop`` sees it in its environment (empty strings for what is unknown)."""

    def text(value: object) -> str:
        return "" if value is None else str(value)

    return {
        "EVALSTOP_STOP_STEP": text(result.stop_step),
        "EVALSTOP_BEST_STEP": text(result.best_step),
        "EVALSTOP_BEST_SCORE": text(result.best_score),
        "EVALSTOP_BEST_CHECKPOINT": text(result.best_checkpoint),
        "EVALSTOP_PROTECTED_CHECKPOINT": text(result.protected_checkpoint),
        "EVALSTOP_RESULT": text(result_file),
    }


def write_result(result: WatchResult, path: Path) -> None:
    """Write the result JSON atomically (a reader never sees half a file), creating its folder if need be (a log
    whose folder never appeared still gets its result)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)


def run(
    watcher: Watcher,
    plan: StopPlan,
    result_file: Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Follow ``watcher``'s log to its end as ``plan`` says; act on a stop.

    Raises:
        WatchError: Bad input (see :class:`~evalstop_callbacks.watch.watcher.Watcher`), or the timeout passed
            before the metric was ever seen (the message names the series the log did show).
    """
    backoff = plan.backoff or Backoff()
    started = time.monotonic()
    missing = _Missing(watcher, plan.warn_after)
    pid_code: int | None = None
    pid_ended = False
    while not watcher.stopped:
        found = watcher.poll()
        if watcher.stopped:
            break
        missing.check()
        if plan.pid is not None:
            state = process_state(plan.pid)
            if not state.alive:
                pid_ended, pid_code = True, state.exit_code
                break
        if plan.timeout is not None:
            since = watcher.last_eval_at if watcher.last_eval_at is not None else started
            if time.monotonic() - since >= plan.timeout:
                if watcher.last_eval_at is None:
                    after = f" after {plan.timeout:g} s"
                    raise WatchError(never_decided(watcher, after) or f"no evaluation of the metric{after}")
                break
        sleep(backoff.next(found))
    result = watcher.finish()
    if watcher.stopped and not pid_ended:
        return _act(result, plan, result_file)
    if pid_ended:
        status = "unreadable (not the watcher's child and already reaped)" if pid_code is None else str(pid_code)
        result.ended = f"process {plan.pid} exited, status {status}"
        code = 0 if pid_code is None else pid_code
    else:
        result.ended = f"no new evaluation for {plan.timeout:g} s"
        code = 0
    error = never_decided(watcher)
    if error is not None:
        result.ended += f"; {error}"
    if result_file is not None:
        write_result(result, result_file)
    return Outcome(result, 2 if error is not None else code, result.ended, error)


def _act(result: WatchResult, plan: StopPlan, result_file: Path | None) -> Outcome:
    """Carry out a stop: the result is written first, so an ``--on-stop`` command can read it."""
    result.ended = f"stop at step {result.stop_step}"
    if result_file is not None:
        write_result(result, result_file)
    if plan.pid is not None:
        how = stop_process(plan.pid, plan.grace)
        result.ended = f"stop at step {result.stop_step}: process {plan.pid} {how}"
    elif plan.on_stop is not None:
        try:
            code = run_stop_command(plan.on_stop, stop_env(result, result_file))
        except (OSError, subprocess.SubprocessError) as exc:
            code, why = 1, str(exc)
        else:
            why = f"exit status {code}"
        result.ended = f"stop at step {result.stop_step}: --on-stop command {why}"
        if code != 0:
            if result_file is not None:
                write_result(result, result_file)
            return Outcome(result, 1, result.ended)
    if result_file is not None:
        write_result(result, result_file)
    return Outcome(result, 0, result.ended)
