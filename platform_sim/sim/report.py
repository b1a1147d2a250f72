"""Human output of the simulator: Markdown tables, the paper report and its PNG plots.

Pure formatting from the plain rows of :func:`~platform_sim.sim.metrics.metric_row`; the only I/O is in
:func:`write_paper_report`, which writes ``report.md``, ``results.json`` and ``*.png`` into a directory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from platform_sim.core.detectors import spec_plan_matters

logger = logging.getLogger(__name__)

PAPER_REFERENCE: dict[str, Any] = {
    "evalstop": {"precision": 0.983, "recall": 0.993, "fpr": 0.015, "jct_gain_pct": 9.4, "wasted_reduction_pct": 21.8},
    "stop-at-p": {"precision": 0.571, "fpr": 0.645},
    "loss-plateau": {"precision": 0.570, "recall": 0.383},
    "composability_jct_gain_pct": (8.9, 25.2),
    "noise_precision": {0.01: 1.0, 0.12: 0.81},
    "hack_rate_min_precision": 0.89,
}
"""The paper's published figures (docs/design.md section 6), printed beside ours."""

MAIN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("stop", "stop", "s"),
    ("precision", "precision", "pct"),
    ("recall", "recall", "pct"),
    ("fpr", "FPR", "pct"),
    ("fpr_healthy_rlhf", "FPR healthy RLHF", "pct"),
    ("jct_mean_h", "mean JCT (h)", "f2"),
    ("jct_gain_pct", "JCT gain", "gain"),
    ("jct_p95_h", "p95 JCT (h)", "f1"),
    ("wasted_gpu_h", "wasted GPU-h", "f0"),
    ("wasted_reduction_pct", "wasted cut", "gain"),
    ("regret", "regret", "f3"),
    ("delay_evals", "delay (evals)", "f2"),
    ("utilization", "util.", "pct"),
    ("p_value_jct_ttest", "p (JCT, t)", "p"),
)


def _fmt(value: Any, kind: str, ci: float | None = None) -> str:
    if value is None:
        return "-"
    if kind == "s":
        return str(value)
    if kind == "p":
        return f"{value:.1e}" if value < 0.001 else f"{value:.3f}"
    if kind == "pct":
        s = f"{100 * value:.1f}%"
        return s + (f" ±{100 * ci:.1f}" if ci is not None else "")
    if kind == "gain":
        s = f"{value:+.1f}%"
        return s + (f" ±{ci:.1f}" if ci is not None else "")
    digits = int(kind[1:])
    s = f"{value:.{digits}f}"
    return s + (f" ±{ci:.{digits}f}" if ci is not None else "")


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str]] = MAIN_COLUMNS,
    lead: Sequence[tuple[str, str, str]] = (),
    with_ci: bool = True,
) -> str:
    """A Markdown table of ``rows``: ``lead`` columns first (e.g. the swept parameter), then ``columns``.

    Each column is ``(field, header, format)``; formats: ``s`` text, ``pct`` fraction as percent, ``gain`` percent
    value with sign, ``fN`` float with N digits, ``p`` p-value. With ``with_ci`` the 95% half-width follows the mean.
    """
    cols = list(lead) + list(columns)
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        ci = r.get("ci95", {}) if with_ci else {}
        lines.append("| " + " | ".join(_fmt(r.get(f), k, ci.get(f)) for f, _, k in cols) + " |")
    return "\n".join(lines)


def _paper_main_comparison(main: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| policy | metric | paper | ours |", "|---|---|---|---|"]
    for r in main:
        ref = PAPER_REFERENCE.get(r["stop"])
        if not isinstance(ref, dict):
            continue
        for metric, paper_value in ref.items():
            ours = r.get(metric)
            kind = "gain" if metric.endswith("_pct") else "pct"
            paper_s = _fmt(paper_value, kind)
            lines.append(f"| {r['stop']} | {metric} | {paper_s} | {_fmt(ours, kind)} |")
    return "\n".join(lines)


def paper_markdown(results: Mapping[str, Any], command: str = "evalstop-sim paper") -> str:
    """The whole paper report as Markdown."""
    cfg = results["config"]
    wl = cfg["workload"]
    out = [
        "# EvalStop paper reproduction (simulator)",
        "",
        f"Command: `{command}`. {cfg['seeds']} seeds; each figure is the mean over seeds with its 95% confidence "
        "half-width (Student t). JCT gain and wasted-compute cut are paired per seed against the same base "
        "scheduler with no stop policy; `p (JCT, t)` is the two-sided paired t-test of mean JCT, base vs base + "
        "policy (the Wilcoxon p-value is in results.json).",
        "",
        f"Default point: {wl['gpus']} GPUs, {wl['n_jobs']} jobs, mix {wl['mix']}, sigma {wl['sigma']}, "
        f"hack rate {wl['hack_rate']}, {wl['n_evals']} evals per run, load {wl['load']}, detector "
        f"`{json.dumps(cfg['detector'])}`, base {cfg['base']}. Model and calibration: docs/simulator.md.",
        "",
        "## Main table (SRTF-Est base)",
        "",
        markdown_table(results["main"]),
        "",
        "### Paper vs ours",
        "",
        _paper_main_comparison(results["main"]),
        "",
        "## Composability: every base scheduler with and without EvalStop",
        "",
        markdown_table(results["composability"], lead=(("base", "base", "s"),)),
        "",
        f"Paper: JCT gains {PAPER_REFERENCE['composability_jct_gain_pct'][0]}-"
        f"{PAPER_REFERENCE['composability_jct_gain_pct'][1]}% across the four bases.",
        "",
        "## Noise sweep (EvalStop on SRTF-Est)",
        "",
        markdown_table(results["noise"], lead=(("sigma", "sigma", "f2"),)),
        "",
        "Paper: precision 100% at sigma 0.01 falling to 81% at 0.12.",
        "",
        "## Hacking-rate sweep (EvalStop on SRTF-Est)",
        "",
        markdown_table(results["hack_rate"], lead=(("hack_rate", "hack rate", "f1"),)),
        "",
        "Paper: precision >= 89% for hacking rates 20-80%.",
        "",
        "## k sweep (EvalStop on SRTF-Est)",
        "",
        markdown_table(results["k"], lead=(("k", "k", "s"),)),
        "",
    ]
    return "\n".join(out)


def save_figure(fig: Any, path: Path, dpi: int) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it (pyplot keeps every open figure alive); return ``path``.

    Args:
        fig: A ``matplotlib.figure.Figure`` made with pyplot (the caller has chosen the Agg backend).
        path: The PNG file to write.
        dpi: Resolution of the PNG.
    """
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def write_plots(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """PNG plots of the sweeps and the main table; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in tests
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def sweep(name: str, param: str, xlabel: str) -> None:
        rows = results[name]
        xs = [r[param] for r in rows]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for ax, (metric, label, scale) in zip(
            axes,
            (("precision", "precision (%)", 100), ("recall", "recall (%)", 100), ("jct_gain_pct", "JCT gain (%)", 1)),
        ):
            ys = [(r[metric] or 0) * scale for r in rows]
            es = [((r["ci95"].get(metric) or 0) * scale) for r in rows]
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(f"EvalStop on {results['config']['base']}: {xlabel} sweep (mean, 95% CI)")
        written.append(save_figure(fig, out_dir / f"{name}_sweep.png", dpi=110))

    sweep("noise", "sigma", "sigma")
    sweep("hack_rate", "hack_rate", "hacking rate")
    sweep("k", "k", "k")

    for name, label_field, title in (
        ("main", "stop", "stop policy (SRTF-Est base)"),
        ("composability", None, "base scheduler"),
    ):
        rows = results[name]
        labels = [r["stop"] if label_field else f"{r['base']}+{r['stop']}" for r in rows]
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
        for ax, (metric, ylabel) in zip(axes, (("jct_mean_h", "mean JCT (h)"), ("wasted_gpu_h", "wasted GPU-hours"))):
            ys = [r[metric] or 0 for r in rows]
            es = [r["ci95"].get(metric) or 0 for r in rows]
            ax.bar(range(len(rows)), ys, yerr=es, capsize=3)
            ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"{title} (mean, 95% CI)")
        written.append(save_figure(fig, out_dir / f"{name}.png", dpi=110))
    return written


def write_paper_report(
    results: Mapping[str, Any], out_dir: str | Path, command: str = "evalstop-sim paper", plots: bool = True
) -> list[Path]:
    """Write ``report.md``, ``results.json`` and (with ``plots``) the PNGs into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(paper_markdown(results, command) + "\n", encoding="utf-8")
    js = out / "results.json"
    js.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    paths = [md, js]
    if plots:
        paths += write_plots(results, out)
    return paths


PER_RUN_NOTE = "(per run: tested by each job's planned progress)"
"""What :func:`detector_line` adds for a detector whose per-run tests the jobs' planned steps switch on (every
simulated job's reports carry them), since its spec lists only the per-look parameters it would use without them."""


def detector_line(spec: Mapping[str, Any] | None, note: str = "", planned: bool = False) -> str:
    """``detector: NAME k=v ...`` (plus ``note``), the line every human report prints about the detector it ran.

    Args:
        spec: A complete detector spec (None: the command ran no detector).
        note: Why this detector, e.g. ``"(the paper's rule)"``.
        planned: Whether every job's reports carried its planned steps: :data:`PER_RUN_NOTE` is added when the
            detector then tests per run.
    """
    if spec is None:
        return "detector: none"
    params = " ".join(f"{k}={v}" for k, v in spec.get("params", {}).items() if v is not None)
    notes = [n for n in (note, PER_RUN_NOTE if planned and spec_plan_matters(spec) else "") if n]
    return f"detector: {spec['name']}{' ' + params if params else ''}{''.join(' ' + n for n in notes)}"
