"""One detector on one recorded trace's own eval sequence, and the maps of trace scores onto the platform's 0-1 scale.

What ``evalstop-sim replay``, ``benchmark``, ``detectors`` and ``tune`` report per trace: :func:`trace_detection`
(stop step, delivered checkpoint, delay, regret) and :func:`trace_summary` over many traces; the score maps
(:class:`Scale`, :func:`corpus_scale`, :func:`trace_scales`, :data:`SCORE_SCALES`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.traces import RealTrace

SCORE_SCALES: tuple[str, ...] = ("environment", "trace")
"""How scores are mapped onto the 0-1 scale: one map per environment (the default) or per trace."""


@dataclass(frozen=True)
class Scale:
    """The affine map from trace units to the platform's 0-1 scale: ``(x - lo) / (hi - lo)``."""

    lo: float
    hi: float

    @property
    def span(self) -> float:
        return self.hi - self.lo

    def __call__(self, x: float) -> float:
        return (x - self.lo) / self.span


def _scale_of(traces: Sequence[RealTrace]) -> Scale:
    lo = min(min(t.scores) for t in traces)
    hi = max(max(t.scores) for t in traces)
    return Scale(lo, hi if hi > lo else lo + 1.0)


def corpus_scale(traces: Sequence[RealTrace]) -> Scale:
    """One map for all of ``traces`` (their minimum -> 0, maximum -> 1): right for traces that share units."""
    return _scale_of(traces)


def scale_group(trace: RealTrace, score_scale: str = "environment") -> str:
    """The key of the traces that share ``trace``'s map: its environment (``""`` if unnamed) or its name."""
    if score_scale not in SCORE_SCALES:
        raise ValueError(f"score_scale must be one of {', '.join(SCORE_SCALES)}, got {score_scale!r}")
    return trace.name if score_scale == "trace" else (trace.environment or "")


def trace_scales(traces: Sequence[RealTrace], score_scale: str = "environment") -> dict[str, Scale]:
    """Each trace's map to the 0-1 scale, by trace name (see :data:`SCORE_SCALES`)."""
    groups: dict[str, list[RealTrace]] = {}
    for t in traces:
        groups.setdefault(scale_group(t, score_scale), []).append(t)
    by_group = {g: _scale_of(ts) for g, ts in groups.items()}
    return {t.name: by_group[scale_group(t, score_scale)] for t in traces}


ScaleArg = Scale | Mapping[str, Scale]


def scale_for(trace: RealTrace, scale: ScaleArg | None) -> Scale | None:
    """The map of ``trace`` onto the 0-1 scale: ``scale`` itself when it is one map (or None), else its entry."""
    if scale is None or isinstance(scale, Scale):
        return scale
    return scale[trace.name]


def regret_of(trace: RealTrace, delivered: float) -> float:
    """The share of the run's gain that delivering a checkpoint of score ``delivered`` gives up.

    The gain is the true peak minus the first eval; a run that never rose above its first eval is measured against
    its range (peak minus lowest eval) instead, and a flat run has no regret.
    """
    peak = trace.peak_score
    gain = peak - trace.scores[0]
    if gain <= 0:
        gain = peak - min(trace.scores)
    return (peak - delivered) / gain if gain > 0 else 0.0


def trace_detection(
    trace: RealTrace,
    detector: Mapping[str, Any] | None,
    scale: Scale | None = None,
    skip_evals: int = 0,
    examples: Sequence[Sequence[float] | None] | None = None,
    spreads: Sequence[tuple[float, int] | None] | None = None,
    report_plan: bool = True,
) -> dict[str, Any]:
    """Run the detector over one trace's real eval sequence and report what it did.

    Args:
        trace: The trace.
        detector: Detector spec (on the scale the scores are given in); None: the paper's rule, ``paper_spec()``.
        scale: The trace's map to the platform scale; None: the detector sees the recorded scores in their own
            units, as ``EvalStopCallback`` in that run would have.
        skip_evals: Report only from the eval after the first ``skip_evals`` ones (a job that starts reporting to
            the scheduler after a warm-up); its best checkpoint is then the best of the reported evals.
        examples: Per-example scores per eval (trace units) to use instead of the trace's recorded ones.
        spreads: ``(std, n)`` per eval (trace units), reported as ``eval_std``/``eval_n``; None: none.
        report_plan: Whether the reports carry the header's ``planned_steps`` (as a trainer callback's do); False:
            none, as a client that does not know the run's length (an Optuna pruner) reports.

    Returns:
        ``{"trace", "environment", "split", "label", "algo", "stopped", "stop_step", "stop_index", "best_step",
        "peak_step", "evals", "delay_evals", "regret", "regret_pct", "peak_score", "delivered_score"}``; scores in
        trace units.
    """
    det = detector_from_spec(paper_spec() if detector is None else detector)
    monitor = JobMonitor(job_id=trace.name, job_type="rlhf", detector=det)
    # Detectors that read per-example scores get the recorded ones, on the same scale as the means.
    if not det.uses_example_scores:
        examples = ()
    elif examples is None:
        examples = trace.examples
    f: Callable[[float], float] = scale if scale is not None else float
    stop_index = None
    planned = trace.reported_planned_steps if report_plan else None
    for i, (step, score) in enumerate(zip(trace.steps, trace.scores)):
        if i < skip_evals:
            continue
        per = examples[i] if i < len(examples) else None
        spread = spreads[i] if spreads is not None and i < len(spreads) else None
        std, n = (None, None) if spread is None else (spread[0] * (f(1.0) - f(0.0)), spread[1])
        values = None if per is None else [f(v) for v in per]
        decision = monitor.observe(step, f(score), values, std, n, planned)
        if decision.should_stop:
            stop_index = i
            break
    stopped = stop_index is not None
    if stopped and monitor.best_step is not None:
        best_step = int(monitor.best_step)
        delivered = trace.scores[trace.steps.index(best_step)]
    else:
        best_step, delivered = trace.steps[-1], trace.scores[-1]
    peak = trace.peak_score
    return {
        "trace": trace.name,
        "environment": trace.environment,
        "split": trace.split,
        "label": trace.label,
        "algo": trace.algo,
        "stopped": stopped,
        "stop_step": trace.steps[stop_index] if stop_index is not None else None,
        "stop_index": stop_index,
        "best_step": best_step,
        "peak_step": trace.peak_step,
        "evals": len(trace.steps),
        "delay_evals": (stop_index - trace.peak_index) if stop_index is not None else None,
        "regret": regret_of(trace, delivered),
        "regret_pct": 100.0 * (peak - delivered) / abs(peak) if peak != 0 else None,
        "peak_score": peak,
        "delivered_score": delivered,
    }


def trace_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Detection over the traces: stopped hacking / healthy, median delay, worst regret of stopped hacking traces;
    ambiguous traces are counted and listed, never scored."""
    hack = [r for r in rows if r["label"] == "hacking"]
    healthy = [r for r in rows if r["label"] == "healthy"]
    delays = [r["delay_evals"] for r in hack if r["stopped"]]
    regrets = [r["regret_pct"] for r in hack if r["stopped"] and r["regret_pct"] is not None]
    return {
        "hacking": len(hack),
        "healthy": len(healthy),
        "ambiguous": sum(r["label"] == "ambiguous" for r in rows),
        "ambiguous_traces": [r["trace"] for r in rows if r["label"] == "ambiguous"],
        "hacking_stopped": sum(r["stopped"] for r in hack),
        "healthy_stopped": sum(r["stopped"] for r in healthy),
        "median_delay_evals": statistics.median(delays) if delays else None,
        "max_delay_evals": max(delays) if delays else None,
        "max_regret_pct_stopped_hacking": max(regrets) if regrets else None,
        "max_regret_stopped": max(
            (r["regret"] for r in rows if r["stopped"] and r["label"] != "ambiguous"), default=None
        ),
    }


def native_min_delta(traces: Sequence[RealTrace], score_scale: str = "environment") -> Scale | None:
    """The one map all ``traces`` share (so a tolerance in their units is one number on the 0-1 scale), else None."""
    scales = set(trace_scales(traces, score_scale).values())
    return scales.pop() if len(scales) == 1 else None
