"""Command-line flags that choose where the independent simulations of a multi-run command run.

Every multi-run command of ``evalstop-sim`` (``paper``, ``replay``, ``detectors``, ``sweep``) calls
:func:`add_backend_args` on its sub-parser and :func:`runner_from_args` to get its
:class:`~platform_sim.sim.runner.Runner`:

- ``--backend pool`` (default): a local process pool of ``--workers`` processes;
- ``--backend ray``: Ray tasks, on the cluster at ``--address`` (or ``$RAY_ADDRESS``), else on a local Ray instance
  of ``--workers`` CPUs started for the command;
- ``--backend serial``: in this process (debugging, profiling).

Results are the same whatever the backend: each task carries its seed.

The rest of these commands' boilerplate lives here too, so that they all behave alike: :func:`runner_for_command`
(a bad backend flag as a one-line usage error), :func:`run_with_progress` (the runner's lifetime, the progress bar
and the wall time), :func:`command_line` (the command as typed, for reports), :func:`write_results_dir`
(``--out``: ``results.json`` and ``report.md``) and :func:`print_results` (``--json`` or the human tables).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from .runner import ProcessRunner, Runner, SerialRunner

T = TypeVar("T")

Progress = Callable[[int], None]
"""A callback taking a count: ``on_plan(total)`` once when the tasks are planned, ``progress(n)`` as they finish."""

BACKENDS: tuple[str, ...] = ("pool", "ray", "serial")


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2 (re-exported by :mod:`platform_sim.sim.cli`).

    Defined here, not in ``cli``, so that it is one class even under ``python -m platform_sim.sim.cli``, where
    ``cli`` runs as ``__main__`` and the commands import ``platform_sim.sim.cli`` a second time.
    """


class BackendArgError(ValueError):
    """A bad backend flag; the message names the flag."""


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """Add ``--backend``, ``--workers`` and ``--address`` to a multi-run command's parser."""
    g = p.add_argument_group("where the simulations run")
    g.add_argument("--backend", choices=BACKENDS, default="pool",
                   help="pool: local process pool (default); ray: Ray tasks (pip install 'evalstop[ray]'); "
                        "serial: in this process")
    g.add_argument("--workers", type=int, default=None,
                   help="simulations at once (default: the CPUs available here; with --backend ray and --address: "
                        "the whole cluster)")
    g.add_argument("--address", default=None,
                   help="Ray cluster to use (e.g. ray://head:10001, or 'auto' on a cluster node); default: "
                        "$RAY_ADDRESS, else a local Ray instance for this command")


def runner_from_args(args: argparse.Namespace) -> Runner:
    """The runner chosen by :func:`add_backend_args`'s flags.

    Raises:
        BackendArgError: ``--workers`` < 1, ``--address`` without ``--backend ray``, or Ray not installed.
    """
    workers = getattr(args, "workers", None)
    backend = getattr(args, "backend", "pool")
    address = getattr(args, "address", None)
    if workers is not None and workers < 1:
        raise BackendArgError(f"--workers must be >= 1, got {workers}")
    if address is not None and backend != "ray":
        raise BackendArgError(f"--address needs --backend ray (got --backend {backend})")
    if backend == "ray":
        try:
            import ray  # noqa: F401  - fail here, with the flag's name, rather than at the first task
        except ImportError:
            raise BackendArgError("--backend ray needs Ray: pip install 'evalstop[ray]'") from None
        from .ray_backend import RayRunner

        return RayRunner(workers=workers, address=address)
    if backend == "serial":
        return SerialRunner()
    if backend != "pool":
        raise BackendArgError(f"--backend: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return ProcessRunner(workers=workers)


def runner_for_command(args: argparse.Namespace) -> Runner:
    """:func:`runner_from_args` for a command: a bad flag becomes the CLI's one-line usage error (exit code 2).

    Raises:
        UsageError: What :func:`runner_from_args` raises as :class:`BackendArgError`.
    """
    try:
        return runner_from_args(args)
    except BackendArgError as exc:
        raise UsageError(str(exc)) from None


def run_with_progress(runner: Runner, study: Callable[[Runner, Progress, Progress], T], *, desc: str, unit: str,
                      show: bool) -> tuple[T, float]:
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
