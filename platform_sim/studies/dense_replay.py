"""Cadence hints on densely recorded traces: what a hint buys in training steps, on real eval sequences.

A dense trace (``python -m lab traces record --eval-every 1``) holds an evaluation at (nearly) every step, so it can serve
any cadence: :func:`dense_trace_run` replays one trace as a job whose **regular** evaluations are the recorded ones
at multiples of ``every`` steps, and, when the scheduler core's decision names a ``next_eval_step`` before the next
regular one, reads the recorded evaluation at that step (the first recorded at or after it) as an **extra**
evaluation, exactly as :class:`~evalstop_callbacks.EvalStopCallback` would evaluate there. Nothing is interpolated
and no noise is added: every score the detector sees is one the real run produced at that step.

The **true peak** of a dense trace is the step of the highest centred moving average of its scores over one regular
interval (``every`` steps, made odd): the highest single score of 150 noisy evaluations is mostly noise, while the
smoothed curve is what an eval interval of ``every`` steps could at best find. ``delay_steps`` is the stop step minus that
peak step.

:func:`dense_cadence_study` runs every trace at each cadence and sums up: hacking and healthy traces stopped, the
median and mean delay in steps over the hacking traces stopped, and the evaluations spent (regular and extra).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from platform_sim.core.cadence import EvalBudget, cadence_from_spec
from platform_sim.core.checks import check_nonneg
from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.engine import DEFAULT_EVAL_COST
from platform_sim.sim.traces import RealTrace


def smoothed_peak_step(trace: RealTrace, every: int) -> int:
    """The step of the highest centred moving average of ``trace``'s scores over ``every`` evaluations (made odd;
    the window shrinks at the ends); the earliest on ties.

    Raises:
        ValueError: ``every`` < 1.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    half = every // 2  # every=5 -> 2 on each side; every=4 -> 2 (a window of 5)
    scores = trace.scores
    n = len(scores)
    best_i, best = 0, float("-inf")
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i + half + 1)
        m = sum(scores[lo:hi]) / (hi - lo)
        if m > best:
            best_i, best = i, m
    return trace.steps[best_i]


def dense_trace_run(
    trace: RealTrace,
    detector: Mapping[str, Any] | None,
    cadence: Mapping[str, Any] | str | None,
    every: int,
    eval_budget: EvalBudget | None = None,
    peak_every: int | None = None,
    eval_cost: float = DEFAULT_EVAL_COST,
) -> dict[str, Any]:
    """Replay one dense trace at a regular interval of ``every`` steps, honouring the core's cadence hints.

    Args:
        trace: A trace with evaluations at (nearly) every step.
        detector: Detector spec (None: the paper's k-decline rule, ``paper_spec()``); it sees
            the recorded scores in the trace's own units, as the callback in that run would have.
        cadence: Cadence spec (None or ``"fixed"``: no hints).
        every: The regular interval in steps; the regular evaluations are the recorded ones at multiples of it.
        eval_budget: What the run may spend on hinted evaluations (None: no limit), as the callback's budget.
        peak_every: The smoothing window of the true peak (:func:`smoothed_peak_step`), None: ``every``. A replay at
            ``every=1`` passes the regular interval it is compared with, so that both measure delays from the same
            peak (the single highest of 150 noisy evals would be mostly noise).
        eval_cost: What one evaluation takes, as a share of a regular interval, as in the simulator (read only by
            a budget's ``max_eval_share``: regular evals are inside the run's steps, extra ones add to them).

    Returns:
        ``{"trace", "environment", "split", "label", "stopped", "stop_step", "peak_step", "delay_steps",
        "regular_evals", "extra_evals", "extra_steps"}``.

    Raises:
        ValueError: ``every`` < 1, a negative ``eval_cost``, a bad spec, or a trace with fewer than two regular
            evaluations at this cadence.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    check_nonneg("eval_cost", eval_cost)
    regular = [s for s in trace.steps if s > 0 and s % every == 0]
    if len(regular) < 2:
        raise ValueError(
            f"trace {trace.name}: fewer than two recorded evaluations at multiples of {every} steps; "
            "a dense replay needs a trace recorded at least that densely"
        )
    score_at = dict(zip(trace.steps, trace.scores))
    det = detector_from_spec(paper_spec() if detector is None else detector)
    # Detectors that read per-example scores get the recorded ones of each eval, as in the run itself.
    examples_at = dict(zip(trace.steps, trace.examples)) if det.uses_example_scores and trace.examples else {}
    monitor = JobMonitor(job_id=trace.name, job_type="rlhf", detector=det, cadence=cadence_from_spec(cadence))
    extra_steps: list[int] = []
    stop_step: int | None = None
    step: int | None = regular[0]
    while step is not None:
        per = examples_at.get(step)
        values = None if per is None else list(per)
        decision = monitor.observe(step, score_at[step], values, planned_steps=trace.reported_planned_steps)
        if decision.should_stop:
            stop_step = step
            break
        next_regular = next((s for s in regular if s > step), None)
        hint = decision.next_eval_step
        # Time in regular intervals, as the simulator counts it: the run's progress plus its extra evals.
        n_extra = len(extra_steps)
        budget_left = eval_budget is None or eval_budget.allows(
            n_extra, len(monitor.steps) * eval_cost, step / every + n_extra * eval_cost
        )
        # The first recorded eval at or after the hinted step, if it still comes before the next regular one.
        hinted = None if hint is None else next((s for s in trace.steps if s >= hint), None)
        if budget_left and hinted is not None and next_regular is not None and step < hinted < next_regular:
            extra_steps.append(hinted)
            step = hinted
        else:
            step = next_regular
    peak = smoothed_peak_step(trace, every if peak_every is None else peak_every)
    return {
        "trace": trace.name,
        "environment": trace.environment,
        "split": trace.split,
        "label": trace.label,
        "stopped": stop_step is not None,
        "stop_step": stop_step,
        "peak_step": peak,
        "delay_steps": None if stop_step is None else stop_step - peak,
        "regular_evals": len(monitor.steps) - len(extra_steps),
        "extra_evals": len(extra_steps),
        "extra_steps": extra_steps,
    }


def dense_cadence_study(
    traces: Sequence[RealTrace],
    detector: Mapping[str, Any] | None,
    cadences: Sequence[tuple[str, Mapping[str, Any] | str | None]],
    every: int,
    eval_budget: EvalBudget | None = None,
    peak_every: int | None = None,
) -> dict[str, Any]:
    """Every trace at every cadence: per-trace rows and one summary per cadence label (``peak_every`` as in
    :func:`dense_trace_run`).

    A summary has ``hacking``/``healthy`` (traces of each label), ``hacking_stopped``, ``healthy_stopped``,
    ``median_delay_steps`` and ``mean_delay_steps`` (hacking traces stopped; None if none),
    ``median_delay_all_steps`` (every hacking trace, one never stopped counting as a delay longer than any: None when
    half or more were never stopped), ``evals`` and ``extra_evals`` (all traces). Ambiguous traces run and are listed
    but count in neither label.

    The median over the stopped traces alone flatters a cadence that stops fewer of them (it drops the hardest
    ones); ``median_delay_all_steps`` compares cadences that stop different numbers of hacking traces.
    """
    rows: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for label, spec in cadences:
        out = [dense_trace_run(t, detector, spec, every, eval_budget, peak_every) for t in traces]
        rows[label] = out
        hacking = [r for r in out if r["label"] == "hacking"]
        healthy = [r for r in out if r["label"] == "healthy"]
        delays = [r["delay_steps"] for r in hacking if r["stopped"]]
        summaries[label] = {
            "cadence": label,
            "hacking": len(hacking),
            "healthy": len(healthy),
            "hacking_stopped": sum(r["stopped"] for r in hacking),
            "healthy_stopped": sum(r["stopped"] for r in healthy),
            "median_delay_steps": statistics.median(delays) if delays else None,
            "mean_delay_steps": statistics.fmean(delays) if delays else None,
            "median_delay_all_steps": median_with_never(delays, len(hacking)),
            "evals": sum(r["regular_evals"] + r["extra_evals"] for r in out),
            "extra_evals": sum(r["extra_evals"] for r in out),
        }
    return {"every": every, "detector": detector, "summaries": summaries, "rows": rows}


def median_with_never(delays: Sequence[float], n: int) -> float | None:
    """The median of ``n`` delays of which ``delays`` are known and the other ``n - len(delays)`` are "never" (longer
    than any); None when a never is in the middle (or ``n`` is 0)."""
    if n == 0:
        return None
    inf = float("inf")
    med = statistics.median(sorted(delays) + [inf] * (n - len(delays)))
    return None if med == inf else med
