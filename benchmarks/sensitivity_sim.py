"""How sensitive the reproduction is to our calibration: EvalStop on SRTF-Est away from the default point.

Each line changes one workload parameter (or the detector) from the defaults of docs/simulator.md and reports the
EvalStop row (mean over seeds, paired against SRTF-Est alone on the same seeds). This is the table behind the
"Sensitivity" section of docs/results/paper-reproduction.md.

    python benchmarks/sensitivity_sim.py --seeds 10 [--workers 2] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from platform_sim.sim.experiments import PolicySpec, rows_for_policies
from platform_sim.sim.runner import ProcessRunner
from platform_sim.sim.workload import WorkloadConfig

D = WorkloadConfig()
VARIANTS: list[tuple[str, WorkloadConfig, dict | None]] = [
    ("default", D, None),
    ("hack_gamma=1 (Gao, d linear in progress)", replace(D, hack_gamma=1.0), None),
    ("hack_gamma=1.5", replace(D, hack_gamma=1.5), None),
    ("hack_gamma=3", replace(D, hack_gamma=3.0), None),
    ("n_evals=10 (every 10%)", replace(D, n_evals=10), None),
    ("n_evals=40 (every 2.5%)", replace(D, n_evals=40), None),
    ("healthy_tau=(0.3, 0.6) (saturating early)", replace(D, healthy_tau=(0.3, 0.6)), None),
    ("healthy_tau=(0.8, 1.5)", replace(D, healthy_tau=(0.8, 1.5)), None),
    ("healthy_gain=(0.5, 0.6)", replace(D, healthy_gain=(0.5, 0.6)), None),
    ("sigma=0.03", replace(D, sigma=0.03), None),
    ("sigma=0.05", replace(D, sigma=0.05), None),
    ("sigma=0.05, min_delta=0.05", replace(D, sigma=0.05), {"name": "k-decline", "params": {"min_delta": 0.05}}),
    ("load=0.5", replace(D, load=0.5), None),
    ("load=1.0", replace(D, load=1.0), None),
    ("est_error=0.6", replace(D, est_error=0.6), None),
    ("mix=balanced", replace(D, mix="balanced"), None),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = []
    print("| variant | precision | recall | FPR | FPR healthy RLHF | JCT gain | wasted cut | delay (evals) | regret |")
    print("|---|---|---|---|---|---|---|---|---|")
    with ProcessRunner(args.workers) as runner:
        for name, wl, det in VARIANTS:
            (row,) = rows_for_policies(wl, [PolicySpec(stop="evalstop", detector=det)], range(args.seeds), runner)
            row["variant"] = name
            out.append(row)
            print(
                f"| {name} | {row['precision']:.1%} | {row['recall']:.1%} | {row['fpr']:.1%} | "
                f"{row['fpr_healthy_rlhf']:.1%} | {row['jct_gain_pct']:+.1f}% | {row['wasted_reduction_pct']:+.1f}% | "
                f"{row['delay_evals']:.2f} | {row['regret']:.3f} |",
                flush=True,
            )
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
