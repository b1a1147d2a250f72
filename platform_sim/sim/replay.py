"""``evalstop-sim replay``: the simulated platform fed by recorded real training traces.

How a trace becomes a job of the platform:

- The workload is a synthetic one (:func:`~platform_sim.sim.workload.generate_workload`: arrivals, job types, GPU
  demands, durations, user estimates, LoRA/DPO curves, loss curves), and then **every RLHF job is given a recorded
  trace** (the traces are shuffled per seed and dealt round-robin). The job keeps its platform size and duration; the
  trace's eval curve is placed on the job's progress (step / planned steps), so a 300-step CPU run becomes a
  multi-hour 8-GPU job with the same curve shape. Its hacking label is the trace's label
  (:func:`~platform_sim.sim.traces.label_of`), the ground truth of every detection metric. The hack rate of the
  replay is therefore the corpus's share of hacking traces, not ``--hack-rate``.
- Scores: recorded scores are in the trace's own units (gold points for the CPU environment). They are mapped onto the
  platform's 0-1 score scale by one affine map for the whole corpus (corpus minimum -> 0, maximum -> 1), which keeps
  every curve's shape and the order of scores. ``--min-delta`` is on that 0-1 scale; the equivalent in trace units is
  printed (``min_delta_native``).
- Noise: a recorded curve already carries its real evaluation noise (the held-out sample), so trace jobs get no
  added noise; synthetic jobs keep the Gaussian ``--sigma``.
- The eval grid has as many evals as the traces (all traces of one replay must have the same number of evals per
  run; the shipped corpus has 30); a trace's scores land on the grid by linear interpolation in progress, which is
  exact when its evals are evenly spaced.

Besides the platform tables (the main table on ``--base`` and the composability table over every base scheduler, as
``paper`` prints them), replay runs the detector on each trace's own eval sequence and reports one row per trace:
``trace``, ``label``, ``stopped``, ``stop_step``, ``best_step`` (the checkpoint the job delivers: the detector's best
at the stop, else the last one, as on the platform), ``peak_step``, ``delay_evals`` (stop eval minus true peak eval)
and ``regret_pct`` (100 x (peak - delivered) / |peak|, in trace units).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from platform_sim.core.detectors import detector_from_spec
from platform_sim.core.monitor import JobMonitor

from .curves import TabulatedCurve, eval_grid
from .traces import RealTrace, TraceFormatError, load_traces, recorded_examples, shipped_traces_dir
from .workload import Workload, WorkloadConfig, generate_workload

REPLAY_BASES: tuple[str, ...] = ("fifo", "sjf-est", "srtf-est", "loss-aware")
REPLAY_STOPS: tuple[str, ...] = ("none", "evalstop", "stop-at-p", "loss-plateau", "oracle")


@dataclass(frozen=True)
class TraceCurve:
    """A trace reduced to what a replay needs (plain, picklable data).

    Args:
        name: The trace's name.
        hacking: Its label.
        progress: Progress of each eval, increasing in (0, 1].
        scores: Scores on the platform's 0-1 scale.
    """

    name: str
    hacking: bool
    progress: tuple[float, ...]
    scores: tuple[float, ...]


@dataclass(frozen=True)
class Scale:
    """The affine map from trace units to the platform's 0-1 scale: ``(x - lo) / (hi - lo)``."""

    lo: float
    hi: float

    @property
    def span(self) -> float:
        return self.hi - self.lo

    def __call__(self, x: float) -> float:
        return (x - self.lo) / self.span


def corpus_scale(traces: Sequence[RealTrace]) -> Scale:
    lo = min(min(t.scores) for t in traces)
    hi = max(max(t.scores) for t in traces)
    return Scale(lo, hi if hi > lo else lo + 1.0)


def trace_curves(traces: Sequence[RealTrace], scale: Scale) -> tuple[TraceCurve, ...]:
    return tuple(TraceCurve(t.name, t.hacking, t.progress(), tuple(scale(s) for s in t.scores)) for t in traces)


def evals_per_run(traces: Sequence[RealTrace]) -> int:
    """The common number of evals per run of ``traces``.

    Raises:
        TraceFormatError: the traces do not all have the same number of evals (the platform's grid is shared).
    """
    counts = sorted({len(t.steps) for t in traces})
    if len(counts) != 1:
        raise TraceFormatError(
            f"traces of one replay must have the same number of evals per run; found {counts} "
            f"(e.g. {next(t.name for t in traces if len(t.steps) == counts[0])} has {counts[0]})")
    return counts[0]


def build_replay_workload(config: WorkloadConfig, curves: Sequence[TraceCurve], seed: int) -> Workload:
    """The synthetic workload of ``config`` and ``seed`` with every RLHF job's curve replaced by a recorded one.

    Args:
        config: Workload parameters; ``n_evals`` must equal the traces' eval count.
        curves: The traces (platform scale).
        seed: Workload seed; it also decides which trace each RLHF job gets.
    """
    if not curves:
        raise ValueError("a replay needs at least one trace")
    base = generate_workload(config, seed)
    rng = np.random.default_rng([int(seed), 4242])
    order = [int(i) for i in rng.permutation(len(curves))]
    grid = eval_grid(config.n_evals)
    true_evals = base.true_evals.copy()
    noise = base.noise.copy()
    jobs = []
    dealt = 0
    for job in base.jobs:
        if job.job_type != "rlhf":
            jobs.append(job)
            continue
        c = curves[order[dealt % len(curves)]]
        if dealt and dealt % len(curves) == 0:  # a fresh shuffle per round, so repeats do not line up
            order = [int(i) for i in rng.permutation(len(curves))]
            c = curves[order[0]]
        dealt += 1
        curve = TabulatedCurve(c.progress, c.scores)
        true_evals[job.index] = curve.values(grid)
        noise[job.index] = 0.0  # the recorded curve carries its real eval noise already
        jobs.append(replace(job, hacking=c.hacking, curve=curve))
    return Workload(jobs, config.n_evals, config.sigma, true_evals, base.losses, noise, int(seed), config)


@dataclass(frozen=True)
class ReplayTask:
    """One replay workload (config, traces, seed) and the policies to run on it."""

    workload: WorkloadConfig
    curves: tuple[TraceCurve, ...]
    seed: int
    policies: tuple[Any, ...]  # PolicySpec
    observation: Mapping[str, Any] | None = None  # None: the means alone (Gaussian model with the trace's noise)


def run_replay_task(task: ReplayTask) -> list[dict[str, Any]]:
    """Run every policy of ``task`` on its replay workload; one metrics dict per policy. Picklable, pure."""
    from . import eval_scores  # noqa: F401  (registers the "recorded-examples" observation model in workers)
    from .engine import simulate
    from .metrics import run_metrics
    from .observe import make_observation_model

    workload = build_replay_workload(task.workload, task.curves, task.seed)
    out = []
    for spec in task.policies:
        result = simulate(workload, spec.build(workload), gpus=task.workload.gpus,
                          observation=make_observation_model(workload, task.observation))
        m = run_metrics(result)
        m["seed"] = task.seed
        out.append(m)
    return out


def trace_detection(trace: RealTrace, detector: Mapping[str, Any] | None, scale: Scale,
                    skip_evals: int = 0, examples: Sequence[Sequence[float] | None] | None = None) -> dict[str, Any]:
    """Run the detector over one trace's real eval sequence (platform scale) and report what it did.

    Args:
        trace: The trace.
        detector: Detector spec (platform scale).
        scale: The corpus's map to the platform scale.
        skip_evals: Report only from the eval after the first ``skip_evals`` ones (a job that starts reporting to
            the scheduler after a warm-up); its best checkpoint is then the best of the reported evals.
        examples: The trace's recorded per-example scores per eval (:func:`~platform_sim.sim.traces.recorded_examples`,
            trace units), when the caller already read them; by default they are read from the trace's file for a
            detector that uses them.

    Returns:
        ``{"trace", "label", "algo", "stopped", "stop_step", "best_step", "peak_step", "delay_evals",
        "regret_pct", "peak_score", "delivered_score"}``; scores in trace units.
    """
    det = detector_from_spec(detector)
    monitor = JobMonitor(job_id=trace.name, job_type="rlhf", detector=det)
    # Detectors that read per-example scores get the recorded ones, on the same scale as the means.
    if not det.uses_example_scores:
        examples = []
    elif examples is None:
        examples = recorded_examples(trace)
    stop_index = None
    for i, (step, score) in enumerate(zip(trace.steps, trace.scores)):
        if i < skip_evals:
            continue
        per = examples[i] if i < len(examples) else None
        decision = monitor.observe(step, scale(score), None if per is None else [scale(v) for v in per])
        if decision.should_stop:
            stop_index = i
            break
    stopped = stop_index is not None
    if stopped:
        best_step = int(monitor.best_step)
        delivered = trace.scores[trace.steps.index(best_step)]
    else:
        best_step, delivered = trace.steps[-1], trace.scores[-1]
    peak = trace.peak_score
    return {
        "trace": trace.name,
        "label": trace.label,
        "algo": trace.algo,
        "stopped": stopped,
        "stop_step": trace.steps[stop_index] if stopped else None,
        "best_step": best_step,
        "peak_step": trace.peak_step,
        "delay_evals": (stop_index - trace.peak_index) if stopped else None,
        "regret_pct": 100.0 * (peak - delivered) / abs(peak) if peak != 0 else None,
        "peak_score": peak,
        "delivered_score": delivered,
    }


def trace_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Detection over the traces: stopped hacking / healthy, median delay, worst regret of stopped hacking traces."""
    hack = [r for r in rows if r["label"] == "hacking"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    delays = [r["delay_evals"] for r in hack if r["stopped"]]
    regrets = [r["regret_pct"] for r in hack if r["stopped"] and r["regret_pct"] is not None]
    return {
        "hacking": len(hack),
        "healthy": len(healthy),
        "hacking_stopped": sum(r["stopped"] for r in hack),
        "healthy_stopped": sum(r["stopped"] for r in healthy),
        "median_delay_evals": statistics.median(delays) if delays else None,
        "max_delay_evals": max(delays) if delays else None,
        "max_regret_pct_stopped_hacking": max(regrets) if regrets else None,
    }


def recorded_observation(traces: Sequence[RealTrace], curves: Sequence[TraceCurve], scale: Scale,
                         examples: int | None = None, rho: float | None = None) -> dict[str, Any]:
    """The observation-model spec that gives trace jobs their *recorded* per-example scores (platform scale) and the
    synthetic jobs generated ones (``examples``, ``rho``: :mod:`platform_sim.sim.eval_scores`' defaults if None)."""
    recorded = []
    for trace, curve in zip(traces, curves):
        per_eval = recorded_examples(trace)
        recorded.append((list(curve.scores), [[scale(v) for v in e] if e else [] for e in per_eval]))
    params: dict[str, Any] = {"traces": recorded}
    if examples is not None:
        params["examples"] = examples
    if rho is not None:
        params["rho"] = rho
    return {"name": "recorded-examples", "params": params}


def replay(traces: Sequence[RealTrace], workload: WorkloadConfig, detector: Mapping[str, Any] | None,
           seeds: int, base: str = "srtf-est", stop_at_p: float = 0.65, runner: Any = None,
           progress: Callable[[int], None] | None = None, on_plan: Callable[[int], None] | None = None,
           ) -> dict[str, Any]:
    """Replay ``traces`` on the platform: ``{"main", "composability", "traces", "trace_summary", "config"}``.

    Args:
        traces: Recorded traces (validated, same number of evals each).
        workload: The synthetic part (its ``n_evals`` is replaced by the traces' eval count).
        detector: EvalStop's detector spec (None: the paper's k=2, min_delta 0), on the 0-1 platform scale.
        seeds: Seeds 0..seeds-1 (each a different workload and a different dealing of traces).
        base: Base scheduler of the main table.
        stop_at_p: p of the StopAt-p baseline.
        runner: A :class:`~platform_sim.sim.runner.Runner` (default: serial).
        progress, on_plan: Progress callbacks (tasks finished; total tasks).
    """
    from .experiments import PolicySpec
    from .metrics import metric_row
    from .runner import SerialRunner

    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    n_evals = evals_per_run(traces)
    workload = replace(workload, n_evals=n_evals)
    scale = corpus_scale(traces)
    curves = trace_curves(traces, scale)
    det_obj = detector_from_spec(detector)
    det = det_obj.spec()
    # Detectors that read per-example scores see the recorded ones (the other jobs' are generated).
    observation = (recorded_observation(traces, curves, scale)
                   if det_obj.uses_example_scores else None)

    def spec(stop: str, b: str) -> PolicySpec:
        return PolicySpec(base=b, stop=stop, detector=det if stop == "evalstop" else None,
                          stop_params={"p": stop_at_p} if stop == "stop-at-p" else {})

    specs: dict[str, PolicySpec] = {}
    for stop in REPLAY_STOPS:
        specs.setdefault(spec(stop, base).key(), spec(stop, base))
    for b in REPLAY_BASES:
        for stop in ("none", "evalstop"):
            specs.setdefault(spec(stop, b).key(), spec(stop, b))
    keys = list(specs)
    tasks = [ReplayTask(workload, curves, seed, tuple(specs.values()), observation) for seed in range(seeds)]
    if on_plan:
        on_plan(len(tasks))
    results = (runner or SerialRunner()).map(run_replay_task, tasks, progress)
    per = {k: [res[i] for res in results] for i, k in enumerate(keys)}

    def row(stop: str, b: str) -> dict[str, Any]:
        mine = per[spec(stop, b).key()]
        return metric_row(b, stop, mine, per[spec("none", b).key()] if stop != "none" else None)

    rows = [trace_detection(t, det, scale) for t in traces]
    return {
        "main": [row(stop, base) for stop in REPLAY_STOPS],
        "composability": [row(stop, b) for b in REPLAY_BASES for stop in ("none", "evalstop")],
        "traces": rows,
        "trace_summary": trace_summary(rows),
        "config": {
            "seeds": seeds, "workload": workload.to_dict(), "detector": det, "base": base, "stop_at_p": stop_at_p,
            "n_traces": len(traces), "hacking_traces": sum(t.hacking for t in traces),
            "scale": {"lo": scale.lo, "hi": scale.hi},
            "min_delta_native": det["params"].get("min_delta", 0.0) * scale.span
            if det["name"] == "k-decline" else None,
        },
    }


# -- command line -------------------------------------------------------------------------------------------------

TRACE_COLUMNS = ("trace", "label", "stopped", "stop_step", "best_step", "peak_step", "delay_evals", "regret_pct")


def traces_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of the per-trace rows."""
    lines = ["| " + " | ".join(TRACE_COLUMNS) + " |", "|" + "---|" * len(TRACE_COLUMNS)]
    for r in rows:
        cells = []
        for c in TRACE_COLUMNS:
            v = r.get(c)
            if v is None:
                cells.append("-")
            elif isinstance(v, bool):
                cells.append("yes" if v else "no")
            elif isinstance(v, float):
                cells.append(f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_line(s: Mapping[str, Any]) -> str:
    med = "-" if s["median_delay_evals"] is None else f"{s['median_delay_evals']:g}"
    reg = "-" if s["max_regret_pct_stopped_hacking"] is None else f"{s['max_regret_pct_stopped_hacking']:.1f}%"
    return (f"hacking traces stopped {s['hacking_stopped']}/{s['hacking']}, healthy traces stopped "
            f"{s['healthy_stopped']}/{s['healthy']}, median delay {med} evals after the true peak, worst regret of a "
            f"stopped hacking trace {reg}")


def add_replay(sub: argparse._SubParsersAction) -> None:
    """Add ``replay`` to ``evalstop-sim``."""
    from .backend_cli import add_backend_args
    from .cli import add_workload_args

    p = sub.add_parser(
        "replay", help="the platform fed by recorded real training traces",
        description="Turn recorded traces (evalstop traces record) into the RLHF jobs of the simulated platform, "
                    "mixed with synthetic LoRA/DPO jobs, and report the main and composability tables for every "
                    "stop policy and base scheduler, plus per-trace detection results.")
    p.add_argument("--traces", default=None, help="folder of *.jsonl traces (default: the shipped corpus)")
    p.add_argument("--seeds", type=int, default=10, help="workload seeds (default 10)")
    p.add_argument("--base", default="srtf-est", choices=list(REPLAY_BASES),
                   help="base scheduler of the main table (default srtf-est)")
    p.add_argument("--trace-min-delta", type=float, default=None, metavar="X",
                   help="decline tolerance in the traces' own units (gold points for the shipped corpus), converted "
                        "to the platform's 0-1 scale; replaces --min-delta")
    p.add_argument("--out", default=None, help="also write results.json and report.md into this folder")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_backend_args(p)
    add_workload_args(p)
    p.set_defaults(func=cmd_replay)


def replay_markdown(results: Mapping[str, Any], command: str) -> str:
    from .report import markdown_table

    cfg = results["config"]
    return "\n".join([
        "# EvalStop on recorded real traces (evalstop-sim replay)", "",
        f"Command: `{command}`. {cfg['n_traces']} traces ({cfg['hacking_traces']} hacking), {cfg['seeds']} seeds, "
        f"detector `{json.dumps(cfg['detector'])}` on the 0-1 platform scale (min_delta in trace units: "
        f"{cfg['min_delta_native'] if cfg['min_delta_native'] is not None else '-'}).", "",
        "## Per trace", "", traces_table(results["traces"]), "", summary_line(results["trace_summary"]), "",
        f"## Main table ({cfg['base']} base)", "", markdown_table(results["main"]), "",
        "## Composability", "", markdown_table(results["composability"], lead=(("base", "base", "s"),)), "",
    ])


def cmd_replay(args: argparse.Namespace) -> int:
    from .backend_cli import command_line, print_results, run_with_progress, runner_for_command, write_results_dir
    from .cli import UsageError, detector_from_args, workload_from_args
    from .report import markdown_table

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    folder = Path(args.traces) if args.traces is not None else shipped_traces_dir()
    try:
        traces = load_traces(folder)
        evals_per_run(traces)
    except FileNotFoundError as exc:
        raise UsageError(f"--traces: {exc}") from None
    except TraceFormatError as exc:
        raise UsageError(f"--traces: {exc}") from None
    wl = workload_from_args(args)
    if args.trace_min_delta is not None:
        if not (args.trace_min_delta >= 0) or not math.isfinite(args.trace_min_delta):
            raise UsageError(f"--trace-min-delta must be a finite number >= 0, got {args.trace_min_delta}")
        if args.detector != "k-decline":
            raise UsageError("--trace-min-delta applies to the k-decline detector only")
        args.min_delta = args.trace_min_delta / corpus_scale(traces).span
    det = detector_from_args(args)
    runner = runner_for_command(args)
    results, wall = run_with_progress(
        runner, functools.partial(replay, traces, wl, det, args.seeds, args.base, args.stop_at_p), desc="replay",
        unit="seed", show=not args.no_progress and not args.json)
    results["config"]["wall_s"] = wall
    results["config"]["traces_dir"] = str(folder)
    command = command_line("replay")
    if args.out:
        write_results_dir(args.out, results, replay_markdown(results, command))
    return print_results(results, args.json, lambda: "\n".join([
        traces_table(results["traces"]), summary_line(results["trace_summary"]), "",
        markdown_table(results["main"]), "",
        markdown_table(results["composability"], lead=(("base", "base", "s"),))]))
