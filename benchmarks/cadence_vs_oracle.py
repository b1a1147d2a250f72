"""The cadence hint against the Oracle bound: EvalStop with the fixed and the adaptive cadence, evaluations priced.

For each sigma, on the same seeds: the base alone, the Oracle, and EvalStop (k-decline, k=2) at the fixed cadence
and at several adaptive cadences (``fraction`` of an interval after a first decline; ``min_drop``: only after a drop
of that many noise standard errors). Prints one markdown table per sigma: JCT gain and waste cut, each also as a
share of the Oracle's, healthy RLHF jobs stopped, hacking jobs stopped, GPU-hours spent evaluating, extra evals and
detection delay (evals after the true peak). Figures in docs/simulation.md section 8.

With ``--detector default`` EvalStop runs the project's default detector (``trend``) instead, whose hint is its last
test's p-value below ``p_hint`` (default 0.5), at fractions 0.25, 0.5 and 0.75; with ``--detector shape-sens`` the
Bayesian ``shape-sens``, whose hint is one minus its posterior of being past an overoptimization peak below
``p_hint`` (0.5, 0.8, 0.95 at fractions 0.25 and 0.5). With ``--detector shape-now``, ``shape`` with
``behind=0`` (the peak may lie behind the current eval) on a small grid of thresholds and ``future`` values, each
at the fixed cadence and at several adaptive ones; after the table the benchmark names the row that
:func:`choose` picks on these seeds. ``--first-seed`` moves the seeds (tuning runs use seeds 100-109; the reported
ones are 0-9: a setting is chosen on the first and judged on the second).

    python benchmarks/cadence_vs_oracle.py [--sigmas 0.02,0.12] [--seeds 10] [--eval-cost 0.05] [--workers 2]
        [--detector paper|default|shape-sens|shape-now] [--first-seed 0]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from platform_sim.core.detectors import default_spec, paper_spec, shape_sens_spec
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

SHAPE_CADENCES = [("fixed", None)] + [
    (f"adaptive f={f:g} p_hint={p:g}", {"name": "adaptive", "params": {"fraction": f, "p_hint": p}})
    for f in (0.25, 0.5)
    for p in (0.5, 0.8, 0.95)
]

NOW_CADENCES = [("fixed", None)] + [
    (f"adaptive f={f:g} p_hint={p:g}", {"name": "adaptive", "params": {"fraction": f, "p_hint": p}})
    for f in (0.25, 0.33, 0.5)
    for p in (0.7, 0.8)
]


def _shape_now(threshold: float, future: float) -> tuple[str, dict[str, Any]]:
    params = {"threshold": threshold, "future": future, "min_tau": 2.0, "behind": 0}
    return f"shape behind=0 threshold={threshold:g} future={future:g}", {"name": "shape", "params": params}


#: Per --detector: the detector variants (label, spec) and the cadences tried with each.
DETECTOR_RUNS: dict[str, tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, Any]]]] = {
    "paper": ([("", paper_spec())], CADENCES),
    "default": ([("", default_spec())], DEFAULT_CADENCES),
    "shape-sens": ([("", shape_sens_spec())], SHAPE_CADENCES),
    "shape-now": ([_shape_now(t, f) for t in (0.7, 0.8, 0.9) for f in (1.25, 1.5)], NOW_CADENCES),
}

#: Healthy RLHF jobs a variant may stop per run at the fixed cadence to be chosen (under 1% of about 64).
MAX_HEALTHY_STOPS = 0.5
#: The most extra evaluation GPU time a chosen cadence may spend against the same detector at the fixed cadence.
MAX_EVAL_GPU_RISE = 0.02

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
    ("regret hacking", "regret_hacking", ".3f"),
)


def choose(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The adaptive row with the largest waste cut whose variant stops at most :data:`MAX_HEALTHY_STOPS` healthy
    jobs per run at the fixed cadence, which stops no more healthy jobs than that fixed row, and whose evaluation
    GPU time is at most :data:`MAX_EVAL_GPU_RISE` above it; None if no row qualifies."""
    fixed = {r["variant"]: r for r in rows if r.get("cadence") == "fixed"}
    ok = [
        r
        for r in rows
        if r.get("cadence") not in (None, "fixed", "-")
        and fixed[r["variant"]]["false_stops"] <= MAX_HEALTHY_STOPS
        and r["false_stops"] <= fixed[r["variant"]]["false_stops"]
        and r["eval_gpu_h"] <= (1.0 + MAX_EVAL_GPU_RISE) * fixed[r["variant"]]["eval_gpu_h"]
    ]
    return max(ok, key=lambda r: r["wasted_reduction_pct"]) if ok else None


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
        choices=tuple(DETECTOR_RUNS),
        default="paper",
        help="EvalStop's detector: the paper's k-decline k=2 (default), the project's default (trend) or shape-sens",
    )
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1 (default 0)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    variants, cadences = DETECTOR_RUNS[args.detector]
    with ProcessRunner(args.workers) as runner:
        for sigma in (float(s) for s in args.sigmas.split(",")):
            rows: list[dict[str, Any]] = []
            for label, detector in variants:
                got = cadence_comparison(
                    replace(WorkloadConfig(), sigma=sigma),
                    range(args.first_seed, args.first_seed + args.seeds),
                    detector=detector,
                    cadences=cadences,
                    eval_cost=args.eval_cost,
                    runner=runner,
                )
                rows += [{**r, "variant": label} for r in (got if not rows else got[1:])]  # one Oracle row
            print(
                f"\nsigma {sigma:g}, seeds {args.first_seed}-{args.first_seed + args.seeds - 1}, SRTF-Est, "
                f"{args.detector} detector, eval cost "
                f"{args.eval_cost:g} of an interval\n"
            )
            print("| policy | " + " | ".join(c[0] for c in COLUMNS) + " |")
            print("|---|" + "---:|" * len(COLUMNS))
            for r in rows:
                parts = [p for p in (r["variant"], r["cadence"]) if p]
                name = "Oracle" if r["stop"] == "oracle" else "EvalStop, " + ", ".join(parts)
                cells = ["-" if r[key] is None else format(r[key], fmt) for _, key, fmt in COLUMNS]
                print(f"| {name} | " + " | ".join(cells) + " |")
            pick = choose([r for r in rows if r["stop"] != "oracle"])
            print(
                "\nchosen on these seeds (largest waste cut; fixed-cadence healthy stops <= "
                f"{MAX_HEALTHY_STOPS:g} per run, no more with the hint, eval GPU <= +{100 * MAX_EVAL_GPU_RISE:g}%): "
                + ("none" if pick is None else f"{pick['variant'] or args.detector}, {pick['cadence']}")
            )
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
