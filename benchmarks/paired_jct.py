"""JCT of each detector against the paper's rule, paired by seed (same workload, same noise, same scheduler).

``evalstop-sim detectors`` reports each detector's JCT gain over no stop policy with a confidence interval over
seeds; two such intervals overlap even when one detector is better on every seed. This script runs the paper's rule
and the given detectors (or the ``evalstop-fleet`` stop policy) on the same seeds and prints the mean per-seed difference of mean JCT (negative: faster
than the paper's rule), its 95% confidence half-width, the seeds where the detector was faster, and scipy's paired
t-test and Wilcoxon p-values.

    python benchmarks/paired_jct.py [--sigma 0.02] [--seeds 30] [--labels shape,shape-sens,cusum]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from scipy import stats

from platform_sim.sim.experiments import PolicySpec, run_one
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.detector_study import CANDIDATES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=0.02)
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument(
        "--labels",
        default="shape,shape-sens,cusum,evalstop-fleet",
        help="detectors of evalstop-sim detectors, or evalstop-fleet (the stop policy with its defaults)",
    )
    args = ap.parse_args()
    logging.getLogger("platform_sim.core").setLevel(logging.ERROR)
    specs = dict(CANDIDATES)
    labels = args.labels.split(",")
    unknown = [lab for lab in labels if lab not in specs and lab != "evalstop-fleet"]
    if unknown:
        ap.error(f"unknown --labels {', '.join(unknown)}; choose from {', '.join(specs)}")
    wl = WorkloadConfig(sigma=args.sigma)
    per_example = {"name": "per-example", "params": {}}
    t0 = time.perf_counter()
    jct: dict[str, list[float]] = {lab: [] for lab in ["paper k=2", *labels]}
    for seed in range(args.seeds):
        for lab in jct:
            spec = (
                PolicySpec(stop="evalstop-fleet")
                if lab == "evalstop-fleet"
                else PolicySpec(stop="evalstop", detector=specs[lab])
            )
            jct[lab].append(run_one(wl, spec, seed, observation=per_example)[1]["jct_mean_h"])
    base = np.asarray(jct["paper k=2"])
    print(
        f"sigma {args.sigma}, default workload, srtf-est, seeds 0-{args.seeds - 1} "
        f"({time.perf_counter() - t0:.0f} s); paper's rule mean JCT {base.mean():.3f} h"
    )
    print(
        "| detector | mean JCT (h) | JCT - paper's rule (h), mean ±95% | % of the paper's rule's JCT | seeds faster "
        "| paired t p | Wilcoxon p |"
    )
    print("|---|---|---|---|---|---|---|")
    for lab in labels:
        x = np.asarray(jct[lab])
        d = x - base
        half = float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))
        print(
            f"| {lab} | {x.mean():.3f} | {d.mean():+.4f} ±{half:.4f} | {100 * d.mean() / base.mean():+.2f}% "
            f"| {int((d < 0).sum())}/{d.size} | {stats.ttest_rel(x, base).pvalue:.2g} "
            f"| {stats.wilcoxon(x, base).pvalue:.2g} |"
        )


if __name__ == "__main__":
    main()
