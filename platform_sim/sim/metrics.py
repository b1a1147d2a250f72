"""Metrics of docs/design.md section 6: per run (:func:`run_metrics`) and per table row over seeds (:func:`metric_row`).

Detection (positive = a hacking RLHF job, over all jobs of a run):

- precision = stopped hacking / all stopped (None when nothing was stopped);
- recall = stopped hacking / all hacking (None when no job hacks);
- fpr = stopped non-hacking / all non-hacking; fpr_healthy_rlhf the same over healthy RLHF jobs only;
- delay_evals = mean over stopped hacking jobs of (stop eval - true peak eval), in evals (negative: stopped early);
- regret = mean over all jobs of (true peak score - true score of the delivered checkpoint); a job that runs to the
  end delivers its last checkpoint, a stopped one the checkpoint its stop policy names.

System: jct_mean_h and jct_p95_h (completion or stop time minus submit time), wasted_gpu_h (GPU-hours of progress
after each job's true peak eval, extra evals' time included), makespan_h, utilization (GPU-hours held / (GPUs x
makespan)), eval_gpu_h (GPU-hours spent evaluating, regular and extra evals) and extra_evals (evals a cadence hint
added).

A row (:func:`metric_row`) is the mean over seeds with a 95% confidence half-width (Student t) for each metric, plus
the paired comparison against the same base with no stop policy on the same seeds: ``jct_gain_pct`` and
``wasted_reduction_pct`` (mean of the per-seed relative reductions, positive is better) and the p-values of a paired
t-test and a Wilcoxon signed-rank test of JCT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .outcomes import SimResult

RUN_METRICS: tuple[str, ...] = (
    "precision",
    "recall",
    "fpr",
    "fpr_healthy_rlhf",
    "delay_evals",
    "regret",
    "regret_hacking",
    "regret_healthy",
    "jct_mean_h",
    "jct_p95_h",
    "wasted_gpu_h",
    "makespan_h",
    "utilization",
    "stopped",
    "stopped_hacking",
    "false_stops",
    "preemptions",
    "eval_gpu_h",
    "extra_evals",
)
"""Fields of :func:`run_metrics` that are averaged into a row."""


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def run_metrics(result: SimResult) -> dict[str, Any]:
    """The metrics of one run, as plain JSON-serializable data (None where a ratio is undefined)."""
    outs = result.outcomes
    n = len(outs)
    hacking = np.fromiter((o.hacking for o in outs), bool, n)
    stopped = np.fromiter((o.stopped for o in outs), bool, n)
    rlhf = np.fromiter((o.job_type == "rlhf" for o in outs), bool, n)
    jct = np.fromiter((o.end_time - o.submit_time for o in outs), float, n)
    regret = np.fromiter((o.peak_value - o.delivered_value for o in outs), float, n)
    wasted = float(sum(o.wasted_gpu_hours for o in outs))
    tp = int(np.sum(stopped & hacking))
    fp = int(np.sum(stopped & ~hacking))
    healthy_rlhf = rlhf & ~hacking
    delays = [o.stop_eval - o.peak_eval for o in outs if o.stopped and o.hacking and o.stop_eval is not None]
    makespan = result.makespan_h
    return {
        "scheduler": result.scheduler,
        "jobs": n,
        "hacking": int(hacking.sum()),
        "stopped": int(stopped.sum()),
        "stopped_hacking": tp,
        "false_stops": fp,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, int(hacking.sum())),
        "fpr": _ratio(fp, int((~hacking).sum())),
        "fpr_healthy_rlhf": _ratio(int(np.sum(stopped & healthy_rlhf)), int(healthy_rlhf.sum())),
        "delay_evals": float(np.mean(delays)) if delays else None,
        "regret": float(regret.mean()) if n else None,
        "regret_hacking": float(regret[hacking].mean()) if hacking.any() else None,
        "regret_healthy": float(regret[~hacking].mean()) if (~hacking).any() else None,
        "jct_mean_h": float(jct.mean()) if n else None,
        "jct_p95_h": float(np.percentile(jct, 95)) if n else None,
        "wasted_gpu_h": wasted,
        "makespan_h": makespan,
        "utilization": _ratio(result.busy_gpu_hours, result.gpus * makespan),
        "preemptions": int(sum(o.preemptions for o in outs)),
        "eval_gpu_h": float(sum(o.eval_gpu_hours for o in outs)),
        "extra_evals": int(sum(o.extra_evals for o in outs)),
        "events": result.events,
        "wall_s": result.wall_s,
    }


def mean_ci(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and 95% confidence half-width (Student t) of the defined values; (None, None) if there are none."""
    vals = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(vals) == 0:
        return None, None
    if len(vals) == 1:
        return float(vals[0]), None
    from scipy import stats  # local import: scipy costs ~0.2 s to import and single runs do not need it

    half = float(stats.t.ppf(0.975, len(vals) - 1) * vals.std(ddof=1) / math.sqrt(len(vals)))
    return float(vals.mean()), half


def _paired_reduction_pct(stop: Sequence[float | None], base: Sequence[float | None]) -> list[float]:
    out = []
    for s, b in zip(stop, base):
        if s is not None and b is not None and b > 0:
            out.append(100.0 * (1.0 - s / b))
    return out


def metric_row(
    base: str,
    stop: str,
    runs: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]] | None = None,
    **params: Any,
) -> dict[str, Any]:
    """One table row: the mean over seeds of each run metric, its 95% CI, and the paired gain over ``baseline``.

    Args:
        base: Base scheduler name.
        stop: Stop policy name.
        runs: :func:`run_metrics` dicts, one per seed.
        baseline: The same base with no stop policy, on the same seeds in the same order (None: no gains).
        **params: Sweep parameters to record in the row (``sigma=0.05``, ``k=3``, ...).
    """
    if baseline is not None and len(baseline) != len(runs):
        raise ValueError(f"baseline has {len(baseline)} runs, expected {len(runs)} (one per seed)")
    row: dict[str, Any] = {"base": base, "stop": stop, **params, "seeds": len(runs)}
    ci: dict[str, float | None] = {}
    for name in RUN_METRICS:
        row[name], ci[name] = mean_ci(r.get(name) for r in runs)
    row["jct_gain_pct"] = row["wasted_reduction_pct"] = None
    row["p_value_jct_ttest"] = row["p_value_jct_wilcoxon"] = None
    if baseline is not None:
        jct_s = [r["jct_mean_h"] for r in runs]
        jct_b = [r["jct_mean_h"] for r in baseline]
        row["jct_gain_pct"], ci["jct_gain_pct"] = mean_ci(_paired_reduction_pct(jct_s, jct_b))
        row["wasted_reduction_pct"], ci["wasted_reduction_pct"] = mean_ci(
            _paired_reduction_pct([r["wasted_gpu_h"] for r in runs], [r["wasted_gpu_h"] for r in baseline])
        )
        row["p_value_jct_ttest"], row["p_value_jct_wilcoxon"] = paired_tests(jct_b, jct_s)
    row["ci95"] = ci
    return row


def paired_tests(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, float | None]:
    """Two-sided p-values of the paired t-test and the Wilcoxon signed-rank test of ``a`` vs ``b`` (None if < 2
    pairs or all differences are zero)."""
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diffs) < 2 or not np.any(diffs != 0):
        return None, None
    from scipy import stats

    t_p = float(stats.ttest_rel(a, b).pvalue)
    try:
        w_p = float(stats.wilcoxon(a, b).pvalue)
    except ValueError:
        w_p = None
    return t_p, w_p


def _share(value: float | None, bound: float | None) -> float | None:
    if value is None or bound is None or bound <= 0:
        return None
    return value / bound


def add_oracle_shares(rows: Sequence[dict[str, Any]], oracle: Mapping[str, Any] | None) -> None:
    """Set ``waste_cut_share_of_oracle`` and ``jct_gain_share_of_oracle`` on each of ``rows`` (in place).

    Args:
        rows: :func:`~platform_sim.sim.metrics.metric_row` rows with their paired gains over the base alone.
        oracle: The Oracle's row on the same base, workload and seeds; None (or a row without gains): the shares
            are None.
    """
    for row in rows:
        row["waste_cut_share_of_oracle"] = _share(
            row.get("wasted_reduction_pct"), oracle.get("wasted_reduction_pct") if oracle else None
        )
        row["jct_gain_share_of_oracle"] = _share(
            row.get("jct_gain_pct"), oracle.get("jct_gain_pct") if oracle else None
        )
