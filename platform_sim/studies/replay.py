"""``evalstop-sim replay``: the simulated platform fed by recorded real training traces.

How a trace becomes a job of the platform:

- The workload is a synthetic one (:func:`~platform_sim.sim.workload.generate_workload`: arrivals, job types, GPU
  demands, durations, user estimates, LoRA/DPO curves, loss curves), and then **every RLHF job is given a recorded
  trace** (the traces are shuffled per seed and dealt round-robin). The job keeps its platform size and duration; the
  trace's eval curve is placed on the job's progress (its own step / its own planned steps), so a 300-step CPU run
  and a 120-step one both become multi-hour 8-GPU jobs with their own curve shapes. Its hacking label is the trace's
  label (:func:`~platform_sim.sim.traces.label_trace`), the ground truth of every detection metric; *ambiguous*
  traces are not dealt (the platform's metrics need a yes or no) and are listed in the results. The hack rate of the
  replay is therefore the corpus's share of hacking traces, not ``--hack-rate``.
- Traces of one folder may differ in length, eval interval, planned steps, trainer and model, and may or may not carry
  per-example scores. The platform's eval grid has as many evals as the longest trace; every trace's means (and its
  per-example scores, example by example) land on the grid by linear interpolation in progress, which is exact for a
  trace with that many evenly spaced evals and keeps every recorded value of the others at their progress.
- Scores: recorded scores are in each trace's own units (gold points, accuracy, win rate...). Each **environment** is
  mapped onto the platform's 0-1 score scale on its own, by the affine map of its traces' minimum -> 0 and maximum ->
  1 (``score_scale="environment"``, the default; traces without an ``environment`` field form one group), which keeps
  every curve's shape, the order of scores, and the relative size of a run's rise and of its noise within the
  environment. ``score_scale="trace"`` maps every trace by its own minimum and maximum instead. ``--min-delta`` is on
  the 0-1 scale; ``--trace-min-delta`` takes it in the traces' own units when they all share one map.
- Noise: a recorded curve already carries its real evaluation noise (the held-out sample), so trace jobs get no
  added noise; synthetic jobs keep the Gaussian ``--sigma``.

Besides the platform tables (the main table on ``--base`` and the composability table over every base scheduler, as
``paper`` prints them), replay runs the detector on each trace's own eval sequence (all of its evals, on its 0-1
scale) and reports one row per trace: ``trace``, ``environment``, ``split``, ``label``, ``stopped``, ``stop_step``,
``best_step`` (the checkpoint the job delivers: the detector's best at the stop, else the last one, as on the
platform), ``peak_step``, ``delay_evals`` (stop eval minus true peak eval), ``regret`` (the share of the run's gain,
true peak minus first eval, that the delivered checkpoint gives up) and ``regret_pct`` (100 x (peak - delivered) /
|peak|, in trace units).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from platform_sim.core.cadence import EvalBudget
from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.sim.curves import TabulatedCurve, eval_grid
from platform_sim.sim.engine import DEFAULT_EVAL_COST
from platform_sim.sim.experiments import BASES, MAIN_STOPS, PolicySpec, run_policies
from platform_sim.sim.metrics import add_oracle_shares, metric_row
from platform_sim.sim.traces import RealTrace
from platform_sim.sim.workload import Workload, WorkloadConfig, generate_workload

from .trace_detection import (
    Scale,
    ScaleArg,
    native_min_delta,
    scale_for,
    scale_group,
    trace_detection,
    trace_scales,
    trace_summary,
)

REPLAY_BASES: tuple[str, ...] = BASES
"""Base schedulers of the composability table (the paper's)."""
REPLAY_STOPS: tuple[str, ...] = MAIN_STOPS
"""Stop policies of the main table (the paper's)."""


@dataclass(frozen=True)
class TraceCurve:
    """A trace reduced to what a replay needs (plain, picklable data).

    Args:
        name: The trace's name.
        hacking: Its label (ambiguous traces are never made into curves).
        progress: Progress of each eval, increasing in (0, 1].
        scores: Scores on the platform's 0-1 scale.
        examples: Per-example scores per eval on the same scale (None entries where not recorded; empty: none).
    """

    name: str
    hacking: bool
    progress: tuple[float, ...]
    scores: tuple[float, ...]
    examples: tuple[tuple[float, ...] | None, ...] = ()

    def on_grid(self, grid: np.ndarray) -> tuple[np.ndarray, list[tuple[float, ...] | None]]:
        """The means and per-example scores at the platform's eval points (linear interpolation in progress).

        A grid point between two recorded evals gets the interpolation of their per-example scores, example by
        example, when both have the same examples; otherwise the nearer eval's (None if it has none).
        """
        xs = np.asarray(self.progress)
        means = np.interp(grid, xs, np.asarray(self.scores))
        per: list[tuple[float, ...] | None] = []
        if not self.examples:
            return means, [None] * len(grid)
        for g in grid:
            j = int(np.searchsorted(xs, g, side="right"))  # xs[j-1] <= g < xs[j]
            lo, hi = max(j - 1, 0), min(j, len(xs) - 1)
            a, b = self.examples[lo], self.examples[hi]
            if lo == hi or xs[hi] == xs[lo]:
                per.append(a)
                continue
            t = float(min(max((g - xs[lo]) / (xs[hi] - xs[lo]), 0.0), 1.0))
            if a is not None and b is not None and len(a) == len(b):
                per.append(tuple((1 - t) * u + t * v for u, v in zip(a, b)))
            else:
                per.append(a if t < 0.5 else b)
        return means, per


def trace_curves(traces: Sequence[RealTrace], scale: ScaleArg) -> tuple[TraceCurve, ...]:
    """The hacking and healthy traces as curves on the 0-1 scale (``scale``: one map, or one per trace name)."""
    out = []
    for t in traces:
        if t.label == "ambiguous":
            continue
        s = scale_for(t, scale)
        assert s is not None
        examples = tuple(None if e is None else tuple(s(v) for v in e) for e in t.examples)
        out.append(TraceCurve(t.name, t.hacking, t.progress(), tuple(s(v) for v in t.scores), examples))
    return tuple(out)


def grid_evals(traces: Sequence[RealTrace]) -> int:
    """Evals per run of the platform's grid for ``traces``: the longest trace's count (at least 2)."""
    if not traces:
        raise ValueError("no traces")
    return max(2, max(len(t.steps) for t in traces))


evals_per_run = grid_evals
"""Former name of :func:`grid_evals` (traces of one replay no longer need the same number of evals)."""


def build_replay_workload(config: WorkloadConfig, curves: Sequence[TraceCurve], seed: int) -> Workload:
    """The synthetic workload of ``config`` and ``seed`` with every RLHF job's curve replaced by a recorded one.

    Args:
        config: Workload parameters; ``n_evals`` is the platform's eval grid (e.g. :func:`grid_evals`).
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
    policies: tuple[PolicySpec, ...]
    observation: Mapping[str, Any] | None = None  # None: the means alone (Gaussian model with the trace's noise)
    eval_cost: float = DEFAULT_EVAL_COST  # one eval's GPU time, as a share of a regular eval interval
    eval_budget: EvalBudget | None = None  # what a job may spend on hints (None: no limit)


def run_replay_task(task: ReplayTask) -> list[dict[str, Any]]:
    """Run every policy of ``task`` on its replay workload; one metrics dict per policy. Picklable, pure."""
    from platform_sim.sim import eval_scores  # noqa: F401  (registers the "recorded-examples" observation model in workers)

    workload = build_replay_workload(task.workload, task.curves, task.seed)
    return run_policies(
        workload,
        task.policies,
        task.seed,
        gpus=task.workload.gpus,
        observation=task.observation,
        eval_cost=task.eval_cost,
        eval_budget=task.eval_budget,
    )


def on_regular_grid(trace: RealTrace, n_evals: int) -> RealTrace:
    """``trace`` reduced to its recorded evals nearest to a grid of ``n_evals`` evenly spaced evals (each at most
    once): what a job evaluated on that grid sees of a densely recorded run. The label stays the full trace's (it
    describes the gold curve, not the cadence)."""
    progress = np.asarray(trace.progress())
    keep = sorted({int(np.abs(progress - g).argmin()) for g in eval_grid(n_evals)})
    if len(keep) == len(trace.steps):
        return trace

    def pick(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[i] for i in keep) if values else ()

    sub = replace(
        trace,
        steps=pick(trace.steps),
        scores=pick(trace.scores),
        proxy=pick(trace.proxy),
        wall_s=pick(trace.wall_s),
        examples=pick(trace.examples),
        spreads=pick(trace.spreads),
    )
    object.__setattr__(sub, "_labelling", trace.labelling)  # the cached label of the whole curve
    return sub


def recorded_observation(
    traces: Sequence[RealTrace],
    curves: Sequence[TraceCurve],
    examples: int | None = None,
    rho: float | None = None,
    n_evals: int | None = None,
) -> dict[str, Any]:
    """The observation-model spec that gives trace jobs their *recorded* per-example scores (platform scale, on the
    platform's eval grid of ``n_evals`` points, default :func:`grid_evals`) and the synthetic jobs generated ones
    (``examples``, ``rho``: :mod:`platform_sim.sim.eval_scores`' defaults if None). The curves are already on the
    platform scale, so no score map is needed."""
    grid = eval_grid(n_evals or grid_evals(traces))
    recorded = []
    for curve in curves:
        means, per = curve.on_grid(grid)
        # The whole record too, so that an extra eval off the grid (a cadence hint) reads the nearest recorded eval.
        full = (list(curve.progress), list(curve.scores), [list(e) if e else [] for e in curve.examples])
        recorded.append((means.tolist(), [list(e) if e else [] for e in per], *full))
    params: dict[str, Any] = {"traces": recorded}
    if examples is not None:
        params["examples"] = examples
    if rho is not None:
        params["rho"] = rho
    return {"name": "recorded-examples", "params": params}


def replay(
    traces: Sequence[RealTrace],
    workload: WorkloadConfig,
    detector: Mapping[str, Any] | None,
    seeds: int,
    base: str = "srtf-est",
    stop_at_p: float = 0.65,
    runner: Any = None,
    progress: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    score_scale: str = "environment",
    cadence: Mapping[str, Any] | str | None = None,
    eval_cost: float = DEFAULT_EVAL_COST,
    n_evals: int | None = None,
    eval_budget: EvalBudget | None = None,
) -> dict[str, Any]:
    """Replay ``traces`` on the platform: ``{"main", "composability", "traces", "trace_summary", "config"}``.

    Args:
        traces: Recorded traces (validated; any mix of lengths, eval intervals, planned steps, trainers).
        workload: The synthetic part (its ``n_evals`` is replaced by :func:`grid_evals`).
        detector: EvalStop's detector spec (None: the paper's k=2, min_delta 0), on the 0-1 platform scale.
        seeds: Seeds 0..seeds-1 (each a different workload and a different dealing of traces).
        base: Base scheduler of the main table.
        stop_at_p: p of the StopAt-p baseline.
        runner: A :class:`~platform_sim.sim.runner.Runner` (default: serial).
        progress, on_plan: Progress callbacks (tasks finished; total tasks).
        score_scale: ``environment`` or ``trace`` (:data:`SCORE_SCALES`).
        cadence: EvalStop's cadence spec (None: fixed). An extra eval of a trace job reads the recorded curve
            between its two nearest recorded evals (linear interpolation, no added noise); a detector that reads
            per-example scores gets the nearest recorded eval's mean and per-example scores.
        eval_cost: One eval's GPU time, as a share of a regular eval interval.
        n_evals: Regular evals per run on the platform (None: the longest trace's count, :func:`grid_evals`). Dense
            traces (an eval every step) replay at a sparser regular interval this way, e.g. 30 for 150-step traces
            recorded every step (every 5 steps), and the recorded evals between serve the extra evals of hints.
            The per-trace rows then read each trace on that grid too (:func:`on_regular_grid`).
        eval_budget: What a job may spend on cadence hints (None: no limit), as the callback's budget.

    Raises:
        ValueError: ``seeds`` < 1, ``n_evals`` < 2, or every trace is ambiguous (nothing to deal to the platform).
    """
    from platform_sim.sim.runner import SerialRunner

    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    grid_given = n_evals
    if n_evals is None:
        n_evals = grid_evals(traces)
    elif isinstance(n_evals, bool) or not isinstance(n_evals, int) or n_evals < 2:
        raise ValueError(f"n_evals (regular evals per run) must be an integer >= 2, got {n_evals!r}")
    workload = replace(workload, n_evals=n_evals)
    scales = trace_scales(traces, score_scale)
    curves = trace_curves(traces, scales)
    if not curves:
        raise ValueError("every trace is ambiguous: nothing to replay on the platform")
    det_obj = detector_from_spec(paper_spec() if detector is None else detector)
    det = det_obj.spec()
    # Detectors that read per-example scores see the recorded ones (the other jobs' are generated).
    observation = recorded_observation(traces, curves, n_evals=n_evals) if det_obj.uses_example_scores else None

    def spec(stop: str, b: str) -> PolicySpec:
        return PolicySpec(
            base=b,
            stop=stop,
            detector=det if stop == "evalstop" else None,
            stop_params={"p": stop_at_p} if stop == "stop-at-p" else {},
            cadence=cadence if stop == "evalstop" else None,
        )

    specs: dict[str, PolicySpec] = {}
    for stop in REPLAY_STOPS:
        specs.setdefault(spec(stop, base).key(), spec(stop, base))
    for b in REPLAY_BASES:
        for stop in ("none", "evalstop", "oracle"):  # the Oracle per base: every row's share of its waste cut
            specs.setdefault(spec(stop, b).key(), spec(stop, b))
    keys = list(specs)
    tasks = [
        ReplayTask(workload, curves, seed, tuple(specs.values()), observation, eval_cost, eval_budget)
        for seed in range(seeds)
    ]
    if on_plan:
        on_plan(len(tasks))
    results = (runner or SerialRunner()).map(run_replay_task, tasks, progress)
    per = {k: [res[i] for res in results] for i, k in enumerate(keys)}

    def row(stop: str, b: str) -> dict[str, Any]:

        mine = per[spec(stop, b).key()]
        base_runs = per[spec("none", b).key()] if stop != "none" else None
        out = metric_row(b, stop, mine, base_runs)
        add_oracle_shares(
            [out], metric_row(b, "oracle", per[spec("oracle", b).key()], base_runs) if base_runs is not None else None
        )
        return out

    # With a grid of its own (dense traces), the per-trace rows see what a job on that grid sees; no hints there
    # (those play on the platform), so a row is the regular interval's.
    on_grid = traces if grid_given is None else [on_regular_grid(t, n_evals) for t in traces]
    # A trace whose eval lines carry a spread (eval_std, eval_n) is reported with it, as its run's reports were.
    rows = [trace_detection(t, det, scales[t.name], spreads=t.spreads or None) for t in on_grid]
    counts, maps = _traces_config(traces, scales, score_scale, det, n_evals)
    return {
        "main": [row(stop, base) for stop in REPLAY_STOPS],
        "composability": [row(stop, b) for b in REPLAY_BASES for stop in ("none", "evalstop")],
        "traces": rows,
        "trace_summary": trace_summary(rows),
        "config": {
            "seeds": seeds,
            "workload": workload.to_dict(),
            "detector": det,
            "base": base,
            "stop_at_p": stop_at_p,
            **counts,
            "cadence": cadence,
            "eval_cost": eval_cost,
            **(eval_budget or EvalBudget()).to_dict(),
            **maps,
        },
    }


def _traces_config(
    traces: Sequence[RealTrace],
    scales: Mapping[str, Scale],
    score_scale: str,
    det: Mapping[str, Any],
    n_evals: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What :func:`replay`'s ``config`` says about the traces: their counts and grid; their score maps (and, for
    the k-decline rule, its ``min_delta`` in the traces' own units when they share one map)."""
    shared = native_min_delta(traces, score_scale)
    groups = {scale_group(t, score_scale): scales[t.name] for t in traces}
    counts = {
        "n_traces": len(traces),
        "hacking_traces": sum(t.hacking for t in traces),
        "ambiguous_traces": [t.name for t in traces if t.label == "ambiguous"],
        "grid_evals": n_evals,
        "eval_counts": sorted({len(t.steps) for t in traces}),
        "score_scale": score_scale,
    }
    maps = {
        "scales": {g: {"lo": s.lo, "hi": s.hi} for g, s in groups.items()}
        if score_scale == "environment"
        else len(groups),
        "scale": {"lo": shared.lo, "hi": shared.hi} if shared is not None else None,
        "min_delta_native": det["params"].get("min_delta", 0.0) * shared.span
        if det["name"] == "k-decline" and shared is not None
        else None,
    }
    return counts, maps
