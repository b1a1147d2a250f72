"""The paper's main and composability tables on synthetic and on real-calibrated RLHF curves, side by side.

Fits the RLHF curve shapes and noise of a trace folder (only its tune split when the traces carry one; see
``platform_sim/sim/curve_fit.py``), prints the fitted traces and the calibration, then runs ``evalstop-sim paper``'s
experiment twice on the same seeds (synthetic curves, the default; real-calibrated curves, ``--curves real``) and
prints the main table (on SRTF-Est) and the composability table of each, one above the other, as Markdown. Then a few
variants of the real-calibrated workload (the corpus's own hack rate; the residual noise estimate instead of the
per-example one). This is the table behind "Real-calibrated curves" in docs/simulation.md.

    python benchmarks/real_curves.py --seeds 100 [--traces DIR] [--job-types rlhf|all|rlhf,dpo] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from platform_sim.core import default_spec
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.curve_fit import calibration_from_folder
from platform_sim.sim.eval_scores import observation_for
from platform_sim.sim.experiments import PaperConfig, PolicySpec, paper, rows_for_policies
from platform_sim.sim.report import markdown_table
from platform_sim.sim.runner import SerialRunner
from platform_sim.sim.workload import WorkloadConfig

COLUMNS = (
    ("stop", "stop", "s"),
    ("precision", "precision", "pct"),
    ("recall", "recall", "pct"),
    ("fpr", "FPR", "pct"),
    ("fpr_healthy_rlhf", "FPR healthy RLHF", "pct"),
    ("jct_mean_h", "mean JCT (h)", "f2"),
    ("jct_gain_pct", "JCT gain", "gain"),
    ("wasted_gpu_h", "wasted GPU-h", "f0"),
    ("wasted_reduction_pct", "wasted cut", "gain"),
    ("regret", "regret", "f3"),
    ("delay_evals", "delay (evals)", "f2"),
)
"""The columns printed (``--json`` keeps every field of every row)."""

ROW = (
    "| {name} | {precision:.1%} | {recall:.1%} | {fpr:.1%} | {fpr_healthy_rlhf:.1%} | {jct_gain_pct:+.1f}% | "
    "{wasted_reduction_pct:+.1f}% | {delay_evals:.2f} | {regret:.3f} |"
)


def _fmt_fit(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _with_curves(rows: Sequence[dict[str, Any]], curves: str) -> list[dict[str, Any]]:
    return [{"curves": curves, **r} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--traces", default=None, help="trace folder (default: the shipped corpus)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write every row and the calibration here")
    ap.add_argument(
        "--job-types", default="rlhf", help="comma-separated job types of the traces to fit, or 'all' (default rlhf)"
    )
    args = ap.parse_args()
    folder = args.traces or corpus_dir("real")
    job_types = None if args.job_types == "all" else tuple(args.job_types.split(","))
    cal, fits = calibration_from_folder(folder, job_types=job_types)
    cal_res, _ = calibration_from_folder(folder, job_types=job_types, noise="residual")
    print(
        f"Calibration: {len(fits)} traces fitted ({len(cal.hacking)} hacking, {len(cal.healthy)} healthy), "
        f"split {cal.split!r}, hack share {cal.hack_share:.2f}\n"
    )
    print(
        "| trace | label | peak | decline (gains/progress) | drop (gains) | plateau share | noise / gain | "
        "residual noise / gain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for f in fits:
        print(
            f"| {f.name} | {f.label} | {_fmt_fit(f.peak, '.3f')} | {_fmt_fit(f.decline, '.2f')} | "
            f"{_fmt_fit(f.drop, '.2f')} | {_fmt_fit(f.plateau_share, '.3f')} | {f.noise:.3f} ({f.noise_source}) | "
            f"{f.noise_residual:.3f} |"
        )
    s = cal.summary()
    print("\n| parameter | median | min | max |\n|---|---|---|---|")
    for key in ("peak", "decline", "drop", "hacking_noise", "plateau_share", "healthy_noise"):
        print(f"| {key} | {s[key]['median']:.3f} | {s[key]['min']:.3f} | {s[key]['max']:.3f} |")

    runner = SerialRunner()
    out: dict[str, Any] = {"calibration": cal.to_dict(), "fits": [f.__dict__ for f in fits], "seeds": args.seeds}
    results = {}
    for curves, wl in (("synthetic", WorkloadConfig()), ("real", WorkloadConfig(real_curves=cal))):
        t0 = time.perf_counter()
        results[curves] = paper(PaperConfig(seeds=args.seeds, workload=wl), runner)
        results[curves]["config"]["wall_s"] = time.perf_counter() - t0
    lead = (("curves", "curves", "s"),)
    main_rows = _with_curves(results["synthetic"]["main"], "synthetic") + _with_curves(results["real"]["main"], "real")
    comp_rows = _with_curves(results["synthetic"]["composability"], "synthetic") + _with_curves(
        results["real"]["composability"], "real"
    )
    print(f"\nMain table (SRTF-Est, {args.seeds} seeds):\n")
    print(markdown_table(main_rows, COLUMNS, lead=lead, with_ci=False))
    print(f"\nComposability ({args.seeds} seeds):\n")
    print(markdown_table(comp_rows, COLUMNS, lead=lead + (("base", "base", "s"),), with_ci=False))
    out["main"], out["composability"] = main_rows, comp_rows
    out["wall_s"] = {k: r["config"]["wall_s"] for k, r in results.items()}

    real = WorkloadConfig(real_curves=cal)
    variants: list[tuple[str, WorkloadConfig, dict[str, Any] | None]] = [
        ("real, hack rate 0.6 (as the tables)", real, None),
        (f"real, the corpus's hack rate {cal.hack_share:.2f}", replace(real, hack_rate=cal.hack_share), None),
        ("real, residual noise estimate", WorkloadConfig(real_curves=cal_res), None),
        (
            "real, no smoothing (plain resampling of the traces)",
            WorkloadConfig(real_curves=replace(cal, smoothing=0.0)),
            None,
        ),
        ("synthetic, detector shape", WorkloadConfig(), {"name": "shape", "params": {}}),
        ("real, detector shape", real, {"name": "shape", "params": {}}),
        ("synthetic, detector k-decline-se", WorkloadConfig(), {"name": "k-decline-se", "params": {}}),
        ("real, detector k-decline-se", real, {"name": "k-decline-se", "params": {}}),
        ("synthetic, the default detector (tuned trend)", WorkloadConfig(), default_spec()),
        ("real, the default detector (tuned trend)", real, default_spec()),
    ]
    print(f"\nEvalStop on SRTF-Est, variants (k-decline, k=2 unless named; {args.seeds} seeds):\n")
    print("| variant | precision | recall | FPR | FPR healthy RLHF | JCT gain | wasted cut | delay (evals) | regret |")
    print("|---|---|---|---|---|---|---|---|---|")
    out["variants"] = []
    for name, wl, det in variants:
        (row,) = rows_for_policies(
            wl, [PolicySpec(stop="evalstop", detector=det)], range(args.seeds), runner, observation=observation_for(det)
        )
        print(ROW.format(name=name, **row), flush=True)
        out["variants"].append({"variant": name, **row})
    print(
        f"\nwall: synthetic {out['wall_s']['synthetic']:.1f} s, real {out['wall_s']['real']:.1f} s (whole paper "
        "experiment each)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
