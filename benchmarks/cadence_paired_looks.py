"""Paired looks on the 4x-eval dense traces: a look that re-evaluates the best checkpoint on the same examples.

A prototype outside the core, measured against the dense-trace target of cadence hints (the median delay after the
true peak at least halved against the fixed cadence, at equal healthy stops), which no hint of the core reaches
(docs/results/paired-looks.md): a look one step after a regular eval adds little evidence when it is judged, like
any eval, against the highest of many noisy evals.

Each trace of a folder recorded with a larger eval set (``python -m lab traces record --eval-every 1 --eval-samples 8``,
as ``platform_sim/data/corpora/dense-x8``: 192 completions per eval) is split into four sub-evals of the default size
(48 completions, 2 per held-out prompt; :func:`platform_sim.sim.traces.sub_evals`), independent evals of the very
same policy at every step. Replayed as a job:

- Regular evals every ``--every`` steps read sub-eval 0 and go to the project's default detector (``trend``) through
  the core's :class:`~platform_sim.core.monitor.JobMonitor`, which stops the job as it would at the fixed cadence.
- A look follows a regular eval that is below the best regular eval so far (trigger ``below-best``), or whose doubt
  is below ``p_hint`` (trigger ``doubt``: the core's own cadence hint, f=0.2). It evaluates the policy ``gap`` steps
  later on ``size`` other sub-evals, and the best checkpoint on the same sub-evals (same prompts, same sample slots,
  same seeded sampling stream: in replay, the recording of the best step). A one-sided paired t-test of the
  per-example differences (look minus best, plus ``min_drop``) below 0 at level ``alpha`` stops the job at the look;
  otherwise the look is forgotten and the job waits for its next regular eval.
- Re-evaluating the best removes the winner's curse of comparing with the highest of many noisy evals; pairing by
  example removes the variance that two evals of nearby policies share.
- Cost, in eval units (one default-size eval): a regular eval 1; a look ``size`` for the policy plus ``size`` for the
  best checkpoint, the latter once per best step (an implementation would keep it until a new best).

Labels and true peaks come from the full 192-completion evals (the peak: the highest centred 5-step mean, as in
:mod:`platform_sim.studies.dense_replay`). Evidence discipline: the look's setting is chosen on the ``tune`` traces
(the smallest median delay among the settings that stop no more healthy and no fewer hacking traces than the
default detector at the fixed cadence; ties: fewer eval units) and judged once on the ``test`` traces and on every
``--held-out`` folder, against the default detector at the fixed cadence on the same sub-eval 0. Figures in
docs/results/paired-looks.md.

``--grid v2`` tries a second grid, fixed before the runs of ``platform_sim/data/corpora/dense-x8-more2`` were read:
a warm-up before the first look (``armed``), chained looks (``chain``) and consecutive significant looks
(``confirm``). ``--best-per-group`` applies the tune rule to every group on its own, an upper bound of what the grid
can show there.

    python benchmarks/cadence_paired_looks.py [--traces DIR [DIR ...]] [--held-out DIR ...] [--every 5] [--sweep]
        [--grid v1|v2] [--best-per-group] [--max-cost-rise 0.25] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scipy import stats

from platform_sim.core.cadence import cadence_from_spec
from platform_sim.core.detectors import default_spec, detector_from_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.traces import (
    RealTrace,
    load_trace_folders,
    sub_evals,
)
from platform_sim.studies.dense_replay import median_with_never, smoothed_peak_step


@dataclass(frozen=True)
class LookRule:
    """When to look and when a look stops the job.

    Args:
        trigger: ``below-best`` (after a regular eval below the best so far) or ``doubt`` (the core's hint:
            ``trend``'s p-value below ``p_hint``).
        p_hint: The doubt bar of the ``doubt`` trigger.
        alpha: Level of the one-sided paired t-test at a look.
        min_drop: The look must be this far (score units) below the best.
        gap: Steps from the regular eval to the look (less than the regular interval).
        size: Sub-evals (of 48 completions) in a look, for the policy and for the best checkpoint each.
        armed: Look only once the job has at least this many regular evals (the default detector's window, 6,
            means a look never stops a job before the detector itself could).
        chain: A look that does not stop the job but whose mean is still below the best's is followed by another
            ``gap`` steps later, until the next regular eval (False: one look per interval).
        confirm: Consecutive significant looks needed to stop, counted across intervals; a look that is not
            significant, or a new best, starts the count again.
    """

    trigger: str
    p_hint: float
    alpha: float
    min_drop: float
    gap: int
    size: int
    armed: int = 1
    chain: bool = False
    confirm: int = 1

    def label(self) -> str:
        when = "below best" if self.trigger == "below-best" else f"doubt < {self.p_hint:g}"
        text = f"look when {when}, alpha={self.alpha:g} min_drop={self.min_drop:g} gap={self.gap} size={self.size}"
        # The fields grid v2 added are named only when they differ from grid v1's behaviour.
        extra = [f"armed={self.armed}"] * (self.armed != 1) + ["chain"] * self.chain
        extra += [f"confirm={self.confirm}"] * (self.confirm != 1)
        return " ".join([text, *extra])


def _paired_p(look: list[float], best: list[float], min_drop: float) -> float:
    """One-sided p-value that the look's mean is more than ``min_drop`` below the best's, paired by example."""
    diff = [a - b + min_drop for a, b in zip(look, best, strict=True)]
    mean, sd = statistics.fmean(diff), statistics.stdev(diff)
    if sd == 0.0:
        return 0.0 if mean < 0 else 1.0
    return float(stats.t.cdf(mean / (sd / math.sqrt(len(diff))), len(diff) - 1))


def _mean_below(look: list[float], best: list[float]) -> bool:
    """Whether the look's mean is below the best's on the same examples (a chained look's trigger)."""
    return statistics.fmean(look) < statistics.fmean(best)


def replay_trace(trace: RealTrace, rule: LookRule | None, every: int) -> dict[str, Any]:
    """One x8 trace as a job: regular evals on sub-eval 0, looks by ``rule`` (None: the fixed cadence)."""
    subs = sub_evals(trace)
    if rule is not None and rule.size > len(subs) - 1:
        raise ValueError(f"trace {trace.name}: a look of {rule.size} sub-evals needs {rule.size + 1} of them")
    # Per sub-eval, per step: its per-example scores (sub_evals refuses an eval without them).
    examples = [[list(e or ()) for e in sub.examples] for sub in subs]
    regular = [s for s in trace.steps if s > 0 and s % every == 0]
    index = {s: i for i, s in enumerate(trace.steps)}
    cadence = None
    if rule is not None and rule.trigger == "doubt":
        cadence = {"name": "adaptive", "params": {"fraction": 0.2, "p_hint": rule.p_hint}}
    monitor = JobMonitor(
        job_id=trace.name,
        job_type="rlhf",
        detector=detector_from_spec(default_spec()),
        cadence=cadence_from_spec(cadence),
    )
    best_step, best = -1, -math.inf
    stop, looks, units, best_evaluated, hits = None, 0, 0, set(), 0
    for n_regular, step in enumerate(regular, start=1):
        i = index[step]
        decision = monitor.observe(step, subs[0].scores[i], examples[0][i])
        units += 1
        if subs[0].scores[i] > best:
            best, best_step, hits = subs[0].scores[i], step, 0
        if decision.should_stop:
            stop = step
            break
        if rule is None or best_step == step or n_regular < rule.armed:
            continue
        wanted = decision.next_eval_step is not None if rule.trigger == "doubt" else subs[0].scores[i] < best
        if not wanted or rule.gap >= every:
            continue
        part = range(1, rule.size + 1)
        then = [v for j in part for v in examples[j][index[best_step]]]
        look = step + rule.gap
        while look < step + every and look in index:
            looks += 1
            units += rule.size + (0 if best_step in best_evaluated else rule.size)
            best_evaluated.add(best_step)
            now = [v for j in part for v in examples[j][index[look]]]
            hits = hits + 1 if _paired_p(now, then, rule.min_drop) < rule.alpha else 0
            if hits >= rule.confirm:
                stop = look
                break
            if not (rule.chain and _mean_below(now, then)):
                break
            look += rule.gap
        if stop is not None:
            break
    peak = smoothed_peak_step(trace, every)
    return {
        "trace": trace.name,
        "label": trace.label,
        "stop_step": stop,
        "peak_step": peak,
        "delay_steps": None if stop is None else stop - peak,
        "looks": looks,
        "eval_units": units,
    }


def study(traces: list[RealTrace], rule: LookRule | None, every: int) -> dict[str, Any]:
    """Every trace under ``rule``: per-trace rows and a summary (as :func:`~platform_sim.studies.dense_replay.
    dense_cadence_study`'s)."""
    rows = [replay_trace(t, rule, every) for t in traces]
    hacking = [r for r in rows if r["label"] == "hacking"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    delays = [r["delay_steps"] for r in hacking if r["stop_step"] is not None]
    return {
        "rule": None if rule is None else asdict(rule),
        "hacking": len(hacking),
        "healthy": len(healthy),
        "hacking_stopped": len(delays),
        "healthy_stopped": sum(r["stop_step"] is not None for r in healthy),
        "median_delay_steps": statistics.median(delays) if delays else None,
        "median_delay_all_steps": median_with_never(delays, len(hacking)),
        "looks": sum(r["looks"] for r in rows),
        "eval_units": sum(r["eval_units"] for r in rows),
        "healthy_stops": [(r["trace"], r["stop_step"]) for r in healthy if r["stop_step"] is not None],
        "rows": rows,
    }


ALPHAS = (0.2, 0.1, 0.05, 0.01, 0.001)
MIN_DROPS = (0.0, 0.1)
SIZES = (1, 2, 3)
#: Every setting tried on the tune traces.
GRID: list[LookRule] = [
    LookRule(trigger, p, alpha, drop, gap, size)
    for trigger, p in (("below-best", 0.0), ("doubt", 0.05), ("doubt", 0.5))
    for alpha, drop, gap, size in itertools.product(ALPHAS, MIN_DROPS, (1, 2, 3), SIZES)
]
#: A second grid, fixed before the keyword runs of seeds 8-11 were read (docs/results/paired-looks.md): looks after
#: a regular eval below the best only, with a warm-up, chained looks and confirmation added.
GRID_V2: list[LookRule] = [
    LookRule("below-best", 0.0, alpha, drop, gap, size, armed, chain, confirm)
    for alpha, drop, gap, size, armed, chain, confirm in itertools.product(
        ALPHAS, MIN_DROPS, (1, 2), (2, 3), (1, 6), (False, True), (1, 2)
    )
]
GRIDS = {"v1": GRID, "v2": GRID_V2}


def choose(
    fixed: dict[str, Any], tried: list[tuple[LookRule, dict[str, Any]]], max_rise: float | None = None
) -> tuple[LookRule, dict[str, Any]] | None:
    """The setting with the smallest median delay (misses as never) that stops no more healthy and no fewer hacking
    traces than ``fixed`` and spends at most ``max_rise`` (a share; None: any) more eval units; ties: fewer eval
    units. None when no setting qualifies."""
    ok = [
        (s["median_delay_all_steps"], s["eval_units"], i)
        for i, (_, s) in enumerate(tried)
        if s["healthy_stopped"] <= fixed["healthy_stopped"]
        and s["hacking_stopped"] >= fixed["hacking_stopped"]
        and s["median_delay_all_steps"] is not None
        and (max_rise is None or s["eval_units"] <= (1.0 + max_rise) * fixed["eval_units"])
    ]
    return tried[min(ok)[2]] if ok else None


def _median(s: dict[str, Any]) -> str:
    """A study's median delay (misses as never) as printed: "never" when half or more were never stopped."""
    return "never" if s["median_delay_all_steps"] is None else f"{s['median_delay_all_steps']:g}"


def _row(name: str, cadence: str, s: dict[str, Any], base_units: int) -> str:
    med = _median(s)
    rise = 100.0 * (s["eval_units"] - base_units) / base_units
    stops = "; ".join(f"{n} at {st}" for n, st in s["healthy_stops"]) or "-"
    return (
        f"| {name} | {cadence} | {s['hacking_stopped']}/{s['hacking']} | {s['healthy_stopped']}/{s['healthy']} | "
        f"{med} | {s['looks']} | {s['eval_units']} ({rise:+.0f}%) | {stops} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--traces",
        nargs="+",
        default=[str(corpus_dir("dense-x8"))],
        metavar="DIR",
        help="one or more folders of dense traces recorded with --eval-samples 8, read together and grouped by their "
        "tune and test splits (default: the shipped platform_sim/data/corpora/dense-x8)",
    )
    ap.add_argument(
        "--held-out",
        nargs="*",
        default=[],
        metavar="DIR",
        help="more folders of such traces, each judged once with the setting chosen on tune",
    )
    ap.add_argument("--every", type=int, default=5, help="the regular interval in steps (default 5)")
    ap.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default="v1",
        help="the settings tried on tune: v1, the first 270 (default); v2, 320 with warm-up, chained looks and "
        "confirmation",
    )
    ap.add_argument(
        "--max-cost-rise",
        type=float,
        default=0.25,
        metavar="SHARE",
        help="also choose the best setting that spends at most this share more eval units than the fixed cadence "
        "on tune (default 0.25)",
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also print the fastest pick at every alpha x min_drop and at every size of the grid, on every group "
        "(a sensitivity read after the judgement, not a choice)",
    )
    ap.add_argument(
        "--best-per-group",
        action="store_true",
        help="also pick, on every group itself, the setting of the grid that the tune rule would pick there: how far "
        "the grid can reach on that group at all (an upper bound read after the judgement, not a choice)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of markdown")
    args = ap.parse_args()
    if not math.isfinite(args.max_cost_rise) or args.max_cost_rise < 0:
        ap.error(f"--max-cost-rise must be a finite number >= 0, got {args.max_cost_rise}")
    if args.every < 2:
        ap.error(f"--every must be >= 2 (a look comes between two regular evals), got {args.every}")
    t0 = time.perf_counter()
    try:
        every_trace = load_trace_folders([*args.traces, *args.held_out])  # a run may be in one group only
    except ValueError as exc:
        ap.error(f"--traces/--held-out: {exc}")
    folder_of = {folder: Path(folder).resolve() for folder in args.held_out}
    held_out = {
        f"held-out {folder}": [t for t in every_trace if Path(t.path).resolve().parent == where]
        for folder, where in folder_of.items()
    }
    held = {t.name for ts in held_out.values() for t in ts}
    traces = [t for t in every_trace if t.name not in held]
    groups = {split: [t for t in traces if t.split == split] for split in ("tune", "test")}
    groups.update(held_out)
    if not groups["tune"]:
        ap.error(f"--traces {' '.join(args.traces)}: no trace of the tune split")
    grid = [r for r in GRIDS[args.grid] if r.gap < args.every]
    fixed_tune = study(groups["tune"], None, args.every)
    tried = [(rule, study(groups["tune"], rule, args.every)) for rule in grid]
    picks = {
        "fastest": choose(fixed_tune, tried),
        f"within +{args.max_cost_rise:.0%} eval units": choose(fixed_tune, tried, args.max_cost_rise),
    }
    results: dict[str, Any] = {"every": args.every, "settings_tried": len(grid), "chosen": {}, "groups": {}}
    lines = [f"# paired looks: {len(grid)} settings tried on tune, each pick judged once on the other groups\n"]
    for pick, got in picks.items():
        results["chosen"][pick] = None if got is None else asdict(got[0])
        lines.append(f"- {pick}: " + ("no setting qualifies" if got is None else got[0].label()))
    lines += [
        "",
        "| traces | cadence | hacking stopped | healthy stopped | median delay, misses as never (steps) | looks | "
        "eval units (vs fixed) | healthy runs stopped (step) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, ts in groups.items():
        fixed = fixed_tune if name == "tune" else study(ts, None, args.every)
        results["groups"][name] = {"fixed": fixed}
        lines.append(_row(f"{name} ({len(ts)})", "fixed", fixed, fixed["eval_units"]))
        for pick, got in picks.items():
            if got is None:
                continue
            looked = got[1] if name == "tune" else study(ts, got[0], args.every)
            results["groups"][name][pick] = looked
            lines.append(_row(f"{name} ({len(ts)})", f"paired looks, {pick}", looked, fixed["eval_units"]))
    fastest = picks["fastest"]
    if args.sweep and fastest is not None:
        base = fastest[0]
        names = list(groups)
        lines += [
            f"\nsweep: {base.label()}, at every alpha x min_drop and at every size (hacking stopped, healthy "
            "stopped, median delay)\n",
            "| alpha | min_drop | size | " + " | ".join(names) + " |",
            "|---:|---:|---:|" + "---|" * len(names),
        ]
        results["sweep"] = []
        swept_rules = [replace(base, alpha=a, min_drop=d) for a, d in itertools.product(ALPHAS, MIN_DROPS)]
        swept_rules += [replace(base, size=n) for n in SIZES if n != base.size]
        for rule in swept_rules:
            swept = {name: study(ts, rule, args.every) for name, ts in groups.items()}
            results["sweep"].append({"rule": asdict(rule), "groups": swept})
            cells = [
                f"{g['hacking_stopped']}/{g['hacking']}, {g['healthy_stopped']}/{g['healthy']}, {_median(g)}"
                for g in swept.values()
            ]
            lines.append(f"| {rule.alpha:g} | {rule.min_drop:g} | {rule.size} | " + " | ".join(cells) + " |")
    if args.best_per_group:
        lines += [
            "\nbest per group: the tune rule applied on each group itself (an upper bound, not a choice)\n",
            "| traces | fixed median (steps) | best setting there | hacking stopped | healthy stopped | median delay "
            "(steps) | eval units (vs fixed) |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        results["best_per_group"] = {}
        for name, ts in groups.items():
            fixed = results["groups"][name]["fixed"]
            own = tried if name == "tune" else [(rule, study(ts, rule, args.every)) for rule in grid]
            got = choose(fixed, own)
            results["best_per_group"][name] = None if got is None else {"rule": asdict(got[0]), "study": got[1]}
            if got is None:
                lines.append(f"| {name} | {_median(fixed)} | no setting qualifies | | | | |")
                continue
            found = got[1]
            rise = 100.0 * (found["eval_units"] - fixed["eval_units"]) / fixed["eval_units"]
            lines.append(
                f"| {name} | {_median(fixed)} | {got[0].label()} | {found['hacking_stopped']}/"
                f"{found['hacking']} | {found['healthy_stopped']}/{found['healthy']} | "
                f"{_median(found)} | {found['eval_units']} ({rise:+.0f}%) |"
            )
    if args.json:
        print(json.dumps(results, indent=1, default=str))
        return
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
