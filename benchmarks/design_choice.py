"""The error-control design for the default's trend test, chosen on the tuning data (``benchmarks/dense_noisy.py``).

Candidates: :class:`~error_control.ProgressTrend` over its spending rules, noise estimates, window fractions and
alphas (:data:`GRID`). Each is replayed on the *tuning* data only: the synthetic healthy runs of seeds ``0..`` (both
curve families, 20/120/300 evals per run, noise 5% and 25% of the gain), the healthy dense traces of the ``tune``
environment (every 1, 2, 5 steps), and for recall the synthetic hacking runs of seeds ``0..`` (20 evals, noise 5% and
10%) and the real corpus's ``tune`` hacking traces. Rule: among the candidates that meet the healthy targets in every
tuning cell (<= 5% stopped, no stop costing > 10% of the gain), the one with the most hacking runs stopped (ties:
the smaller median delay). :data:`CHOSEN` is what that rule picked (the printout of ``python
benchmarks/design_choice.py``); ``dense_noisy.py --designs --split test`` judges it on held-out data.

    python benchmarks/design_choice.py [--runs 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from dense_noisy import DetectorFactory, Run, dense_traces, hacking_rows, healthy_grid, summary
from error_control import ProgressTrend


def factory(**params: Any) -> DetectorFactory:
    """A :class:`ProgressTrend` per run; ``spend="planned"`` gets the run's planned number of evals."""

    def make(run: Run) -> ProgressTrend:
        planned = params.get("spend") == "planned" or params.get("window_basis") == "planned"
        extra: dict[str, Any] = {"planned_evals": len(run.steps)} if planned else {}
        if params.get("min_progress"):
            extra["planned_steps"] = run.steps[-1]  # a run's last eval is at its last planned step
        return ProgressTrend(**params, **extra)

    return make


def label(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in p.items())


GRID: list[dict[str, Any]] = [
    {
        "spend": "planned",
        "noise": "pooled",
        "frac": frac,
        "alpha": alpha,
        "rel_drop": rel,
        "rho": rho,
        "window_basis": wb,
    }
    for wb in ("seen", "planned")
    for rho in (1.0, 2.0)
    for alpha in (0.05, 0.01)
    for frac in (0.2,)
    for rel in (0.2,)
] + [  # second round around the pick (GRID[6]): larger alpha, other windows and materiality
    {
        "spend": "planned",
        "noise": "pooled",
        "frac": frac,
        "alpha": alpha,
        "rel_drop": rel,
        "rho": 2.0,
        "window_basis": "planned",
    }
    for alpha in (0.1,)
    for frac in (0.15, 0.2, 0.25)
    for rel in (0.1, 0.2)
]

#: The design chosen on the tuning data by :func:`main` (``--runs 100``). No candidate met the healthy targets on
#: every tuning cell (2-3 of the 33 healthy dense ``tune`` traces are stopped at every step and every 2nd step by
#: every one of them, one stop costing 10-12% of the gain), so the rule fell back to: fewest cells missed, then most
#: hacking runs stopped. Round 1 (GRID[0:8], 12:43 UTC) picked GRID[6]: spending F(p) = p^2 over the planned looks,
#: a window of a fifth of the planned evals, run alpha 0.05, materiality 0.2; it was judged on held-out data as
#: ``progress (planned)``. Round 2 (GRID[8:], 13:14 UTC: alpha 0.1, other windows and materiality) picked GRID[10]
#: (alpha 0.1, materiality 0.1): ``progress (planned, round 2)``. The best anytime candidate of the first grid
#: (``epochs``: needs no planned length; window a fifth of the steps seen so far) is kept beside them.
_PLANNED = {"spend": "planned", "noise": "pooled", "frac": 0.2, "rho": 2.0, "window_basis": "planned"}
CHOSEN_PARAMS: dict[str, dict[str, Any]] = {
    "progress (planned)": {**_PLANNED, "alpha": 0.05, "rel_drop": 0.2},
    "progress (planned, round 2)": {**_PLANNED, "alpha": 0.1, "rel_drop": 0.1},
    "progress (anytime)": {"spend": "epochs", "noise": "pooled", "frac": 0.2, "alpha": 0.05, "rel_drop": 0.2},
}
CHOSEN: dict[str, DetectorFactory] = {name: factory(**p) for name, p in CHOSEN_PARAMS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--only", type=int, nargs="*", help="indices into GRID")
    args = ap.parse_args()
    traces = dense_traces("tune")
    results = []
    for i, p in enumerate(GRID):
        if args.only and i not in args.only:
            continue
        t0 = time.perf_counter()
        dets = {label(p): factory(**p)}
        rows = healthy_grid(dets, "tune", args.runs, densities=(20, 50, 120, 300), noises=(0.05, 0.25), traces=traces)
        s = summary(rows)[label(p)]
        h = hacking_rows(dets, "tune", args.runs)
        stopped = sum(r["stopped"] for r in h)
        total = sum(r["runs"] for r in h)
        delays = [r["median_delay"] for r in h if r["median_delay"] is not None]
        results.append((s["missed"], -stopped, statistics.median(delays) if delays else 99, label(p)))
        per = "; ".join(f"{r['source']}: {r['stopped']}/{r['runs']} d={r['median_delay']}" for r in h)
        print(
            f"[{i}] {label(p)}: missed {s['missed']}/{s['cells']} (worst {s['worst_share']:.0%} stopped, cost "
            f"{s['worst_cost']:.0%}); hacking {stopped}/{total} ({per}) [{time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
        for r in rows:
            if not r["ok"]:
                print(
                    f"    missed: {r['source']} N={r['evals']} noise={r['noise']}: {r['stopped']}/{r['runs']} "
                    f"({r['costly']} costly, worst {r['worst_cost']:.0%})"
                )
    ok = sorted(r for r in results if r[0] == 0)
    if ok:
        print("\nchosen:", ok[0][3])
    else:
        print("\nnone meets the healthy targets on every tuning cell; fewest missed, then recall:", min(results)[3])


if __name__ == "__main__":
    main()
