"""What ``evalstop-sim detectors`` prints and writes: the comparison tables (report.md) and the PNG plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

# -- output ------------------------------------------------------------------------------------------------------

STUDY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("detector", "detector", "s"),
    ("precision", "precision", "pct"),
    ("recall", "recall", "pct"),
    ("fpr", "FPR", "pct"),
    ("fpr_healthy_rlhf", "FPR healthy RLHF", "pct"),
    ("delay_median_evals", "median delay (evals)", "f1"),
    ("regret", "regret", "f3"),
    ("jct_gain_pct", "JCT gain", "gain"),
    ("wasted_reduction_pct", "wasted cut", "gain"),
)


def study_markdown(results: Mapping[str, Any], command: str, with_ci: bool = True) -> str:
    """The report: one table per experiment and the per-trace summary."""
    from platform_sim.sim.report import markdown_table

    parts = [
        f"# Detector comparison\n\nCommand: `{command}`; {results['config']['seeds']} seeds, base "
        f"{results['config']['base']}.\n",
        "Detectors: " + "; ".join(f"{d['label']} `{d['spec']}`" for d in results["config"]["detectors"]) + ".\n",
    ]
    for name, lead in (
        ("noise", (("sigma", "sigma", "f2"),)),
        ("hack_rate", (("hack_rate", "hack rate", "pct"),)),
        ("plateau", (("sigma", "sigma", "f2"),)),
        ("real", ()),
    ):
        if results[name]:
            parts.append(f"## {name}\n\n" + markdown_table(results[name], STUDY_COLUMNS, lead, with_ci) + "\n")
    if results["real_summary"]:
        lines = [
            "| detector | hacking stopped | healthy stopped | median delay | worst regret |",
            "|---|---|---|---|---|",
        ]
        for s in results["real_summary"]:
            med = "-" if s["delay_median_evals"] is None else f"{s['delay_median_evals']:g}"
            reg = "-" if s["max_regret_pct"] is None else f"{s['max_regret_pct']:.1f}%"
            lines.append(
                f"| {s['detector']} | {s['hacking_stopped']}/{s['hacking']} | "
                f"{s['healthy_stopped']}/{s['healthy']} | {med} | {reg} |"
            )
        parts.append("## real traces, detector on each trace\n\n" + "\n".join(lines) + "\n")
    if results["config"].get("real_missing"):
        parts.append(f"Real traces not used: {results['config']['real_missing']}\n")
    return "\n".join(parts)


def write_study_plots(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """``detectors_<experiment>.png``: precision, recall and JCT gain against the swept parameter, per detector."""
    import matplotlib

    from platform_sim.sim.report import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, param, xlabel in (
        ("noise", "sigma", "eval noise sigma"),
        ("hack_rate", "hack_rate", "hacking rate"),
        ("plateau", "sigma", "eval noise sigma (healthy runs plateau)"),
    ):
        rows = results[name]
        if not rows:
            continue
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
        for label in dict.fromkeys(r["detector"] for r in rows):
            mine = [r for r in rows if r["detector"] == label]
            xs = [r[param] for r in mine]
            for ax, (metric, scale) in zip(
                axes, (("precision", 100), ("recall", 100), ("delay_median_evals", 1), ("jct_gain_pct", 1))
            ):
                ax.plot(
                    xs,
                    [(r[metric] if r[metric] is not None else np.nan) * scale for r in mine],
                    marker="o",
                    label=label,
                )
        for ax, ylabel in zip(axes, ("precision (%)", "recall (%)", "median delay (evals)", "JCT gain (%)")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Detectors, {name} ({results['config']['seeds']} seeds, base {results['config']['base']})")
        written.append(save_figure(fig, out_dir / f"detectors_{name}.png", dpi=100))
    return written
