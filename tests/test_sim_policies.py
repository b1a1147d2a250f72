"""Base policies, stop policies, their composition, and the read-only job views."""

from __future__ import annotations

import math

import pytest

from platform_sim.sim.policies.policies import (
    BASE_POLICIES,
    FIFO,
    PREEMPTION_COST_H,
    LossAware,
    SJFEst,
    SRTFEst,
    make_base_policy,
)
from platform_sim.sim.policies.stop_policies import (
    STOP_POLICIES,
    EvalStopPolicy,
    LossPlateau,
    NoStop,
    Oracle,
    StopAtP,
    evalstop,
    make_stop_policy,
    with_stop,
)
from platform_sim.sim.policies.views import JobView, ViewWriter

W = ViewWriter


def view(job_id="j", job_type="rlhf", gpus=8, submit=0.0, steps=2000, est=10.0) -> JobView:
    return JobView(job_id, job_type, gpus, submit, steps, est)


def add_evals(v: JobView, scores, losses=None, stride=100):
    for i, s in enumerate(scores):
        W.add_eval(v, (v.n_evals + 1) * stride, s, None if losses is None else losses[i])


# -- views --------------------------------------------------------------------------------------------------------


def test_view_is_read_only_and_exposes_copies():
    v = view()
    add_evals(v, [0.1, 0.2], [2.0, 1.5])
    for name in ("progress", "gpus", "job_type", "eval_scores", "hacking", "duration_h"):
        with pytest.raises(AttributeError):
            setattr(v, name, 1)
    assert isinstance(v.eval_scores, tuple) and v.eval_scores == (0.1, 0.2)
    assert v.loss_history == (2.0, 1.5) and v.recent_losses(1) == (1.5,) and v.recent_losses(0) == ()
    assert (v.last_step, v.last_score, v.n_evals) == (200, 0.2, 2)


def test_view_validates_its_fields():
    with pytest.raises(ValueError, match="gpus"):
        view(gpus=0)
    with pytest.raises(ValueError, match="est_duration_h"):
        view(est=0)
    with pytest.raises(ValueError, match="job_type"):
        view(job_type="pretrain")


def test_view_has_no_ground_truth_attributes():
    public = {n for n in dir(JobView) if not n.startswith("_")}
    for forbidden in ("hacking", "curve", "duration_h", "true_duration", "peak", "label", "loss_curve"):
        assert forbidden not in public
    assert "est_duration_h" in public  # the user's estimate is observable


# -- base policies ------------------------------------------------------------------------------------------------


def test_fifo_and_sjf_keys():
    a, b = view("a", submit=1.0, est=5.0), view("b", submit=2.0, est=1.0)
    assert FIFO().key(a) < FIFO().key(b)
    assert SJFEst().key(b) < SJFEst().key(a)
    assert not FIFO.preempt_on_arrival and not SJFEst.preempt_on_arrival


def test_srtf_key_is_estimate_times_remaining_and_falls_with_progress():
    v = view(est=10.0)
    p = SRTFEst()
    assert p.key(v) == 10.0 and SRTFEst.preempt_on_arrival
    W.set_progress(v, 0.25)
    assert p.key(v) == pytest.approx(7.5)
    assert v.est_remaining_h == pytest.approx(7.5)


def test_loss_aware_ranks_new_jobs_first_then_largest_normalized_reduction():
    p = LossAware()
    new = view("new")
    fast, slow = view("fast"), view("slow")
    add_evals(fast, [0.1, 0.2], [2.0, 1.0])  # reduction 0.5 of the first loss per 0.05 progress
    add_evals(slow, [0.1, 0.2], [2.0, 1.9])
    assert p.key(new) == -math.inf
    assert p.key(fast) < p.key(slow) < 0
    assert p.reduction(fast) == pytest.approx((2.0 - 1.0) / 2.0 / (100 / 2000))
    assert p.should_yield(p.key(slow), p.key(new))
    assert p.should_yield(p.key(slow), p.key(fast))
    assert not p.should_yield(p.key(fast), p.key(slow))
    # the margin: a slightly better waiting job does not preempt
    assert not LossAware(margin=10.0).should_yield(p.key(slow), p.key(fast))
    with pytest.raises(ValueError, match="margin"):
        LossAware(margin=-1)


def test_make_base_policy_names():
    assert set(BASE_POLICIES) == {"fifo", "sjf-est", "srtf-est", "loss-aware"}
    assert isinstance(make_base_policy("srtf-est"), SRTFEst)
    with pytest.raises(ValueError, match="unknown base scheduler 'lifo'"):
        make_base_policy("lifo")


def test_preemption_cost_is_two_minutes():
    assert PREEMPTION_COST_H * 60 == pytest.approx(2.0)


# -- stop policies ------------------------------------------------------------------------------------------------


def test_evalstop_uses_the_job_monitor_and_delivers_the_best_step():
    pol = EvalStopPolicy()
    v = view()
    verdicts = []
    for s in [0.2, 0.5, 0.48, 0.47]:
        add_evals(v, [s])
        verdicts.append(pol.on_eval(v))
    assert verdicts[:3] == [None, None, None]
    assert verdicts[3].deliver_step == 200 and verdicts[3].declines == 2
    assert "2 consecutive declines" in verdicts[3].reason
    assert pol.monitors["j"].stopped_at == 400
    pol.forget("j")
    assert "j" not in pol.monitors


def test_evalstop_detector_spec_is_honoured_and_validated_up_front():
    pol = EvalStopPolicy({"name": "k-decline", "params": {"k": 3}})
    assert pol.detector_spec == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    v = view()
    out = []
    for s in [0.5, 0.4, 0.3, 0.2]:
        add_evals(v, [s])
        out.append(pol.on_eval(v))
    assert out[2] is None and out[3] is not None
    with pytest.raises(ValueError, match="unknown detector"):
        EvalStopPolicy("no-such-detector")


def test_stop_policies_cover_rlhf_by_default_and_validate_types():
    pol = StopAtP()
    assert pol.covers(view(job_type="rlhf")) and not pol.covers(view(job_type="lora"))
    assert StopAtP(job_types=["lora", "rlhf"]).covers(view(job_type="lora"))
    with pytest.raises(ValueError, match="job_types"):
        StopAtP(job_types=["gpt"])
    assert not NoStop().covers(view())


def test_stop_at_p_stops_at_the_first_eval_at_or_after_p():
    pol = StopAtP(0.65)
    v = view(steps=2000)
    hits = []
    for k in range(1, 21):
        W.add_eval(v, (k * 2000) // 20, 0.5)
        hits.append(pol.on_eval(v) is not None)
    assert hits.index(True) == 12  # the 13th eval is at 0.65 exactly
    with pytest.raises(ValueError, match="p must be"):
        StopAtP(0)
    with pytest.raises(ValueError, match="p must be"):
        StopAtP(1.5)


def test_stop_at_p_reaches_p_despite_floating_point_rounding():
    # 0.55 * 100 is 55.00000000000001 in floating point: the eval at step 55 of 100 is at p = 0.55 and must stop.
    assert 0.55 * 100 > 55
    pol = StopAtP(0.55)
    v = view(steps=100)
    W.add_eval(v, 54, 0.5)
    assert pol.on_eval(v) is None
    W.add_eval(v, 55, 0.5)
    verdict = pol.on_eval(v)
    assert verdict is not None and verdict.deliver_step == 55


def test_base_policies_declare_should_yield_and_only_loss_aware_yields():
    running, waiting = 5.0, 1.0  # the waiting job ranks much better
    for cls in (FIFO, SJFEst, SRTFEst):
        assert cls().should_yield(running, waiting) is False
    assert LossAware().should_yield(-1.0, -3.0) is True


def test_loss_plateau_rule():
    pol = LossPlateau(window=2, min_rel_improvement=0.05)
    v = view()
    add_evals(v, [0.1, 0.1], [2.0, 1.5])
    assert pol.on_eval(v) is None  # not enough history
    add_evals(v, [0.1], [1.45])  # (2.0 - 1.45) / 2.0 = 27.5% over 2 evals
    assert pol.on_eval(v) is None
    add_evals(v, [0.1], [1.44])  # (1.5 - 1.44) / 1.5 = 4% < 5%
    verdict = pol.on_eval(v)
    assert verdict is not None and verdict.deliver_step == v.last_step
    with pytest.raises(ValueError, match="window"):
        LossPlateau(window=0)
    with pytest.raises(ValueError, match="min_rel_improvement"):
        LossPlateau(min_rel_improvement=math.nan)


def test_oracle_stops_at_the_true_peak_and_is_the_only_policy_with_ground_truth():
    pol = Oracle({"j": 300})
    v = view()
    add_evals(v, [0.1, 0.2])
    assert pol.on_eval(v) is None
    add_evals(v, [0.3])
    assert pol.on_eval(v).deliver_step == 300
    other = view("other")
    add_evals(other, [0.1] * 5)
    assert pol.on_eval(other) is None
    assert [n for n, c in STOP_POLICIES.items() if c.uses_ground_truth] == ["oracle"]


def test_make_stop_policy_and_composition():
    assert set(STOP_POLICIES) == {"none", "evalstop", "evalstop-fleet", "stop-at-p", "loss-plateau", "oracle"}
    with pytest.raises(ValueError, match="unknown stop policy 'magic'"):
        make_stop_policy("magic")
    with pytest.raises(ValueError, match="bad parameters for stop policy 'stop-at-p'"):
        make_stop_policy("stop-at-p", q=1)
    s = evalstop(FIFO())
    assert s.name == "fifo+evalstop" and isinstance(s.stop, EvalStopPolicy)
    assert with_stop(SRTFEst()).name == "srtf-est+none"
