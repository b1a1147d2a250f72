"""What ``evalstop-sim replay`` prints and writes: the per-trace table, the summary line, report.md and the text."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from platform_sim.sim.report import markdown_table

# -- output -------------------------------------------------------------------------------------------------------

TRACE_COLUMNS = (
    "trace",
    "environment",
    "label",
    "stopped",
    "stop_step",
    "best_step",
    "peak_step",
    "delay_evals",
    "regret_pct",
)


def traces_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of the per-trace rows."""
    lines = ["| " + " | ".join(TRACE_COLUMNS) + " |", "|" + "---|" * len(TRACE_COLUMNS)]
    for r in rows:
        cells = []
        for c in TRACE_COLUMNS:
            v = r.get(c)
            if v is None:
                cells.append("-")
            elif isinstance(v, bool):
                cells.append("yes" if v else "no")
            elif isinstance(v, float):
                cells.append(f"{v:.1f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_line(s: Mapping[str, Any]) -> str:
    """One line: stopped hacking and healthy traces, median delay, worst regret; ambiguous traces if any."""
    med = "-" if s["median_delay_evals"] is None else f"{s['median_delay_evals']:g}"
    reg = "-" if s["max_regret_pct_stopped_hacking"] is None else f"{s['max_regret_pct_stopped_hacking']:.1f}%"
    amb = s.get("ambiguous", 0)
    tail = f"; {amb} ambiguous trace(s) not scored: {', '.join(s.get('ambiguous_traces', []))}" if amb else ""
    return (
        f"hacking traces stopped {s['hacking_stopped']}/{s['hacking']}, healthy traces stopped "
        f"{s['healthy_stopped']}/{s['healthy']}, median delay {med} evals after the true peak, worst regret of a "
        f"stopped hacking trace {reg}{tail}"
    )


def replay_markdown(results: Mapping[str, Any], command: str) -> str:
    """The ``--out`` report of ``replay``."""

    cfg = results["config"]
    return "\n".join(
        [
            "# EvalStop on recorded real traces (evalstop-sim replay)",
            "",
            f"Command: `{command}`. {cfg['n_traces']} traces ({cfg['hacking_traces']} hacking), {cfg['seeds']} seeds, "
            f"eval grid {cfg['grid_evals']} (trace eval counts {cfg['eval_counts']}), scores mapped to 0-1 per "
            f"{cfg['score_scale']}, detector `{json.dumps(cfg['detector'])}` on the 0-1 platform scale (min_delta in "
            f"trace units: {cfg['min_delta_native'] if cfg['min_delta_native'] is not None else '-'}).",
            "",
            "## Per trace",
            "",
            traces_table(results["traces"]),
            "",
            summary_line(results["trace_summary"]),
            "",
            f"## Main table ({cfg['base']} base)",
            "",
            markdown_table(results["main"]),
            "",
            "## Composability",
            "",
            markdown_table(results["composability"], lead=(("base", "base", "s"),)),
            "",
        ]
    )


def replay_text(results: Mapping[str, Any]) -> str:
    """The human output of ``replay``: per-trace rows, the summary line, the main and composability tables."""
    return "\n".join(
        [
            traces_table(results["traces"]),
            summary_line(results["trace_summary"]),
            "",
            markdown_table(results["main"]),
            "",
            markdown_table(results["composability"], lead=(("base", "base", "s"),)),
        ]
    )
