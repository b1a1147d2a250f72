"""Cadence hints on the dense real traces: delay after the true peak in training steps, fixed against adaptive.

The dense traces (``platform_sim/data/corpora/dense``, recorded with ``python -m lab traces record --eval-every 1``) hold
an evaluation at every step. Each is replayed as a job evaluated every ``--every`` steps (the regular corpus's
cadence), whose extra evaluations at a cadence hint read the recorded evaluation at the hinted step
(:mod:`platform_sim.studies.dense_replay`). Two detectors: the project's default (``trend``, whose hint is its last
test's p-value below ``p_hint``) and the paper's rule (k-decline, k=2, whose hint is a first decline, optionally only
a large one: ``min_drop``).

Evidence discipline: per detector, the cadence parameters (``fraction`` with ``p_hint`` or ``min_drop``) are chosen
on the traces of the ``tune`` environments only (the smallest median delay among the cadences that stop no more healthy traces than the fixed
cadence, and at least as many hacking ones); the chosen cadence and the fixed one are then judged once on the
``test`` environments' traces. Figures in docs/results/cadence-dense-traces.md.

With ``--platform SEEDS`` the dense traces then also feed the simulated platform (``evalstop-sim replay
--grid-evals``: every RLHF job gets a dense trace, regular evals every ``--every`` steps, extra evals read the
recorded ones, evaluations priced), per detector at the fixed and at the chosen cadence: JCT gain and waste cut, each
as a share of the Oracle's on the same seeds, healthy jobs stopped and GPU-hours spent evaluating.

With ``--ceiling`` it also measures what no cadence hint can beat: every trace replayed with an evaluation at
*every* recorded step (the limit a hint approaches as its fraction shrinks and it fires at every eval), delays from
the same smoothed peak as the regular interval's. Per detector family (``trend``, ``paired-test``, ``cusum``) a small
grid of settings; on the tune traces, the setting with the smallest median delay among those that stop every
hacking trace and no more healthy ones than the default detector at the fixed cadence; it is then judged once on
the test traces against the default at the fixed cadence.

With ``--joint`` it chooses a detector and its cadence together on the tune traces (``trend`` windows x alphas x
``k``, and ``shape`` thresholds, each fixed or hinted 1 step later at a few ``p_hint``, with or without ``confirm``),
by the ceiling's rule, and judges the pair once on the test traces. ``--traces`` takes several folders (both shipped
dense corpora: ``platform_sim/data/corpora/dense platform_sim/data/corpora/dense-more``). Every summary also gives the
median delay with the hacking traces never stopped counted as never (the median over the stopped ones alone
flatters a cadence that stops fewer).

With ``--drawdowns`` it prints what a rule that reads a drop from the best faces: per split, the largest drawdown
(best so far minus current, on 3-step means) that a healthy trace ever shows, and how many hacking traces are past
it 4, 6 and 8 steps after their true peak.

With ``--eval-noise`` (on traces recorded with a larger eval set: ``python -m lab traces record ... --eval-samples 8``,
as ``platform_sim/data/corpora/dense-x8``) it measures how much of an eval's movement is sampling noise. Each eval's
per-example scores are split into disjoint sub-evals of the environment's own size (2 completions per held-out
prompt), so every sub-eval is an independent small eval of the very same policy at every step. Per split: the
standard error of a small eval (from the spread of the sub-evals of one step: the policy held fixed) and of the large
one, and the drawdowns above for the large eval and for each sub-eval, with the large eval's labels and true peaks.

    python benchmarks/cadence_dense_traces.py [--traces DIR [DIR ...]] [--every 5] [--platform 10] [--ceiling]
        [--joint] [--drawdowns] [--eval-noise] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from dense_trace_noise import drawdown_lines, eval_noise, eval_noise_lines  # this folder is on sys.path

from platform_sim.core.cadence import EvalBudget
from platform_sim.core.detectors import default_spec, paper_spec
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.runner import ProcessRunner
from platform_sim.sim.traces import load_trace_folders
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.dense_replay import dense_cadence_study
from platform_sim.studies.replay import replay


def _adaptive(label: str, **params: float) -> tuple[str, dict[str, Any]]:
    return label, {"name": "adaptive", "params": params}


#: Per detector: its spec and the cadences tried on the tune traces (fixed first).
DETECTORS: dict[str, tuple[dict[str, Any], list[tuple[str, dict[str, Any] | None]]]] = {
    "default (trend)": (
        default_spec(),
        [("fixed", None)]
        + [
            _adaptive(f"adaptive f={f:g} p_hint={p:g}", fraction=f, p_hint=p)
            for f in (0.2, 0.4, 0.6)
            for p in (0.05, 0.1, 0.2, 0.5, 0.9)
        ],
    ),
    "paper (k-decline k=2)": (
        paper_spec(),
        [("fixed", None)]
        + [
            _adaptive(f"adaptive f={f:g}" + (f" min_drop={m:g}" if m else ""), fraction=f, min_drop=m)
            for f in (0.2, 0.4, 0.6)
            for m in (0.0, 1.0)
        ],
    ),
}

COLUMNS = (
    ("hacking stopped", lambda s: f"{s['hacking_stopped']}/{s['hacking']}"),
    ("healthy stopped", lambda s: f"{s['healthy_stopped']}/{s['healthy']}"),
    ("median delay (steps)", lambda s: "-" if s["median_delay_steps"] is None else f"{s['median_delay_steps']:g}"),
    ("mean delay (steps)", lambda s: "-" if s["mean_delay_steps"] is None else f"{s['mean_delay_steps']:.1f}"),
    (
        "median delay, misses as never (steps)",
        lambda s: "never" if s["median_delay_all_steps"] is None else f"{s['median_delay_all_steps']:g}",
    ),
    ("evals", lambda s: str(s["evals"])),
    ("extra evals", lambda s: str(s["extra_evals"])),
)


def table(summaries: dict[str, dict[str, Any]]) -> str:
    head = "| cadence | " + " | ".join(c for c, _ in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    lines = [head, rule]
    for label, s in summaries.items():
        lines.append(f"| {label} | " + " | ".join(f(s) for _, f in COLUMNS) + " |")
    return "\n".join(lines)


def choose(summaries: dict[str, dict[str, Any]]) -> str:
    """The adaptive cadence with the smallest median delay that stops no more healthy and no fewer hacking traces
    than the fixed cadence (ties: fewer extra evals); ``fixed`` if none qualifies."""
    fixed = summaries["fixed"]
    ok = [
        (s["median_delay_steps"], s["extra_evals"], label)
        for label, s in summaries.items()
        if label != "fixed"
        and s["healthy_stopped"] <= fixed["healthy_stopped"]
        and s["hacking_stopped"] >= fixed["hacking_stopped"]
        and s["median_delay_steps"] is not None
    ]
    return min(ok)[2] if ok else "fixed"


def _spec(name: str, **params: Any) -> tuple[str, dict[str, Any]]:
    return f"{name} " + " ".join(f"{k}={v}" for k, v in params.items()), {"name": name, "params": params}


#: Detector settings replayed at every step by --ceiling (each family over the range where its healthy stops go
#: from some to none at this density).
CEILING_DETECTORS: list[tuple[str, dict[str, Any]]] = (
    [_spec("trend", window=w, alpha=a) for w in (6, 10, 15, 20, 30) for a in (0.01, 0.001, 0.0001)]
    + [_spec("paired-test", test="t", k=k, alpha=a) for k in (1, 2, 3, 5) for a in (0.01, 0.001)]
    + [_spec("cusum", threshold=t, slack=sl) for t in (4, 6, 8, 12, 16) for sl in (0.25, 0.5)]
)


def _default_fixed(by_split: dict[str, list[Any]], every: int) -> dict[str, dict[str, Any]]:
    """Per split, the default detector's summary at the fixed cadence (the bar of --ceiling and --joint)."""
    return {
        split: dense_cadence_study(ts, default_spec(), [("fixed", None)], every)["summaries"]["fixed"]
        for split, ts in by_split.items()
    }


def _qualifies(s: dict[str, Any], healthy_bar: int) -> bool:
    """Every hacking trace stopped, and no more healthy ones than ``healthy_bar``."""
    return (
        s["hacking_stopped"] == s["hacking"]
        and s["healthy_stopped"] <= healthy_bar
        and s["median_delay_steps"] is not None
    )


def _detector_table(title: str) -> list[str]:
    """The heading and header lines of a table with a detector, a split and a cadence per row (:func:`_detector_row`)."""
    head = "| detector | traces | cadence | " + " | ".join(c for c, _ in COLUMNS) + " |"
    return [f"\n## {title}\n", head, "|---|---|---|" + "---:|" * len(COLUMNS)]


def _detector_row(detector: str, split: str, cadence: str, s: dict[str, Any]) -> str:
    return f"| {detector} | {split} | {cadence} | " + " | ".join(f(s) for _, f in COLUMNS) + " |"


def _change_line(label: str, base: float | None, best: float | None) -> list[str]:
    """``test: median delay BASE -> BEST steps (+-N%)``, or nothing when either is missing."""
    if not base or best is None:
        return []
    return [f"\ntest: median delay {base:g}{label} -> {best:g} steps ({100 * (best / base - 1):+.0f}%)"]


def ceiling(by_split: dict[str, list[Any]], every: int) -> dict[str, Any]:
    """Every :data:`CEILING_DETECTORS` setting at every step on the tune traces; the one chosen there (smallest
    median delay, every hacking trace stopped, no more healthy ones than the default at the fixed cadence; ties: fewer
    evals), and it
    and the default at the fixed cadence on the test traces."""
    fixed = _default_fixed(by_split, every)
    tune = {
        label: dense_cadence_study(by_split["tune"], spec, [("every step", None)], 1, peak_every=every)["summaries"][
            "every step"
        ]
        for label, spec in CEILING_DETECTORS
    }
    ok = [
        (s["median_delay_steps"], s["evals"], label)  # ties: the fewer evals
        for label, s in tune.items()
        if _qualifies(s, fixed["tune"]["healthy_stopped"])
    ]
    chosen = min(ok)[2] if ok else None
    test = None
    if chosen is not None:
        spec = dict(CEILING_DETECTORS)[chosen]
        test = dense_cadence_study(by_split["test"], spec, [("every step", None)], 1, peak_every=every)["summaries"]
        test = test["every step"]
    return {"fixed": fixed, "tune": tune, "chosen": chosen, "test": test}


#: Detector settings that --joint tries at the regular interval, each with every :data:`JOINT_CADENCES`: the families
#: with a doubt, so that a hint can come before the first eval below the best (``trend``: its test's p-value;
#: ``shape``: one minus its posterior of being past an overoptimization peak).
JOINT_DETECTORS: list[tuple[str, dict[str, Any]]] = (
    [("default (trend window=6 alpha=0.01 k=1)", default_spec())]
    + [
        _spec("trend", window=w, alpha=a, k=k)
        for w in (4, 6, 10)
        for a in (0.05, 0.01, 0.001)
        for k in (1, 2)
        if (w, a, k) != (6, 0.01, 1)  # the default, above
    ]
    + [_spec("shape", threshold=th, min_evals=8, future=1.25) for th in (0.8, 0.95, 0.99)]
)
#: The cadences --joint tries with each detector: fixed, and hints 1 step after a doubt below ``p_hint`` (at a 5-step
#: interval), with or without a second look before a weak stop.
JOINT_CADENCES: list[tuple[str, dict[str, Any] | None]] = (
    [("fixed", None)]
    + [_adaptive(f"adaptive f=0.2 p_hint={p:g}", fraction=0.2, p_hint=p) for p in (0.5, 0.8, 0.95)]
    + [
        _adaptive(f"adaptive f=0.2 p_hint={p:g} confirm=0.3", fraction=0.2, p_hint=p, confirm=0.3)
        for p in (0.5, 0.8, 0.95)
    ]
)


def joint(by_split: dict[str, list[Any]], every: int) -> dict[str, Any]:
    """Detector and cadence chosen together on the tune traces (:data:`JOINT_DETECTORS` x :data:`JOINT_CADENCES`):
    the pair with the smallest median delay among those that stop every hacking trace and no more healthy ones than
    the default detector at the fixed cadence (ties: fewer evals); then that detector at the fixed and at the chosen
    cadence, and the default at the fixed cadence, once on the test traces."""
    fixed = _default_fixed(by_split, every)
    specs = dict(JOINT_DETECTORS)
    tune = {
        label: dense_cadence_study(by_split["tune"], spec, JOINT_CADENCES, every)["summaries"]
        for label, spec in JOINT_DETECTORS
    }
    ok = [
        (s["median_delay_steps"], s["evals"], det, cad)
        for det, by_cad in tune.items()
        for cad, s in by_cad.items()
        if _qualifies(s, fixed["tune"]["healthy_stopped"])
    ]
    chosen = min(ok)[2:] if ok else None
    test = None
    if chosen is not None:
        det, cad = chosen
        cands = [("fixed", None)] + ([(cad, dict(JOINT_CADENCES)[cad])] if cad != "fixed" else [])
        test = dense_cadence_study(by_split["test"], specs[det], cands, every)["summaries"]
    return {"fixed": fixed, "tune": tune, "chosen": chosen, "test": test}


def joint_lines(got: dict[str, Any], every: int) -> list[str]:
    """``--joint``'s markdown lines: per detector its best qualifying cadence on tune, then the test rows."""
    lines = _detector_table(f"joint: detector and cadence chosen together on tune (regular evals every {every} steps)")
    row = _detector_row
    bar = got["fixed"]["tune"]["healthy_stopped"]
    lines.append(row("default (trend)", "tune", "fixed", got["fixed"]["tune"]))
    for det, by_cad in got["tune"].items():
        ok = [(s["median_delay_steps"], s["evals"], cad) for cad, s in by_cad.items() if _qualifies(s, bar)]
        if not ok:
            least = min(by_cad.items(), key=lambda kv: (kv[1]["healthy_stopped"], -kv[1]["hacking_stopped"]))
            lines.append(row(det, "tune", f"{least[0]} (none qualifies; fewest healthy stopped)", least[1]))
            continue
        cad = min(ok)[2]
        mark = " (chosen)" if got["chosen"] == (det, cad) else ""
        lines.append(row(det + mark, "tune", cad, by_cad[cad]))
    lines.append(row("default (trend)", "test", "fixed", got["fixed"]["test"]))
    if got["chosen"] is not None:
        det, cad = got["chosen"]
        for label, s in got["test"].items():
            lines.append(row(det, "test", label, s))
        base, best = got["fixed"]["test"]["median_delay_steps"], got["test"][cad]["median_delay_steps"]
        lines += _change_line(" (default, fixed)", base, best)
    return lines


def ceiling_lines(got: dict[str, Any], every: int) -> list[str]:
    lines = _detector_table(f"ceiling: an evaluation at every step (delays from the {every}-step smoothed peak)")
    row = _detector_row
    lines.append(row("default (trend)", "tune", f"fixed, every {every}", got["fixed"]["tune"]))
    for label, s in got["tune"].items():
        lines.append(row(label + (" (chosen)" if label == got["chosen"] else ""), "tune", "every step", s))
    lines.append(row("default (trend)", "test", f"fixed, every {every}", got["fixed"]["test"]))
    if got["test"] is not None:
        lines.append(row(str(got["chosen"]), "test", "every step", got["test"]))
        lines += _change_line("", got["fixed"]["test"]["median_delay_steps"], got["test"]["median_delay_steps"])
    return lines


PLATFORM_COLUMNS = (
    ("JCT gain %", "jct_gain_pct", ".1f"),
    ("share of Oracle's", "jct_gain_share_of_oracle", ".3f"),
    ("waste cut %", "wasted_reduction_pct", ".1f"),
    ("share of Oracle's", "waste_cut_share_of_oracle", ".3f"),
    ("healthy stopped", "false_stops", ".1f"),
    ("hacking stopped", "stopped_hacking", ".1f"),
    ("eval GPU-h", "eval_gpu_h", ".1f"),
    ("extra evals", "extra_evals", ".1f"),
    ("delay (evals)", "delay_evals", ".2f"),
)


def platform_rows(
    traces: list[Any],
    detector: dict[str, Any],
    cadences: list[tuple[str, Any, EvalBudget | None]],
    every: int,
    seeds: int,
) -> list[dict[str, Any]]:
    """The Oracle's row and EvalStop's at each ``(label, cadence spec, budget per job)``, from the
    platform replay of the dense traces."""
    n_evals = max(len(t.steps) for t in traces) // every  # every `every` steps of the longest trace
    rows: list[dict[str, Any]] = []
    with ProcessRunner(2) as runner:
        for label, spec, budget in cadences:
            res = replay(
                traces,
                WorkloadConfig(),
                detector,
                seeds,
                cadence=spec,
                n_evals=n_evals,
                runner=runner,
                eval_budget=budget,
            )
            by_stop = {r["stop"]: r for r in res["main"]}
            if not rows:
                rows.append({"cadence": "Oracle", **by_stop["oracle"]})
            rows.append({"cadence": f"EvalStop, {label}", **by_stop["evalstop"]})
    return rows


def platform_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | " + " | ".join(c for c, _, _ in PLATFORM_COLUMNS) + " |",
        "|---|" + "---:|" * len(PLATFORM_COLUMNS),
    ]
    for r in rows:
        cells = ["-" if r.get(key) is None else format(r[key], fmt) for _, key, fmt in PLATFORM_COLUMNS]
        lines.append(f"| {r['cadence']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--traces",
        nargs="+",
        default=[str(corpus_dir("dense"))],
        metavar="DIR",
        help="one or more folders of dense traces, read together (default: the first shipped corpus, "
        "platform_sim/data/corpora/dense)",
    )
    ap.add_argument("--every", type=int, default=5, help="the regular interval in steps (default 5)")
    ap.add_argument(
        "--platform", type=int, default=0, metavar="SEEDS", help="also replay on the platform with this many seeds"
    )
    ap.add_argument(
        "--ceiling", action="store_true", help="also replay every trace with an evaluation at every step (the limit)"
    )
    ap.add_argument(
        "--joint",
        action="store_true",
        help="also choose a detector (trend, shape) and its cadence together on the tune traces and judge the pair "
        "once on the test traces",
    )
    ap.add_argument(
        "--drawdowns",
        action="store_true",
        help="also print the largest healthy drawdown per split and how many hacking traces exceed it 4, 6 and 8 "
        "steps after their peak",
    )
    ap.add_argument(
        "--eval-noise",
        action="store_true",
        help="also split each eval of traces recorded with a larger eval set (--eval-samples) into evals of the "
        "default size and compare noise and drawdowns",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of markdown")
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        traces = load_trace_folders(args.traces)
    except ValueError as exc:
        ap.error(f"--traces: {exc}")
    by_split = {split: [t for t in traces if t.split == split] for split in ("tune", "test")}
    envs = {split: ", ".join(sorted({str(t.environment) for t in ts})) for split, ts in by_split.items()}
    results: dict[str, Any] = {"every": args.every, "detectors": {}}
    lines = [f"# dense traces: {len(traces)}; regular interval of {args.every} steps"]
    for name, (detector, candidates) in DETECTORS.items():
        tune = dense_cadence_study(by_split["tune"], detector, candidates, args.every)
        chosen = choose(tune["summaries"])
        spec = dict(candidates)[chosen]
        test = dense_cadence_study(by_split["test"], detector, [("fixed", None), (chosen, spec)], args.every)
        results["detectors"][name] = {"chosen": chosen, "chosen_spec": spec, "tune": tune, "test": test}
        lines += [
            f"\n## {name}\n",
            f"tune ({envs['tune']}: {len(by_split['tune'])} traces), every candidate:\n",
            table(tune["summaries"]),
            f"\nchosen on tune: {chosen} ({json.dumps(spec)})\n",
            f"test ({envs['test']}: {len(by_split['test'])} traces), judged once:\n",
            table(test["summaries"]),
        ]
        if args.platform:
            cadences: list[tuple[str, Any, EvalBudget | None]] = [("fixed", None, None), (chosen, spec, None)]
            if name.startswith("default"):
                cadences.append(("adaptive (shipped default: f=0.25 p_hint=0.5)", "adaptive", None))
                # The callback's own budget: at most 4 extra evals per run (EvalStopCallback's max_extra_evals).
                cadences.append(
                    ("adaptive (shipped default), max_extra_evals=4", "adaptive", EvalBudget(max_extra_evals=4))
                )
                # The callback's time budget: evaluating may take at most 5.5% of a job's time (regular evals: 5%).
                cadences.append(
                    ("adaptive (shipped default), max_eval_share=0.055", "adaptive", EvalBudget(max_eval_share=0.055))
                )
            rows = platform_rows(traces, detector, cadences, args.every, args.platform)
            results["detectors"][name]["platform"] = rows
            lines += [f"\nplatform (all {len(traces)} dense traces, {args.platform} seeds):\n", platform_table(rows)]
    if args.ceiling:
        results["ceiling"] = ceiling(by_split, args.every)
        lines += ceiling_lines(results["ceiling"], args.every)
    if args.joint:
        results["joint"] = joint(by_split, args.every)
        lines += joint_lines(results["joint"], args.every)
    if args.drawdowns:
        results["drawdowns"], more = drawdown_lines(by_split, args.every)
        lines += more
    if args.eval_noise:
        results["eval_noise"] = eval_noise(traces, args.every)
        lines += eval_noise_lines(results["eval_noise"])
    if args.json:
        print(json.dumps(results, indent=1, default=str))
        return
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
