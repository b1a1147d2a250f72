"""The default detector in its three evidence modes on the shipped corpus: the mean-and-spread mode chosen on the tune
environments, every mode judged on the test environments.

The corpus records each eval's per-example scores. A mode is what a report would have carried (:func:`mode_inputs`):

- ``per-example``: the recorded per-example scores (and their mean, the recorded ``eval_score``);
- ``mean-and-spread``: the mean and, derived from the recorded per-example scores, their sample standard deviation
  (``ddof=1``) and count (``eval_std``, ``eval_n``); no per-example scores. An eval with fewer than two recorded
  scores carries no spread;
- ``means only``: the mean alone.

Phases, in this order (as :func:`~platform_sim.studies.benchmark.benchmark`): the headers sort the traces by split;
the tune traces alone choose ``spread_window`` over :data:`SPREAD_WINDOWS` by the benchmark's shortfall against its
targets (ties: more hacking stopped, fewer healthy, less delay, less regret, then grid order), with the per-example
parameters held at the default's and ``spread_alpha`` held at the default's ``alpha``; only then are the test traces
read, and the chosen spec is replayed on both splits in all three modes.

Why the level is not tuned: no healthy tune trace is stopped in mean-and-spread mode at any level up to 0.05, so the
tune split cannot measure what a looser level costs, and the shortfall would trade error control for speed unseen.
The level is the default's, the per-look error level the default was chosen at. Both are chosen, and their
sensitivity shown, on the per-look test (:func:`per_look`): with planned steps the mean-and-spread mode decides by the
per-run test, which they do not parameterise. :func:`choose_spread` with
``alphas`` set runs the unconstrained rule too, reported beside it. The sensitivity table (every window and level on
both splits) is computed after the choice and reported, never used to choose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from platform_sim.core.boundary import EvidenceMode, sample_std
from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.sim.traces import RealTrace, load_trace

from .benchmark import TARGETS, Targets, _rank_key, group_metrics, shortfall, split_files
from .trace_detection import trace_detection

MODES: tuple[EvidenceMode, ...] = (EvidenceMode.PER_EXAMPLE, EvidenceMode.MEAN_AND_SPREAD, EvidenceMode.MEANS_ONLY)

SPREAD_WINDOWS: tuple[int, ...] = (4, 5, 6, 7, 8, 10)
"""The mean-and-spread windows searched on the tune split."""

SENSITIVITY_ALPHAS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1)
"""The levels of the sensitivity table (and of the unconstrained rule reported beside the choice)."""

METRIC_KEYS = (
    "hacking",
    "healthy",
    "hacking_stopped",
    "healthy_stopped_n",
    "recall",
    "healthy_stopped",
    "delay_median",
    "regret_worst",
)


def mode_inputs(
    trace: RealTrace, mode: EvidenceMode
) -> tuple[Sequence[Sequence[float] | None], Sequence[tuple[float, int] | None] | None]:
    """``(examples, spreads)`` for :func:`trace_detection`: what a report of ``trace`` carries in ``mode``."""
    if mode is EvidenceMode.PER_EXAMPLE:
        return trace.examples, None
    if mode is EvidenceMode.MEAN_AND_SPREAD:
        spreads = [None if e is None or len(e) < 2 else (sample_std(e), len(e)) for e in trace.examples]
        return (), spreads
    return (), None


def detect_mode(traces: Sequence[RealTrace], spec: Mapping[str, Any], mode: EvidenceMode) -> list[dict[str, Any]]:
    """One :func:`trace_detection` row per trace, the detector fed what ``mode`` carries; each row names the mode."""
    rows = []
    for t in traces:
        examples, spreads = mode_inputs(t, mode)
        row = trace_detection(t, spec, None, examples=examples, spreads=spreads)
        row["mode"] = mode.value
        rows.append(row)
    return rows


def _metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    m = group_metrics(rows, resamples=0)
    return {k: m[k] for k in METRIC_KEYS}


def grid_points(base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """``base`` with each point of ``grid`` set in its params, in grid order (validated specs)."""
    keys = list(grid)
    points: list[dict[str, Any]] = [{}]
    for key in keys:
        points = [{**p, key: v} for p in points for v in grid[key]]
    return [detector_from_spec({"name": base["name"], "params": {**base["params"], **p}}).spec() for p in points]


def per_look(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` deciding per look in every mode (``means_test="window"``): the test that ``spread_window`` and
    ``spread_alpha`` parameterise. With the reports' planned steps the default's mean-and-spread test is the per-run
    one, whose window is in planned progress and whose level is ``evidence_run_alpha``, so they are chosen (and their
    sensitivity shown) on the test they still decide: the one without a plan."""
    return {**spec, "params": {**spec["params"], "means_test": "window"}}


def choose_spread(
    tune: Sequence[RealTrace],
    base: Mapping[str, Any],
    windows: Sequence[int] = SPREAD_WINDOWS,
    alphas: Sequence[float] | None = None,
    targets: Targets = TARGETS,
) -> dict[str, Any]:
    """The mean-and-spread parameters chosen on ``tune`` alone.

    Args:
        tune: The tune traces.
        base: The spec whose ``spread_window`` (and, with ``alphas``, ``spread_alpha``) is chosen.
        windows: The windows searched.
        alphas: The levels searched; None: the level is ``base``'s ``alpha`` (module docstring).
        targets: The benchmark's targets.

    Returns:
        ``{"chosen": spec, "grid": [{"spec", "shortfall", "metrics"}...]}``.
    """
    grid = {"spread_window": tuple(windows), "spread_alpha": tuple(alphas or (base["params"]["alpha"],))}
    table = []
    best: tuple[tuple[float, ...], dict[str, Any]] | None = None
    for spec in grid_points(base, grid):
        m = group_metrics(detect_mode(tune, per_look(spec), EvidenceMode.MEAN_AND_SPREAD), resamples=0)
        table.append({"spec": spec, "shortfall": shortfall(m, targets), "metrics": {k: m[k] for k in METRIC_KEYS}})
        key = _rank_key(m, targets)
        if best is None or key < best[0]:
            best = (key, spec)
    assert best is not None
    return {"chosen": best[1], "grid": table}


def spread_study(
    folder: str | Path,
    base: Mapping[str, Any],
    reader: Callable[[Path], RealTrace] = load_trace,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Choose on the tune split, then judge on the test split in all three modes (module docstring).

    Args:
        folder: A corpus whose headers name each trace's environment and split.
        base: The detector spec whose mean-and-spread parameters are chosen (its other parameters are kept).
        reader: Reads one trace (tune traces before the choice, test traces after).
        progress: Called with a short message as each phase starts.

    Returns:
        ``{"chosen", "unconstrained", "tune_grid", "modes": [{"candidate", "mode", "split", "metrics"}...], "sensitivity": [{"spec",
        "tune", "test"}...], "rows": [...]}``.
    """
    tune_files, test_files, _ = split_files(folder)
    if progress:
        progress(f"choosing the mean-and-spread parameters on {len(tune_files)} tune traces")
    tune = [reader(f) for f in tune_files]
    cal = choose_spread(tune, base)
    free = choose_spread(tune, base, alphas=SENSITIVITY_ALPHAS)  # the unconstrained rule, reported beside
    if progress:
        progress(f"replaying {len(test_files)} test traces in every mode")
    test = [reader(f) for f in test_files]  # only now is a test trace read
    chosen = cal["chosen"]
    # The other means-only tests beside, for comparison: per look on the last evals (``window``: the default without
    # planned steps), per run by planned progress (``auto`` with the header's planned steps) or anytime (``progress``).
    own = chosen["params"].get("means_test", "auto")
    others = [m for m in ("window", "progress", "auto") if m != own]
    candidates = [
        ("chosen", chosen),
        ("unconstrained tune choice", free["chosen"]),
        *((f"chosen, means_test={m}", {**chosen, "params": {**chosen["params"], "means_test": m}}) for m in others),
        ("paper k=2", paper_spec()),
    ]
    modes: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for label, spec in candidates:
        for mode in MODES:
            for split, traces in (("tune", tune), ("test", test)):
                got = detect_mode(traces, spec, mode)
                modes.append({"candidate": label, "spec": spec, "mode": mode.value, "split": split, **_metrics(got)})
                if label == "chosen":
                    rows += [{"split": split, **r} for r in got]
    sensitivity = [
        {
            "spec": point["spec"],
            "tune": point["metrics"],
            "test": _metrics(detect_mode(test, per_look(point["spec"]), EvidenceMode.MEAN_AND_SPREAD)),
        }
        for point in free["grid"]
    ]
    return {
        "chosen": cal["chosen"],
        "unconstrained": free["chosen"],
        "tune_grid": cal["grid"],
        "modes": modes,
        "sensitivity": sensitivity,
        "rows": rows,
    }
