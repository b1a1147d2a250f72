"""Detection on the shipped real traces vs synthetic curves, and the figures of docs/results/real-traces.md.

Prints Markdown: the corpus (one row per trace), per-trace detection for the paper's bare rule and for tolerances,
and EvalStop's platform metrics on real traces (``replay``) beside the synthetic simulator's on the same detector.
Writes ``docs/img/real-traces-*.png``.

    python benchmarks/real_traces.py [--traces DIR] [--environment NAME] [--seeds 10] [--img docs/img]

Tolerances are in the traces' own units, so the tables use the traces of one environment (``--environment``; default:
the traces without one if there are any, else the most common environment).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.experiments import PolicySpec, rows_for_policies
from platform_sim.sim.traces import load_traces
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.replay import replay
from platform_sim.studies.trace_detection import corpus_scale, trace_detection, trace_summary

TOLERANCES_GOLD = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
WARMUP_EVALS = 3  # a tenth of the run


def _fmt(v, pct=False, digits=1):
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def plot_grid(traces, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(traces)
    cols = 4
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.4 * rows), squeeze=False)
    for ax, t in zip(axes.flat, traces):
        ax.plot(t.steps, t.scores, "-", color="tab:green", lw=1.5)
        ax.axvline(t.peak_step, color="tab:blue", ls=":", lw=1)
        ax.set_title(f"{t.name} ({t.label})", fontsize=8, color="tab:red" if t.hacking else "black")
        ax.tick_params(labelsize=6)
        if any(p is not None for p in t.proxy):
            ax2 = ax.twinx()
            ax2.plot(t.steps, [p if p is not None else float("nan") for p in t.proxy], "--", color="tab:orange", lw=1)
            ax2.tick_params(labelsize=6, colors="tab:orange")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(
        "Recorded traces: held-out gold (green, left axis) and held-out proxy (orange dashed, right axis); "
        "dotted: gold peak",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--img", default="docs/img")
    ap.add_argument("--tolerance", type=float, default=0.1, help="the tolerance (gold points) of the side-by-side")
    ap.add_argument("--environment", default=None, help="the environment whose traces the tables use")
    ns = ap.parse_args(argv)
    t0 = time.perf_counter()
    folder = Path(ns.traces) if ns.traces else corpus_dir("real")
    traces = load_traces(folder)
    env = ns.environment
    if env is None and all(t.environment for t in traces):
        counts = {e: sum(t.environment == e for t in traces) for e in {t.environment for t in traces if t.environment}}
        env = max(sorted(counts), key=lambda e: counts[e])
    traces = [t for t in traces if t.environment == env]
    if not traces:
        raise SystemExit(f"no trace of environment {env!r} in {folder}")
    scale = corpus_scale(traces)  # one environment: one unit, one map (what replay uses per environment)
    print(
        f"# Real traces: {len(traces)} from {folder} (environment {env or 'unnamed'}); platform scale: gold "
        f"{scale.lo:.2f} -> 0, "
        f"{scale.hi:.2f} -> 1 (1 gold point = {1 / scale.span:.4f})\n"
    )

    print("## Corpus\n")
    print("| trace | algo | label | evals | first | peak (step) | final | proxy at peak | proxy at end | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in traces:
        pp = t.proxy[t.peak_index]
        wall = t.wall_s[-1]
        print(
            f"| {t.name} | {t.algo} | {t.label} | {len(t.steps)} | {t.scores[0]:.2f} | {t.peak_score:.2f} "
            f"({t.peak_step}) | {t.scores[-1]:.2f} | {_fmt(pp, digits=2)} | {_fmt(t.proxy[-1], digits=2)} | "
            f"{_fmt(wall, digits=0)} |"
        )

    print("\n## Per-trace detection, k=2, by tolerance (min_delta in gold points)\n")
    print(
        "| min_delta (gold) | min_delta (0-1 scale) | warm-up (evals) | hacking stopped | "
        "healthy stopped | median delay (evals) | max delay | worst regret of a stopped hacking trace |"
    )
    print("|---|---|---|---|---|---|---|---|")
    per_tol = {}
    for tol, warm in [(t, 0) for t in TOLERANCES_GOLD] + [(0.0, WARMUP_EVALS), (ns.tolerance, WARMUP_EVALS)]:
        det = {"name": "k-decline", "params": {"k": 2, "min_delta": tol / scale.span, "warmup": warm}}
        rows = [trace_detection(t, det, scale) for t in traces]
        s = trace_summary(rows)
        if not warm:
            per_tol[tol] = rows
        print(
            f"| {tol:g} | {tol / scale.span:.4f} | {warm} | {s['hacking_stopped']}/{s['hacking']} | "
            f"{s['healthy_stopped']}/{s['healthy']} | {_fmt(s['median_delay_evals'])} | "
            f"{_fmt(s['max_delay_evals'])} | {_fmt(s['max_regret_pct_stopped_hacking'])}% |"
        )

    for tol, warm in ((0.0, 0), (ns.tolerance, WARMUP_EVALS)):
        print(f"\n### Per trace, min_delta {tol:g} gold, warm-up {warm} evals\n")
        print("| trace | label | stopped | stop_step | best_step | peak_step | delay_evals | regret_pct |")
        print("|---|---|---|---|---|---|---|---|")
        for r in [
            trace_detection(
                t, {"name": "k-decline", "params": {"k": 2, "min_delta": tol / scale.span, "warmup": warm}}, scale
            )
            for t in traces
        ]:
            print(
                f"| {r['trace']} | {r['label']} | {'yes' if r['stopped'] else 'no'} | {_fmt(r['stop_step'])} | "
                f"{r['best_step']} | {r['peak_step']} | {_fmt(r['delay_evals'])} | {_fmt(r['regret_pct'])} |"
            )

    print(f"\n## Platform: EvalStop on SRTF-Est, real traces (replay) vs synthetic curves, {ns.seeds} seeds\n")
    print(
        "| curves | min_delta (0-1) | warm-up | precision | recall | FPR healthy RLHF | delay (evals) | JCT gain | "
        "wasted cut | regret |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tol, warm in ((0.0, 0), (ns.tolerance, 0), (ns.tolerance, WARMUP_EVALS)):
        det = {"name": "k-decline", "params": {"k": 2, "min_delta": tol / scale.span, "warmup": warm}}
        real = replay(traces, WorkloadConfig(), det, ns.seeds)
        ev = next(r for r in real["main"] if r["stop"] == "evalstop")
        syn = rows_for_policies(WorkloadConfig(), [PolicySpec(stop="evalstop", detector=det)], range(ns.seeds))[0]
        for name, r in (("real traces", ev), ("synthetic (default workload)", syn)):
            print(
                f"| {name} | {tol / scale.span:.4f} | {warm} | {_fmt(r['precision'], True)} | {_fmt(r['recall'], True)} | "
                f"{_fmt(r['fpr_healthy_rlhf'], True)} | {_fmt(r['delay_evals'], digits=2)} | "
                f"{_fmt(r['jct_gain_pct'])}% | {_fmt(r['wasted_reduction_pct'])}% | {_fmt(r['regret'], digits=3)} |"
            )

    img = Path(ns.img)
    img.mkdir(parents=True, exist_ok=True)
    plot_grid(traces, img / "real-traces-grid.png")
    print(f"\nfigures: {img / 'real-traces-grid.png'}; {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
