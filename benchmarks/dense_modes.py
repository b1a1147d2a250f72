"""Healthy runs made dense and noisy in the per-example and mean-and-spread modes: false stops per run.

Issue 47 asks that the false-stop rate hold per run "in every mode". ``benchmarks/dense_noisy.py`` shows it for the
means only; this study gives the synthetic runs of that study **per-example scores**, so the default's per-example
test (the paired slope t) and its mean-and-spread test (the known-variance z) can be measured as evals get denser,
on tuning data that can show a problem (the 33 dense tune traces showed none).

**The per-example scores** follow the simulator's rule (:mod:`platform_sim.sim.eval_scores`,
:class:`~platform_sim.sim.eval_scores.PerExampleObservation`): ``n`` examples per eval, each with a fixed difficulty
``a_j`` (the same at every eval of the run) and fresh sampling noise ``b_tj`` of sd ``sigma * sqrt(n)`` at every eval,
with ``rho = var(a) / (var(a) + var(b))`` = 0.85 (the simulator's default, measured on the shipped real traces); the
deviations are centred per eval and added to the eval's observed mean, so the scores' mean is exactly the mean the
means-only study sees (noise sd ``sigma`` = the cell's noise level times the run's gain). **Mean-and-spread**: the
mean with the sample standard deviation (``ddof=1``) and count of those scores (the rule of
``benchmarks/mean_and_spread.py``).

Cells: the two healthy families of ``dense_noisy.py`` (``saturating``, ``plateau``) at N = 20, 50, 120, 300 evals (one
per step, planned steps = N), noise 5%, 10%, 25% of the gain; the dense recorded traces (every 1st, 2nd, 5th step)
with their recorded per-example scores; the real corpus's healthy traces of the split at their normal cadence. Recall
at the normal cadence: synthetic hacking at 20 evals (noise 5%, 10%) and synthetic hacking that peaks at 15%, 30%,
50% or 70% of its plan (``dense_noisy.peaked_hacking``, 30 evals; added to choose the spending shape ``spend_power``
after a held-out loss of early-peaking traces, ``dense_noisy.PEAK_SHARES``), with per-example scores, and the real
corpus's hacking traces of the split in the mode.

Evidence discipline: ``--split tune`` (seeds 0.., tune environments) to choose; ``--split test`` (seeds from
1,000,000, test environments) to judge, once.

    python benchmarks/dense_modes.py --split tune [--runs 100] [--examples 64] [--spec LABEL=JSON ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from dense_noisy import (
    DENSITIES,
    EVERY,
    FAMILIES,
    PEAK_SHARES,
    PEAKED_EVALS,
    TEST_SEED,
    DetectorFactory,
    Run,
    dense_traces,
    hacking_cell,
    hacking_table,
    healthy_cell,
    peaked_hacking,
    real_hacking,
    spec_factory,
    synthetic_hacking,
    synthetic_healthy,
    trace_run,
)

from platform_sim.core.detectors import default_spec, detector_from_spec
from platform_sim.sim.eval_scores import DEFAULT_RHO

MODES: tuple[str, ...] = ("per-example", "mean-and-spread")
NOISES: tuple[float, ...] = (0.05, 0.1, 0.25)


def with_examples(run: Run, rel_sigma: float, examples: int, seed: int, rho: float = DEFAULT_RHO) -> Run:
    """``run`` with per-example scores whose mean is its observed mean (module docstring: the simulator's rule)."""
    rng = np.random.default_rng([seed, len(run.steps), examples, 4701])
    noise_sd = rel_sigma * run.gain * np.sqrt(examples)  # the mean's noise sd is rel_sigma * gain
    difficulty = rng.normal(0.0, noise_sd * np.sqrt(rho / (1.0 - rho)), examples)
    noise = rng.normal(0.0, noise_sd, (len(run.steps), examples))
    block = (difficulty - difficulty.mean()) + (noise - noise.mean(axis=1, keepdims=True))
    scores = run.observed[:, None] + block
    return replace(run, examples=tuple(tuple(row) for row in scores.tolist()))


def shipped() -> dict[str, DetectorFactory]:
    """The default (reports carry planned_steps) and the default without a plan (per look in every mode)."""
    spec = default_spec()
    return {
        "default": spec_factory(spec),
        "default, per look": spec_factory({**spec, "params": {**spec["params"], "means_test": "window"}}),
    }


def healthy_rows(
    detectors: dict[str, DetectorFactory],
    split: str,
    runs: int,
    examples: int,
    densities: Sequence[int],
    rho: float = DEFAULT_RHO,
) -> list[dict[str, Any]]:
    seed0 = 0 if split == "tune" else TEST_SEED
    rows = []
    for fam in FAMILIES:
        for n in densities:
            for r in NOISES:
                rs = [
                    with_examples(run, r, examples, seed0 + i, rho)
                    for i, run in enumerate(synthetic_healthy(fam, n, r, runs, seed0))
                ]
                for mode in MODES:
                    for name, make in detectors.items():
                        cell = healthy_cell(make, rs, mode)
                        rows.append({"source": fam, "evals": n, "noise": r, "mode": mode, "detector": name, **cell})
    real = real_hacking(split, "healthy")  # the real corpus's healthy traces at their normal cadence
    for mode in MODES:
        for name, make in detectors.items():
            cell = healthy_cell(make, real, mode)
            n = round(statistics.median(len(r.steps) for r in real))
            rows.append({"source": "real corpus", "evals": n, "noise": None, "mode": mode, "detector": name} | cell)
    traces = dense_traces(split)
    for every in EVERY:
        rs = [trace_run(t, every) for t in traces]
        n = round(statistics.median(len(r.steps) for r in rs)) if rs else 0
        for mode in MODES:
            for name, make in detectors.items():
                cell = healthy_cell(make, rs, mode)
                rows.append(
                    {
                        "source": f"dense traces, every {every}",
                        "evals": n,
                        "noise": None,
                        "mode": mode,
                        "detector": name,
                    }
                    | cell
                )
    return rows


def hacking_rows(
    detectors: dict[str, DetectorFactory], split: str, runs: int, examples: int, rho: float = DEFAULT_RHO
) -> list[dict[str, Any]]:
    seed0 = 0 if split == "tune" else TEST_SEED
    rows = []
    real = real_hacking(split)
    for r in (0.05, 0.1):
        hacking = synthetic_hacking(20, r, runs, seed0)
        rs = [with_examples(run, r, examples, seed0 + i, rho) for i, run in enumerate(hacking)]
        for mode in MODES:
            for name, make in detectors.items():
                cell = hacking_cell(make, rs, mode)  # type: ignore[arg-type]
                rows.append({"source": f"synthetic, 20 evals, noise {r:g}", "mode": mode, "detector": name, **cell})
    for peak in PEAK_SHARES:  # early and late peaks (dense_noisy.PEAK_SHARES says why they were added)
        for r in (0.05, 0.1):
            rs = [
                with_examples(run, r, examples, seed0 + i, rho)
                for i, run in enumerate(peaked_hacking(peak, r, runs, seed0))
            ]
            for mode in MODES:
                for name, make in detectors.items():
                    cell = hacking_cell(make, rs, mode)  # type: ignore[arg-type]
                    source = f"synthetic, peak at {peak:.0%}, {PEAKED_EVALS} evals, noise {r:g}"
                    rows.append({"source": source, "mode": mode, "detector": name, **cell})
    for mode in MODES:
        for name, make in detectors.items():
            cell = hacking_cell(make, real, mode)  # type: ignore[arg-type]
            rows.append({"source": f"real corpus ({split})", "mode": mode, "detector": name, **cell})
    return rows


def _cell(r: dict[str, Any]) -> str:
    return f"{r['stopped']}/{r['runs']} ({r['costly']} costly)" + ("" if r["ok"] else " ✗")


def healthy_table(rows: Sequence[dict[str, Any]]) -> str:
    dets = list(dict.fromkeys(r["detector"] for r in rows))
    lines = [
        "| healthy runs | evals/run | noise (sd/gain) | mode | " + " | ".join(dets) + " |",
        "|---|---:|---:|---|" + "---:|" * len(dets),
    ]
    keys = list(dict.fromkeys((r["source"], r["evals"], r["noise"], r["mode"]) for r in rows))
    for key in keys:
        cells = {r["detector"]: r for r in rows if (r["source"], r["evals"], r["noise"], r["mode"]) == key}
        noise = "recorded" if key[2] is None else f"{key[2]:g}"
        lines.append(
            f"| {key[0]} | {key[1]} | {noise} | {key[3]} | " + " | ".join(_cell(cells[d]) for d in dets) + " |"
        )
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]], hrows: Sequence[dict[str, Any]]) -> list[str]:
    """Per mode and detector: cells missed, worst share stopped, worst cost; recall (the choice rule's order)."""
    out = []
    for mode in MODES:
        for det in dict.fromkeys(r["detector"] for r in rows):
            mine = [r for r in rows if r["mode"] == mode and r["detector"] == det]
            hack = [r for r in hrows if r["mode"] == mode and r["detector"] == det]
            missed = sum(not r["ok"] for r in mine)
            share = max((r["stopped"] / max(r["runs"], 1) for r in mine), default=0.0)
            cost = max((r["worst_cost"] for r in mine), default=0.0)
            recall = ", ".join(f"{r['source']} {r['stopped']}/{r['runs']}" for r in hack)
            out.append(
                f"- {mode}, {det}: {missed}/{len(mine)} cells missed; worst share stopped {share:.0%}, worst cost "
                f"{cost:.0%} of the gain; recall: {recall}"
            )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="synthetic runs per cell (default 100)")
    ap.add_argument("--split", choices=("tune", "test"), default="tune")
    ap.add_argument("--examples", type=int, default=64, help="examples per eval of the synthetic runs (default 64)")
    ap.add_argument(
        "--rho",
        type=float,
        default=DEFAULT_RHO,
        help="correlation of an example's scores at two evals (default: the simulator's 0.85; 0: fresh examples "
        "at every eval, where the spread is the mean's whole noise)",
    )
    ap.add_argument("--densities", type=int, nargs="+", default=list(DENSITIES), metavar="N")
    ap.add_argument("--no-default", action="store_true", help="only the --spec detectors")
    ap.add_argument("--spec", action="append", default=[], metavar="LABEL=JSON", help="also a detector spec")
    args = ap.parse_args(argv)
    logging.getLogger("platform_sim").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    detectors = {} if args.no_default else shipped()
    for text in args.spec:
        label, sep, spec = text.partition("=")
        if not sep or not label:
            ap.error(f"--spec: expected LABEL=JSON, got {text!r}")
        parsed = json.loads(spec)
        detector_from_spec(parsed)
        detectors[label] = spec_factory(parsed)
    rows = healthy_rows(detectors, args.split, args.runs, args.examples, args.densities, args.rho)
    hrows = hacking_rows(detectors, args.split, args.runs, args.examples, args.rho)
    print(
        f"## Healthy runs, per-example and mean-and-spread ({args.split} data, {args.examples} examples per eval, rho {args.rho:g})\n"
    )
    print(healthy_table(rows))
    print("\n## Hacking runs, normal cadence\n")
    print(hacking_table(hrows, modes=True))
    print("\n## Summary (cells that miss a target: > 5% stopped or a costly stop)\n")
    print("\n".join(summary(rows, hrows)))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
