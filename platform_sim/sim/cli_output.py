"""What the commands of ``evalstop-sim`` print and write, so that they all behave alike.

:func:`run_with_progress` (the runner's lifetime, the progress bar and the wall time), :func:`command_line` (the
command as typed, for reports), :func:`write_results_dir` (``--out``: ``results.json`` and ``report.md``),
:func:`print_results` (``--json`` or the human tables) and :func:`setup_logging` (warnings on stderr, each message
once).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .runner import Runner

T = TypeVar("T")

Progress = Callable[[int], None]
"""A callback taking a count: ``on_plan(total)`` once when the tasks are planned, ``progress(n)`` as they finish."""


def run_with_progress(
    runner: Runner, study: Callable[[Runner, Progress, Progress], T], *, desc: str, unit: str, show: bool
) -> tuple[T, float]:
    """Run ``study(runner, progress, on_plan)`` inside ``with runner``, with a tqdm bar on stderr.

    Args:
        runner: The runner of :func:`runner_for_command`; entered here and closed when ``study`` returns.
        study: The multi-run function (e.g. ``functools.partial(paper, cfg)``); it calls ``on_plan(total)`` once
            it knows how many tasks it runs and ``progress(n)`` as ``n`` more finish.
        desc: The bar's label.
        unit: The bar's unit (``task``, ``seed``).
        show: Whether to show the bar at all (not with ``--no-progress``, nor where stderr must stay quiet).

    Returns:
        ``study``'s result and the wall time in seconds of the whole run, bar included.
    """
    bar = None

    def on_plan(total: int) -> None:
        nonlocal bar
        if show:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr)

    def progress(n: int) -> None:
        if bar is not None:
            bar.update(n)

    t0 = time.perf_counter()
    with runner:
        results = study(runner, progress, on_plan)
    if bar is not None:
        bar.close()
    return results, time.perf_counter() - t0


def command_line(name: str) -> str:
    """The command as typed, for reports: ``evalstop-sim`` and the arguments when the process runs ``evalstop-sim
    <name> ...``, else (called from Python, e.g. tests) just ``evalstop-sim <name>``."""
    return "evalstop-sim " + " ".join(sys.argv[1:]) if sys.argv[1:2] == [name] else f"evalstop-sim {name}"


def write_results_dir(out_dir: str | Path, results: Mapping[str, Any], markdown: str) -> Path:
    """``--out``: create ``out_dir`` and write ``results.json`` (the results, indented) and ``report.md`` into it.

    Returns:
        The folder, for the caller's further files (plots).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(markdown)
    return out


def print_results(results: Mapping[str, Any], as_json: bool, human: Callable[[], str]) -> int:
    """Print ``results`` as indented JSON (``--json``) or else the text of ``human()``; return exit code 0.

    ``human`` is called only when printed, so JSON output does not pay for the tables.
    """
    print(json.dumps(results, indent=2) if as_json else human())
    return 0


class _OncePerMessage(logging.Filter):
    """Drop repeats of a log message: a simulation builds one detector per job, and a per-detector warning
    (e.g. "no per-example eval scores") would otherwise be printed thousands of times."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def setup_logging() -> None:
    """Warnings and errors on stderr, each message once; nothing when the embedding application configured logging."""
    root = logging.getLogger()
    if root.handlers:  # embedded in an application (or pytest) that configured logging: leave it alone
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OncePerMessage())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
