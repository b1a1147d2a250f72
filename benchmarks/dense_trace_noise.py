"""What a rule that reads a drop from the best faces on the dense real traces: drawdowns, and the eval's own noise.

Part of ``benchmarks/cadence_dense_traces.py`` (its ``--drawdowns`` and ``--eval-noise`` tables, described there):
:func:`drawdowns` compares the largest dip a healthy trace ever shows with each hacking trace's dip a few steps after
its true peak; :func:`eval_noise` splits the evals of traces recorded with a larger eval set into independent evals of
the default size, to measure how much of an eval's movement is sampling noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from platform_sim.sim.traces import RealTrace, sub_evals
from platform_sim.studies.dense_replay import smoothed_peak_step

#: Steps after the true peak at which ``--drawdowns`` reads each hacking trace's drawdown (8: half the fixed cadence's
#: 16-step median delay on the test traces, the issue's target).
DRAWDOWN_STEPS = (4, 6, 8)


def drawdowns(
    traces: list[RealTrace], every: int, smooth: int = 3, truth: dict[str, RealTrace] | None = None
) -> dict[str, Any]:
    """What any rule that reads a drop from the best faces: the drawdown of the ``smooth``-step mean of the scores
    (running best minus current), the largest a healthy trace ever shows, against each hacking trace's at
    :data:`DRAWDOWN_STEPS` steps after its true peak (:func:`smoothed_peak_step` over ``every`` steps).

    A rule that never stops a healthy trace must not fire below the largest healthy drawdown, so it can stop a hacking
    trace within ``n`` steps of its peak only where that trace's drawdown there is above it.

    ``truth`` maps a trace's name to the trace whose label and true peak it takes (a sub-eval of a larger eval: the
    larger eval's); by default its own."""
    out: dict[str, Any] = {"healthy_max": {}, "hacking": {}}
    for t in traces:
        ref = (truth or {}).get(t.name, t)
        s = np.convolve(np.asarray(t.scores, dtype=float), np.ones(smooth) / smooth, mode="valid")
        dd = np.maximum.accumulate(s) - s  # dd[i]: the mean of steps i..i+smooth-1 against the best such mean so far
        if ref.label == "healthy":
            out["healthy_max"][t.name] = round(float(dd.max()), 3)
        elif ref.label == "hacking":
            i = t.steps.index(smoothed_peak_step(ref, every))
            # the mean that ends n steps after the peak
            out["hacking"][t.name] = {
                n: round(float(dd[min(len(dd) - 1, max(0, i + n - smooth + 1))]), 3) for n in DRAWDOWN_STEPS
            }
    bar = max(out["healthy_max"].values(), default=0.0)
    out["bar"] = bar
    out["stopped_within"] = {n: sum(d[n] > bar for d in out["hacking"].values()) for n in DRAWDOWN_STEPS}
    return out


def _drawdown_head(lead: list[str], text: int = 1) -> list[str]:
    """Header and rule of a drawdown table: the ``lead`` columns (the first ``text`` of them left-aligned), then the
    bar and the hacking traces past it."""
    cols = [*lead, "largest healthy drawdown", *(f"hacking above it {n} steps after the peak" for n in DRAWDOWN_STEPS)]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * text + "---:|" * (len(cols) - text)]


def _drawdown_cells(d: dict[str, Any], n_hack: int) -> str:
    """A :func:`drawdowns` result's cells: the bar, then per step count the hacking traces past it."""
    return " | ".join([f"{d['bar']:.2f}", *(f"{d['stopped_within'][n]}/{n_hack}" for n in DRAWDOWN_STEPS)])


def drawdown_lines(by_split: dict[str, list[RealTrace]], every: int) -> tuple[dict[str, Any], list[str]]:
    """``--drawdowns`` per split: the results and their markdown lines."""
    res = {split: drawdowns(ts, every) for split, ts in by_split.items()}
    lines = ["\n## Drawdowns: healthy dips against early hacking declines (3-step means)\n"]
    lines += _drawdown_head(["split"])
    for split, r in res.items():
        lines.append(f"| {split} | {_drawdown_cells(r, len(r['hacking']))} |")
    return res, lines


def eval_noise(traces: list[RealTrace], every: int) -> dict[str, Any]:
    """What a larger eval set changes, on traces recorded with one (see ``--eval-noise``)."""
    out: dict[str, Any] = {}
    for split in ("tune", "test"):
        full = [t for t in traces if t.split == split]
        if not full:
            continue
        try:
            subs = [sub_evals(t) for t in full]
        except ValueError as exc:
            raise SystemExit(f"--eval-noise: {exc}") from None
        n_sub = len(subs[0])
        # The sampling noise of one small eval with the policy held fixed: the spread of the sub-evals of one step.
        spread = [np.var([s.scores[i] for s in ss], ddof=1) for ss in subs for i in range(len(ss[0].scores))]
        per_example = [np.var(e, ddof=1) / len(e) for ss in subs for s in ss for e in s.examples if e is not None]
        se_small = float(np.sqrt(np.mean(spread)))
        small = [
            drawdowns([ss[j] for ss in subs], every, truth={ss[j].name: t for ss, t in zip(subs, full)})
            for j in range(n_sub)
        ]
        out[split] = {
            "runs": len(full),
            "completions": {"small": len(subs[0][0].examples[0] or ()), "large": len(full[0].examples[0] or ())},
            "sub_evals": n_sub,
            "se_small": {
                "replicates": round(se_small, 4),
                "per_example": round(float(np.sqrt(np.mean(per_example))), 4),
            },
            "se_large": round(se_small / np.sqrt(n_sub), 4),
            "drawdowns_small": small,
            "drawdowns_large": drawdowns(full, every),
        }
    return out


def eval_noise_lines(res: dict[str, Any]) -> list[str]:
    """``--eval-noise``'s markdown lines: per split, the large eval and each of its small sub-evals."""
    lines = ["\n## A larger eval set: the same runs, each eval split into evals of the default size\n"]
    lines += _drawdown_head(["split", "eval", "completions", "standard error of the eval mean"], text=2)
    for split, r in res.items():
        n_hack = len(r["drawdowns_large"]["hacking"])
        rows = [("all", r["completions"]["large"], f"{r['se_large']:.3f}", r["drawdowns_large"])]
        se = f"{r['se_small']['replicates']:.3f} ({r['se_small']['per_example']:.3f})"
        rows += [(f"sub-eval {j}", r["completions"]["small"], se, d) for j, d in enumerate(r["drawdowns_small"])]
        for label, n, se_cell, d in rows:
            lines.append(f"| {split} | {label} | {n} | {se_cell} | {_drawdown_cells(d, n_hack)} |")
    lines.append(
        "\n(standard error of a sub-eval: from the spread of the sub-evals of one step, the policy held fixed; in "
        "brackets from the per-example scores. The large eval's: the sub-evals' divided by the square root of their "
        "number. Labels and true peaks: the large eval's, for every row.)"
    )
    return lines
