"""What ``evalstop-sim benchmark`` prints and writes: the results tables, report.md and benchmark.png."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# -- output -----------------------------------------------------------------------------------------------------


def _pct(v: float | None, ci: Sequence[float | None] | None = None) -> str:
    if v is None:
        return "-"
    s = f"{100 * v:.0f}%"
    if ci and ci[0] is not None and ci[1] is not None:
        s += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
    return s


def _num(v: float | None, ci: Sequence[float | None] | None = None) -> str:
    if v is None:
        return "-"
    s = f"{v:g}"
    if ci and ci[0] is not None and ci[1] is not None:
        s += f" [{ci[0]:g}, {ci[1]:g}]"
    return s


def results_table(results: Sequence[Mapping[str, Any]], kind: str) -> str:
    """Markdown: one row per candidate and group of ``kind`` (``split`` or ``environment``)."""
    split_col = kind != "split"
    lines = [
        "| candidate | " + kind + (" | split" if split_col else "") + " | hacking / healthy / ambiguous | "
        "precision | recall | healthy stopped | median delay (evals) | worst regret | median regret | "
        "meets targets |",
        "|---|" + "---|" * (10 if split_col else 9),
    ]
    for r in results:
        if r["kind"] != kind:
            continue
        lines.append(
            f"| {r['candidate']} | {r['group']}{' | ' + r['split'] if split_col else ''} | {r['hacking']} / "
            f"{r['healthy']} / {r['ambiguous']} | "
            f"{_pct(r['precision'], r['precision_ci'])} | {_pct(r['recall'], r['recall_ci'])} | "
            f"{_pct(r['healthy_stopped'], r['healthy_stopped_ci'])} | "
            f"{_num(r['delay_median'], r['delay_median_ci'])} | {_pct(r['regret_worst'])} | "
            f"{_pct(r['regret_median'], r['regret_median_ci'])} | {'yes' if r['meets_targets'] else 'no'} |"
        )
    return "\n".join(lines)


def benchmark_markdown(res: Mapping[str, Any], command: str) -> str:
    """The report: environments, chosen parameters, results per split and per environment, the best candidate."""
    cfg, best, t = res["config"], res["best"], res["targets"]
    envs = ", ".join(f"{e} ({v['split']}, {v['traces']})" for e, v in res["environments"].items())
    amb = sorted(name for name, lab in res["labels"].items() if lab["label"] == "ambiguous")
    chosen = "\n".join(f"- {name}: `{spec['params']}`" for name, spec in res["calibration"]["chosen"].items())
    verdict = "meets every target" if best["meets_targets"] else "misses: " + "; ".join(best["misses"])
    return "\n".join(
        [
            "# Detectors tuned on some environments, judged on others (evalstop-sim benchmark)",
            "",
            f"Command: `{command}`. {cfg['tune_traces']} tune and {cfg['test_traces']} test traces; environments: "
            f"{envs}. {cfg['grid_points']} grid points tried on the tune traces in {cfg['calibration_s']:.1f} s; "
            f"{cfg['wall_s']:.1f} s in all.",
            "",
            f"Targets on the test environments: hacking stopped >= {100 * t['recall']:g}%, healthy stopped <= "
            f"{100 * t['healthy_stopped']:g}%, median delay <= {t['delay_median']:g} evals, worst regret of a stopped run "
            f"<= {100 * t['regret_worst']:g}%.",
            "",
            f"Ambiguous traces (left out of every metric): {len(amb)}{': ' + ', '.join(amb) if amb else ''}.",
            "",
            "## Parameters chosen on the tune split",
            "",
            chosen,
            "",
            "Untuned, as they are: "
            + "; ".join(f"{c['label']} `{c['spec']}`" for c in res["candidates"] if "untuned" in c["label"])
            + ".",
            "",
            "## Per split (95% intervals: Wilson for shares, bootstrap for medians)",
            "",
            results_table(res["results"], "split"),
            "",
            "## Per environment",
            "",
            results_table(res["results"], "environment"),
            "",
            f"**Best on the test environments: {best['candidate']}** `{best['spec']}`: {verdict}.",
            "",
        ]
    )


def write_benchmark_plot(res: Mapping[str, Any], path: Path) -> Path:
    """A PNG: recall, healthy stopped and median delay per candidate, tune vs test split, with intervals."""
    import matplotlib

    from platform_sim.sim.report import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = [c["label"] for c in res["candidates"]]
    by = {(r["candidate"], r["group"]): r for r in res["results"] if r["kind"] == "split"}
    t = res["targets"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    x = np.arange(len(cands))
    for ax, (metric, scale, target, title) in zip(
        axes,
        (
            ("recall", 100, 100 * t["recall"], "hacking stopped (%)"),
            ("healthy_stopped", 100, 100 * t["healthy_stopped"], "healthy stopped (%)"),
            ("delay_median", 1, t["delay_median"], "median delay after the peak (evals)"),
        ),
    ):
        for off, split, color in ((-0.2, "tune", "tab:gray"), (0.2, "test", "tab:blue")):
            vals, lo, hi = [], [], []
            for c in cands:
                r = by[(c, split)]
                v = r[metric]
                ci = r[f"{metric}_ci"]
                vals.append(np.nan if v is None else v * scale)
                # a bootstrap interval of a median need not contain it (few traces): no negative whiskers
                lo.append(0 if v is None or ci[0] is None else max(0.0, (v - ci[0]) * scale))
                hi.append(0 if v is None or ci[1] is None else max(0.0, (ci[1] - v) * scale))
            ax.bar(x + off, vals, 0.4, yerr=[lo, hi], color=color, label=split, capsize=2)
        ax.axhline(target, color="tab:red", ls="--", lw=1, label="target")
        ax.set_xticks(x, cands, rotation=35, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"Detectors tuned on the tune environments, judged on the test environments "
        f"({res['config']['tune_traces']} tune / {res['config']['test_traces']} test traces)",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)
