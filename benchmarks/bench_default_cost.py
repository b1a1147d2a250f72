"""The default detector's cost in the simulator: ``evalstop-sim run`` with the default and with the paper's rule.

Issue 47: the default (``trend``) must cost at most 1.5x the paper's rule (``k-decline``, k=2) in the same run of
``evalstop-sim run --gpus 10240 --jobs 100000`` (before: about 108 s against 27 s, 4x). Both commands run here, one
after the other in this process, through the command's own Python entry (:func:`platform_sim.cli.main`), so that a
change in the core's detectors shows up; the ratio of the two is the figure (the machine is shared: the absolute
times move with its load, the ratio much less). ``--jobs 10000 --gpus 1024`` is the quick check.

A third row runs the paper's rule on the same command with the per-example scores generated as for the default
(which the paper's rule never reads): the same observations for both, so the ratio of the default to it is the
detector's own cost, and its difference from the paper's plain row is the cost of simulating per-example evals.

A fourth row is the floor the default cannot go below in this engine: the paper's rule on the same per-example rows,
handed to it as the default gets them (read-only arrays, checked by the monitor, not converted), by a detector class
registered in this process only (``k-decline-arrays``: ``k-decline`` that says it reads per-example scores and takes
arrays). Its time over the paper's plain row is what simulating per-example evals costs the default before any work
of its own; the target leaves the default's own work what is left of 1.5x.

With ``--profile`` the default's run is also profiled (cProfile, the 25 most expensive functions by own time and by
cumulative time), to show where the detector's time goes.

    python benchmarks/bench_default_cost.py [--gpus 10240] [--jobs 100000] [--reps 1] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import time
from collections.abc import Iterator

from platform_sim.cli import main as evalstop_sim
from platform_sim.core.detectors.kdecline import KDeclineDetector
from platform_sim.core.detectors.registry import register_detector
from platform_sim.sim import eval_scores

PAPER_FED = "paper (k-decline k=2), fed per-example scores"
FLOOR = "floor: paper's rule on the default's rows (arrays, no conversion)"


@register_detector
class KDeclineOnArrays(KDeclineDetector):
    """The paper's rule fed the per-example rows as the default is fed them (this benchmark only): the same
    observations and monitor path as the default's, with the paper's work per eval."""

    name = "k-decline-arrays"
    uses_example_scores = True  # so `run` generates per-example rows for it, as for the default
    takes_score_arrays = True  # so the monitor hands the checked array on as it is, as for the default


DETECTORS: dict[str, list[str]] = {
    "default (trend)": [],  # `run` with no --detector: the project's default, default_spec()
    "paper (k-decline k=2)": ["--detector", "k-decline"],
    PAPER_FED: ["--detector", "k-decline"],  # run with the default's observations (per_example_for_every_detector)
    FLOOR: ["--detector", "k-decline-arrays"],
}


@contextlib.contextmanager
def per_example_for_every_detector() -> Iterator[None]:
    """While open, ``evalstop-sim run`` generates per-example eval scores whatever the detector reads."""
    original = eval_scores.observation_for
    eval_scores.observation_for = lambda detector: {"name": "per-example", "params": {}}
    try:
        yield
    finally:
        eval_scores.observation_for = original


def command(gpus: int, jobs: int, extra: list[str]) -> list[str]:
    return ["run", "--gpus", str(gpus), "--jobs", str(jobs), "--json", *extra]


def timed_run(argv: list[str], per_example: bool = False) -> tuple[float, float]:
    """Wall and CPU seconds of one ``evalstop-sim`` command (its printout discarded); ``per_example``: with
    per-example scores generated whatever the detector."""
    observed = per_example_for_every_detector() if per_example else contextlib.nullcontext()
    w, c = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), observed:
        rc = evalstop_sim(argv)
    if rc not in (0, None):
        raise SystemExit(f"evalstop-sim {' '.join(argv)} exited with {rc}")
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=10240)
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--reps", type=int, default=1, help="runs per detector, alternating (default 1)")
    ap.add_argument("--profile", action="store_true", help="also profile the default's run (cProfile)")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in DETECTORS}
    for _ in range(args.reps):
        for name, extra in DETECTORS.items():
            times[name].append(timed_run(command(args.gpus, args.jobs, extra), per_example=name == PAPER_FED))
    print(
        f"evalstop-sim run --gpus {args.gpus} --jobs {args.jobs} (load average {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}; median of {args.reps})"
    )
    print("| detector | wall (s) | CPU (s) |\n|---|---:|---:|")
    med = {}
    for name, ts in times.items():
        med[name] = (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
        print(f"| {name} | {med[name][0]:.1f} | {med[name][1]:.1f} |")
    (dw, dc), (pw, pc) = med["default (trend)"], med["paper (k-decline k=2)"]
    fw, fc = med[PAPER_FED]
    print(f"\nratio default / paper: {dw / pw:.2f}x wall, {dc / pc:.2f}x CPU (target <= 1.5x)")
    print(f"ratio default / paper on the same per-example observations: {dw / fw:.2f}x wall, {dc / fc:.2f}x CPU")
    print(f"per-example observations alone (paper fed them / paper): {fw / pw:.2f}x wall, {fc / pc:.2f}x CPU")
    lw, lc = med[FLOOR]
    print(f"floor (paper's rule on the default's rows / paper): {lw / pw:.2f}x wall, {lc / pc:.2f}x CPU")
    print(
        f"the default's own work over the floor: {(dc - lc) / pc:.2f}x of the paper's CPU (1.5x leaves it "
        f"{max(0.0, 1.5 - lc / pc):.2f}x)"
    )
    if args.profile:
        prof = cProfile.Profile()
        with contextlib.redirect_stdout(io.StringIO()):
            prof.runcall(evalstop_sim, command(args.gpus, args.jobs, DETECTORS["default (trend)"]))
        for key in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(25)
            print(f"\n## default's run, by {key}\n")
            print(out.getvalue())


if __name__ == "__main__":
    main()
