"""``evalstop-sim``: the platform simulator's command line.

Commands:

- ``run``: one simulation, its metrics as a table (or ``--json``).
- ``paper``: every experiment of the paper over many seeds; writes report.md, results.json and PNG plots.

Bad input ends with a one-line error that names the flag and exit code 2. Other commands (``replay``, sweeps) add
themselves to :data:`COMMANDS` with a function that adds their sub-parser.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
from typing import Any, Callable, NoReturn, Sequence

from platform_sim.core.detectors import DETECTORS, detector_from_spec, parse_detector_param
from platform_sim.core.policies import BASE_POLICIES
from platform_sim.core.stop_policies import STOP_POLICIES

from .backend_cli import (UsageError, add_backend_args, command_line, print_results, run_with_progress,
                          runner_for_command)
from .detector_study import add_detectors
from .replay import add_replay
from .sweep import add_sweep
from .workload import MIXES, WorkloadConfig


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _detector_param(text: str) -> tuple[str, Any]:
    try:
        return parse_detector_param(text)
    except ValueError as exc:  # argparse prints an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """Workload and detector flags shared by every command."""
    d = WorkloadConfig()
    g = p.add_argument_group("workload")
    g.add_argument("--gpus", type=int, default=d.gpus, help=f"cluster size (default {d.gpus})")
    g.add_argument("--jobs", type=int, default=d.n_jobs, help=f"jobs per run (default {d.n_jobs})")
    g.add_argument("--mix", choices=list(MIXES), default=d.mix, help=f"job-type mix (default {d.mix})")
    g.add_argument("--sigma", type=float, default=d.sigma, help=f"eval noise std, >= 0 (default {d.sigma})")
    g.add_argument("--hack-rate", type=float, default=d.hack_rate,
                   help=f"fraction of RLHF jobs that hack, in [0, 1] (default {d.hack_rate})")
    g.add_argument("--evals", type=int, default=d.n_evals, help=f"evals per run (default {d.n_evals})")
    g.add_argument("--load", type=float, default=d.load, help=f"offered load (default {d.load})")
    g.add_argument("--est-error", type=float, default=d.est_error,
                   help=f"std of log(user estimate / true duration) (default {d.est_error})")
    g.add_argument("--hack-gamma", type=float, default=d.hack_gamma,
                   help=f"steepness of the hacking curves' decline (default {d.hack_gamma}; 1 = Gao's d linear)")
    e = p.add_argument_group("EvalStop detector")
    e.add_argument("--detector", default="k-decline",
                   help=f"detector name (default k-decline; registered: {', '.join(sorted(DETECTORS))})")
    e.add_argument("--k", type=int, default=None, help="consecutive declines that stop a job (k-decline default 2)")
    e.add_argument("--min-delta", type=float, default=None, help="decline tolerance (k-decline default 0)")
    e.add_argument("--detector-param", action="append", type=_detector_param, default=[], metavar="KEY=VALUE",
                   help="extra detector parameter (repeatable; value parsed as JSON when it can be)")
    e.add_argument("--stop-at-p", type=float, default=0.65, help="p of the stop-at-p baseline (default 0.65)")


def workload_from_args(args: argparse.Namespace) -> WorkloadConfig:
    if args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    if args.gpus < 16:
        raise UsageError("--gpus must be >= 16 (the largest job needs 16)")
    if not (args.sigma >= 0) or not math.isfinite(args.sigma):
        raise UsageError(f"--sigma must be a finite number >= 0, got {args.sigma}")
    if not (0.0 <= args.hack_rate <= 1.0):
        raise UsageError(f"--hack-rate must be in [0, 1], got {args.hack_rate}")
    if args.evals < 2:
        raise UsageError(f"--evals must be >= 2, got {args.evals}")
    if not (args.load > 0) or not math.isfinite(args.load):
        raise UsageError(f"--load must be > 0, got {args.load}")
    if not (args.est_error >= 0):
        raise UsageError(f"--est-error must be >= 0, got {args.est_error}")
    if not (args.hack_gamma > 0):
        raise UsageError(f"--hack-gamma must be > 0, got {args.hack_gamma}")
    if not (0 < args.stop_at_p <= 1):
        raise UsageError(f"--stop-at-p must be in (0, 1], got {args.stop_at_p}")
    return WorkloadConfig(n_jobs=args.jobs, gpus=args.gpus, mix=args.mix, hack_rate=args.hack_rate,
                          sigma=args.sigma, n_evals=args.evals, load=args.load, est_error=args.est_error,
                          hack_gamma=args.hack_gamma)


def detector_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The detector spec of ``--detector/--k/--min-delta/--detector-param``, validated."""
    if args.detector not in DETECTORS:
        raise UsageError(f"--detector: unknown detector {args.detector!r}; choose one of {', '.join(sorted(DETECTORS))}")
    params: dict[str, Any] = {}
    if args.k is not None:
        if args.k < 1:
            raise UsageError(f"--k must be an integer >= 1, got {args.k}")
        params["k"] = args.k
    if args.min_delta is not None:
        if not (args.min_delta >= 0) or not math.isfinite(args.min_delta):
            raise UsageError(f"--min-delta must be a finite number >= 0, got {args.min_delta}")
        params["min_delta"] = args.min_delta
    params.update(dict(args.detector_param))
    spec = {"name": args.detector, "params": params}
    try:
        return detector_from_spec(spec).spec()
    except ValueError as exc:
        raise UsageError(f"--detector-param: {exc}") from None


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


# -- run ---------------------------------------------------------------------------------------------------------


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one simulation and print its metrics",
                       description="Run one simulation and print its metrics.")
    p.add_argument("--base", choices=list(BASE_POLICIES), default="srtf-est", help="base scheduler")
    p.add_argument("--stop", choices=list(STOP_POLICIES), default="evalstop", help="stop policy")
    p.add_argument("--seed", type=_seed, default=0, help="workload seed, integer >= 0 (default 0)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    add_workload_args(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .experiments import PolicySpec, run_one

    wl = workload_from_args(args)
    det = detector_from_args(args)
    spec = PolicySpec(base=args.base, stop=args.stop, detector=det if args.stop == "evalstop" else None,
                      stop_params={"p": args.stop_at_p} if args.stop == "stop-at-p" else {})
    from .eval_scores import observation_for

    # Per-example eval scores are generated only when the detector reads them, so plain runs stay fast
    # (evalstop-fleet's two default detectors both do).
    observation = (observation_for(det) if args.stop == "evalstop"
                   else {"name": "per-example", "params": {}} if args.stop == "evalstop-fleet" else None)
    _, m = run_one(wl, spec, args.seed, observation=observation)
    m["config"] = {"workload": wl.to_dict(), "seed": args.seed, "base": args.base, "stop": args.stop,
                   "detector": det if args.stop == "evalstop" else None}
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"{args.base} + {args.stop}, seed {args.seed}: {wl.n_jobs} jobs on {wl.gpus} GPUs, "
          f"sigma {wl.sigma}, hack rate {wl.hack_rate}")
    for key in ("jobs", "hacking", "stopped", "stopped_hacking", "false_stops", "precision", "recall", "fpr",
                "fpr_healthy_rlhf", "delay_evals", "regret", "jct_mean_h", "jct_p95_h", "wasted_gpu_h",
                "makespan_h", "utilization", "preemptions", "events", "wall_s"):
        v = m[key]
        s = "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        print(f"  {key:18s} {s}")
    return 0


# -- paper -------------------------------------------------------------------------------------------------------


def add_paper(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("paper", help="reproduce every experiment of the paper",
                       description="Reproduce the paper's main table, composability table and the noise, "
                                   "hacking-rate and k sweeps; write report.md, results.json and PNG plots.")
    p.add_argument("--seeds", type=int, default=30, help="seeds per figure (default 30)")
    p.add_argument("--out", default="evalstop-paper", help="output directory (default ./evalstop-paper)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the tables")
    add_backend_args(p)
    p.add_argument("--base", choices=list(BASE_POLICIES), default="srtf-est",
                   help="base scheduler of the main table and sweeps (default srtf-est)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_workload_args(p)
    p.set_defaults(func=cmd_paper)


def cmd_paper(args: argparse.Namespace) -> int:
    from .experiments import PaperConfig, paper
    from .report import markdown_table, write_paper_report

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    runner = runner_for_command(args)
    wl = workload_from_args(args)
    from .eval_scores import observation_for

    det = detector_from_args(args)
    cfg = PaperConfig(seeds=args.seeds, workload=wl, detector=det, base=args.base,
                      stop_at_p=args.stop_at_p, observation=observation_for(det))
    command = command_line("paper")
    results, wall = run_with_progress(runner, functools.partial(paper, cfg), desc="simulations",
                                      unit="task", show=not args.no_progress)
    results["config"]["wall_s"] = wall
    paths = write_paper_report(results, args.out, command, plots=not args.no_plots)
    return print_results(results, args.json, lambda: "\n".join([
        markdown_table(results["main"]), "",
        markdown_table(results["composability"], lead=(("base", "base", "s"),)),
        f"\n{len(paths)} files in {args.out} (report.md, results.json, plots); "
        f"{results['config']['tasks']} tasks in {results['config']['wall_s']:.1f} s"]))


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_run, add_paper, add_sweep, add_replay, add_detectors]
"""Sub-command builders; other modules append theirs (``replay``, sweeps)."""
from platform_sim.integrations.tune_cli import add_tune  # noqa: E402  (imports Ray only when the command runs)
COMMANDS.append(add_tune)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="evalstop-sim", description="EvalStop platform simulator: 64 GPUs, RLHF/DPO/LoRA jobs, "
                     "base schedulers with and without EvalStop.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in COMMANDS:
        add(sub)
    return parser


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


def _setup_logging() -> None:
    root = logging.getLogger()
    if root.handlers:  # embedded in an application (or pytest) that configured logging: leave it alone
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_OncePerMessage())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging()
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        sys.stderr.write(f"evalstop-sim {args.command}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
