"""The cadence hint against the Oracle bound: EvalStop with the fixed and the adaptive cadence, evaluations priced.

For each sigma, on the same seeds: the base alone, the Oracle, and EvalStop (k-decline, k=2) at the fixed cadence
and at several adaptive cadences (``fraction`` of an interval after a first decline; ``min_drop``: only after a drop
of that many noise standard errors). Prints one markdown table per sigma: JCT gain and waste cut, each also as a
share of the Oracle's, healthy RLHF jobs stopped, hacking jobs stopped, GPU-hours spent evaluating, extra evals and
detection delay (evals after the true peak). Figures in docs/simulation.md section 8.

With ``--detector default`` EvalStop runs the project's default detector (``trend``) instead, whose hint is its last
test's p-value below ``p_hint`` (default 0.5), at fractions 0.25, 0.5 and 0.75.

    python benchmarks/cadence_vs_oracle.py [--sigmas 0.02,0.12] [--seeds 10] [--eval-cost 0.05] [--workers 2]
        [--detector paper|default]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from platform_sim.core.detectors import default_spec, paper_spec
from platform_sim.sim.cadence_study import cadence_comparison
from platform_sim.sim.engine import DEFAULT_EVAL_COST
from platform_sim.sim.runner import ProcessRunner
from platform_sim.sim.workload import WorkloadConfig

CADENCES = [("fixed", None)] + [
    (
        f"adaptive f={f:g}" + (f" min_drop={m:g}" if m else ""),
        {"name": "adaptive", "params": {"fraction": f, "min_drop": m}},
    )
    for f in (0.25, 0.5, 0.75)
    for m in (0.0, 1.0)
]

DEFAULT_CADENCES = [("fixed", None)] + [
    (f"adaptive f={f:g}", {"name": "adaptive", "params": {"fraction": f}}) for f in (0.25, 0.5, 0.75)
]

COLUMNS = (
    ("JCT gain %", "jct_gain_pct", ".1f"),
    ("share of Oracle's", "jct_gain_share_of_oracle", ".2f"),
    ("waste cut %", "wasted_reduction_pct", ".1f"),
    ("share of Oracle's", "waste_cut_share_of_oracle", ".2f"),
    ("healthy stopped", "false_stops", ".1f"),
    ("hacking stopped", "stopped_hacking", ".1f"),
    ("eval GPU-h", "eval_gpu_h", ".1f"),
    ("extra evals", "extra_evals", ".1f"),
    ("delay (evals)", "delay_evals", ".2f"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigmas", default="0.02,0.12", help="comma-separated eval noise levels (default 0.02,0.12)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument(
        "--eval-cost",
        type=float,
        default=DEFAULT_EVAL_COST,
        help=f"one eval's GPU time as a share of a regular eval interval (default {DEFAULT_EVAL_COST})",
    )
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument(
        "--detector",
        choices=("paper", "default"),
        default="paper",
        help="EvalStop's detector: the paper's k-decline k=2 (default) or the project's default (trend)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    with ProcessRunner(args.workers) as runner:
        for sigma in (float(s) for s in args.sigmas.split(",")):
            rows = cadence_comparison(
                replace(WorkloadConfig(), sigma=sigma),
                range(args.seeds),
                detector=paper_spec() if args.detector == "paper" else default_spec(),
                cadences=CADENCES if args.detector == "paper" else DEFAULT_CADENCES,
                eval_cost=args.eval_cost,
                runner=runner,
            )
            print(
                f"\nsigma {sigma:g}, {args.seeds} seeds, SRTF-Est, {args.detector} detector, eval cost "
                f"{args.eval_cost:g} of an interval\n"
            )
            print("| policy | " + " | ".join(c[0] for c in COLUMNS) + " |")
            print("|---|" + "---:|" * len(COLUMNS))
            for r in rows:
                name = "Oracle" if r["stop"] == "oracle" else f"EvalStop, {r['cadence']}"
                cells = ["-" if r[key] is None else format(r[key], fmt) for _, key, fmt in COLUMNS]
                print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
