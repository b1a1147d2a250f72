"""The default's "no-rise" stops: which runs it stops before they have risen, at what share of their plan, and what a
guard against early dips would change.

The default's planned means test (``PlannedSlope._material``) counts any significant fall as material while a run's
best window mean is still its first (it has not risen): a fine-tune that gets worse from its first evals is stopped.
On the held-out dense traces that rule stopped one healthy run at 10% of its plan (``docs/results/dense-noisy.md``).
This script replays every run of ``dense_noisy.py``'s harness (synthetic healthy cells, the real corpus's healthy
traces, the dense traces at every 1st, 2nd and 5th step, the synthetic and real hacking runs; the real and dense
traces in every evidence mode) through the real core, and for each stop says whether it was a no-rise stop and at
what progress (``*`` marks a costly stop). ``--guard P`` replays with a guard patched in for this experiment only:
no no-rise stop before progress ``P`` (the core has no such parameter).

Evidence discipline as in ``dense_noisy.py``: ``--split tune`` (seeds 0.., the tune environments) to choose,
``--split test`` (seeds from 1,000,000, the test environments) to judge.

    python benchmarks/norise_stops.py --split tune [--guard 0.2] [--runs 100]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
from collections.abc import Iterator, Sequence

import dense_noisy as dn

from platform_sim.core.detectors import default_spec, detector_from_spec
from platform_sim.core.detectors.progress import PlannedSlope
from platform_sim.core.detectors.trend import TrendDetector
from platform_sim.core.monitor import JobMonitor


@contextlib.contextmanager
def no_rise_guard(progress: float) -> Iterator[None]:
    """Within the block, a run that has not risen is stopped only from ``progress`` of its plan on (0: as shipped)."""
    shipped = PlannedSlope._material

    def guarded(self: PlannedSlope, slope: float, x_last: float) -> bool:
        assert self.best_level is not None and self.start_level is not None
        if self.best_level <= self.start_level:
            return self.progress() >= progress
        return shipped(self, slope, x_last)

    PlannedSlope._material = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        PlannedSlope._material = shipped  # type: ignore[method-assign]


def replay(run: dn.Run, mode: str) -> tuple[bool, float, float] | None:
    """The default on ``run`` in ``mode`` (means, per-example, mean-and-spread): None if never stopped, else
    (a no-rise stop?, progress at the stop, cost of the delivered eval as a share of the run's gain)."""
    det = detector_from_spec(default_spec())
    mon = JobMonitor(job_id=run.name, job_type="rlhf", detector=det)
    planned = run.planned_steps or int(run.steps[-1])
    for i, (step, score) in enumerate(zip(run.steps, run.observed)):
        per = run.examples[i] if mode != "means only" and run.examples else None
        std, n = (None, None)
        if mode == "mean-and-spread" and per is not None and len(per) >= 2:
            std, n = statistics.stdev(per), len(per)
        values = None if per is None or mode == "mean-and-spread" else list(per)
        if mon.observe(int(step), float(score), values, std, n, planned).should_stop:
            assert isinstance(det, TrendDetector)  # the default is trend's
            test = det._per_run.planned  # the planned test that decided (read for this study only)
            no_rise = (
                test is not None
                and test.best_level is not None
                and test.start_level is not None
                and test.best_level <= test.start_level
            )
            best = run.steps.index(mon.best_step) if mon.best_step is not None else i
            return no_rise, step / planned, dn.cost_of(run, best)
    return None


def groups(split: str, runs: int) -> Iterator[tuple[str, Sequence[dn.Run], tuple[str, ...]]]:
    """Every run of ``dense_noisy.py``'s harness for ``split``, with the evidence modes it is replayed in."""
    seed0 = 0 if split == "tune" else dn.TEST_SEED
    all_modes = ("means only", "per-example", "mean-and-spread")
    for fam in dn.FAMILIES:
        for n in dn.DENSITIES:
            for r in dn.NOISE_LEVELS:
                yield (
                    f"healthy {fam}, {n} evals, noise {r:g}",
                    dn.synthetic_healthy(fam, n, r, runs, seed0),
                    ("means only",),
                )
    yield "healthy real corpus", dn.real_hacking(split, "healthy"), all_modes
    traces = dn.dense_traces(split)
    for every in dn.EVERY:
        yield f"healthy dense traces, every {every}", [dn.trace_run(t, every) for t in traces], all_modes
    for r in (0.05, 0.1):
        yield f"hacking synthetic, noise {r:g}", dn.synthetic_hacking(20, r, runs, seed0), ("means only",)
    for p in dn.PEAK_SHARES:
        for r in (0.05, 0.1):
            yield f"hacking peak at {p:.0%}, noise {r:g}", dn.peaked_hacking(p, r, runs, seed0), ("means only",)
    yield "hacking real corpus", dn.real_hacking(split), all_modes


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("tune", "test"), default="tune", help="tuning or held-out data (default tune)")
    ap.add_argument("--runs", type=int, default=100, help="synthetic runs per cell (default 100)")
    ap.add_argument(
        "--guard", type=float, default=0.0, help="no no-rise stop before this progress (default 0: shipped)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the detector's once-per-detector fallback warnings
    print(f"split {args.split}, {args.runs} synthetic runs per cell, guard {args.guard:g}")
    print("| runs | mode | stopped | costly | no-rise stops | their progress (* costly) |")
    print("|---|---|---:|---:|---:|---|")
    with no_rise_guard(args.guard):
        for name, runs, modes in groups(args.split, args.runs):
            for mode in modes:
                stops = [s for s in (replay(r, mode) for r in runs) if s is not None]
                no_rise = [s for s in stops if s[0]]
                where = ", ".join(f"{p:.2f}{'*' if c > dn.COST_BAR else ''}" for _, p, c in no_rise)
                costly = sum(c > dn.COST_BAR for _, _, c in stops)
                print(f"| {name} | {mode} | {len(stops)}/{len(runs)} | {costly} | {len(no_rise)} | {where} |")


if __name__ == "__main__":
    main()
