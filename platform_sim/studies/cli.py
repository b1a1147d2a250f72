"""The studies' commands of ``evalstop-sim`` (assembled by :mod:`platform_sim.cli`).

- ``replay``: the platform fed by recorded real traces (:mod:`platform_sim.studies.replay`).
- ``detectors``: every stop detector on the same workloads and seeds (:mod:`platform_sim.studies.detector_study`).
- ``benchmark``: detectors tuned on the tune-split environments of a trace corpus, judged once on the test-split
  environments (:mod:`platform_sim.studies.benchmark`).
- ``tune``: recorded traces as the trials of a real Ray Tune experiment (:mod:`platform_sim.studies.tune_replay`).

A command given no detector runs the project's default, :func:`platform_sim.core.default_spec`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from platform_sim.core.detectors import detector_from_spec
from platform_sim.sim.cli_args import (
    UsageError,
    add_backend_args,
    add_cadence_args,
    add_corpus_arg,
    add_workload_args,
    budget_or_usage,
    cadence_or_usage,
    detector_from_args,
    detector_param,
    floats_arg,
    require_matplotlib,
    runner_for_command,
    traces_folder,
    workload_from_args,
)
from platform_sim.sim.cli_output import command_line, print_results, run_with_progress, write_results_dir
from platform_sim.sim.policies.policies import BASE_POLICIES
from platform_sim.sim.report import detector_line

from .tune_replay import add_tune

__all__ = ["STUDY_COMMANDS"]


# -- replay -----------------------------------------------------------------------------------------------------------


def add_replay(sub: argparse._SubParsersAction) -> None:
    """Add ``replay`` to ``evalstop-sim``."""
    from .replay import REPLAY_BASES
    from .trace_detection import SCORE_SCALES

    p = sub.add_parser(
        "replay",
        help="the platform fed by recorded real training traces",
        description="Turn recorded traces (python -m lab traces record, or any tool writing the trace format) into the "
        "RLHF jobs of the simulated platform, mixed with synthetic LoRA/DPO jobs, and report the main and "
        "composability tables for every stop policy and base scheduler, plus per-trace detection results. "
        "One folder may mix traces of different lengths, eval intervals, planned steps, trainers and "
        "models, with or without per-example scores; ambiguous traces are listed, not dealt.",
    )
    p.add_argument("--traces", default=None, help="folder of *.jsonl traces (default: the real corpus)")
    add_corpus_arg(p)
    p.add_argument("--seeds", type=int, default=10, help="workload seeds (default 10)")
    p.add_argument(
        "--base",
        default="srtf-est",
        choices=list(REPLAY_BASES),
        help="base scheduler of the main table (default srtf-est)",
    )
    p.add_argument(
        "--score-scale",
        default="environment",
        choices=list(SCORE_SCALES),
        help="map scores onto the platform's 0-1 scale per environment (default: its traces' min -> 0, "
        "max -> 1) or per trace",
    )
    p.add_argument(
        "--trace-min-delta",
        type=float,
        default=None,
        metavar="X",
        help="decline tolerance in the traces' own units (gold points for the shipped corpus), converted "
        "to the platform's 0-1 scale; replaces --min-delta; needs traces that share one scale",
    )
    p.add_argument(
        "--grid-evals",
        type=int,
        default=None,
        metavar="N",
        help="regular evals per run on the platform (default: the longest trace's count); e.g. 30 replays traces "
        "recorded every step of 150 (platform_sim/data/corpora/dense) every 5 steps, and the evals between serve "
        "the extra evals of --cadence adaptive",
    )
    p.add_argument("--out", default=None, help="also write results.json and report.md into this folder")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend_args(p)
    add_workload_args(p)
    add_cadence_args(p)
    p.set_defaults(func=cmd_replay)


def _load_traces_arg(flag: str, folder: Path) -> list[Any]:
    from platform_sim.sim.traces import TraceError, load_traces

    try:
        return load_traces(folder)
    except (FileNotFoundError, TraceError) as exc:
        raise UsageError(f"{flag}: {exc}") from None


def cmd_replay(args: argparse.Namespace) -> int:

    from .replay import replay
    from .replay_report import replay_markdown, replay_text
    from .trace_detection import native_min_delta

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.grid_evals is not None and args.grid_evals < 2:
        raise UsageError(f"--grid-evals must be an integer >= 2, got {args.grid_evals}")
    folder = traces_folder(args)
    traces = _load_traces_arg("--traces", folder)
    if all(t.label == "ambiguous" for t in traces):
        raise UsageError(f"--traces: every trace of {folder} is ambiguous; nothing to replay")
    wl = workload_from_args(args)
    cadence, eval_cost = cadence_or_usage(args)
    budget = budget_or_usage(args)
    if args.trace_min_delta is not None:
        if not (args.trace_min_delta >= 0) or not math.isfinite(args.trace_min_delta):
            raise UsageError(f"--trace-min-delta must be a finite number >= 0, got {args.trace_min_delta}")
        if args.detector not in (None, "k-decline"):
            raise UsageError("--trace-min-delta applies to the k-decline detector only")
        shared = native_min_delta(traces, args.score_scale)
        if shared is None:
            raise UsageError(
                f"--trace-min-delta: the traces are mapped onto the 0-1 scale per {args.score_scale} "
                "with different maps, so a tolerance in their units is no single number there; use "
                "--min-delta (0-1 scale)"
            )
        args.min_delta = args.trace_min_delta / shared.span
    det = detector_from_args(args)
    runner = runner_for_command(args)
    results, wall = run_with_progress(
        runner,
        functools.partial(
            replay,
            traces,
            wl,
            det,
            args.seeds,
            args.base,
            args.stop_at_p,
            score_scale=args.score_scale,
            cadence=cadence,
            eval_cost=eval_cost,
            n_evals=args.grid_evals,
            eval_budget=budget,
        ),
        desc="replay",
        unit="seed",
        show=not args.no_progress and not args.json,
    )
    results["config"]["wall_s"] = wall
    results["config"]["traces_dir"] = str(folder)
    command = command_line("replay")
    if args.out:
        write_results_dir(args.out, results, replay_markdown(results, command))
    # Every platform job's reports carry its planned steps (the per-trace rows, the trace header's when it has one).
    return print_results(results, args.json, lambda: replay_text(results) + "\n" + detector_line(det, planned=True))


# -- detectors --------------------------------------------------------------------------------------------------------


def add_detectors(sub: argparse._SubParsersAction) -> None:
    """Add ``detectors`` to ``evalstop-sim``."""

    p = sub.add_parser(
        "detectors",
        help="compare every stop detector on the same workloads and seeds",
        description="Compare the stop detectors (the paper's k-decline rule and the noise-robust ones) on the same "
        "workloads and seeds: noise sweep, hacking-rate sweep, healthy runs with long plateaus, and the "
        "shipped real traces. Per-example eval scores are generated for every run.",
    )
    p.add_argument("--seeds", type=int, default=30, help="evaluation seeds 0..N-1 (default 30)")
    p.add_argument("--base", default="srtf-est", help="base scheduler (default srtf-est)")
    p.add_argument("--jobs", type=int, default=200, help="jobs per run (default 200)")
    p.add_argument("--traces", default=None, help="folder of real *.jsonl traces (default: the real corpus)")
    add_corpus_arg(p)
    p.add_argument("--no-real", action="store_true", help="skip the real traces")
    p.add_argument(
        "--detector", default=None, help="add one more detector by name to the comparison (with --detector-param)"
    )
    p.add_argument(
        "--detector-param",
        action="append",
        type=detector_param,
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of --detector (repeatable; values parsed as JSON)",
    )
    p.add_argument("--only", default=None, help="comma-separated labels of the built-in detectors to keep")
    p.add_argument("--sigmas", default=None, help="comma-separated sigmas of the noise sweep (default 0.01..0.12)")
    p.add_argument(
        "--parts",
        default="noise,hack_rate,plateau,real",
        help="comma-separated experiments to run (default: noise,hack_rate,plateau,real)",
    )
    p.add_argument("--out", default=None, help="write report.md, results.json and PNG plots into this folder")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend_args(p)
    p.set_defaults(func=cmd_detectors)


def cmd_detectors(args: argparse.Namespace) -> int:
    from platform_sim.sim.experiments import HACK_RATES, SIGMAS
    from platform_sim.sim.workload import WorkloadConfig

    from .detector_study import CANDIDATES, PLATEAU_SIGMAS, StudyConfig, study
    from .detector_study_report import study_markdown, write_study_plots

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    if args.out:
        require_matplotlib("run without --out")
    if args.base not in BASE_POLICIES:
        raise UsageError(f"--base: unknown scheduler {args.base!r}; choose one of {', '.join(BASE_POLICIES)}")
    detectors = list(CANDIDATES)
    if args.only:
        keep = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [k for k in keep if k not in dict(CANDIDATES)]
        if unknown:
            raise UsageError(
                f"--only: unknown detector label(s) {', '.join(unknown)}; choose from "
                f"{', '.join(label for label, _ in CANDIDATES)}"
            )
        detectors = [(label, spec) for label, spec in CANDIDATES if label in keep]
    if args.detector_param and not args.detector:
        raise UsageError("--detector-param needs --detector")
    if args.detector:
        spec = {"name": args.detector, "params": dict(args.detector_param)}
        try:
            spec = detector_from_spec(spec).spec()
        except ValueError as exc:
            raise UsageError(f"--detector: {exc}") from None
        label = args.detector + "".join(
            f" {k}={v}" for k, v in spec["params"].items() if k in dict(args.detector_param)
        )
        detectors.append((label, spec))
    if not detectors:
        raise UsageError("--only left no detector to compare")
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    bad = parts - {"noise", "hack_rate", "plateau", "real"}
    if bad or not parts:
        raise UsageError(
            f"--parts: unknown experiment(s) {', '.join(sorted(bad)) or '(none)'}; choose from "
            "noise, hack_rate, plateau, real"
        )
    traces_dir = "" if args.no_real or "real" not in parts else args.traces
    if traces_dir is None and args.corpus is not None:
        traces_dir = str(traces_folder(args))
    if traces_dir:
        folder = Path(traces_dir)
        if not folder.is_dir():
            raise UsageError(f"--traces: {traces_dir} is not a folder")
    cfg = StudyConfig(
        seeds=args.seeds,
        detectors=tuple(detectors),
        base=args.base,
        traces_dir=traces_dir,
        workload=WorkloadConfig(n_jobs=args.jobs),
        sigmas=(floats_arg("--sigmas", args.sigmas) if args.sigmas else SIGMAS) if "noise" in parts else (),
        hack_rates=HACK_RATES if "hack_rate" in parts else (),
        plateau_sigmas=PLATEAU_SIGMAS if "plateau" in parts else (),
    )
    runner = runner_for_command(args)
    # Per-detector fallback warnings would repeat once per simulated job; every run here has per-example scores.
    # They are logged by the detectors' base module (platform_sim/core/detectors/base.py), under this package logger.
    logging.getLogger("platform_sim.core.detectors").setLevel(logging.ERROR)
    results, wall = run_with_progress(
        runner,
        functools.partial(study, cfg),
        desc="detectors",
        unit="task",
        show=not args.no_progress and not args.json,
    )
    results["config"]["wall_s"] = wall
    command = command_line("detectors")
    results["config"]["command"] = command
    if args.out:
        write_study_plots(results, write_results_dir(args.out, results, study_markdown(results, command)))
    return print_results(results, args.json, lambda: study_markdown(results, command, with_ci=False))


# -- benchmark --------------------------------------------------------------------------------------------------------


def add_benchmark(sub: argparse._SubParsersAction) -> None:
    """Add ``benchmark`` to ``evalstop-sim``."""
    p = sub.add_parser(
        "benchmark",
        help="tune every detector on the tune environments of a trace corpus, judge it on the test ones",
        description="Multi-environment benchmark on recorded traces. Every trace header names its environment and "
        "split (tune or test). Phase 1 reads only the headers; phase 2 chooses every tunable number of "
        "every detector (a small grid each) on the tune traces alone, against the targets (hacking "
        "stopped >= 95%%, healthy stopped <= 5%%, median delay <= 3 evals after the true peak, worst "
        "regret of a stopped run <= 10%% of its gain); phase 3 reads the test traces and evaluates each "
        "tuned candidate and the paper's untuned rule once. Prints precision, recall, healthy stopped, "
        "median delay and worst/median regret per split and per environment with 95%% intervals, and "
        "names the candidate that does best on the test environments. Detectors see the recorded scores "
        "in their own units, as EvalStopCallback would. Ambiguous traces are listed, not scored.",
    )
    p.add_argument("--traces", default=None, help="folder of *.jsonl traces (default: the real corpus)")
    add_corpus_arg(p)
    p.add_argument(
        "--tune-envs", default="", metavar="ENV,...", help="environments to tune on, overriding the headers' split"
    )
    p.add_argument(
        "--test-envs", default="", metavar="ENV,...", help="environments to test on, overriding the headers' split"
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="NAME,...",
        help="detector families to tune (default: all of k-decline, k-decline-se, paired-test, cusum, trend, shape)",
    )
    p.add_argument(
        "--resamples",
        type=int,
        default=1000,
        help="bootstrap resamples of the medians' intervals (default 1000; 0: none)",
    )
    p.add_argument("--out", default=None, help="write results.json, report.md and benchmark.png into this folder")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the tables")
    p.add_argument("--no-progress", action="store_true", help="no progress messages on stderr")
    p.set_defaults(func=cmd_benchmark)


def cmd_benchmark(args: argparse.Namespace) -> int:
    from platform_sim.sim.traces import TraceError

    from .benchmark import GRIDS, BenchmarkError, benchmark
    from .benchmark_report import benchmark_markdown, write_benchmark_plot

    if args.resamples < 0:
        raise UsageError(f"--resamples must be >= 0, got {args.resamples}")
    if args.out:
        require_matplotlib("run without --out")
    grids = dict(GRIDS)
    if args.only:
        keep = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [k for k in keep if k not in GRIDS]
        if unknown or not keep:
            raise UsageError(
                f"--only: unknown detector famil(ies) {', '.join(unknown) or '(none)'}; choose from {', '.join(GRIDS)}"
            )
        grids = {k: GRIDS[k] for k in keep}
    folder = traces_folder(args)

    def envs(text: str) -> list[str]:
        return [x.strip() for x in text.split(",") if x.strip()]

    def say(msg: str) -> None:
        if not args.no_progress and not args.json:
            sys.stderr.write(f"benchmark: {msg}\n")

    # Per-detector fallback warnings ("no per-example scores") would repeat once per trace and grid point.
    logging.getLogger("platform_sim.core").setLevel(logging.ERROR)
    try:
        res = benchmark(
            folder,
            grids,
            tune_envs=envs(args.tune_envs),
            test_envs=envs(args.test_envs),
            resamples=args.resamples,
            progress=say,
        )
    except (FileNotFoundError, TraceError, BenchmarkError) as exc:
        raise UsageError(f"--traces: {exc}") from None
    command = command_line("benchmark")
    res["config"]["command"] = command
    if args.out:
        out = write_results_dir(args.out, res, benchmark_markdown(res, command))
        write_benchmark_plot(res, out / "benchmark.png")
    return print_results(res, args.json, lambda: benchmark_markdown(res, command))


STUDY_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_replay,
    add_detectors,
    add_benchmark,
    add_tune,
]
"""The studies' sub-command builders, in ``--help`` order."""
