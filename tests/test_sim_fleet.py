"""The fleet-level detector choice and the ``evalstop-fleet`` stop policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform_sim.sim.policies.fleet import FleetDetectorChoice, late_gain
from platform_sim.sim.policies.stop_policies import FleetEvalStopPolicy, make_stop_policy
from platform_sim.sim.policies.views import JobView, ViewWriter

CONSERVATIVE = {"name": "shape", "params": {}}
AGGRESSIVE = {"name": "shape", "params": {"threshold": 0.7, "future": 1.5, "min_tau": 2.0}}


def test_late_gain_of_typical_runs():
    p = np.linspace(0.05, 1.0, 20)
    assert late_gain(list(0.1 + 0.6 * p)) == pytest.approx(0.5, abs=0.01)  # steady rise: half of it in the last third
    plateau = 0.1 + 0.6 * (1 - np.exp(-p / 0.1))
    assert 0.0 <= late_gain(list(plateau)) < 0.05
    assert late_gain(list(0.7 - 0.6 * p)) == -1.0  # ended below its start
    assert late_gain([0.1, 0.2, 0.3, 0.4, 0.5]) is None  # too short to have thirds
    assert late_gain([0.3] * 9) == -1.0  # no rise at all


def test_choice_waits_for_min_runs_then_follows_the_median():
    choice = FleetDetectorChoice(CONSERVATIVE, AGGRESSIVE, min_late_gain=0.3, min_runs=3, window=5)
    rising = list(np.linspace(0.1, 0.7, 20))
    flat = list(0.6 - 0.5 * np.exp(-np.linspace(0.05, 1, 20) / 0.1))
    assert choice.spec() == choice.conservative
    choice.record(rising)
    choice.record(rising)
    assert choice.median_late_gain() is None and choice.spec() == choice.conservative  # 2 < min_runs
    choice.record(rising)
    assert choice.spec() == choice.aggressive
    for _ in range(3):  # the most recent runs plateau: the window (5) now has a flat majority
        choice.record(flat)
    assert choice.spec() == choice.conservative and len(choice.gains) == 5
    assert choice.record([0.1, 0.2]) is None and len(choice.gains) == 5  # too short: not counted


def test_choice_state_round_trip_and_validation():
    choice = FleetDetectorChoice(CONSERVATIVE, AGGRESSIVE, min_runs=2, window=4)
    for g in (0.5, 0.4, 0.45):
        choice.gains.append(g)
    again = FleetDetectorChoice(**choice.params())
    again.load_state_dict(json.loads(json.dumps(choice.state_dict())))
    assert again.spec() == choice.spec() == choice.aggressive
    with pytest.raises(ValueError, match="unknown detector"):
        FleetDetectorChoice({"name": "nope"}, AGGRESSIVE)
    with pytest.raises(ValueError, match="threshold"):
        FleetDetectorChoice(CONSERVATIVE, {"name": "shape", "params": {"threshold": 3}})
    for kwargs, word in (
        ({"min_late_gain": 1.5}, "min_late_gain"),
        ({"min_runs": 0}, "min_runs"),
        ({"min_runs": 5, "window": 3}, "window"),
        ({"min_late_gain": True}, "min_late_gain"),
    ):
        with pytest.raises(ValueError, match=word):
            FleetDetectorChoice(CONSERVATIVE, AGGRESSIVE, **kwargs)


def _feed(policy: FleetEvalStopPolicy, job_id: str, scores) -> bool:
    """Report ``scores`` for one RLHF job through the policy; forget it at the end (as the simulator does)."""
    stopped = False
    view = JobView(job_id, "rlhf", 1, 0.0, len(scores), 1.0)
    for i, s in enumerate(scores):
        ViewWriter.add_eval(view, i + 1, float(s), example_scores=[float(s) + d for d in (-0.01, 0.0, 0.01, 0.0)])
        if policy.on_eval(view) is not None:
            stopped = True
            break
    policy.forget(job_id)
    return stopped


def test_policy_learns_only_from_runs_that_finished_unstopped():
    policy = make_stop_policy("evalstop-fleet", min_runs=2)
    assert isinstance(policy, FleetEvalStopPolicy) and policy.params()["min_runs"] == 2
    rising = list(np.linspace(0.1, 0.7, 20))
    collapse = [0.1, 0.3, 0.5, 0.6, 0.62, 0.6, 0.5, 0.35, 0.2, 0.1, 0.0]
    assert _feed(policy, "hack", collapse)  # stopped: says nothing about finished runs
    assert policy.choice.gains == [] and policy.chosen["hack"] == "conservative"
    assert not _feed(policy, "ok-1", rising) and not _feed(policy, "ok-2", rising)
    assert len(policy.choice.gains) == 2
    _feed(policy, "next", rising[:3])
    assert policy.chosen["next"] == "aggressive"
    assert policy.monitors == {}  # forgotten


def test_in_the_simulator_the_choice_follows_the_workloads_healthy_runs():
    # Healthy runs that keep rising (default workload) turn the fleet aggressive once enough of them finished; runs
    # that plateau (the plateau scenario) keep it conservative.
    from platform_sim.sim.engine import simulate
    from platform_sim.sim.experiments import PolicySpec
    from platform_sim.sim.observe import make_observation_model
    from platform_sim.sim.workload import WorkloadConfig, generate_workload
    from platform_sim.studies.detector_study import PLATEAU_TAU

    shares = {}
    for name, config in (
        ("default", WorkloadConfig(n_jobs=120, sigma=0.02)),
        ("plateau", WorkloadConfig(n_jobs=120, sigma=0.02, healthy_tau=PLATEAU_TAU)),
    ):
        workload = generate_workload(config, 0)
        sched = PolicySpec(stop="evalstop-fleet", stop_params={"min_runs": 4}).build(workload)
        simulate(workload, sched, observation=make_observation_model(workload, {"name": "per-example"}))
        chosen = list(sched.stop.chosen.values())
        shares[name] = chosen.count("aggressive") / len(chosen)
    assert shares["default"] > 0.5 and shares["plateau"] == 0.0, shares
