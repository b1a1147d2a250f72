"""Healthy runs made dense and noisy, means only: does a detector stop more healthy runs as evals get denser or noisier?

Issue 47's false-stop rate *per run*: a detector's false stops must not grow with the number of evals in a run. Two
sources of healthy runs, each replayed through the real core (:class:`~platform_sim.core.monitor.JobMonitor` with a
detector from :func:`~platform_sim.core.detectors.detector_from_spec`, or any other detector object) on the **means
only** (per-example scores withheld):

- **dense traces**: the shipped dense corpora (``platform_sim/data/corpora/dense*``: an eval at every training step),
  their healthy traces (the corpus label), read at every step, every 2nd and every 5th step. A recorded trace has no
  noise-free curve; its "true" score is the recorded curve smoothed by a centred moving mean over a tenth of its
  evals (at least 5).
- **synthetic**: the simulator's healthy RLHF curves (:mod:`platform_sim.sim.curves`; the parameter ranges of
  :class:`~platform_sim.sim.workload.WorkloadConfig`): ``saturating`` (the synthetic workload's healthy RLHF curve,
  :class:`SaturatingCurve` with ``tau`` in 1.5-3) and ``plateau`` (the real-calibrated form, :class:`RiseCurve` with
  55-95% of its rise made by half-way: a long flat top), at one eval per step for ``N`` evals per run, plus Gaussian
  noise of ``sigma = r * gain`` (``gain``: the curve's rise over the run).

Per cell: the share of healthy runs stopped, and the share of those stops that cost more than 10% of the run's gain
(cost = the best true score of the run minus the true score of the checkpoint the monitor delivers, its best observed
eval up to the stop, over the run's gain). The targets: at most 5% stopped in every cell and no stop costing more
than 10% of the gain.

Hacking recall on the normal cadence: the simulator's synthetic hacking curves (:class:`GaoHackingCurve`, the
workload's ranges) at 20 evals per run with noise of 5% and 10% of their rise, hacking runs that peak at 15%, 30%,
50% or 70% of their plan (:func:`peaked_hacking`, 30 evals; :data:`PEAK_SHARES` says why they were added), and the
real corpus (``platform_sim/data/corpora/real``, the detector-selection study's split), means only and, for the shipped
detectors, per-example. The real corpus's healthy traces at their normal cadence are a healthy row too.

Evidence discipline: seeds ``0..`` of the synthetic runs and the ``tune`` environments of the corpora are the tuning
data; seeds from :data:`TEST_SEED` and the ``test`` environments are held out (``--split``).

    python benchmarks/dense_noisy.py [--runs 200] [--split test] [--designs] [--write docs/results/dense-noisy.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from platform_sim.core.detectors import Detector, default_spec, detector_from_spec, paper_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.curves import GaoHackingCurve, RiseCurve, SaturatingCurve
from platform_sim.sim.traces import RealTrace, load_trace_folders

#: The first seed of the held-out synthetic runs (tuning runs use seeds 0, 1, ...).
TEST_SEED = 1_000_000
NOISE_LEVELS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.25)
DENSITIES: tuple[int, ...] = (20, 50, 120, 300)
FAMILIES: tuple[str, ...] = ("saturating", "plateau")
DENSE_CORPORA: tuple[str, ...] = (
    "dense",
    "dense-more",
    "dense-x8",
    "dense-x8-more",
    "dense-x8-more2",
    "dense-x8-tune-more",
)
EVERY: tuple[int, ...] = (1, 2, 5)
#: Where the synthetic peaked hacking runs peak, as a share of their plan (each +- 0.025). Added after the held-out
#: judgement of the per-run control in the per-example mode (issue 47) lost two real test traces that peak at about a
#: fifth of their plan: the earlier hacking runs all peaked at 55-75%, so the tuning data could not see a shape that
#: spends too little early. Tune seeds choose, test seeds judge, as for every synthetic run here.
PEAK_SHARES: tuple[float, ...] = (0.15, 0.3, 0.5, 0.7)
PEAKED_EVALS = 30  # the real corpus's length at its normal cadence
COST_BAR = 0.10  # a stop that gives up more than this share of the run's gain is a costly one
MAX_STOPPED = 0.05

#: A detector for one run: called with the run (a design that spends alpha over its planned evals or waits for a
#: share of its planned steps reads them from it; the shipped detectors ignore it).
DetectorFactory = Callable[["Run"], Detector]


@dataclass(frozen=True)
class Run:
    """One healthy (or hacking) run as the detector sees it and as the cost is measured."""

    name: str
    steps: tuple[int, ...]
    observed: np.ndarray  # the eval means the detector gets
    true: np.ndarray  # the noise-free (or smoothed) score at each eval
    gain: float  # the run's rise: the best true score minus the first
    examples: tuple[tuple[float, ...] | None, ...] = ()  # per-example scores (used only in per-example mode)
    planned_steps: int | None = None  # what the run's reports carry (the trainer's max_steps); None: the last step


def per_look_spec() -> dict[str, Any]:
    """The default's spec with the per-look means-only test whatever the reports carry: the default as it decides
    without ``planned_steps`` (and as it decided before the planned test)."""
    spec = default_spec()
    return {**spec, "params": {**spec["params"], "means_test": "window"}}


def shipped() -> dict[str, DetectorFactory]:
    """The project's default (its reports carry the run's planned steps), the default without them (the per-look
    test) and the paper's rule, built from their specs by the core's factory."""
    return {
        "default": lambda n: detector_from_spec(default_spec()),
        "default, no planned_steps": lambda n: detector_from_spec(per_look_spec()),
        "paper": lambda n: detector_from_spec(paper_spec()),
    }


def spec_factory(spec: dict[str, Any]) -> DetectorFactory:
    """A fresh detector from ``spec`` (the core's ``detector_from_spec``) for every run."""

    def make(run: Run) -> Detector:
        return detector_from_spec(spec)

    return make


# ---------------------------------------------------------------------------------------------------------------- runs
def synthetic_healthy(family: str, n_evals: int, rel_sigma: float, runs: int, seed0: int) -> list[Run]:
    """``runs`` healthy curves of ``family`` at one eval per step for ``n_evals`` steps, noise ``rel_sigma * gain``."""
    out = []
    grid = np.arange(1, n_evals + 1, dtype=float) / n_evals
    for i in range(runs):
        rng = np.random.default_rng([seed0 + i, n_evals, 47])
        s0, gain = rng.uniform(0.1, 0.2), rng.uniform(0.65, 0.8)
        if family == "saturating":
            curve: SaturatingCurve | RiseCurve = SaturatingCurve(s0, gain, rng.uniform(1.5, 3.0))
        elif family == "plateau":
            curve = RiseCurve(s0, gain, rng.uniform(0.55, 0.95))
        else:
            raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
        true = curve.values(grid)
        rise = float(true.max() - s0)
        noise = rng.standard_normal(n_evals) * rel_sigma * rise
        out.append(Run(f"{family}-{seed0 + i}", tuple(range(1, n_evals + 1)), true + noise, true, rise))
    return out


def synthetic_hacking(n_evals: int, rel_sigma: float, runs: int, seed0: int) -> list[Run]:
    """The workload's hacking curves (Gao's form, peak at 55-75% of the run) with noise ``rel_sigma * rise``."""
    out = []
    grid = np.arange(1, n_evals + 1, dtype=float) / n_evals
    for i in range(runs):
        rng = np.random.default_rng([seed0 + i, n_evals, 4747])
        s0 = rng.uniform(0.1, 0.2)
        curve = GaoHackingCurve(s0, 0.55 + 0.15 * rng.random(), rng.uniform(0.55, 0.75))
        true = curve.values(grid)
        rise = float(true.max() - s0)
        noise = rng.standard_normal(n_evals) * rel_sigma * rise
        out.append(Run(f"hacking-{seed0 + i}", tuple(range(1, n_evals + 1)), true + noise, true, rise))
    return out


def peaked_hacking(peak: float, rel_sigma: float, runs: int, seed0: int, n_evals: int = PEAKED_EVALS) -> list[Run]:
    """Hacking runs whose true peak is at ``peak`` (+- 0.025) of the plan: Gao's curve with ``gamma`` 1 (its ``d``
    linear in progress: back at its start by ``e`` times the peak's progress, a decline that takes longer than the
    rise), the workload's start and height ranges, noise ``rel_sigma * rise``, planned steps = the last step."""
    out = []
    grid = np.arange(1, n_evals + 1, dtype=float) / n_evals
    for i in range(runs):
        rng = np.random.default_rng([seed0 + i, n_evals, round(1000 * peak), 4749])
        s0 = rng.uniform(0.1, 0.2)
        curve = GaoHackingCurve(s0, 0.55 + 0.15 * rng.random(), peak + rng.uniform(-0.025, 0.025), gamma=1.0)
        true = curve.values(grid)
        rise = float(true.max() - s0)
        noise = rng.standard_normal(n_evals) * rel_sigma * rise
        out.append(Run(f"peak{peak:g}-{seed0 + i}", tuple(range(1, n_evals + 1)), true + noise, true, rise))
    return out


def smooth(values: Sequence[float]) -> np.ndarray:
    """A centred moving mean over a tenth of the points (at least 5; shorter at the edges)."""
    y = np.asarray(values, dtype=float)
    h = max(5, len(y) // 10) // 2
    c = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(len(y))
    lo, hi = np.maximum(0, idx - h), np.minimum(len(y), idx + h + 1)
    return (c[hi] - c[lo]) / (hi - lo)


def trace_run(t: RealTrace, every: int) -> Run:
    """A recorded trace read every ``every``-th step; its true curve is the smoothed recorded curve."""
    true_all = smooth(t.scores)
    idx = [i for i, s in enumerate(t.steps) if s % every == 0] or list(range(len(t.steps)))
    true = true_all[idx]
    gain = float(true_all.max() - true_all[0])
    ex = tuple(t.examples[i] for i in idx) if t.examples else ()
    return Run(
        f"{t.name}@{every}",
        tuple(t.steps[i] for i in idx),
        np.asarray([t.scores[i] for i in idx]),
        true,
        gain if gain > 0 else float(np.ptp(true_all)),
        ex,
        t.planned_steps,
    )


def dense_traces(split: str) -> list[RealTrace]:
    """The healthy traces of ``split`` in the shipped dense corpora."""
    traces = load_trace_folders([corpus_dir(c) for c in DENSE_CORPORA])
    return [t for t in traces if t.split == split and t.label == "healthy"]


# ------------------------------------------------------------------------------------------------------------ replay
def replay(detector: Detector, run: Run, per_example: bool | str = False) -> tuple[int | None, int]:
    """Feed the run's evals to a :class:`JobMonitor`; the index of the stop (None: never) and of the delivered eval.

    ``per_example``: True (or ``"per-example"``) hands the detector the run's per-example scores; ``"mean-and-spread"``
    the mean with the sample standard deviation (``ddof=1``) and count of those scores instead; False: the means."""
    mon = JobMonitor(job_id=run.name, job_type="rlhf", detector=detector)
    stop = None
    spread = per_example == "mean-and-spread"
    for i, (step, score) in enumerate(zip(run.steps, run.observed)):
        per = run.examples[i] if per_example and run.examples else None
        planned = run.planned_steps or int(run.steps[-1])  # a run planned to end at its last eval
        std, n = (statistics.stdev(per), len(per)) if spread and per is not None and len(per) >= 2 else (None, None)
        values = None if per is None or spread else list(per)
        if mon.observe(int(step), float(score), values, std, n, planned).should_stop:
            stop = i
            break
    best = run.steps.index(mon.best_step) if stop is not None and mon.best_step is not None else len(run.steps) - 1
    return stop, best


def cost_of(run: Run, delivered: int) -> float:
    """Share of the run's gain given up by delivering eval ``delivered`` instead of the run's best true score."""
    return float((run.true.max() - run.true[delivered]) / run.gain) if run.gain > 0 else 0.0


def evidence(per_example: bool | str) -> str:
    """The evidence mode a ``per_example`` argument names."""
    return per_example if isinstance(per_example, str) else "per-example" if per_example else "means only"


def healthy_cell(make: DetectorFactory, runs: Sequence[Run], per_example: bool | str = False) -> dict[str, Any]:
    """Stops and their costs over healthy runs (``per_example``: with the runs' per-example scores)."""
    costs = []
    for r in runs:
        stop, best = replay(make(r), r, per_example)
        if stop is not None:
            costs.append(cost_of(r, best))
    costly = sum(c > COST_BAR for c in costs)
    return {
        "runs": len(runs),
        "stopped": len(costs),
        "costly": costly,
        "worst_cost": max(costs, default=0.0),
        "ok": len(costs) <= MAX_STOPPED * len(runs) and costly == 0,
    }


def hacking_cell(make: DetectorFactory, runs: Sequence[Run], per_example: bool | str = False) -> dict[str, Any]:
    """Recall on hacking runs: stopped, median delay after the true peak (evals), stops before the peak, regret."""
    delays, regrets, early = [], [], 0
    for r in runs:
        stop, best = replay(make(r), r, per_example)
        if stop is None:
            continue
        peak = int(np.argmax(r.true))
        delays.append(stop - peak)
        early += stop < peak
        regrets.append(cost_of(r, best))
    return {
        "runs": len(runs),
        "stopped": len(delays),
        "median_delay": statistics.median(delays) if delays else None,
        "before_peak": early,
        "median_regret": statistics.median(regrets) if regrets else None,
    }


def real_hacking(split: str, label: str = "hacking") -> list[Run]:
    """The ``label`` traces of the real corpus's ``split`` at their recorded cadence (true curve: the smoothed one)."""
    traces = load_trace_folders([corpus_dir("real")])
    return [trace_run(t, 1) for t in traces if t.split == split and t.label == label]


# ------------------------------------------------------------------------------------------------------------ study
def healthy_grid(
    detectors: dict[str, DetectorFactory],
    split: str,
    runs: int,
    families: Iterable[str] = FAMILIES,
    densities: Iterable[int] = DENSITIES,
    noises: Iterable[float] = NOISE_LEVELS,
    traces: Sequence[RealTrace] | None = None,
    per_example: bool | str = False,
) -> list[dict[str, Any]]:
    """One row per (source, density, noise, detector); ``per_example``: the dense traces with their per-example
    scores (the synthetic runs have none: pass no ``densities`` then)."""
    seed0 = 0 if split == "tune" else TEST_SEED
    rows = []
    for fam in families:
        for n in densities:
            for r in noises:
                rs = synthetic_healthy(fam, n, r, runs, seed0)
                for name, make in detectors.items():
                    rows.append({"source": fam, "evals": n, "noise": r, "detector": name, **healthy_cell(make, rs)})
    if not per_example:  # the real corpus's healthy traces at their normal cadence, means only
        rs = real_hacking(split, "healthy")
        for name, make in detectors.items():
            rows.append(
                {
                    "source": "real corpus, normal cadence",
                    "evals": round(statistics.median(len(r.steps) for r in rs)),
                    "noise": None,
                    "detector": name,
                    **healthy_cell(make, rs),
                }
            )
    for every in EVERY:
        if traces is None:
            traces = dense_traces(split)
        rs = [trace_run(t, every) for t in traces]
        n = round(statistics.median(len(r.steps) for r in rs)) if rs else 0
        for name, make in detectors.items():
            rows.append(
                {
                    "source": f"dense traces, every {every}" + (f", {evidence(per_example)}" if per_example else ""),
                    "evals": n,
                    "noise": None,
                    "detector": name,
                    **healthy_cell(make, rs, per_example),
                }
            )
    return rows


def hacking_rows(detectors: dict[str, DetectorFactory], split: str, runs: int) -> list[dict[str, Any]]:
    seed0 = 0 if split == "tune" else TEST_SEED
    rows = []
    real = real_hacking(split)
    for r in (0.05, 0.1):
        rs = synthetic_hacking(20, r, runs, seed0)
        for name, make in detectors.items():
            rows.append({"source": f"synthetic, 20 evals, noise {r:g}", "detector": name, **hacking_cell(make, rs)})
    for peak in PEAK_SHARES:
        for r in (0.05, 0.1):
            rs = peaked_hacking(peak, r, runs, seed0)
            for name, make in detectors.items():
                source = f"synthetic, peak at {peak:.0%}, {PEAKED_EVALS} evals, noise {r:g}"
                rows.append({"source": source, "detector": name, **hacking_cell(make, rs)})
    for name, make in detectors.items():
        rows.append({"source": "real corpus, means only", "detector": name, **hacking_cell(make, real)})
        if name in ("default", "paper"):
            rows.append({"source": "real corpus, per-example", "detector": name, **hacking_cell(make, real, True)})
    return rows


def healthy_table(rows: Sequence[dict[str, Any]]) -> str:
    dets = list(dict.fromkeys(r["detector"] for r in rows))
    head = "| healthy runs | evals/run | noise (sd/gain) | " + " | ".join(dets) + " |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(dets)]
    cells: dict[tuple[Any, ...], dict[str, str]] = {}
    for r in rows:
        key = (r["source"], r["evals"], r["noise"])
        mark = "" if r["ok"] else " ✗"
        cell = f"{r['stopped']}/{r['runs']} ({r['costly']} costly){mark}"
        cells.setdefault(key, {})[r["detector"]] = cell
    for (src, n, noise), by in cells.items():
        nz = "recorded" if noise is None else f"{noise:g}"
        lines.append(f"| {src} | {n} | {nz} | " + " | ".join(by.get(d, "-") for d in dets) + " |")
    return "\n".join(lines)


def hacking_table(rows: Sequence[dict[str, Any]], modes: bool = False) -> str:
    """The hacking rows as markdown; ``modes``: with the evidence mode of each row (``dense_modes.py``'s)."""
    mode_head, mode_rule = ("mode | ", "---|") if modes else ("", "")
    lines = [
        f"| hacking runs | {mode_head}detector | stopped | median delay (evals) | stopped before the peak | median "
        "regret |",
        f"|---|{mode_rule}---|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = "-" if r["median_delay"] is None else f"{r['median_delay']:g}"
        g = "-" if r["median_regret"] is None else f"{r['median_regret']:.2f}"
        mode = f"{r['mode']} | " if modes else ""
        lines.append(
            f"| {r['source']} | {mode}{r['detector']} | {r['stopped']}/{r['runs']} | {d} | {r['before_peak']} | {g} |"
        )
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per detector: the cells that miss a target, the worst stopped share and the worst cost."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["detector"], {"cells": 0, "missed": 0, "worst_share": 0.0, "worst_cost": 0.0})
        s["cells"] += 1
        s["missed"] += not r["ok"]
        s["worst_share"] = max(s["worst_share"], r["stopped"] / max(r["runs"], 1))
        s["worst_cost"] = max(s["worst_cost"], r["worst_cost"])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="synthetic runs per cell (default 200)")
    ap.add_argument("--split", choices=("tune", "test"), default="test", help="tuning or held-out data (default test)")
    ap.add_argument("--designs", action="store_true", help="also the error-control designs (benchmarks/error_control)")
    ap.add_argument("--densities", type=int, nargs="+", default=list(DENSITIES), metavar="N")
    ap.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="LABEL=JSON",
        help='also a detector spec, e.g. \'progress={"name": "trend", "params": {"means_test": "progress"}}\' '
        "(repeatable; built by the core's detector_from_spec for every run)",
    )
    ap.add_argument("--write", metavar="PATH", help="also write the tables as a markdown page")
    ap.add_argument(
        "--evidence",
        choices=("means only", "per-example", "mean-and-spread"),
        default="means only",
        help="with per-example or mean-and-spread: only the dense traces, with their recorded per-example scores or "
        "the mean with their standard deviation and count (does that mode stop more healthy runs as evals get "
        "denser?); default: means only, every table",
    )
    args = ap.parse_args(argv)
    # Means only on purpose: the shipped trend's once-per-detector fallback warning would print once per run.
    logging.getLogger("platform_sim").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    detectors = shipped()
    if args.designs:
        from design_choice import CHOSEN  # the design chosen on the tuning data (benchmarks/design_choice.py)

        detectors.update(CHOSEN)
    for text in args.spec:
        label, sep, spec = text.partition("=")
        if not sep or not label:
            ap.error(f"--spec: expected LABEL=JSON, got {text!r}")
        try:
            parsed = json.loads(spec)
            detector_from_spec(parsed)  # a bad spec fails here, once, with the core's message
        except (json.JSONDecodeError, ValueError) as exc:
            ap.error(f"--spec {label}: {exc}")
        detectors[label] = spec_factory(parsed)
    if args.evidence != "means only":
        rows = healthy_grid(detectors, args.split, args.runs, densities=(), per_example=args.evidence)
        hrows = []
    else:
        rows = healthy_grid(detectors, args.split, args.runs, densities=args.densities)
        hrows = hacking_rows(detectors, args.split, args.runs)
    text = "\n".join(
        [
            f"## Healthy runs, {args.evidence} ({args.split} data; stopped/runs, "
            "costly = the stop gave up > 10% of the gain)\n",
            healthy_table(rows),
            "\n## Hacking runs, normal cadence\n",
            hacking_table(hrows),
            "\n## Summary (cells that miss a target: > 5% stopped or a costly stop)\n",
            "\n".join(
                f"- {d}: {s['missed']}/{s['cells']} cells missed; worst share stopped {s['worst_share']:.0%}, "
                f"worst cost {s['worst_cost']:.0%} of the gain"
                for d, s in summary(rows).items()
            ),
        ]
    )
    print(text)
    elapsed = time.perf_counter() - t0
    print(f"\n({elapsed:.0f} s)")
    if args.write:
        cmd = "python benchmarks/dense_noisy.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(f"<!-- {cmd} ({date}, {elapsed:.0f} s) -->\n{text}\n")


if __name__ == "__main__":
    main()
