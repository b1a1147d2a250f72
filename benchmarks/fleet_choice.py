"""The ``evalstop-fleet`` stop policy against its two detectors alone and the paper's rule, on the issue's scenarios.

``evalstop-fleet`` gives each new RLHF job ``shape`` (conservative) or ``shape-sens`` (aggressive), chosen from the late
gains of the jobs that finished without being stopped (``platform_sim/sim/policies/fleet.py``). This script runs, on the same
seeds, the default workload and the plateau workload at sigma 0.02 and 0.12, and the shipped real traces as the RLHF
jobs of the platform (recorded per-example scores), and prints precision, recall, FPR on healthy RLHF jobs, the
median delay after the true peak, regret and JCT gain over no stop policy (paired by seed), plus the share of RLHF
jobs that got the aggressive detector.

    python benchmarks/fleet_choice.py [--seeds 30] [--workers 2]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from platform_sim.sim.engine import simulate
from platform_sim.sim.experiments import PolicySpec
from platform_sim.sim.metrics import metric_row, run_metrics
from platform_sim.sim.observe import make_observation_model
from platform_sim.sim.workload import WorkloadConfig, generate_workload
from platform_sim.studies.detector_study import CANDIDATES, PLATEAU_TAU

SPECS = dict(CANDIDATES)
POLICIES: dict[str, PolicySpec] = {
    "none": PolicySpec(),
    "paper k=2": PolicySpec(stop="evalstop", detector=SPECS["paper k=2"]),
    "shape (0.95)": PolicySpec(stop="evalstop", detector={"name": "shape", "params": {}}),
    "shape-sens": PolicySpec(stop="evalstop", detector=SPECS["shape-sens"]),
    "evalstop-fleet": PolicySpec(stop="evalstop-fleet"),
}
SCENARIOS: dict[str, WorkloadConfig | None] = {
    "default, sigma 0.02": WorkloadConfig(sigma=0.02),
    "default, sigma 0.12": WorkloadConfig(sigma=0.12),
    "plateau, sigma 0.02": WorkloadConfig(sigma=0.02, healthy_tau=PLATEAU_TAU),
    "plateau, sigma 0.12": WorkloadConfig(sigma=0.12, healthy_tau=PLATEAU_TAU),
    "real traces": None,
}


def _real() -> tuple[Any, Any, Any, WorkloadConfig]:
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import load_traces
    from platform_sim.studies.replay import evals_per_run, recorded_observation, trace_curves
    from platform_sim.studies.trace_detection import corpus_scale

    traces = load_traces(corpus_dir("real"))
    scale = corpus_scale(traces)
    curves = trace_curves(traces, scale)
    return traces, curves, recorded_observation(traces, curves), WorkloadConfig(n_evals=evals_per_run(traces))


def run_task(task: tuple[str, int]) -> dict[str, Any]:
    logging.getLogger("platform_sim.core").setLevel(logging.ERROR)
    scenario, seed = task
    config = SCENARIOS[scenario]
    if config is None:
        from platform_sim.studies.replay import build_replay_workload

        _, curves, observation, config = _real()
        workload = build_replay_workload(config, curves, seed)
    else:
        workload = generate_workload(config, seed)
        observation = {"name": "per-example", "params": {}}
    out: dict[str, Any] = {}
    for label, spec in POLICIES.items():
        sched = spec.build(workload)
        result = simulate(workload, sched, gpus=config.gpus, observation=make_observation_model(workload, observation))
        m = run_metrics(result)
        m["delays"] = [
            o.stop_eval - o.peak_eval for o in result.outcomes if o.stopped and o.hacking and o.stop_eval is not None
        ]
        chosen = getattr(sched.stop, "chosen", None)
        m["aggressive_share"] = (sum(v == "aggressive" for v in chosen.values()) / len(chosen)) if chosen else None
        out[label] = m
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    tasks = [(scenario, seed) for scenario in SCENARIOS for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_task, tasks))
    print(f"{args.seeds} seeds, srtf-est, 64 GPUs; {time.perf_counter() - t0:.0f} s")
    print(
        "| scenario | policy | precision % | recall % | FPR healthy RLHF % | median delay | regret | JCT gain % "
        "| RLHF jobs given shape-sens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        runs = {label: [r[label] for (s, _), r in zip(tasks, results) if s == scenario] for label in POLICIES}
        for label in POLICIES:
            if label == "none":
                continue
            row = metric_row("srtf-est", label, runs[label], runs["none"])
            delays = [d for m in runs[label] for d in m["delays"]]
            shares = [m["aggressive_share"] for m in runs[label] if m["aggressive_share"] is not None]
            share = f"{100 * statistics.mean(shares):.0f}%" if shares else "-"
            print(
                f"| {scenario} | {label} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | "
                f"{100 * row['fpr_healthy_rlhf']:.1f} | {statistics.median(delays) if delays else '-'} | "
                f"{row['regret']:.3f} | {row['jct_gain_pct']:+.1f} ±{row['ci95']['jct_gain_pct']:.1f} | {share} |"
            )


if __name__ == "__main__":
    main()
