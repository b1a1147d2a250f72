"""JobMonitor: validation, idempotency, conflicts, best step, the stop latch and persistence (docs/design.md section 2)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.core import (
    Action,
    ConflictError,
    InvalidReportError,
    JobMonitor,
    Report,
    detector_from_spec,
)


def state(mon: JobMonitor) -> str:
    return json.dumps(mon.state_dict(), sort_keys=True)


def monitor_with(scores, k=2, min_delta=0.0, step0=0, stride=10) -> JobMonitor:
    mon = JobMonitor("j", "rlhf", detector_from_spec({"name": "k-decline", "params": {"k": k, "min_delta": min_delta}}))
    for i, s in enumerate(scores):
        mon.observe(step0 + i * stride, s)
    return mon


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.5", None, True])
def test_non_finite_or_non_numeric_scores_rejected_without_state_change(bad):
    mon = monitor_with([0.1, 0.3])
    before = state(mon)
    with pytest.raises(InvalidReportError, match="eval_score"):
        mon.observe(20, bad)
    assert state(mon) == before
    # the same step with a valid score is then accepted: the bad report left no trace
    assert mon.observe(20, 0.4).action is Action.CONTINUE


@pytest.mark.parametrize("bad", [[0.1, math.nan], [math.inf], ["x"], "abc", [], {"a": 1}])
def test_bad_per_example_scores_rejected_without_state_change(bad):
    mon = monitor_with([0.1])
    before = state(mon)
    with pytest.raises(InvalidReportError, match="eval_scores"):
        mon.observe(10, 0.2, bad)
    assert state(mon) == before


@pytest.mark.parametrize("step", [-1, 1.5, "3", None, True])
def test_bad_steps_rejected_without_state_change(step):
    mon = monitor_with([0.1])
    before = state(mon)
    with pytest.raises(InvalidReportError, match="step"):
        mon.observe(step, 0.2)
    assert state(mon) == before


def test_integral_float_step_accepted_as_int():
    mon = monitor_with([])
    mon.observe(10.0, 0.5)
    assert mon.steps == [10] and isinstance(mon.steps[0], int)


def test_duplicate_report_is_idempotent():
    mon = monitor_with([0.5, 0.4])
    before = state(mon)
    again = mon.observe(10, 0.4)
    assert again == mon.decisions[1]
    assert state(mon) == before
    # a re-send of an older step with its original score gets its original decision too
    assert mon.observe(0, 0.5) == mon.decisions[0]
    assert state(mon) == before


def test_duplicate_after_stop_returns_the_decision_it_got_then():
    mon = monitor_with([0.5, 0.4, 0.3, 0.2])
    assert mon.stopped_at == 20
    assert mon.observe(10, 0.4).action is Action.CONTINUE  # what step 10 got when it was reported
    assert mon.observe(30, 0.2).action is Action.STOP


def test_different_score_for_a_seen_step_is_a_conflict():
    mon = monitor_with([0.5, 0.4])
    before = state(mon)
    with pytest.raises(ConflictError, match="already reported step 10"):
        mon.observe(10, 0.41)
    assert state(mon) == before


def test_older_unseen_step_is_a_conflict():
    mon = monitor_with([0.5, 0.4], step0=10)  # steps 10, 20
    before = state(mon)
    with pytest.raises(ConflictError, match="older than the last"):
        mon.observe(15, 0.4)
    with pytest.raises(ConflictError, match="older than the last"):
        mon.observe(0, 0.4)
    assert state(mon) == before


def test_best_step_is_highest_score_earliest_on_ties():
    mon = monitor_with([0.2, 0.6, 0.6, 0.1, 0.6])
    assert (mon.best_step, mon.best_score) == (10, 0.6)
    assert mon.last_decision.best_step == 10


def test_stop_latch_holds_once_stopped():
    mon = monitor_with([0.5, 0.4, 0.3])
    assert mon.stopped and mon.stopped_at == 20
    d = mon.observe(30, 0.99)  # a recovery does not un-stop the job
    assert d.action is Action.STOP and mon.stopped_at == 20
    assert "stopped at step 20" in d.reason
    # a stopped job's best is the checkpoint that exists: the best up to the stop, not a later eval
    assert (d.best_step, d.best_score) == (0, 0.5)
    assert (mon.best_step, mon.best_score) == (0, 0.5)


def test_decision_names_best_checkpoint_on_stop():
    mon = monitor_with([0.2, 0.7, 0.65, 0.6])
    d = mon.last_decision
    assert d.should_stop and d.best_step == 10 and d.best_score == 0.7 and d.declines == 2


def test_state_dict_round_trip_through_json_continues_identically():
    scores = [0.1, 0.5, 0.45, 0.46, 0.44, 0.43, 0.9]
    full = monitor_with(scores, k=2)
    part = monitor_with(scores[:4], k=2)
    resumed = JobMonitor.from_state_dict(json.loads(json.dumps(part.state_dict())))
    for i, s in enumerate(scores[4:], start=4):
        resumed.observe(i * 10, s)
    assert state(resumed) == state(full)
    # resumed monitor also answers duplicates of pre-resume steps idempotently
    assert resumed.observe(10, 0.5) == full.decisions[1]


def test_report_routing_checks_job_and_type():
    mon = JobMonitor("a", "rlhf")
    with pytest.raises(InvalidReportError, match="sent to job 'a'"):
        mon.observe_report(Report("b", "rlhf", 0, 0.1))
    with pytest.raises(ConflictError, match="type 'rlhf'"):
        mon.observe_report(Report("a", "dpo", 0, 0.1))
    assert mon.observe_report(Report("a", "rlhf", 0, 0.1, (0.1, 0.1))).action is Action.CONTINUE


def test_unknown_job_type_rejected():
    with pytest.raises(InvalidReportError, match="job_type"):
        JobMonitor("a", "pretraining")


# -- property test: the monitor against an independent statement of the rule ------------------------------------


def reference(scores, k, min_delta):
    """First index where the k-th consecutive decline happens (None if never), and the earliest argmax among the
    evaluations up to that stop (all of them if never stopped)."""
    run, stop = 0, None
    for t in range(1, len(scores)):
        run = run + 1 if scores[t] < scores[t - 1] - min_delta else 0
        if run >= k and stop is None:
            stop = t
    upto = len(scores) if stop is None else stop + 1
    best = max(range(upto), key=lambda i: (scores[i], -i)) if scores else None
    return stop, best


scores_st = st.lists(
    st.floats(-1.0, 1.0, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 2)), min_size=0, max_size=30
)


@settings(max_examples=300, deadline=None)
@given(
    scores=scores_st,
    k=st.integers(1, 4),
    min_delta=st.sampled_from([0.0, 0.01, 0.1]),
    split=st.integers(0, 30),
    dup=st.integers(0, 29),
)
def test_property_monitor_matches_the_rule_and_survives_resume(scores, k, min_delta, split, dup):
    stop, best = reference(scores, k, min_delta)
    split = min(split, len(scores))
    mon = monitor_with(scores[:split], k=k, min_delta=min_delta)
    mon = JobMonitor.from_state_dict(json.loads(json.dumps(mon.state_dict())))
    for i in range(split, len(scores)):
        mon.observe(i * 10, scores[i])
    assert mon.stopped_at == (None if stop is None else stop * 10)
    assert mon.best_step == (None if best is None else best * 10)
    # decisions latch: CONTINUE before the stop index, STOP from it on
    for i, d in enumerate(mon.decisions):
        assert d.should_stop == (stop is not None and i >= stop)
    if scores:
        # duplicates are idempotent, conflicts rejected, state untouched by either
        i = dup % len(scores)
        before = state(mon)
        assert mon.observe(i * 10, scores[i]) == mon.decisions[i]
        with pytest.raises(ConflictError):
            mon.observe(i * 10, scores[i] + 0.5)
        with pytest.raises(InvalidReportError):
            mon.observe(len(scores) * 10, math.nan)
        assert state(mon) == before
