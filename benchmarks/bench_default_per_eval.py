"""Per-eval cost of the default detector through ``JobMonitor.observe``, beside the paper's rule, in the same run.

Synthetic jobs: 100 held-out examples with fixed difficulties, a rise over 14 evals then a fall over 10, Gaussian
noise; each job reported until its detector stops it. The default gets the per-example scores (what the simulator
gives it), the paper's rule the means. Prints microseconds of CPU per eval and their ratio.

    python benchmarks/bench_default_per_eval.py [--jobs 3000] [--examples 100]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

from platform_sim.core import default_spec, detector_from_spec, paper_spec
from platform_sim.core.monitor import JobMonitor


def make_jobs(n_jobs: int, n_examples: int, seed: int = 0) -> list[list[tuple[float, ...]]]:
    rng = np.random.default_rng(seed)
    curve = np.r_[np.linspace(0.0, 0.2, 14), np.linspace(0.2, 0.05, 10)]
    jobs = []
    for _ in range(n_jobs):
        base = rng.normal(0.5, 0.1, n_examples)
        jobs.append([tuple(map(float, base + c + rng.normal(0, 0.05, n_examples))) for c in curve])
    return jobs


def cost(jobs, spec, per_example: bool) -> tuple[int, float]:
    """(evals reported, CPU seconds) of reporting every job until its detector stops it."""
    t0, n = time.process_time(), 0
    for j, evals in enumerate(jobs):
        monitor = JobMonitor(str(j), "rlhf", detector_from_spec(spec))
        for i, scores in enumerate(evals):
            n += 1
            if monitor.observe(10 * i + 10, sum(scores) / len(scores), scores if per_example else None).should_stop:
                break
    return n, time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--examples", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    jobs = make_jobs(args.jobs, args.examples)
    n_p, s_p = cost(jobs, paper_spec(), per_example=False)
    n_d, s_d = cost(jobs, default_spec(), per_example=True)
    print("| detector | evals | CPU s | us per eval |\n|---|---|---|---|")
    print(f"| paper (k-decline 2, means) | {n_p} | {s_p:.2f} | {1e6 * s_p / n_p:.1f} |")
    print(f"| default (trend, per-example) | {n_d} | {s_d:.2f} | {1e6 * s_d / n_d:.1f} |")
    print(f"\nratio per eval: {(s_d / n_d) / (s_p / n_p):.1f}x")


if __name__ == "__main__":
    main()
