"""Calibrate the detectors compared by ``evalstop-sim detectors`` on tuning seeds (never the evaluation seeds).

Grid-searches each detector family (``platform_sim.studies.detector_study.CALIBRATION_GRIDS``) on seeds 1000-1009 of
three scenarios (default workload at sigma 0.02 and 0.12, healthy plateaus at sigma 0.02) with the detection-only
fast path (same observations as the simulator), prints every feasible point and the chosen one per family, and
writes the whole grid as JSON.

    python benchmarks/calibrate_detectors.py [--out calibration.json] [--only trend,cusum] [--rule default-only]
        [--grid '{"alpha": [0.1, 0.2, 0.3]}']
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from platform_sim.studies.detector_study import CALIBRATION_GRIDS, CALIBRATION_RULES, calibrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the grid as JSON here")
    ap.add_argument("--only", default=None, help="comma-separated families to calibrate (default: all)")
    ap.add_argument(
        "--rule",
        choices=sorted(CALIBRATION_RULES),
        default="plateau-safe",
        help="selection rule (default plateau-safe)",
    )
    ap.add_argument("--grid", default=None, help='override a family\'s grid, JSON: {"alpha": [0.1, 0.2]}')
    args = ap.parse_args()
    logging.getLogger("platform_sim.core.detectors").setLevel(logging.ERROR)
    grids = CALIBRATION_GRIDS
    if args.only:
        grids = {k: v for k, v in CALIBRATION_GRIDS.items() if k in args.only.split(",")}
    t0 = time.perf_counter()
    if args.grid:
        override = json.loads(args.grid)
        grids = {k: (name, {**grid, **{p: tuple(v) for p, v in override.items()}}) for k, (name, grid) in grids.items()}
    rule = CALIBRATION_RULES[args.rule]
    res = calibrate(rule=rule, grids=grids, progress=lambda msg: print(msg, flush=True))
    print(f"\nrule: {rule}")
    for label in grids:
        feasible = [r for r in res["grid"] if r["label"] == label and r["feasible"]]
        print(f"\n{label}: {len(feasible)} feasible points")
        for r in feasible:
            cells = "  ".join(
                f"{s}: P={r[s]['precision'] or 0:.3f} R={r[s]['recall'] or 0:.3f} d={r[s]['delay_median_evals']}"
                for s in ("default_s0.02", "default_s0.12", "plateau_s0.02")
            )
            print(f"  {r['spec']['params']}  {cells}")
        print(f"  chosen: {res['chosen'][label]}")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
