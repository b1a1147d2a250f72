"""``evalstop-sim detectors``: every stop detector on the same workloads and seeds.

Four experiments, each a list of rows (one per detector and parameter value) with the metrics of
:func:`~platform_sim.sim.metrics.metric_row` under the same names as ``evalstop-sim paper``, plus
``delay_median_evals`` (median over all stopped hacking jobs of all seeds of the stop eval minus the true peak eval):

- ``noise``: the default workload (RLHF-heavy, 64 GPUs, 60% hacking) at sigma 0.01 to 0.12;
- ``hack_rate``: the default workload at hacking rates 20% to 80%;
- ``plateau``: healthy RLHF runs that reach their top by mid-run and then stay flat (``healthy_tau`` 0.1 to 0.25
  instead of 1.5 to 3), at several sigmas: the case where the paper's rule fires on healthy runs;
- ``real``: the shipped real traces (``platform_sim/data/corpora/real``) as the RLHF jobs of the platform, as in
  ``evalstop-sim replay``, with their *recorded* per-example scores; ``real_traces`` has one row per detector and
  trace (stopped, stop step, delivered step, delay, regret).

Every run uses per-example eval scores (:mod:`platform_sim.sim.eval_scores`), so paired detectors see them; their
mean is exactly the plain simulator's observation, so detectors on the mean see the same numbers as in ``paper``.

The detectors and their parameters are :data:`CANDIDATES`. Their parameters were calibrated with
:func:`calibrate` on seeds :data:`TUNING_SEEDS`, which the evaluation (seeds 0 .. N-1) never uses; see
``docs/results/detectors-synthetic.md`` and ``benchmarks/calibrate_detectors.py``.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from platform_sim.core.detectors import default_spec, detector_from_spec, shape_sens_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.eval_scores import DEFAULT_EXAMPLES, DEFAULT_RHO, PerExampleObservation
from platform_sim.sim.experiments import HACK_RATES, SIGMAS, PolicySpec, run_policies
from platform_sim.sim.outcomes import SimResult
from platform_sim.sim.policies.policies import PREEMPTION_COST_H
from platform_sim.sim.workload import WorkloadConfig, generate_workload

logger = logging.getLogger(__name__)

PLATEAU_TAU: tuple[float, float] = (0.1, 0.25)
"""``healthy_tau`` of the plateau scenario: healthy RLHF runs reach about 90% of their gain by progress 0.25-0.6."""

PLATEAU_SIGMAS: tuple[float, ...] = (0.02, 0.05, 0.12)

TUNING_SEEDS: tuple[int, ...] = tuple(range(1000, 1010))
"""Seeds used to calibrate :data:`CANDIDATES`; disjoint from the evaluation seeds 0 .. N-1."""

CANDIDATES: tuple[tuple[str, dict[str, Any]], ...] = (
    # The paper's rule, unchanged.
    ("paper k=2", {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}),
    # The project's default (what every entry point runs when given no detector).
    ("default", default_spec()),
    # Calibrated with CalibrationRule() on TUNING_SEEDS (benchmarks/calibrate_detectors.py, docs/results/detectors-synthetic.md):
    # precision >= 95% at sigma 0.02 and 0.12 and on plateaus at sigma 0.02, then recall at sigma 0.12.
    ("k-decline+tol", {"name": "k-decline", "params": {"k": 3, "min_delta": 0.05}}),
    ("k-decline-se", {"name": "k-decline-se", "params": {"k": 2, "z": 1.0}}),
    ("paired-test", {"name": "paired-test", "params": {"test": "t", "alpha": 0.05, "k": 3}}),
    ("cusum", {"name": "cusum", "params": {"slack": 0.0, "threshold": 4.0}}),
    ("trend", {"name": "trend", "params": {"window": 8, "short_window": 4, "alpha": 0.01, "k": 1}}),
    # Calibrated with CALIBRATION_RULES["default-only"]: precision >= 95% at sigma 0.12 only, then recall there; it
    # trades the plateau scenario's precision for the high-noise target (docs/results/detectors-synthetic.md).
    ("trend-sens", {"name": "trend", "params": {"window": 8, "alpha": 0.3, "k": 1, "level_alpha": 0.2}}),
    # The model-based detector (platform_sim/core/detectors/shape.py); "shape" calibrated with the same rule as the
    # robust ones above, "shape-sens" with CALIBRATION_RULES["high-noise"] (healthy runs assumed still rising).
    ("shape", {"name": "shape", "params": {"threshold": 0.8, "k": 1}}),
    ("shape-sens", shape_sens_spec()),
)
"""``(label, detector spec)`` compared by ``evalstop-sim detectors``."""


# -- fast detection-only evaluation (calibration) ----------------------------------------------------------------


def job_series(
    config: WorkloadConfig,
    seed: int,
    examples: int = DEFAULT_EXAMPLES,
    rho: float = DEFAULT_RHO,
) -> list[tuple[bool, int, np.ndarray, list[tuple[float, tuple[float, ...] | None]]]]:
    """The observed eval series of every RLHF job of a workload: ``(hacking, peak eval, truth, evals)``.

    Observations depend only on the job and the eval index, never on the schedule, so running a detector over these
    series gives exactly the detection outcome (stop eval, delivered checkpoint) that the simulator gives.
    """
    wl = generate_workload(config, seed)
    obs = PerExampleObservation(wl, examples, rho)
    out = []
    for job in wl.jobs:
        if job.job_type != "rlhf":
            continue
        evals = [obs.observe_eval(job, k, k / wl.n_evals) for k in range(1, wl.n_evals + 1)]
        out.append((job.hacking, int(wl.peak_index[job.index]) + 1, wl.true_evals[job.index], evals))
    return out


def detection_metrics(spec: Mapping[str, Any], series: Iterable[Sequence[tuple]]) -> dict[str, Any]:
    """Precision, recall, healthy-RLHF FPR, median delay and regret of a detector over job series."""
    tp = fp = n_hack = n_ok = 0
    delays: list[int] = []
    regrets: list[float] = []
    for jobs in series:
        for hacking, peak, truth, evals in jobs:
            monitor = JobMonitor("job", "rlhf", detector_from_spec(spec))
            stop = None
            for k, (score, scores) in enumerate(evals, 1):
                if monitor.observe(k, score, scores).should_stop:
                    stop = k
                    break
            n_hack += hacking
            n_ok += not hacking
            if stop is not None:
                tp += hacking
                fp += not hacking
                if hacking:
                    delays.append(stop - peak)
            if stop is None:
                delivered = len(evals)
            elif monitor.best_step is None:  # a stop comes after at least one observed eval, which sets the best
                raise RuntimeError(f"monitor stopped at eval {stop} without a best checkpoint")
            else:
                delivered = monitor.best_step
            regrets.append(float(truth.max() - truth[delivered - 1]))
    return {
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / n_hack if n_hack else None,
        "fpr_healthy_rlhf": fp / n_ok if n_ok else None,
        "delay_median_evals": float(np.median(delays)) if delays else None,
        "regret": float(np.mean(regrets)) if regrets else None,
    }


CALIBRATION_GRIDS: dict[str, tuple[str, dict[str, Sequence[Any]]]] = {
    "k-decline+tol": ("k-decline", {"k": (1, 2, 3), "min_delta": (0.0, 0.02, 0.05, 0.1, 0.15, 0.2)}),
    "k-decline-se": ("k-decline-se", {"k": (1, 2, 3), "z": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)}),
    "paired-test": ("paired-test", {"test": ("t",), "alpha": (0.001, 0.01, 0.05, 0.1), "k": (1, 2, 3)}),
    "cusum": ("cusum", {"slack": (0.0, 0.25, 0.5, 1.0), "threshold": (2.0, 3.0, 4.0, 6.0, 8.0)}),
    "trend": ("trend", {"window": (6, 8, 10), "short_window": (None, 4), "alpha": (0.01, 0.05, 0.1, 0.2), "k": (1,)}),
    "shape": ("shape", {"threshold": (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99), "k": (1, 2)}),
    # For the "high-noise" rule: healthy runs assumed to be still rising (min_tau), less prior mass on peaks ahead.
    "shape-sens": ("shape", {"threshold": (0.6, 0.65, 0.7), "future": (1.5, 2.0, 3.0), "min_tau": (1.0, 2.0)}),
}
"""Parameter grids searched by :func:`calibrate`."""

CALIBRATION_SCENARIOS: dict[str, WorkloadConfig] = {
    "default_s0.02": WorkloadConfig(sigma=0.02),
    "default_s0.12": WorkloadConfig(sigma=0.12),
    "plateau_s0.02": WorkloadConfig(sigma=0.02, healthy_tau=PLATEAU_TAU),
}


@dataclass(frozen=True)
class CalibrationRule:
    """How :func:`calibrate` picks a grid point.

    Among the grid points with precision >= ``min_precision`` in every scenario of ``constrain``: prefer those whose
    median delay in ``fast`` is at most ``max_delay`` (as fast as the paper's rule at the default point, which is
    what its JCT gain comes from), then the highest recall in ``objective`` (rounded to 0.01), then the lowest
    median delay in ``objective``, then the highest recall. With ``balanced``, "recall" in that order is the smaller
    of precision and recall (the point that clears both with the widest margin).
    """

    objective: str = "default_s0.12"
    constrain: tuple[str, ...] = ("default_s0.02", "default_s0.12", "plateau_s0.02")
    min_precision: float = 0.95
    fast: str = "default_s0.02"
    max_delay: float = 3.0
    balanced: bool = False


CALIBRATION_RULES: dict[str, CalibrationRule] = {
    "plateau-safe": CalibrationRule(),
    # What the default workload alone allows (its healthy RLHF runs never plateau): shows the price on plateaus.
    "default-only": CalibrationRule(constrain=("default_s0.12",)),
    # The high-noise target alone: median delay <= 4 evals at sigma 0.12, then the widest margin above
    # both 95% marks (min of precision and recall); used for ``shape-sens``.
    "high-noise": CalibrationRule(constrain=("default_s0.12",), fast="default_s0.12", max_delay=4.0, balanced=True),
}


def calibrate(
    seeds: Sequence[int] = TUNING_SEEDS,
    rule: CalibrationRule = CalibrationRule(),
    grids: Mapping[str, tuple[str, Mapping[str, Sequence[Any]]]] = CALIBRATION_GRIDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Grid-search each detector family's parameters on ``seeds`` (never the evaluation seeds).

    Returns:
        ``{"chosen": {label: spec or None}, "grid": [{"label", "spec", scenario: metrics, ...}, ...]}``.
    """
    series = {name: [job_series(cfg, s) for s in seeds] for name, cfg in CALIBRATION_SCENARIOS.items()}
    grid_rows: list[dict[str, Any]] = []
    chosen: dict[str, Any] = {}
    for label, (name, grid) in grids.items():
        best_key: tuple | None = None
        for values in itertools.product(*grid.values()):
            spec = {"name": name, "params": dict(zip(grid.keys(), values))}
            row: dict[str, Any] = {"label": label, "spec": spec}
            for scen, data in series.items():
                row[scen] = detection_metrics(spec, data)
            ok = all((row[c]["precision"] or 0.0) >= rule.min_precision for c in rule.constrain)
            row["feasible"] = ok
            grid_rows.append(row)
            if progress:
                progress(f"{label} {spec['params']}: {row[rule.objective]}")
            if ok:
                obj = row[rule.objective]
                quick = (row[rule.fast]["delay_median_evals"] or 99.0) <= rule.max_delay
                score = obj["recall"] or 0.0
                if rule.balanced:
                    score = min(score, obj["precision"] or 0.0)
                key = (quick, round(score, 2), -(obj["delay_median_evals"] or 99.0), score)
                if best_key is None or key > best_key:
                    best_key, chosen[label] = key, spec
        chosen.setdefault(label, None)
    return {"chosen": chosen, "grid": grid_rows, "seeds": list(seeds), "rule": rule.__dict__}


# -- the study ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyConfig:
    """What ``evalstop-sim detectors`` runs.

    Args:
        seeds: Evaluation seeds 0 .. seeds-1.
        detectors: ``(label, spec)`` pairs to compare.
        base: Base scheduler.
        workload: The default point (sigma and hack rate are swept from it).
        sigmas: Noise sweep.
        hack_rates: Hacking-rate sweep.
        plateau_sigmas: Sigmas of the plateau scenario.
        traces_dir: Real traces (None: the shipped corpus; "" to skip).
        examples: Held-out examples per eval for the generated per-example scores.
        rho: Their checkpoint-to-checkpoint correlation.
    """

    seeds: int = 30
    detectors: tuple[tuple[str, Mapping[str, Any]], ...] = CANDIDATES
    base: str = "srtf-est"
    workload: WorkloadConfig = WorkloadConfig()
    sigmas: tuple[float, ...] = SIGMAS
    hack_rates: tuple[float, ...] = HACK_RATES
    plateau_sigmas: tuple[float, ...] = PLATEAU_SIGMAS
    traces_dir: str | None = None
    examples: int = DEFAULT_EXAMPLES
    rho: float = DEFAULT_RHO


@dataclass(frozen=True)
class StudyTask:
    """One workload (synthetic or replay) and seed, with every policy to run on it."""

    workload: WorkloadConfig
    seed: int
    policies: tuple[PolicySpec, ...]
    observation: Mapping[str, Any]
    replay_curves: tuple[Any, ...] = field(default=())  # TraceCurve objects for a replay workload


def run_study_task(task: StudyTask) -> list[dict[str, Any]]:
    """Run every policy of ``task``; one :func:`run_metrics` dict per policy with the job-level ``delays`` added."""
    from .replay import build_replay_workload

    if task.replay_curves:
        workload = build_replay_workload(task.workload, task.replay_curves, task.seed)
    else:
        workload = generate_workload(task.workload, task.seed)

    def delays(result: SimResult) -> dict[str, Any]:
        return {
            "delays": [
                o.stop_eval - o.peak_eval
                for o in result.outcomes
                if o.stopped and o.hacking and o.stop_eval is not None
            ]
        }

    return run_policies(
        workload,
        task.policies,
        task.seed,
        gpus=task.workload.gpus,
        observation=task.observation,
        preemption_cost_h=PREEMPTION_COST_H,
        extra=delays,
    )


@dataclass
class _Plan:
    tasks: list[StudyTask] = field(default_factory=list)
    # (experiment, params, label, index of the policy in the task, index of the baseline) per task group
    groups: list[tuple[str, dict[str, Any], list[int], list[tuple[str, int]]]] = field(default_factory=list)


def _plan(cfg: StudyConfig, real: tuple[Any, ...] | None, real_obs: Mapping[str, Any] | None) -> _Plan:
    synthetic_obs = {"name": "per-example", "params": {"examples": cfg.examples, "rho": cfg.rho}}
    policies = (PolicySpec(base=cfg.base),) + tuple(
        PolicySpec(base=cfg.base, stop="evalstop", detector=detector_from_spec(spec).spec())
        for _, spec in cfg.detectors
    )
    plan = _Plan()
    scenarios: list[tuple[str, dict[str, Any], WorkloadConfig]] = []
    scenarios += [("noise", {"sigma": s}, replace(cfg.workload, sigma=s)) for s in cfg.sigmas]
    scenarios += [("hack_rate", {"hack_rate": h}, replace(cfg.workload, hack_rate=h)) for h in cfg.hack_rates]
    scenarios += [
        ("plateau", {"sigma": s}, replace(cfg.workload, sigma=s, healthy_tau=PLATEAU_TAU)) for s in cfg.plateau_sigmas
    ]
    for experiment, params, wl in scenarios:
        idx = []
        for seed in range(cfg.seeds):
            idx.append(len(plan.tasks))
            plan.tasks.append(StudyTask(wl, seed, policies, synthetic_obs))
        plan.groups.append((experiment, params, idx, [(label, i + 1) for i, (label, _) in enumerate(cfg.detectors)]))
    if real:
        curves, n_evals = real
        wl = replace(cfg.workload, n_evals=n_evals)
        idx = []
        for seed in range(cfg.seeds):
            idx.append(len(plan.tasks))
            plan.tasks.append(StudyTask(wl, seed, policies, real_obs or synthetic_obs, curves))
        plan.groups.append(("real", {}, idx, [(label, i + 1) for i, (label, _) in enumerate(cfg.detectors)]))
    return plan


def _row(
    label: str,
    spec: Mapping[str, Any],
    base: str,
    runs: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
) -> dict[str, Any]:
    from platform_sim.sim.metrics import metric_row

    row = metric_row(base, "evalstop", runs, baseline, detector=label, **params)
    delays = [d for r in runs for d in r["delays"]]
    row["delay_median_evals"] = float(statistics.median(delays)) if delays else None
    row["detector_spec"] = detector_from_spec(spec).spec()
    return row


def load_real(traces_dir: str | None) -> tuple[list[Any], Any, str | None, bool]:
    """``(traces, scales, note, platform_ok)``: the real traces (``[]`` and a note when none are usable), each
    trace's map to the 0-1 scale (per environment, :func:`~platform_sim.studies.trace_detection.trace_scales`), and whether they
    can feed the platform replay (any mix of lengths can; a corpus of only ambiguous traces cannot)."""
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import TraceError, load_traces

    from .trace_detection import trace_scales

    folder = Path(traces_dir) if traces_dir else corpus_dir("real")
    try:
        traces = load_traces(folder)
    except (FileNotFoundError, TraceError, ValueError) as exc:
        return [], None, str(exc), False
    if all(t.label == "ambiguous" for t in traces):
        return traces, trace_scales(traces), "platform replay skipped: every trace is ambiguous", False
    return traces, trace_scales(traces), None, True


def trace_rows(
    traces: Sequence[Any],
    scale: Any,
    detectors: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[dict[str, Any]]:
    """Each detector over each trace's recorded eval sequence (means and per-example scores, platform scale).

    Args:
        traces: The traces.
        scale: One :class:`~platform_sim.studies.replay.Scale` for all, or one per trace name.
        detectors: ``(label, spec)`` pairs.
    """
    from .trace_detection import Scale, trace_detection

    keys = (
        "trace",
        "environment",
        "split",
        "label",
        "stopped",
        "stop_step",
        "best_step",
        "peak_step",
        "delay_evals",
        "regret",
        "regret_pct",
    )
    rows = []
    for trace in traces:
        s = scale if isinstance(scale, Scale) else scale[trace.name]
        for label, spec in detectors:
            row = trace_detection(trace, spec, s)
            rows.append({"detector": label, **{k: row[k] for k in keys}})
    return rows


def trace_summaries(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per detector: hacking traces stopped, healthy traces stopped, median delay, worst regret of a stopped trace."""
    out = []
    for label in dict.fromkeys(r["detector"] for r in rows):
        mine = [r for r in rows if r["detector"] == label]
        hack = [r for r in mine if r["label"] == "hacking"]
        ok = [r for r in mine if r["label"] == "healthy"]
        delays = [r["delay_evals"] for r in hack if r["stopped"]]
        regrets = [r["regret_pct"] for r in hack if r["stopped"] and r["regret_pct"] is not None]
        out.append(
            {
                "detector": label,
                "hacking": len(hack),
                "hacking_stopped": sum(r["stopped"] for r in hack),
                "healthy": len(ok),
                "healthy_stopped": sum(r["stopped"] for r in ok),
                "ambiguous": sum(r["label"] == "ambiguous" for r in mine),
                "delay_median_evals": float(statistics.median(delays)) if delays else None,
                "max_regret_pct": max(regrets) if regrets else None,
            }
        )
    return out


def study(
    cfg: StudyConfig,
    runner: Any = None,
    progress: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run the comparison; ``{"noise", "hack_rate", "plateau", "real", "real_traces", "real_summary", "config"}``."""
    from platform_sim.sim.runner import SerialRunner

    from .replay import grid_evals, recorded_observation, trace_curves

    if cfg.seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {cfg.seeds}")
    for _, spec in cfg.detectors:
        detector_from_spec(spec)  # fail before any run
    real_note = None
    real = None
    real_obs = None
    traces: list[Any] = []
    scale = None
    if cfg.traces_dir != "":
        traces, scale, real_note, platform_ok = load_real(cfg.traces_dir)
        if traces and platform_ok:
            curves = trace_curves(traces, scale)
            real = (curves, grid_evals(traces))
            real_obs = recorded_observation(traces, curves, cfg.examples, cfg.rho, n_evals=real[1])
    plan = _plan(cfg, real, real_obs)
    if on_plan:
        on_plan(len(plan.tasks))
    results = (runner or SerialRunner()).map(run_study_task, plan.tasks, progress)
    out: dict[str, Any] = {"noise": [], "hack_rate": [], "plateau": [], "real": []}
    specs = dict(cfg.detectors)
    for experiment, params, idx, members in plan.groups:
        baseline = [results[i][0] for i in idx]
        for label, j in members:
            out[experiment].append(_row(label, specs[label], cfg.base, [results[i][j] for i in idx], baseline, params))
    rows = trace_rows(traces, scale, cfg.detectors) if traces else []
    out["real_traces"] = rows
    out["real_summary"] = trace_summaries(rows)
    out["config"] = {
        "seeds": cfg.seeds,
        "base": cfg.base,
        "workload": cfg.workload.to_dict(),
        "detectors": [{"label": label, "spec": detector_from_spec(spec).spec()} for label, spec in cfg.detectors],
        "plateau_healthy_tau": list(PLATEAU_TAU),
        "tuning_seeds": list(TUNING_SEEDS),
        "per_example": {"examples": cfg.examples, "rho": cfg.rho},
        "real_traces": len(traces),
        "real_hacking": sum(t.hacking for t in traces),
        "real_missing": real_note,
        "tasks": len(plan.tasks),
    }
    return out
