"""How much can any detector get from the eval means? A Bayes detector that knows the simulator's own priors.

For every RLHF job of the evaluation seeds, the posterior probability that the job is a hacking one *and* its true
peak eval is already behind is computed exactly over a large sample of true curves drawn from the simulator's own
workload generator on other seeds (the particles), with the Gaussian eval noise of known sigma. Stopping when that
posterior exceeds ``c`` is the best a detector can do on this workload when it knows everything but the job's own
parameters; no deployable detector knows the curve families' parameter ranges, so this is an upper bound, not a
candidate. It shows whether a target is out of reach of the information in the means, or only of our detectors.

    python benchmarks/bayes_bound.py [--sigma 0.12] [--plateau] [--seeds 30] [--particle-seeds 80]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from platform_sim.sim.workload import WorkloadConfig, generate_workload
from platform_sim.studies.detector_study import PLATEAU_TAU, job_series

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=0.12, help="eval noise (default 0.12)")
    ap.add_argument("--plateau", action="store_true", help="the plateau scenario's healthy runs")
    ap.add_argument("--seeds", type=int, default=30, help="evaluation seeds 0..N-1 (default 30)")
    ap.add_argument(
        "--particle-seeds",
        type=int,
        default=80,
        help="seeds 5000.. whose true RLHF curves are the prior sample (default 80)",
    )
    args = ap.parse_args()
    cfg = (
        WorkloadConfig(sigma=args.sigma, healthy_tau=PLATEAU_TAU) if args.plateau else WorkloadConfig(sigma=args.sigma)
    )
    t0 = time.perf_counter()
    curves, hacking = [], []
    for seed in range(5000, 5000 + args.particle_seeds):
        wl = generate_workload(cfg, seed)
        for job in wl.jobs:
            if job.job_type == "rlhf":
                curves.append(wl.true_evals[job.index])
                hacking.append(job.hacking)
    parts, hk = np.asarray(curves), np.asarray(hacking)
    peak = parts.argmax(axis=1) + 1  # 1-based eval of each particle's true peak
    jobs = [j for s in range(args.seeds) for j in job_series(cfg, s)]
    y = np.asarray([[score for score, _ in evals] for _, _, _, evals in jobs])
    is_hack = np.asarray([h for h, _, _, _ in jobs])
    true_peak = np.asarray([p for _, p, _, _ in jobs])
    n_evals = y.shape[1]
    post = np.zeros_like(y)
    for a in range(0, len(jobs), 200):  # chunks keep the jobs x particles x evals array small
        d2 = (y[a : a + 200, None, :] - parts[None, :, :]) ** 2 / (2.0 * args.sigma**2)
        loglik = -np.cumsum(d2, axis=2)
        loglik -= loglik.max(axis=1, keepdims=True)
        w = np.exp(loglik)
        w /= w.sum(axis=1, keepdims=True)
        for t in range(n_evals):
            post[a : a + 200, t] = w[:, hk & (peak <= t + 1), t].sum(axis=1)
    print(
        f"sigma {args.sigma}, {'plateau' if args.plateau else 'default'} workload: {len(jobs)} RLHF jobs "
        f"(seeds 0-{args.seeds - 1}), {len(parts)} particles; {time.perf_counter() - t0:.0f} s"
    )
    print("| posterior threshold | precision % | recall % | FPR healthy RLHF % | median delay (evals) |")
    print("|---|---|---|---|---|")
    for c in THRESHOLDS:
        fired = (post > c).any(axis=1)
        stop = np.argmax(post > c, axis=1) + 1
        tp, fp = int((fired & is_hack).sum()), int((fired & ~is_hack).sum())
        delays = stop[fired & is_hack] - true_peak[fired & is_hack]
        print(
            f"| {c} | {100 * tp / max(tp + fp, 1):.1f} | {100 * tp / is_hack.sum():.1f} | "
            f"{100 * fp / (~is_hack).sum():.1f} | {np.median(delays):.0f} |"
        )


if __name__ == "__main__":
    main()
