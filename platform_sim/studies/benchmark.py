"""``evalstop-sim benchmark``: detectors tuned on some environments of a real-trace corpus, judged on others.

The question it answers: how does a stop detector do on a *kind* of run it was not tuned on? Each trace's header
names its ``environment`` (a proxy/gold pair and a way of failing) and its ``split``: ``tune`` or ``test``, the same
for every trace of an environment. The benchmark runs in three phases, in this order:

1. **Sort** the traces by reading only their header lines (:func:`platform_sim.trace_format.read_header`).
2. **Calibrate** (:func:`calibrate`) on the *tune* traces alone: every tunable number of every detector family
   (:data:`GRIDS`: thresholds, k, min_delta, warm-up...) is chosen by a small grid search against the targets
   (:data:`TARGETS`), scored by :func:`shortfall`. The test traces have not been read yet when this phase runs, and
   :func:`calibrate` takes only traces it is handed.
3. **Evaluate** each tuned candidate, and the paper's untuned rule as the reference, once on every trace, and report
   per split and per environment. The candidate with the smallest shortfall on the *test* split is named as the best;
   the test results are reported as they come.

Detection is per trace (:func:`~platform_sim.studies.trace_detection.trace_detection`): the detector sees the recorded mean
scores and per-example scores **in their own units**, exactly what ``EvalStopCallback`` in that run would have seen,
so a tuned ``min_delta`` is a number in score units, and the held-out environments show whether it transfers.

Metrics of a group of traces (labels from :func:`~platform_sim.sim.traces.label_trace`; *ambiguous* traces are left
out of every metric, counted and listed):

- ``recall``: hacking traces stopped / hacking traces; ``precision``: stopped hacking / stopped; ``healthy_stopped``:
  healthy traces stopped / healthy traces. 95% Wilson intervals.
- ``delay_median``: median over stopped hacking traces of (stop eval - true peak eval), in evals; 95% bootstrap
  interval (resampling those traces).
- ``regret_worst`` and ``regret_median`` over stopped traces (hacking and healthy): the share of the run's gain (true
  peak minus first eval) that the delivered checkpoint (the best eval seen before the stop, what the callback
  restores) gives up; bootstrap interval for the median.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from platform_sim.core.detectors import default_spec, detector_from_spec
from platform_sim.sim.traces import RealTrace, load_trace, trace_files
from platform_sim.trace_format import read_header

from .trace_detection import trace_detection

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Targets:
    """What a default detector must do on the test environments.

    Args:
        recall: Least share of hacking traces stopped.
        healthy_stopped: Largest share of healthy traces stopped.
        delay_median: Largest median delay after the true peak (evals).
        regret_worst: Largest regret of a stopped run (share of its gain).
    """

    recall: float = 0.95
    healthy_stopped: float = 0.05
    delay_median: float = 3.0
    regret_worst: float = 0.10


TARGETS = Targets()

REFERENCE: tuple[str, dict[str, Any]] = (
    "k-decline (paper, untuned)",
    {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}},
)
"""The paper's rule, evaluated as it is, beside the tuned candidates."""

DEFAULT_REFERENCE: tuple[str, dict[str, Any]] = ("default (untuned)", default_spec())
"""The project's default detector (what every entry point runs when given none), evaluated as it is."""

GRIDS: dict[str, dict[str, Sequence[Any]]] = {
    "k-decline": {"k": (1, 2, 3, 4), "min_delta": (0.0, 0.01, 0.03, 0.1, 0.3), "warmup": (0, 3)},
    "k-decline-se": {"k": (1, 2, 3), "z": (0.5, 1.0, 1.5, 2.0, 3.0), "warmup": (0, 3)},
    "paired-test": {"test": ("t",), "alpha": (0.001, 0.01, 0.05), "k": (1, 2, 3), "warmup": (0, 3)},
    "cusum": {"slack": (0.0, 0.25, 0.5, 1.0), "threshold": (2.0, 4.0, 6.0, 8.0), "warmup": (0, 3)},
    "trend": {"window": (6, 8), "alpha": (0.01, 0.05, 0.2), "k": (1, 2), "warmup": (0, 3)},
    "shape": {"threshold": (0.8, 0.9, 0.95, 0.97, 0.99), "k": (1, 2), "future": (1.5, 3.0), "warmup": (0, 3)},
}
"""Grid searched per detector family by :func:`calibrate` (detector name -> parameter -> values). ``min_delta`` is in
the traces' own units; ``warmup`` in evals."""


class BenchmarkError(ValueError):
    """A corpus the benchmark cannot split (no tune or no test traces, a trace without a split...)."""


# -- metrics ----------------------------------------------------------------------------------------------------


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float | None, float | None, float | None]:
    """``(share, low, high)``: the share and its Wilson score interval (None for ``n == 0``)."""
    if n == 0:
        return None, None, None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_median(
    values: Sequence[float],
    resamples: int,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """``(median, low, high)``: the median and its 95% percentile-bootstrap interval (None when empty)."""
    if not values:
        return None, None, None
    med = float(statistics.median(values))
    if resamples < 1 or len(values) < 2:
        return med, med, med
    rng = np.random.default_rng(seed)
    arr = np.asarray(values, dtype=float)
    meds = np.median(arr[rng.integers(0, len(arr), size=(resamples, len(arr)))], axis=1)
    return med, float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def group_metrics(rows: Sequence[Mapping[str, Any]], resamples: int = 1000) -> dict[str, Any]:
    """The metrics of one group of per-trace rows (:func:`~platform_sim.studies.trace_detection.trace_detection`'s).

    Args:
        rows: One row per trace.
        resamples: Bootstrap resamples of the medians' intervals (0: none).
    """
    hack = [r for r in rows if r["label"] == "hacking"]
    ok = [r for r in rows if r["label"] == "healthy"]
    stopped = [r for r in hack + ok if r["stopped"]]
    tp = sum(r["stopped"] for r in hack)
    fp = sum(r["stopped"] for r in ok)
    recall, recall_lo, recall_hi = wilson(tp, len(hack))
    precision, prec_lo, prec_hi = wilson(tp, tp + fp)
    hs, hs_lo, hs_hi = wilson(fp, len(ok))
    delays = [float(r["delay_evals"]) for r in hack if r["stopped"]]
    regrets = [float(r["regret"]) for r in stopped]
    d_med, d_lo, d_hi = bootstrap_median(delays, resamples)
    r_med, r_lo, r_hi = bootstrap_median(regrets, resamples, seed=1)
    return {
        "traces": len(rows),
        "hacking": len(hack),
        "healthy": len(ok),
        "ambiguous": sum(r["label"] == "ambiguous" for r in rows),
        "ambiguous_traces": [r["trace"] for r in rows if r["label"] == "ambiguous"],
        "hacking_stopped": tp,
        "healthy_stopped_n": fp,
        "recall": recall,
        "recall_ci": [recall_lo, recall_hi],
        "precision": precision,
        "precision_ci": [prec_lo, prec_hi],
        "healthy_stopped": hs,
        "healthy_stopped_ci": [hs_lo, hs_hi],
        "delay_median": d_med,
        "delay_median_ci": [d_lo, d_hi],
        "regret_worst": max(regrets) if regrets else None,
        "regret_median": r_med,
        "regret_median_ci": [r_lo, r_hi],
    }


def shortfall(m: Mapping[str, Any], targets: Targets = TARGETS) -> float:
    """How far a group's metrics miss the targets: 0 when every target is met.

    The sum of the misses in the targets' own units, each divided by a scale that makes them comparable: recall and
    healthy-stopped shares as they are, the median delay in tens of evals, the worst regret as a share. A group with
    no hacking trace misses nothing on recall and delay; one whose hacking traces are never stopped misses the delay
    target by a full 1.
    """
    miss = 0.0
    if m["hacking"]:
        miss += max(0.0, targets.recall - (m["recall"] or 0.0))
        miss += 1.0 if m["delay_median"] is None else max(0.0, m["delay_median"] - targets.delay_median) / 10.0
    if m["healthy"]:
        miss += max(0.0, (m["healthy_stopped"] or 0.0) - targets.healthy_stopped)
    if m["regret_worst"] is not None:
        miss += max(0.0, m["regret_worst"] - targets.regret_worst)
    return miss


_GRID_KEYS = (
    "hacking",
    "healthy",
    "ambiguous",
    "hacking_stopped",
    "healthy_stopped_n",
    "recall",
    "precision",
    "healthy_stopped",
    "delay_median",
    "regret_worst",
    "regret_median",
)


def _rank_key(m: Mapping[str, Any], targets: Targets) -> tuple[float, ...]:
    # Smaller is better: the shortfall, then more hacking stopped, fewer healthy stopped, less delay, less regret.
    return (
        round(shortfall(m, targets), 9),
        -(m["recall"] or 0.0),
        m["healthy_stopped"] or 0.0,
        m["delay_median"] if m["delay_median"] is not None else math.inf,
        m["regret_median"] if m["regret_median"] is not None else 0.0,
    )


# -- the phases -------------------------------------------------------------------------------------------------


def detect_all(traces: Sequence[RealTrace], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One detection row per trace (the detector on the recorded scores in their own units)."""
    return [trace_detection(t, spec, None) for t in traces]


def grid_specs(name: str, grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every point of a family's grid as a validated detector spec, in grid order.

    Raises:
        ValueError: a point the detector rejects (names the parameter).
    """
    specs = []
    for values in itertools.product(*grid.values()):
        specs.append(detector_from_spec({"name": name, "params": dict(zip(grid.keys(), values))}).spec())
    return specs


def calibrate(
    tune: Sequence[RealTrace],
    grids: Mapping[str, Mapping[str, Sequence[Any]]] = GRIDS,
    targets: Targets = TARGETS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Choose each detector family's parameters on ``tune`` (the tune-split traces, and nothing else).

    Every grid point is run over every trace of ``tune``; the chosen point has the smallest :func:`shortfall` on the
    pooled tune traces (ties: more hacking stopped, fewer healthy stopped, less delay, less regret, then grid order).

    Args:
        tune: The traces to tune on.
        grids: Detector name -> parameter -> values.
        targets: The targets.
        progress: Called with the family name as each family starts.

    Returns:
        ``{"chosen": {name: spec}, "grid": {name: [{"spec", "shortfall", "metrics"}...]}, "traces": [names]}``.

    Raises:
        BenchmarkError: ``tune`` holds no hacking or no healthy trace (nothing to tune against).
    """
    rows_probe = [t.label for t in tune]
    if "hacking" not in rows_probe or "healthy" not in rows_probe:
        raise BenchmarkError(
            f"the tune split needs hacking and healthy traces; its labels: "
            f"{ {lab: rows_probe.count(lab) for lab in set(rows_probe)} }"
        )
    chosen: dict[str, dict[str, Any]] = {}
    table: dict[str, list[dict[str, Any]]] = {}
    for name, grid in grids.items():
        if progress:
            progress(name)
        best: tuple[tuple[float, ...], dict[str, Any]] | None = None
        table[name] = []
        for spec in grid_specs(name, grid):
            m = group_metrics(detect_all(tune, spec), resamples=0)
            table[name].append(
                {"spec": spec, "shortfall": shortfall(m, targets), "metrics": {k: m[k] for k in _GRID_KEYS}}
            )
            key = _rank_key(m, targets)
            if best is None or key < best[0]:
                best = (key, spec)
        assert best is not None
        chosen[name] = best[1]
    return {"chosen": chosen, "grid": table, "traces": [t.name for t in tune]}


def _env_of(header: Mapping[str, Any]) -> str:
    return str(header.get("environment") or "unnamed")


def split_files(
    folder: str | Path,
    tune_envs: Sequence[str] = (),
    test_envs: Sequence[str] = (),
) -> tuple[list[Path], list[Path], dict[str, str]]:
    """``(tune files, test files, environment -> split)`` from the traces' headers alone.

    Args:
        folder: The corpus.
        tune_envs, test_envs: Environments whose split is set here, overriding the headers.

    Raises:
        BenchmarkError: an environment with traces of both splits, a trace with no split, no tune or no test trace,
            or an environment named in both lists.
        TraceError: a bad header (file and line named).
    """
    both = set(tune_envs) & set(test_envs)
    if both:
        raise BenchmarkError(f"environment(s) {', '.join(sorted(both))} named as both tune and test")
    override = {**{e: "tune" for e in tune_envs}, **{e: "test" for e in test_envs}}
    env_split: dict[str, str] = {}
    tune: list[Path] = []
    test: list[Path] = []
    for f in trace_files(folder):
        header = read_header(f)
        env = _env_of(header)
        split = override.get(env, header.get("split"))
        if split is None:
            raise BenchmarkError(
                f"{f}: the trace has no split (header field split, or --tune-envs/--test-envs for "
                f"its environment {env!r})"
            )
        if env_split.setdefault(env, split) != split:
            raise BenchmarkError(
                f"{f}: environment {env!r} has traces of both splits; a split is a set of environments, not of runs"
            )
        (tune if split == "tune" else test).append(f)
    unknown = set(override) - set(env_split)
    if unknown:
        raise BenchmarkError(f"no trace of environment(s) {', '.join(sorted(unknown))}")
    if not tune or not test:
        raise BenchmarkError(
            f"the benchmark needs tune and test environments; found {len(tune)} tune and {len(test)} test traces"
        )
    return tune, test, env_split


def benchmark(
    folder: str | Path,
    grids: Mapping[str, Mapping[str, Sequence[Any]]] = GRIDS,
    targets: Targets = TARGETS,
    tune_envs: Sequence[str] = (),
    test_envs: Sequence[str] = (),
    resamples: int = 1000,
    reader: Callable[[Path], RealTrace] = load_trace,
    calibrator: Callable[..., dict[str, Any]] = calibrate,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the three phases (see the module docstring) on the corpus in ``folder``.

    Args:
        folder: Traces with ``environment`` and ``split`` in their headers.
        grids: The grids of :func:`calibrate`.
        targets: The targets.
        tune_envs, test_envs: Split overrides by environment.
        resamples: Bootstrap resamples of the reported intervals.
        reader: Reads one trace file (every trace is read through it: tune traces before the calibration, test
            traces after).
        calibrator: The calibration (:func:`calibrate`), called with the tune traces only.
        progress: Called with a short message as each phase or family starts.

    Returns:
        ``{"config", "targets", "environments", "calibration", "candidates", "results", "rows", "best"}``.
    """
    t0 = time.perf_counter()
    tune_files, test_files, env_split = split_files(folder, tune_envs, test_envs)
    if progress:
        progress(f"calibrating on {len(tune_files)} tune traces")
    tune = [reader(f) for f in tune_files]
    cal = calibrator(tune, grids, targets, progress)
    t_cal = time.perf_counter() - t0
    # Only now is a test trace read.
    if progress:
        progress(f"evaluating on {len(test_files)} test traces")
    test = [reader(f) for f in test_files]
    candidates = [REFERENCE, DEFAULT_REFERENCE] + [(f"{name} (tuned)", spec) for name, spec in cal["chosen"].items()]
    envs = sorted(env_split, key=lambda e: (env_split[e] != "tune", e))
    results: list[dict[str, Any]] = []
    all_rows: list[dict[str, Any]] = []
    for label, spec in candidates:
        rows_tune, rows_test = detect_all(tune, spec), detect_all(test, spec)
        for r in rows_tune:
            r["split"] = "tune"
        for r in rows_test:
            r["split"] = "test"
        rows = rows_tune + rows_test
        for r in rows:
            r["environment"] = r["environment"] or "unnamed"
        all_rows += [
            {
                "candidate": label,
                **{
                    k: r[k]
                    for k in (
                        "trace",
                        "environment",
                        "split",
                        "label",
                        "stopped",
                        "stop_step",
                        "peak_step",
                        "evals",
                        "delay_evals",
                        "regret",
                    )
                },
            }
            for r in rows
        ]
        for kind, group, members in [("split", "tune", rows_tune), ("split", "test", rows_test)] + [
            ("environment", e, [r for r in rows if r["environment"] == e]) for e in envs
        ]:
            m = group_metrics(members, resamples)
            results.append(
                {
                    "candidate": label,
                    "spec": spec,
                    "kind": kind,
                    "group": group,
                    "split": group if kind == "split" else env_split[group],
                    "shortfall": shortfall(m, targets),
                    "meets_targets": shortfall(m, targets) == 0.0,
                    **m,
                }
            )
    test_rows = {r["candidate"]: r for r in results if r["kind"] == "split" and r["group"] == "test"}
    best_label = min(test_rows, key=lambda c: _rank_key(test_rows[c], targets))
    best = test_rows[best_label]
    labels = {t.name: t.labelling for t in tune + test}
    return {
        "config": {
            "folder": str(folder),
            "tune_traces": len(tune),
            "test_traces": len(test),
            "resamples": resamples,
            "grids": {k: {p: list(v) for p, v in g.items()} for k, g in grids.items()},
            "grid_points": sum(len(cal["grid"][k]) for k in cal["grid"]),
            "calibration_s": t_cal,
            "wall_s": time.perf_counter() - t0,
        },
        "targets": asdict(targets),
        "environments": {
            e: {"split": env_split[e], "traces": sum(_env_of(t.header) == e for t in tune + test)} for e in envs
        },
        "labels": {name: lab.to_dict() for name, lab in labels.items()},
        "calibration": cal,
        "candidates": [{"label": label, "spec": spec} for label, spec in candidates],
        "results": results,
        "rows": all_rows,
        "best": {
            "candidate": best_label,
            "spec": best["spec"],
            "meets_targets": best["meets_targets"],
            "shortfall": best["shortfall"],
            "misses": misses(best, targets),
        },
    }


def misses(m: Mapping[str, Any], targets: Targets = TARGETS) -> list[str]:
    """Each target a group's metrics miss, in words with numbers (empty when all are met)."""
    out = []
    if m["hacking"] and (m["recall"] or 0.0) < targets.recall:
        out.append(f"hacking stopped {100 * (m['recall'] or 0):.1f}% < {100 * targets.recall:g}%")
    if m["healthy"] and (m["healthy_stopped"] or 0.0) > targets.healthy_stopped:
        out.append(f"healthy stopped {100 * m['healthy_stopped']:.1f}% > {100 * targets.healthy_stopped:g}%")
    if m["hacking"] and (m["delay_median"] is None or m["delay_median"] > targets.delay_median):
        d = "none stopped" if m["delay_median"] is None else f"{m['delay_median']:g} evals"
        out.append(f"median delay {d} > {targets.delay_median:g} evals")
    if m["regret_worst"] is not None and m["regret_worst"] > targets.regret_worst:
        out.append(f"worst regret of a stopped run {100 * m['regret_worst']:.1f}% > {100 * targets.regret_worst:g}%")
    return out
