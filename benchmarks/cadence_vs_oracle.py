"""The cadence hint against the Oracle bound: EvalStop with the fixed and the adaptive cadence, evaluations priced.

For each sigma, on the same seeds: the base alone, the Oracle, and EvalStop (k-decline, k=2) at the fixed cadence
and at several adaptive cadences (``fraction`` of an interval after a first decline; ``min_drop``: only after a drop
of that many noise standard errors). Prints one markdown table per sigma: JCT gain and waste cut, each also as a
share of the Oracle's, healthy RLHF jobs stopped, hacking jobs stopped, GPU-hours spent evaluating, extra evals and
detection delay (evals after the true peak). Figures in docs/simulation.md section 8.

With ``--detector default`` EvalStop runs the project's default detector (``trend``) instead, whose hint is its last
test's p-value below ``p_hint`` (default 0.5), at fractions 0.25, 0.5 and 0.75; with ``--detector shape-sens`` the
Bayesian ``shape-sens``, whose hint is one minus its posterior of being past an overoptimization peak below
``p_hint`` (0.5, 0.8, 0.95 at fractions 0.25 and 0.5). With ``--detector shape-now``, ``shape`` with
``behind=0`` (the peak may lie behind the current eval) on a grid of ``--thresholds`` x ``--futures`` x
``--min-evals``, each at the fixed cadence and at the adaptive ones of ``--fractions`` x ``--p-hints``; after the
table the benchmark names the row that :func:`choose_on_all` picks on these seeds (with ``--halves``, a row that
qualifies on each half of them). ``--first-seed`` moves the seeds (tuning runs use seeds 100-119; the reported ones
are 0-9, 200-219, 300-319 and 400-419: a setting is chosen on the first and judged on the others).
``--max-extra-evals`` caps each job's extra evals and ``--max-eval-share`` its share of time spent evaluating, as the
callback's budgets of those names. ``--p-hints-at-best`` and
``--confirms`` add the cadence's ``p_hint_at_best`` (the doubt bar after an eval that is the job's best so far) and
``confirm`` (a second look a ``fraction`` of an interval later before a stop whose doubt is above it) to the grid;
``--margin [K]`` makes the rule ask a pick to stop, over all the seeds, at most ``F - K sqrt(F)`` healthy jobs
(K: 1 when the flag has no value) where its detector stops ``F`` at the fixed cadence.

    python benchmarks/cadence_vs_oracle.py [--sigmas 0.02,0.12] [--seeds 10] [--eval-cost 0.05] [--workers 2]
        [--detector paper|default|shape-sens|shape-now] [--first-seed 0]
        [--thresholds 0.7,0.8,0.9] [--futures 1.25,1.5] [--min-evals 5]
        [--fractions 0.25,0.33,0.5] [--p-hints 0.7,0.8] [--p-hints-at-best none,0.7] [--confirms none,0.3]
        [--max-extra-evals none,2,4] [--max-eval-share none,0.055] [--halves] [--margin [K]]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from platform_sim.core.cadence import EvalBudget
from platform_sim.core.detectors import default_spec, paper_spec, shape_sens_spec
from platform_sim.sim.engine import DEFAULT_EVAL_COST
from platform_sim.sim.runner import ProcessRunner
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.cadence_study import cadence_comparison

CADENCES = [("fixed", None)] + [
    (
        f"adaptive f={f:g}" + (f" min_drop={m:g}" if m else ""),
        {"name": "adaptive", "params": {"fraction": f, "min_drop": m}},
    )
    for f in (0.25, 0.5, 0.75)
    for m in (0.0, 1.0)
]

DEFAULT_CADENCES = [("fixed", None)] + [
    (f"adaptive f={f:g}", {"name": "adaptive", "params": {"fraction": f}}) for f in (0.25, 0.5, 0.75)
]

SHAPE_CADENCES = [("fixed", None)] + [
    (f"adaptive f={f:g} p_hint={p:g}", {"name": "adaptive", "params": {"fraction": f, "p_hint": p}})
    for f in (0.25, 0.5)
    for p in (0.5, 0.8, 0.95)
]


def now_cadences(
    fractions: list[float],
    p_hints: list[float],
    at_best: Sequence[float | None] = (None,),
    confirms: Sequence[float | None] = (None,),
) -> list[tuple[str, Any]]:
    """The fixed cadence and the adaptive ones of ``--detector shape-now``: every fraction x p_hint x
    p_hint_at_best x confirm (None: the parameter unset; labels of the earlier grids read as before)."""
    out: list[tuple[str, Any]] = [("fixed", None)]
    for f in fractions:
        for p in p_hints:
            for b in at_best:
                for c in confirms:
                    params: dict[str, Any] = {"fraction": f, "p_hint": p}
                    label = f"adaptive f={f:g} p_hint={p:g}"
                    if b is not None:
                        params["p_hint_at_best"] = b
                        label += f" p_hint_at_best={b:g}"
                    if c is not None:
                        params["confirm"] = c
                        label += f" confirm={c:g}"
                    out.append((label, {"name": "adaptive", "params": params}))
    return out


def _shape_now(threshold: float, future: float, min_evals: int = 5) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"threshold": threshold, "future": future, "min_tau": 2.0, "behind": 0}
    label = f"shape behind=0 threshold={threshold:g} future={future:g}"
    if min_evals != 5:  # the detector's defaults; labels of the first grid read as before
        params["min_evals"] = min_evals
        label += f" min_evals={min_evals}"
    return label, {"name": "shape", "params": params}


def _floats(text: str) -> list[float]:
    """A comma-separated list of numbers (an argparse type: bad input is a usage error that names it)."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _budgets(text: str) -> list[int | None]:
    """A comma-separated list of budgets: integers >= 0 or ``none`` (an argparse type)."""
    try:
        out = [None if v.strip().lower() == "none" else int(v) for v in text.split(",")]
    except ValueError:
        out = [-1]
    if any(b is not None and b < 0 for b in out):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 or 'none', got {text!r}")
    return out


def _optional_floats(text: str) -> list[float | None]:
    """A comma-separated list of numbers or ``none`` (an argparse type)."""
    try:
        return [None if v.strip().lower() == "none" else float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers or 'none', got {text!r}") from None


def _ints(text: str) -> list[int]:
    """A comma-separated list of integers (an argparse type)."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


#: Per --detector: the detector variants (label, spec) and the cadences tried with each.
DETECTOR_RUNS: dict[str, tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, Any]]]] = {
    "paper": ([("", paper_spec())], CADENCES),
    "default": ([("", default_spec())], DEFAULT_CADENCES),
    "shape-sens": ([("", shape_sens_spec())], SHAPE_CADENCES),
    "shape-now": ([], []),  # the grid of --thresholds x --futures x --min-evals, at --fractions x --p-hints
}

#: Healthy RLHF jobs a variant may stop per run at the fixed cadence to be chosen (under 1% of about 64).
MAX_HEALTHY_STOPS = 0.5
#: The most extra evaluation GPU time a chosen cadence may spend against the same detector at the fixed cadence.
MAX_EVAL_GPU_RISE = 0.02

COLUMNS = (
    ("JCT gain %", "jct_gain_pct", ".1f"),
    ("share of Oracle's", "jct_gain_share_of_oracle", ".2f"),
    ("waste cut %", "wasted_reduction_pct", ".1f"),
    ("share of Oracle's", "waste_cut_share_of_oracle", ".3f"),
    ("healthy stopped", "false_stops", ".2f"),
    ("hacking stopped", "stopped_hacking", ".1f"),
    ("eval GPU-h", "eval_gpu_h", ".1f"),
    ("extra evals", "extra_evals", ".1f"),
    ("delay (evals)", "delay_evals", ".2f"),
    ("regret hacking", "regret_hacking", ".3f"),
)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def choose_on_all(parts: list[list[dict[str, Any]]], margin: float = 0.0) -> tuple[str, str] | None:
    """``(variant, cadence)`` of the adaptive row with the largest mean waste cut over the parts of the seeds among
    those that, on *every* part, belong to a variant that stops at most :data:`MAX_HEALTHY_STOPS` healthy jobs per
    run at the fixed cadence, stop no more healthy jobs than that fixed row and spend at most
    :data:`MAX_EVAL_GPU_RISE` more evaluation GPU time; None if no row qualifies.

    On ten seeds the healthy-stop condition is decided by one or two jobs, so a row that passes it on all the seeds
    together may pass by chance; asking it of each half (``--halves``) guards against choosing such a row. With
    ``margin`` (``--margin [K]``, K > 0) a row must also stop, over all the parts together, at most the fixed row's
    healthy jobs minus ``K`` Poisson standard deviations of that count (``F - K sqrt(F)`` for ``F`` jobs), so that the
    pick does not turn on a job or two that held-out seeds will not repeat."""
    keys: set[tuple[str, str]] | None = None
    for rows in parts:
        fixed = {r["variant"]: r for r in rows if r.get("cadence") == "fixed"}
        ok = {
            (r["variant"], r["cadence"])
            for r in rows
            if r.get("cadence") not in (None, "fixed", "-")
            and fixed[r["variant"]]["false_stops"] <= MAX_HEALTHY_STOPS
            and r["false_stops"] <= fixed[r["variant"]]["false_stops"]
            and r["eval_gpu_h"] <= (1.0 + MAX_EVAL_GPU_RISE) * fixed[r["variant"]]["eval_gpu_h"]
        }
        keys = ok if keys is None else keys & ok
    if margin and keys:
        # Healthy jobs stopped over all the parts (false_stops is per run; each part's seeds count once).
        def stopped(variant: str, cadence: str) -> float:
            return sum(
                r["false_stops"] * r["seeds"]
                for rows in parts
                for r in rows
                if r.get("variant") == variant and r.get("cadence") == cadence
            )

        keys = {
            (v, c)
            for v, c in keys
            if stopped(v, c) <= stopped(v, "fixed") - margin * math.sqrt(stopped(v, "fixed")) + 1e-9
        }
    if not keys:
        return None
    cut = {k: 0.0 for k in keys}
    for rows in parts:
        for r in rows:
            if (r.get("variant"), r.get("cadence")) in cut:
                cut[(r["variant"], r["cadence"])] += r["wasted_reduction_pct"] / len(parts)
    return max(sorted(cut), key=lambda k: cut[k])


def _table(rows: list[dict[str, Any]], title: str) -> None:
    print(f"\n{title}\n")
    print("| policy | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for r in rows:
        parts = [p for p in (r["variant"], r["cadence"]) if p]
        name = "Oracle" if r["stop"] == "oracle" else "EvalStop, " + ", ".join(parts)
        cells = ["-" if r[key] is None else format(r[key], fmt) for _, key, fmt in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigmas", default="0.02,0.12", help="comma-separated eval noise levels (default 0.02,0.12)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument(
        "--eval-cost",
        type=float,
        default=DEFAULT_EVAL_COST,
        help=f"one eval's GPU time as a share of a regular eval interval (default {DEFAULT_EVAL_COST})",
    )
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument(
        "--detector",
        choices=tuple(DETECTOR_RUNS),
        default="paper",
        help="EvalStop's detector: the paper's k-decline k=2 (default), the project's default (trend), shape-sens, "
        "or shape with behind=0 on a grid (shape-now)",
    )
    ap.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1 (default 0)")
    ap.add_argument(
        "--thresholds",
        type=_floats,
        default="0.7,0.8,0.9",
        help="shape-now: posterior thresholds (default 0.7,0.8,0.9)",
    )
    ap.add_argument("--futures", type=_floats, default="1.25,1.5", help="shape-now: future values (default 1.25,1.5)")
    ap.add_argument("--min-evals", type=_ints, default="5", help="shape-now: min_evals values (default 5)")
    ap.add_argument(
        "--fractions",
        type=_floats,
        default="0.25,0.33,0.5",
        help="shape-now: cadence fractions (default 0.25,0.33,0.5)",
    )
    ap.add_argument(
        "--p-hints", type=_floats, default="0.7,0.8", help="shape-now: cadence p_hint values (default 0.7,0.8)"
    )
    ap.add_argument(
        "--p-hints-at-best",
        type=_optional_floats,
        default="none",
        help="shape-now: cadence p_hint_at_best values, 'none' for unset (default none)",
    )
    ap.add_argument(
        "--confirms",
        type=_optional_floats,
        default="none",
        help="shape-now: cadence confirm values, 'none' for unset (default none)",
    )
    ap.add_argument(
        "--margin",
        type=_positive_float,
        nargs="?",
        const=1.0,
        default=0.0,
        metavar="K",
        help="the rule also asks that a pick stop at most F - K sqrt(F) healthy jobs over all the seeds, F being its "
        "detector's at the fixed cadence (K: 1 when the flag has no value)",
    )
    ap.add_argument(
        "--max-extra-evals",
        type=_budgets,
        default="none",
        help="comma-separated budgets of extra evals per job, as the callback's max_extra_evals; each budget runs "
        "every variant ('none': no limit, the default)",
    )
    ap.add_argument(
        "--max-eval-share",
        type=_optional_floats,
        default="none",
        help="comma-separated time budgets, as the callback's max_eval_share: no hint is followed while a job's "
        "evals took more than this share of its time; each runs with every --max-extra-evals ('none': no limit)",
    )
    ap.add_argument(
        "--halves",
        action="store_true",
        help="run the seeds as two halves, each with its own table, and choose a row that qualifies on both",
    )
    args = ap.parse_args()
    if args.seeds < (2 if args.halves else 1):
        ap.error(f"--seeds must be at least {2 if args.halves else 1}{' with --halves' if args.halves else ''}")
    t0 = time.perf_counter()
    variants, cadences = DETECTOR_RUNS[args.detector]
    if args.detector == "shape-now":
        variants = [_shape_now(t, f, m) for m in args.min_evals for t in args.thresholds for f in args.futures]
        cadences = now_cadences(args.fractions, args.p_hints, args.p_hints_at_best, args.confirms)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    parts = [seeds[: len(seeds) // 2], seeds[len(seeds) // 2 :]] if args.halves else [seeds]
    rule = (
        f"largest waste cut; fixed-cadence healthy stops <= {MAX_HEALTHY_STOPS:g} per run, no more with the hint, "
        f"eval GPU <= +{100 * MAX_EVAL_GPU_RISE:g}%"
        + ("; on each half" if args.halves else "")
        + (f"; over all seeds at most F - {args.margin:g} sqrt(F) healthy stops" if args.margin else "")
    )
    with ProcessRunner(args.workers) as runner:
        for sigma in (float(s) for s in args.sigmas.split(",")):
            part_rows: list[list[dict[str, Any]]] = []
            for part in parts:
                rows: list[dict[str, Any]] = []
                budgets = [(n, s) for n in args.max_extra_evals for s in args.max_eval_share]
                for n_extra, share in budgets:
                    budget = None if n_extra is None and share is None else EvalBudget(n_extra, share)
                    for label, detector in variants:
                        got = cadence_comparison(
                            replace(WorkloadConfig(), sigma=sigma),
                            part,
                            detector=detector,
                            cadences=cadences,
                            eval_cost=args.eval_cost,
                            runner=runner,
                            eval_budget=budget,
                        )
                        if budget is not None:
                            tag = ", ".join(f"{k}={v:g}" for k, v in budget.to_dict().items() if v is not None)
                            label = f"{label}, {tag}" if label else tag
                        rows += [{**r, "variant": label} for r in (got if not rows else got[1:])]  # one Oracle row
                _table(
                    rows,
                    f"sigma {sigma:g}, seeds {part[0]}-{part[-1]}, SRTF-Est, {args.detector} detector, eval cost "
                    f"{args.eval_cost:g} of an interval",
                )
                part_rows.append([r for r in rows if r["stop"] != "oracle"])
            pick = choose_on_all(part_rows, margin=args.margin)
            print(
                f"\nchosen on these seeds ({rule}): "
                + ("none" if pick is None else f"{pick[0] or args.detector}, {pick[1]}")
            )
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
