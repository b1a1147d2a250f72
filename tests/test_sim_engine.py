"""The event-driven engine on hand-built workloads whose timelines can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.sim.curves import TabulatedCurve, eval_grid
from platform_sim.sim.engine import simulate
from platform_sim.sim.experiments import PolicySpec
from platform_sim.sim.policies.policies import FIFO, PREEMPTION_COST_H, LossAware, SJFEst, SRTFEst
from platform_sim.sim.policies.stop_policies import EvalStopPolicy, Oracle, with_stop
from platform_sim.sim.workload import JobSpec, Workload, WorkloadConfig, generate_workload


def make_workload(specs, n_evals=5, sigma=0.0):
    """specs: dicts with gpus, submit, dur, est (default dur), type (rlhf), hacking, evals (true scores), losses."""
    grid = eval_grid(n_evals)
    jobs, true, losses = [], [], []
    for i, s in enumerate(specs):
        evals = s.get("evals") or list(np.linspace(0.2, 0.8, n_evals))
        curve = TabulatedCurve(grid, evals)
        loss = s.get("losses") or list(np.linspace(2.0, 1.0, n_evals))
        jobs.append(
            JobSpec(
                i,
                f"j{i}",
                s.get("type", "rlhf"),
                s["gpus"],
                s["submit"],
                s["dur"],
                s.get("est", s["dur"]),
                s.get("steps", 1000),
                s.get("hacking", False),
                curve,
                TabulatedCurve(grid, loss),
            )
        )
        true.append(evals)
        losses.append(loss)
    n = len(specs)
    return Workload(jobs, n_evals, sigma, np.array(true, float), np.array(losses, float), np.zeros((n, n_evals)))


def by_id(result):
    return {o.job_id: o for o in result.outcomes}


def test_a_lone_job_runs_exactly_its_duration():
    wl = make_workload([{"gpus": 8, "submit": 1.5, "dur": 3.0}])
    r = simulate(wl, with_stop(FIFO()), gpus=16)
    o = r.outcomes[0]
    assert (o.start_time, o.end_time) == (1.5, pytest.approx(4.5))
    assert o.gpu_hours == pytest.approx(24.0) and not o.stopped and o.deliver_eval == 5
    # nobody reads this job's evals: arrival + completion only; with EvalStop: arrival + 5 evals (the last completes)
    assert r.events == 2
    r2 = simulate(wl, with_stop(FIFO(), EvalStopPolicy()), gpus=16)
    assert r2.events == 1 + 5 and r2.outcomes[0].end_time == pytest.approx(4.5)
    assert r.makespan_h == pytest.approx(3.0) and r.busy_gpu_hours == pytest.approx(24.0)


def test_gang_allocation_waits_for_all_gpus():
    wl = make_workload([{"gpus": 16, "submit": 0.0, "dur": 2.0}, {"gpus": 8, "submit": 0.5, "dur": 1.0}])
    o = by_id(simulate(wl, with_stop(FIFO()), gpus=16))
    assert o["j1"].start_time == pytest.approx(2.0) and o["j1"].jct == pytest.approx(2.5)


def test_backfill_starts_a_job_that_fits_behind_one_that_does_not():
    wl = make_workload(
        [
            {"gpus": 8, "submit": 0.0, "dur": 4.0},
            {"gpus": 16, "submit": 0.1, "dur": 1.0},
            {"gpus": 8, "submit": 0.2, "dur": 1.0},
        ]
    )
    o = by_id(simulate(wl, with_stop(FIFO()), gpus=16))
    assert o["j2"].start_time == pytest.approx(0.2)
    assert o["j1"].start_time == pytest.approx(4.0)


def test_sjf_est_orders_by_the_estimate_not_the_truth():
    wl = make_workload(
        [
            {"gpus": 16, "submit": 0.0, "dur": 1.0},
            {"gpus": 16, "submit": 0.1, "dur": 5.0, "est": 0.5},  # claims to be short
            {"gpus": 16, "submit": 0.2, "dur": 1.0, "est": 2.0},
        ]
    )
    o = by_id(simulate(wl, with_stop(SJFEst()), gpus=16))
    assert o["j1"].start_time == pytest.approx(1.0) and o["j2"].start_time == pytest.approx(6.0)


def test_srtf_preempts_a_longer_job_and_charges_the_resume_cost():
    wl = make_workload([{"gpus": 16, "submit": 0.0, "dur": 10.0}, {"gpus": 16, "submit": 1.0, "dur": 1.0}])
    o = by_id(simulate(wl, with_stop(SRTFEst()), gpus=16))
    assert o["j1"].start_time == pytest.approx(1.0) and o["j1"].end_time == pytest.approx(2.0)
    assert o["j0"].preemptions == 1
    assert o["j0"].end_time == pytest.approx(2.0 + PREEMPTION_COST_H + 9.0)
    assert o["j0"].gpu_hours == pytest.approx(16 * (10.0 + PREEMPTION_COST_H))


def test_srtf_does_not_preempt_for_a_job_with_a_longer_remaining_estimate():
    wl = make_workload([{"gpus": 16, "submit": 0.0, "dur": 10.0}, {"gpus": 16, "submit": 5.0, "dur": 1.0, "est": 6.0}])
    o = by_id(simulate(wl, with_stop(SRTFEst()), gpus=16))
    # at t=5 the running job has 5 h left by its estimate, the newcomer claims 6: no preemption
    assert o["j0"].preemptions == 0 and o["j1"].start_time == pytest.approx(10.0)


def test_srtf_preempts_only_if_enough_gpus_can_be_freed():
    wl = make_workload(
        [
            {"gpus": 8, "submit": 0.0, "dur": 10.0},
            {"gpus": 8, "submit": 0.0, "dur": 1.0, "est": 0.5},
            {"gpus": 16, "submit": 0.5, "dur": 1.0, "est": 2.0},
        ]
    )
    o = by_id(simulate(wl, with_stop(SRTFEst()), gpus=16))
    # j2 outranks j0 (2 < 9.5) but freeing j0 alone gives 8 of 16 GPUs and j1 (0.25 left) outranks j2: no preemption
    assert o["j0"].preemptions == 0 and o["j1"].preemptions == 0
    # when j1 ends at 1.0 the 8 free GPUs are not enough and no arrival triggers preemption: j2 waits for j0
    assert o["j2"].start_time == pytest.approx(10.0)


def test_evalstop_frees_the_gpus_at_the_stop_and_delivers_the_best_checkpoint():
    wl = make_workload(
        [
            {"gpus": 16, "submit": 0.0, "dur": 4.0, "hacking": True, "evals": [0.5, 0.9, 0.8, 0.7, 0.6]},
            {"gpus": 16, "submit": 0.1, "dur": 1.0},
        ]
    )
    o = by_id(simulate(wl, with_stop(FIFO(), EvalStopPolicy()), gpus=16))
    a = o["j0"]
    assert a.stopped and a.stop_eval == 4 and a.deliver_eval == 2 and a.peak_eval == 2
    assert a.end_time == pytest.approx(3.2) and a.delivered_value == a.peak_value == 0.9
    assert a.wasted_gpu_hours == pytest.approx((4 / 5 - 2 / 5) * 4.0 * 16)
    assert o["j1"].start_time == pytest.approx(3.2)
    # without a stop policy the job runs on and delivers its last checkpoint
    b = by_id(simulate(wl, with_stop(FIFO()), gpus=16))["j0"]
    assert not b.stopped and b.end_time == pytest.approx(4.0) and b.delivered_value == 0.6
    assert b.wasted_gpu_hours == pytest.approx((1 - 2 / 5) * 4.0 * 16)


def test_stop_policy_only_consulted_for_covered_types():
    wl = make_workload([{"gpus": 8, "submit": 0.0, "dur": 1.0, "type": "lora", "evals": [0.5, 0.4, 0.3, 0.2, 0.1]}])
    o = simulate(wl, with_stop(FIFO(), EvalStopPolicy()), gpus=16).outcomes[0]
    assert not o.stopped
    o = simulate(wl, with_stop(FIFO(), EvalStopPolicy(job_types=["lora"])), gpus=16).outcomes[0]
    assert o.stopped and o.stop_eval == 3


def test_oracle_stops_exactly_at_the_true_peak():
    wl = make_workload([{"gpus": 8, "submit": 0.0, "dur": 5.0, "hacking": True, "evals": [0.1, 0.3, 0.6, 0.5, 0.4]}])
    o = simulate(wl, with_stop(FIFO(), Oracle(wl.peak_steps())), gpus=16).outcomes[0]
    assert o.stopped and o.stop_eval == o.deliver_eval == o.peak_eval == 3
    assert o.end_time == pytest.approx(3.0) and o.wasted_gpu_hours == 0.0


def test_peak_ties_go_to_the_earliest_eval():
    wl = make_workload([{"gpus": 8, "submit": 0.0, "dur": 1.0, "evals": [0.1, 0.5, 0.5, 0.5, 0.5]}])
    assert int(wl.peak_index[0]) == 1
    assert simulate(wl, with_stop(FIFO()), gpus=16).outcomes[0].wasted_gpu_hours == pytest.approx(0.6 * 8)


def test_loss_aware_preempts_a_slow_job_for_a_new_one_at_its_eval():
    wl = make_workload(
        [
            {"gpus": 16, "submit": 0.0, "dur": 5.0, "losses": [2.0, 1.99, 1.98, 1.97, 1.96]},
            {"gpus": 16, "submit": 0.5, "dur": 1.0},
        ]
    )
    o = by_id(simulate(wl, with_stop(LossAware()), gpus=16))
    # j0 has no slope yet at eval 1 (new jobs rank first among themselves by arrival); at eval 2 (t=2) it yields
    assert o["j1"].start_time == pytest.approx(2.0)
    assert o["j0"].preemptions == 1


def test_job_bigger_than_the_cluster_is_rejected():
    wl = make_workload([{"gpus": 32, "submit": 0.0, "dur": 1.0}])
    with pytest.raises(ValueError, match="more GPUs than the cluster"):
        simulate(wl, with_stop(FIFO()), gpus=16)


def test_same_seed_same_outcomes_and_different_seed_different_outcomes():
    cfg = WorkloadConfig(n_jobs=60)
    runs = [
        simulate(generate_workload(cfg, s), PolicySpec(stop="evalstop").build(generate_workload(cfg, s)))
        for s in (5, 5, 6)
    ]
    assert runs[0].outcomes == runs[1].outcomes
    assert runs[0].outcomes != runs[2].outcomes


def max_concurrent_gpus(outcomes):
    events = sorted(
        [(o.start_time, o.gpus) for o in outcomes] + [(o.end_time, -o.gpus) for o in outcomes],
        key=lambda e: (e[0], e[1]),
    )  # ends before starts at the same instant
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    base=st.sampled_from(["fifo", "sjf-est"]),
    stop=st.sampled_from(["none", "evalstop", "stop-at-p"]),
    load=st.sampled_from([0.5, 1.5]),
)
def test_property_capacity_never_exceeded_and_every_job_ends_once(seed, base, stop, load):
    wl = generate_workload(WorkloadConfig(n_jobs=40, load=load), seed)
    r = simulate(wl, PolicySpec(base=base, stop=stop).build(wl), gpus=64)
    assert max_concurrent_gpus(r.outcomes) <= 64
    for o, j in zip(r.outcomes, wl.jobs):
        assert o.job_id == j.job_id and o.start_time >= o.submit_time - 1e-12
        if not o.stopped:  # non-preemptive: a completed job ran exactly its duration
            assert o.end_time - o.start_time == pytest.approx(j.duration_h)
        assert o.gpu_hours == pytest.approx((o.end_time - o.start_time) * o.gpus)
        assert 1 <= o.deliver_eval <= (o.stop_eval or wl.n_evals)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), base=st.sampled_from(["srtf-est", "loss-aware"]))
def test_property_preemptive_policies_conserve_work(seed, base):
    wl = generate_workload(WorkloadConfig(n_jobs=40, load=1.5), seed)
    r = simulate(wl, PolicySpec(base=base).build(wl), gpus=64)
    for o, j in zip(r.outcomes, wl.jobs):
        # GPU time held = the work plus one resume cost per preemption (preempted during a resume loses it only)
        held = o.gpu_hours / o.gpus
        assert held >= j.duration_h - 1e-9
        assert held <= j.duration_h + o.preemptions * PREEMPTION_COST_H + 1e-9
    assert r.busy_gpu_hours == pytest.approx(sum(o.gpu_hours for o in r.outcomes))
