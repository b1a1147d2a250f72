"""Where the default's costly stops lose their gain: the stop itself, or the checkpoint it delivers.

``dense_noisy.py`` calls a stop costly when the checkpoint the monitor delivers (its best *observed* eval up to the
stop) is more than 10% of the run's gain below the run's best *true* score. That loss has two parts:

- **the stop's own cost**: the best true score among the evals up to the stop, against the run's best. A stop before
  the run has made its gain (an early dip, a run that rises again later) loses this part, and no choice of checkpoint
  can win it back;
- **the checkpoint choice**: the best true score up to the stop, against the true score of the eval delivered. Under
  noise the best observed eval is often a noise spike (the winner's curse), not the best checkpoint.

This script replays every run of ``dense_noisy.py``'s harness (the groups and evidence modes of
``norise_stops.py``) through the real core with the default, and lists each costly stop with both parts, the
progress of the stop and of the delivered eval, and the cause (the part over the 10% bar; "both" when each is).

A what-if table follows: the same stops had the delivered eval been the one with the best centred moving mean of
``W`` observed evals up to the stop (``--widths``), a choice that averages out some noise. The core delivers the best
observed eval (the project's contract); this measures what another choice would give, it changes nothing. A width is
to be chosen on ``--split tune`` and judged on ``--split test``.

    python benchmarks/costly_stops.py [--split test] [--runs 200] [--widths 3 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import dense_noisy as dn
import numpy as np
from norise_stops import groups

from platform_sim.core.detectors import default_spec, detector_from_spec


@dataclass(frozen=True)
class Stop:
    """One stop of the default, its cost split in two (shares of the run's gain)."""

    run: str
    at: float  # progress of the stop (step over planned steps)
    delivered_at: float  # progress of the delivered eval
    cost: float  # the run's best true score minus the delivered eval's true score
    own: float  # the run's best true score minus the best true score up to the stop
    smoothed: dict[int, float]  # the cost had the eval with the best centred moving mean of W evals been delivered

    @property
    def choice(self) -> float:
        """What the checkpoint choice lost: the best true score up to the stop minus the delivered one's."""
        return self.cost - self.own

    @property
    def cause(self) -> str:
        own, choice = self.own > dn.COST_BAR, self.choice > dn.COST_BAR
        if own and choice:
            return "both"
        if own:
            return "the stop"
        return "the checkpoint choice" if choice else "neither alone"


def smoothed_best(observed: np.ndarray, width: int) -> int:
    """The index of the best centred moving mean of ``width`` observed evals (fewer at the ends: only the evals
    up to the stop exist), ties to the earliest; ``width`` 1 is the contract's choice, the best observed eval."""
    h = width // 2
    n = len(observed)
    # Each window's mean from its own values (no running sums: their round-off would break ties between equal evals).
    means = [float(np.mean(observed[max(0, i - h) : min(n, i + h + 1)])) for i in range(n)]
    return int(np.argmax(means))


def replay(run: dn.Run, mode: str, widths: Sequence[int] = ()) -> Stop | None:
    """The default on ``run`` in ``mode`` (means only, per-example, mean-and-spread); None if never stopped.
    ``widths``: also the cost of delivering the best moving mean of that many evals (what-if, not the core's)."""
    # dense_noisy's replay through the real monitor: the index of the stop and of the delivered (best observed) eval.
    stop, best = dn.replay(detector_from_spec(default_spec()), run, False if mode == "means only" else mode)
    if stop is None:
        return None
    planned = run.planned_steps or int(run.steps[-1])
    seen = np.asarray(run.observed[: stop + 1], dtype=float)
    smoothed = {w: dn.cost_of(run, smoothed_best(seen, w)) for w in widths}
    own = dn.cost_of(run, int(np.argmax(run.true[: stop + 1])))
    at, delivered = run.steps[stop] / planned, run.steps[best] / planned
    return Stop(run.name, at, delivered, dn.cost_of(run, best), own, smoothed)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("tune", "test"), default="test", help="tuning or held-out data (default test)")
    ap.add_argument("--runs", type=int, default=200, help="synthetic runs per cell (default 200)")
    ap.add_argument(
        "--widths",
        type=int,
        nargs="*",
        default=[3, 5],
        metavar="W",
        help="what-if: also the costs had the best centred moving mean of W evals been delivered (default 3 5)",
    )
    args = ap.parse_args(argv)
    if any(w < 1 for w in args.widths):
        ap.error(f"--widths: every width must be >= 1, got {args.widths}")
    widths = [1, *args.widths]
    logging.basicConfig(level=logging.ERROR)  # the detector's once-per-detector fallback warnings
    print(
        f"split {args.split}, {args.runs} synthetic runs per cell; costly: the delivered eval gives up more than "
        f"{dn.COST_BAR:.0%} of the run's gain"
    )
    print("| runs | mode | run | stop at | delivered | cost | the stop's own | the choice's | cause |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    causes: dict[str, Counter[str]] = {"healthy": Counter(), "hacking": Counter()}
    # Recorded traces apart: their "true" curve is itself a moving mean of what was recorded (dense_noisy.smooth),
    # so a moving-mean choice is judged there partly by its own yardstick; the synthetic runs have a noise-free truth.
    costs: dict[tuple[str, str], dict[int, list[float]]] = {}
    for name, runs, modes in groups(args.split, args.runs):
        kind = name.split()[0]
        source = "recorded" if "real" in name or "traces" in name else "synthetic"
        for mode in modes:
            for run in runs:
                s = replay(run, mode, widths)
                if s is None:
                    continue
                assert s.smoothed[1] == s.cost  # width 1 is the monitor's own choice
                for w in widths:
                    costs.setdefault((kind, source), {v: [] for v in widths})[w].append(s.smoothed[w])
                if s.cost <= dn.COST_BAR:
                    continue
                causes[kind][s.cause] += 1
                print(
                    f"| {name} | {mode} | {s.run} | {s.at:.0%} | {s.delivered_at:.0%} | {s.cost:.0%} | {s.own:.0%} | "
                    f"{s.choice:.0%} | {s.cause} |"
                )
    for kind, count in causes.items():
        parts = ", ".join(f"{c} {n}" for c, n in count.most_common()) or "none"
        stops = sum(len(by_width[1]) for (k, _), by_width in costs.items() if k == kind)
        print(f"\n{kind}: {sum(count.values())} costly of {stops} stops; cause: {parts}")
    print("\nWhat-if, the same stops with another choice of the delivered eval (1: the best observed, as shipped):")
    print("| stops | choice | costly | mean cost | median cost | 90th pct |")
    print("|---|---|---:|---:|---:|---:|")
    for (kind, source), by_width in sorted(costs.items()):
        for w, cs in by_width.items():
            label = "best observed eval (shipped)" if w == 1 else f"best moving mean of {w}"
            q90 = float(np.quantile(cs, 0.9))
            print(
                f"| {kind}, {source} ({len(cs)}) | {label} | {sum(c > dn.COST_BAR for c in cs)} | {statistics.fmean(cs):.1%} | "
                f"{statistics.median(cs):.1%} | {q90:.1%} |"
            )


if __name__ == "__main__":
    main()
