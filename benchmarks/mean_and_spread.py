"""The default detector in its three evidence modes on the shipped corpus, and the figures of
docs/results/mean-and-spread.md.

Chooses the default's mean-and-spread window on the tune environments alone, then replays the test environments in
every mode: per-example scores; the mean with the sample standard deviation (``ddof=1``) and count of the recorded
per-example scores (``eval_std``, ``eval_n``), no per-example scores; the mean alone
(:mod:`platform_sim.studies.spread_study`). Prints Markdown tables: the three modes per split, the unconstrained
tune choice beside the chosen one, and the sensitivity of the result to the window and the level.

    python benchmarks/mean_and_spread.py [--traces DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from platform_sim.core.detectors import default_spec
from platform_sim.sim.corpora import corpus_dir
from platform_sim.studies.spread_study import spread_study


def _n(m, key, total):
    return f"{m[key]}/{m[total]}"


def _d(v):
    return "-" if v is None else f"{v:g}"


def _pct(v):
    return "-" if v is None else f"{100 * v:.0f}%"


def _params(spec):
    p = spec["params"]
    return f"window {p['window']}, alpha {p['alpha']:g}; spread_window {p.get('spread_window')}, spread_alpha {p.get('spread_alpha')}"


def mode_table(results) -> str:
    lines = [
        "| candidate | mode | split | hacking stopped | healthy stopped | median delay (evals) | worst regret |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in results["modes"]:
        lines.append(
            f"| {m['candidate']} | {m['mode']} | {m['split']} | {_n(m, 'hacking_stopped', 'hacking')} | "
            f"{_n(m, 'healthy_stopped_n', 'healthy')} | {_d(m['delay_median'])} | {_pct(m['regret_worst'])} |"
        )
    return "\n".join(lines)


def sensitivity_table(results) -> str:
    lines = [
        "| spread_window | spread_alpha | tune: hacking | tune: healthy | tune: delay | test: hacking | test: healthy "
        "| test: delay | test: worst regret |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["sensitivity"]:
        p, a, b = row["spec"]["params"], row["tune"], row["test"]
        lines.append(
            f"| {p['spread_window']} | {p['spread_alpha']:g} | {_n(a, 'hacking_stopped', 'hacking')} | "
            f"{_n(a, 'healthy_stopped_n', 'healthy')} | {_d(a['delay_median'])} | {_n(b, 'hacking_stopped', 'hacking')} | "
            f"{_n(b, 'healthy_stopped_n', 'healthy')} | {_d(b['delay_median'])} | {_pct(b['regret_worst'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=None, help="corpus (default: the shipped real corpus)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure and per-trace row here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the once-per-detector fallback warnings are the point of a mode
    folder = args.traces or corpus_dir("real")
    t0 = time.perf_counter()
    results = spread_study(folder, default_spec(), progress=lambda msg: print(f"# {msg}", file=sys.stderr))
    print(f"chosen on tune: {_params(results['chosen'])}")
    print(f"unconstrained tune choice: {_params(results['unconstrained'])}\n")
    print(mode_table(results), "\n")
    print(sensitivity_table(results))
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
