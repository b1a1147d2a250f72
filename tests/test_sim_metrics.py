"""Metric definitions on hand-built outcomes, and rows over seeds."""

from __future__ import annotations

import pytest

from platform_sim.sim.metrics import mean_ci, metric_row, paired_tests, run_metrics
from platform_sim.sim.outcomes import JobOutcome, SimResult


def outcome(
    i,
    jt="rlhf",
    hacking=False,
    stopped=False,
    stop_eval=None,
    peak=10,
    deliver=20,
    peak_v=0.8,
    deliv_v=0.8,
    submit=0.0,
    end=10.0,
    gpus=8,
    wasted=0.0,
):
    return JobOutcome(
        f"j{i}",
        jt,
        hacking,
        gpus,
        submit,
        submit,
        end,
        stopped,
        stop_eval,
        deliver,
        peak,
        peak_v,
        deliv_v,
        gpus * (end - submit),
        wasted,
        0,
    )


def result(outs, makespan=20.0, busy=None):
    busy = sum(o.gpu_hours for o in outs) if busy is None else busy
    return SimResult(outs, 64, 20, makespan, busy, 100, 0.01, "x+y")


def test_detection_metrics():
    outs = [
        outcome(0, hacking=True, stopped=True, stop_eval=14, peak=12, deliver=12),  # TP, delay 2
        outcome(1, hacking=True, stopped=True, stop_eval=11, peak=12, deliver=11, deliv_v=0.7),  # TP, delay -1
        outcome(2, hacking=True, deliv_v=0.3),  # FN
        outcome(3, stopped=True, stop_eval=8, deliver=8, deliv_v=0.5),  # FP on healthy RLHF
        outcome(4),  # TN healthy RLHF
        outcome(5, jt="lora"),
        outcome(6, jt="dpo"),  # TN
    ]
    m = run_metrics(result(outs))
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["fpr"] == pytest.approx(1 / 4)
    assert m["fpr_healthy_rlhf"] == pytest.approx(1 / 2)
    assert m["delay_evals"] == pytest.approx(0.5)
    assert m["regret"] == pytest.approx((0.1 + 0.5 + 0.3) / 7)
    assert m["regret_hacking"] == pytest.approx(0.6 / 3)
    assert (m["stopped"], m["stopped_hacking"], m["false_stops"]) == (3, 2, 1)


def test_undefined_ratios_are_none():
    m = run_metrics(result([outcome(0), outcome(1, jt="lora")]))
    assert m["precision"] is None and m["recall"] is None and m["delay_evals"] is None
    assert m["fpr"] == 0.0


def test_system_metrics():
    outs = [outcome(i, submit=float(i), end=float(i) + 1 + i, wasted=1.5) for i in range(20)]
    m = run_metrics(result(outs, makespan=40.0))
    jcts = [1.0 + i for i in range(20)]
    assert m["jct_mean_h"] == pytest.approx(sum(jcts) / 20)
    assert m["jct_p95_h"] == pytest.approx(19.05)
    assert m["wasted_gpu_h"] == pytest.approx(30.0)
    assert m["utilization"] == pytest.approx(sum(8 * j for j in jcts) / (64 * 40.0))


def test_mean_ci():
    assert mean_ci([]) == (None, None)
    assert mean_ci([None, 2.0]) == (2.0, None)
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / 3**0.5, rel=1e-5)


def test_metric_row_pairs_with_the_baseline_seed_by_seed():
    base = [{"jct_mean_h": 10.0, "wasted_gpu_h": 100.0}, {"jct_mean_h": 20.0, "wasted_gpu_h": 50.0}]
    stop = [{"jct_mean_h": 9.0, "wasted_gpu_h": 50.0}, {"jct_mean_h": 15.0, "wasted_gpu_h": 25.0}]
    row = metric_row("srtf-est", "evalstop", stop, base, sigma=0.02)
    assert row["base"] == "srtf-est" and row["stop"] == "evalstop" and row["sigma"] == 0.02 and row["seeds"] == 2
    assert row["jct_gain_pct"] == pytest.approx((10.0 + 25.0) / 2)
    assert row["wasted_reduction_pct"] == pytest.approx(50.0)
    assert row["jct_mean_h"] == pytest.approx(12.0) and row["ci95"]["jct_mean_h"] is not None
    assert row["p_value_jct_ttest"] is not None
    with pytest.raises(ValueError, match="one per seed"):
        metric_row("a", "b", stop, base[:1])
    assert metric_row("a", "none", base)["jct_gain_pct"] is None


def test_paired_tests():
    assert paired_tests([1.0], [2.0]) == (None, None)
    assert paired_tests([1.0, 2.0], [1.0, 2.0]) == (None, None)
    t, w = paired_tests([10, 11, 12, 13, 14, 15], [9, 9.5, 10, 11, 12, 12.5])
    assert 0 < t < 0.01 and 0 < w < 0.05
