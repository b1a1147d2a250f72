"""The engine's commands of ``evalstop-sim``: ``run``, ``paper`` and ``sweep`` (assembled by :mod:`platform_sim.cli`).

- ``run``: one simulation, its metrics as a table (or ``--json``).
- ``paper``: every experiment of the paper over many seeds; writes report.md, results.json and PNG plots. The only
  command whose detector, when none is given, is the paper's rule (:func:`~platform_sim.core.paper_spec`).
- ``sweep``: every combination of a TOML/YAML parameter grid (:mod:`platform_sim.sim.sweep`).

The studies' commands are in :mod:`platform_sim.studies.cli`; this module imports the engine only.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from dataclasses import replace

from platform_sim.core.cadence import EvalBudget
from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.sim.policies.policies import BASE_POLICIES
from platform_sim.sim.policies.stop_policies import STOP_POLICIES

from .cli_args import (
    UsageError,
    add_backend_args,
    add_cadence_args,
    add_workload_args,
    budget_or_usage,
    cadence_or_usage,
    detector_from_args,
    require_matplotlib,
    runner_for_command,
    seed_arg,
    workload_from_args,
)
from .cli_output import command_line, print_results, run_with_progress
from .curve_fit import add_curve_args
from .report import detector_line

__all__ = ["ENGINE_COMMANDS", "cmd_paper", "cmd_run", "cmd_sweep"]


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run one simulation and print its metrics", description="Run one simulation and print its metrics."
    )
    p.add_argument("--base", choices=list(BASE_POLICIES), default="srtf-est", help="base scheduler")
    p.add_argument("--stop", choices=list(STOP_POLICIES), default="evalstop", help="stop policy")
    p.add_argument("--seed", type=seed_arg, default=0, help="workload seed, integer >= 0 (default 0)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    add_workload_args(p)
    add_curve_args(p)
    add_cadence_args(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from .experiments import PolicySpec, run_one

    wl = workload_from_args(args)
    det = detector_from_args(args)
    cadence, eval_cost = cadence_or_usage(args)
    budget = budget_or_usage(args)
    spec = PolicySpec(
        base=args.base,
        stop=args.stop,
        detector=det if args.stop == "evalstop" else None,
        stop_params={"p": args.stop_at_p} if args.stop == "stop-at-p" else {},
        cadence=cadence if args.stop == "evalstop" else None,
    )
    from .eval_scores import observation_for

    # Per-example eval scores are generated only when the detector reads them, so plain runs stay fast
    # (evalstop-fleet's two default detectors both do).
    observation = (
        observation_for(det)
        if args.stop == "evalstop"
        else {"name": "per-example", "params": {}}
        if args.stop == "evalstop-fleet"
        else None
    )
    _, m = run_one(wl, spec, args.seed, observation=observation, eval_cost=eval_cost, eval_budget=budget)
    # The waste cut as a share of the Oracle's: the base alone and the Oracle on the same seed.
    base_m = run_one(wl, PolicySpec(base=args.base), args.seed, eval_cost=eval_cost)[1]
    oracle_m = run_one(wl, PolicySpec(base=args.base, stop="oracle"), args.seed, eval_cost=eval_cost)[1]
    cut, bound = base_m["wasted_gpu_h"] - m["wasted_gpu_h"], base_m["wasted_gpu_h"] - oracle_m["wasted_gpu_h"]
    m["waste_cut_share_of_oracle"] = cut / bound if bound > 0 else None
    m["config"] = {
        "workload": wl.to_dict(),
        "seed": args.seed,
        "base": args.base,
        "stop": args.stop,
        "detector": det if args.stop == "evalstop" else None,
        "cadence": cadence if args.stop == "evalstop" else None,
        "eval_cost": eval_cost,
        **(budget or EvalBudget()).to_dict(),
    }
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    print(
        f"{args.base} + {args.stop}, seed {args.seed}: {wl.n_jobs} jobs on {wl.gpus} GPUs, "
        f"sigma {wl.sigma}, hack rate {wl.hack_rate}"
    )
    if args.stop == "evalstop":
        print(detector_line(det, planned=True))  # every simulated job's reports carry its planned steps
    for key in (
        "jobs",
        "hacking",
        "stopped",
        "stopped_hacking",
        "false_stops",
        "precision",
        "recall",
        "fpr",
        "fpr_healthy_rlhf",
        "delay_evals",
        "regret",
        "jct_mean_h",
        "jct_p95_h",
        "wasted_gpu_h",
        "makespan_h",
        "utilization",
        "preemptions",
        "eval_gpu_h",
        "extra_evals",
        "waste_cut_share_of_oracle",
        "events",
        "wall_s",
    ):
        v = m[key]
        s = "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
        print(f"  {key:18s} {s}")
    return 0


# -- paper -------------------------------------------------------------------------------------------------------


def add_paper(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "paper",
        help="reproduce every experiment of the paper (with the paper's k-decline rule)",
        description="Reproduce the paper's main table, composability table and the noise, "
        "hacking-rate and k sweeps; write report.md, results.json and PNG plots. Unlike every other command, "
        "EvalStop runs the paper's rule (k-decline, k=2) when no detector flag is given, since this command "
        "reproduces the paper.",
    )
    p.add_argument("--seeds", type=int, default=30, help="seeds per figure (default 30)")
    p.add_argument("--out", default="evalstop-paper", help="output directory (default ./evalstop-paper)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the tables")
    add_backend_args(p)
    p.add_argument(
        "--base",
        choices=list(BASE_POLICIES),
        default="srtf-est",
        help="base scheduler of the main table and sweeps (default srtf-est)",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_workload_args(p, paper_rule=True)
    add_curve_args(p)
    add_cadence_args(p)
    p.set_defaults(func=cmd_paper)


def cmd_paper(args: argparse.Namespace) -> int:
    from .experiments import PaperConfig, paper
    from .report import markdown_table, write_paper_report

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if not args.no_plots:
        require_matplotlib("pass --no-plots")
    runner = runner_for_command(args)
    wl = workload_from_args(args)
    from .eval_scores import observation_for

    det = detector_from_args(args, fallback=paper_spec())
    cadence, eval_cost = cadence_or_usage(args)
    budget = budget_or_usage(args)
    cfg = PaperConfig(
        seeds=args.seeds,
        workload=wl,
        detector=det,
        base=args.base,
        stop_at_p=args.stop_at_p,
        observation=observation_for(det),
        cadence=cadence,
        eval_cost=eval_cost,
        eval_budget=budget,
    )
    command = command_line("paper")
    results, wall = run_with_progress(
        runner, functools.partial(paper, cfg), desc="simulations", unit="task", show=not args.no_progress
    )
    results["config"]["wall_s"] = wall
    paths = write_paper_report(results, args.out, command, plots=not args.no_plots)
    return print_results(
        results,
        args.json,
        lambda: "\n".join(
            [
                markdown_table(results["main"]),
                "",
                markdown_table(results["composability"], lead=(("base", "base", "s"),)),
                "",
                detector_line(
                    det, "(the paper's rule)" if det == detector_from_spec(paper_spec()).spec() else "", planned=True
                ),
                f"{len(paths)} files in {args.out} (report.md, results.json, plots); "
                f"{results['config']['tasks']} tasks in {results['config']['wall_s']:.1f} s",
            ]
        ),
    )


# -- sweep -------------------------------------------------------------------------------------------------------


def add_sweep(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` sub-command to ``evalstop-sim``'s sub-parsers."""
    p = sub.add_parser(
        "sweep",
        help="run every combination of a parameter grid (TOML or YAML file)",
        description="Run every combination of the parameters in a TOML or YAML grid file over many "
        "seeds; one row per cell and policy, paired against the same base scheduler "
        "without a stop policy. See docs/simulator.md for the file format.",
    )
    p.add_argument("grid", metavar="GRID", help="grid file (.toml, .yaml or .yml)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the grid file's, else 10)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--out", default=None, help="also write the JSON results to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend_args(p)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .sweep import SweepFileError, load_sweep_file, sweep, sweep_text

    if args.seeds is not None and args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    try:
        spec = load_sweep_file(args.grid)
    except SweepFileError as exc:
        raise UsageError(f"GRID {exc}") from None
    if args.seeds is not None:
        spec = replace(spec, seeds=tuple(range(args.seeds)))
    runner = runner_for_command(args)
    results, _ = run_with_progress(
        runner, functools.partial(sweep, spec), desc="simulations", unit="task", show=not args.no_progress
    )
    results["config"]["backend"] = args.backend
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return print_results(results, args.json, lambda: sweep_text(spec, results, args.backend))


ENGINE_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_run, add_paper, add_sweep]
"""The engine's sub-command builders, in ``--help`` order."""
