"""Cost of each detector in the simulator: one 64-GPU / 200-job SRTF-Est run with per-example eval scores.

Prints the median wall time of ``--repeat`` runs (seed 0) per detector of ``evalstop-sim detectors`` at each sigma,
and the same run with no stop policy and with the paper's rule without per-example scores, for reference; then the
cost of one ``update`` call per detector, averaged over a run of 20 and of 100 evals with 48 per-example scores
(a slowly rising series that never stops, so every eval is decided).

    python benchmarks/bench_detectors.py [--repeat 3] [--sigmas 0.02,0.12]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np

from platform_sim.core import detector_from_spec
from platform_sim.sim.experiments import PolicySpec, run_one
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.detector_study import CANDIDATES


def timed(wl: WorkloadConfig, spec: PolicySpec, observation, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run_one(wl, spec, 0, observation=observation)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sigmas", default="0.02,0.12")
    args = ap.parse_args()
    logging.getLogger("platform_sim.core.detectors").setLevel(logging.ERROR)
    per_example = {"name": "per-example", "params": {}}
    for sigma in (float(s) for s in args.sigmas.split(",")):
        wl = WorkloadConfig(sigma=sigma)
        print(f"sigma {sigma}: median of {args.repeat} runs (64 GPUs, 200 jobs, srtf-est)")
        print(
            f"  {'no stop policy, plain observations':42s} {1000 * timed(wl, PolicySpec(), None, args.repeat):8.1f} ms"
        )
        paper = PolicySpec(stop="evalstop", detector={"name": "k-decline", "params": {}})
        print(f"  {'paper k=2, plain observations':42s} {1000 * timed(wl, paper, None, args.repeat):8.1f} ms")
        for label, spec in CANDIDATES:
            ms = 1000 * timed(wl, PolicySpec(stop="evalstop", detector=spec), per_example, args.repeat)
            print(f"  {label + ', per-example scores':42s} {ms:8.1f} ms")
    print("cost of one update() call, mean over a whole run (48 per-example scores per eval)")
    rng = np.random.default_rng(0)
    for n_evals in (20, 100):
        means = 0.1 + 0.5 * np.sqrt(np.linspace(0.05, 1.0, n_evals))
        evals = [(float(m), list(m + rng.normal(0, 0.2, 48))) for m in means]
        for label, spec in CANDIDATES:
            best = float("inf")
            for _ in range(args.repeat):
                det = detector_from_spec(spec)
                t0 = time.perf_counter()
                for step, (m, scores) in enumerate(evals, 1):
                    det.update(step, m, scores)
                best = min(best, time.perf_counter() - t0)
            print(f"  {n_evals:3d} evals  {label:16s} {1e6 * best / n_evals:9.1f} us per eval")


if __name__ == "__main__":
    main()
