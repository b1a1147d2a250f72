"""Dense-trace replay of cadence hints: regular evals at multiples of the cadence, extra evals read where hinted."""

from __future__ import annotations

import pytest
from _trace_factory import write

from platform_sim.core.cadence import EvalBudget
from platform_sim.sim.traces import load_trace
from platform_sim.studies.dense_replay import dense_cadence_study, dense_trace_run, smoothed_peak_step

K2 = {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
ADAPTIVE = {"name": "adaptive", "params": {"fraction": 0.2}}  # a hint 1 step after a first decline at every=5


def _dense(tmp_path, means, name="dense"):
    return load_trace(write(tmp_path / f"{name}.jsonl", means, every=1))


def _peak_then_fall(n=60, peak=30):
    """Rises by 1 per step up to step ``peak``, then falls by 1 per step: every comparison after the peak declines."""
    return [float(i) if i <= peak else float(2 * peak - i) for i in range(1, n + 1)]


def test_fixed_cadence_reads_only_the_regular_steps(tmp_path):
    r = dense_trace_run(_dense(tmp_path, _peak_then_fall()), K2, None, every=5)
    # peak at 30; declines at 35 and 40: stopped at the second regular eval after the peak
    assert r["stopped"] and r["stop_step"] == 40 and r["extra_evals"] == 0 and r["extra_steps"] == []
    assert r["regular_evals"] == 8 and r["peak_step"] == 30 and r["delay_steps"] == 10


def test_adaptive_cadence_reads_the_recorded_eval_at_the_hinted_step(tmp_path):
    r = dense_trace_run(_dense(tmp_path, _peak_then_fall()), K2, ADAPTIVE, every=5)
    # first decline at 35, hint 35 + 0.2 * 5 = 36: the recorded eval of step 36 is the second decline
    assert r["extra_steps"] == [36] and r["stop_step"] == 36 and r["delay_steps"] == 6
    assert r["regular_evals"] == 7


def test_budget_of_extra_evals_is_honoured(tmp_path):
    r = dense_trace_run(_dense(tmp_path, _peak_then_fall()), K2, ADAPTIVE, every=5, eval_budget=EvalBudget(0))
    assert r["extra_steps"] == [] and r["stop_step"] == 40


def test_a_time_share_budget_counts_evals_against_the_runs_progress(tmp_path):
    trace = _dense(tmp_path, _peak_then_fall())
    # 7 regular evals by step 35, each 0.05 of an interval: the regular interval's share, so a share just above it
    # lets the hint in and one just below does not; a costlier eval (0.2 of an interval) is over a 0.1 share.
    assert dense_trace_run(trace, K2, ADAPTIVE, every=5, eval_budget=EvalBudget(None, 0.051))["extra_steps"] == [36]
    assert dense_trace_run(trace, K2, ADAPTIVE, every=5, eval_budget=EvalBudget(None, 0.049))["extra_steps"] == []
    costly = dense_trace_run(trace, K2, ADAPTIVE, every=5, eval_budget=EvalBudget(None, 0.1), eval_cost=0.2)
    assert costly["extra_steps"] == [] and costly["stop_step"] == 40
    with pytest.raises(ValueError, match="eval_cost"):
        dense_trace_run(trace, K2, ADAPTIVE, every=5, eval_cost=-0.1)


def test_a_hint_with_no_recorded_eval_before_the_next_regular_one_is_not_taken(tmp_path):
    # evals every 5 steps only: the hinted step 36 has no recording before the regular 40
    means = _peak_then_fall()[4::5]
    trace = load_trace(write(tmp_path / "sparse.jsonl", means, every=5))
    r = dense_trace_run(trace, K2, ADAPTIVE, every=5)
    assert r["extra_steps"] == [] and r["stop_step"] == 40


def test_smoothed_peak_ignores_a_single_high_eval(tmp_path):
    means = [float(min(i, 20)) for i in range(1, 41)]  # rises to a plateau at step 20
    means[9] = 24.0  # one wild eval at step 10, above the plateau
    trace = _dense(tmp_path, means)
    assert trace.peak_step == 10  # the raw maximum
    assert smoothed_peak_step(trace, 5) >= 20  # a window of 5 around step 10 is still below the plateau


def test_bad_cadence_arguments_are_named(tmp_path):
    trace = _dense(tmp_path, _peak_then_fall(n=8, peak=4))
    with pytest.raises(ValueError, match="every must be >= 1"):
        dense_trace_run(trace, K2, None, every=0)
    with pytest.raises(ValueError, match="fewer than two recorded evaluations at multiples of 5"):
        dense_trace_run(trace, K2, None, every=5)
    with pytest.raises(ValueError, match="unknown cadence"):
        dense_trace_run(_dense(tmp_path, _peak_then_fall(), "b"), K2, "sometimes", every=5)


def test_study_sums_up_per_label(tmp_path):
    hacking = _dense(tmp_path, [m * 0.1 for m in _peak_then_fall(n=100, peak=50)], "hack")
    healthy = _dense(tmp_path, [min(i, 60) * 0.1 for i in range(1, 101)], "ok")
    assert (hacking.label, healthy.label) == ("hacking", "healthy")
    res = dense_cadence_study([hacking, healthy], K2, [("fixed", None), ("adaptive", ADAPTIVE)], every=5)
    fixed, adaptive = res["summaries"]["fixed"], res["summaries"]["adaptive"]
    assert fixed["hacking_stopped"] == adaptive["hacking_stopped"] == 1
    assert fixed["healthy_stopped"] == adaptive["healthy_stopped"] == 0  # a noise-free plateau never declines
    assert fixed["median_delay_steps"] == 10 and adaptive["median_delay_steps"] == 6
    assert adaptive["extra_evals"] == 1 and adaptive["evals"] == fixed["evals"]  # one extra, one regular fewer


def test_the_median_with_misses_counts_a_hacking_trace_never_stopped_as_longer_than_any(tmp_path):
    # Three hacking traces: two fall fast (the paper's rule stops them 10 steps after the peak), one falls by 0.25
    # per regular interval, too little for k-decline with min_delta 0.5 to count as a decline.
    fast = [_dense(tmp_path, [m * 0.3 for m in _peak_then_fall(n=100, peak=50)], f"fast{i}") for i in range(2)]
    slow = _dense(tmp_path, [min(i, 50) * 0.1 - 0.05 * max(0, i - 50) for i in range(1, 101)], "slow")
    assert {t.label for t in (*fast, slow)} == {"hacking"}
    det = {"name": "k-decline", "params": {"k": 2, "min_delta": 0.5}}
    two = dense_cadence_study(fast, det, [("fixed", None)], every=5)["summaries"]["fixed"]
    three = dense_cadence_study([*fast, slow], det, [("fixed", None)], every=5)["summaries"]["fixed"]
    assert two["median_delay_steps"] == two["median_delay_all_steps"] == 10  # every one stopped: the same median
    assert three["hacking_stopped"] == 2 and three["median_delay_steps"] == 10  # the stopped ones alone: unchanged
    assert three["median_delay_all_steps"] == 10  # of 10, 10 and never
    one = dense_cadence_study([fast[0], slow], det, [("fixed", None)], every=5)["summaries"]["fixed"]
    assert one["median_delay_steps"] == 10 and one["median_delay_all_steps"] is None  # of 10 and never: never


def test_an_every_step_replay_measures_its_delay_from_the_regular_cadences_peak(tmp_path):
    means = [float(min(i, 20)) for i in range(1, 41)]  # rises to a plateau at step 20, then falls from step 31 on
    means[9] = 24.0  # one wild eval at step 10
    means[30:] = [20.0 - (i - 30) for i in range(31, 41)]
    trace = _dense(tmp_path, means)
    single = dense_trace_run(trace, K2, None, every=1)
    smoothed = dense_trace_run(trace, K2, None, every=1, peak_every=5)
    assert single["peak_step"] == 10  # every=1 alone smooths over one eval: the wild one is the peak
    assert smoothed["peak_step"] == smoothed_peak_step(trace, 5) >= 20
    assert smoothed["stop_step"] == single["stop_step"]  # the replay itself is the same
    assert smoothed["delay_steps"] == single["stop_step"] - smoothed["peak_step"]
    study = dense_cadence_study([trace], K2, [("every step", None)], every=1, peak_every=5)
    assert study["rows"]["every step"][0]["peak_step"] == smoothed["peak_step"]
