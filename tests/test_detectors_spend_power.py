"""The per-run tests' spending shape ``F(p) = p**spend_power`` (the Kim-DeMets power family) up to the plan.

``trend``'s per-run tests spend their run level by planned progress: a look at progress ``p`` after an eval at ``p'``
may spend ``level * (F(p) - F(p'))``. ``spend_power`` picks the shape (1: evenly by progress; 2: little early);
past the plan every shape is ``2 - 1/p``. The parameter is checked, bounded, listed only off its default, and kept
in the detector's state so that a resumed run keeps the shape it started with.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from platform_sim.core import default_spec, detector_from_spec
from platform_sim.core.detectors import make_detector
from platform_sim.core.detectors.progress import PlannedEvidence, PlannedSlope, spent
from platform_sim.core.monitor import JobMonitor

DEFAULT_POWER = detector_from_spec(default_spec()).spend_power


def _spec(**params):
    spec = default_spec()
    return {**spec, "params": {**spec["params"], **params}}


@pytest.mark.parametrize(
    ("power", "expected"),
    [
        (1.0, [0.0, 0.1, 0.5, 1.0]),
        (1.5, [0.0, 0.1**1.5, 0.5**1.5, 1.0]),
        (2.0, [0.0, 0.01, 0.25, 1.0]),
        (3.0, [0.0, 0.001, 0.125, 1.0]),
    ],
)
def test_the_spent_share_is_p_to_the_power_up_to_the_plan_and_the_same_past_it(power, expected):
    assert [spent(p, power) for p in (0.0, 0.1, 0.5, 1.0)] == pytest.approx(expected, rel=1e-12, abs=0.0)
    assert spent(1.0 + 1e-9, power) == pytest.approx(1.0)  # continuous at the planned end
    assert spent(2.0, power) == 1.5 and spent(4.0, power) == 1.75  # past the plan: 2 - 1/p, whatever the power
    assert all(spent(a, power) < spent(b, power) for a, b in [(0.05, 0.1), (0.9, 1.0), (1.0, 1.5)])


def test_the_squared_shape_is_bit_for_bit_the_product():
    assert all(spent(p, 2.0) == p * p for p in np.linspace(0.0, 1.0, 101))
    assert spent(0.3) == spent(0.3, 2.0)  # the default argument


@pytest.mark.parametrize("power", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("interval", [1, 7])
def test_each_look_spends_exactly_its_share_and_a_run_to_its_plan_spends_its_level(power, interval):
    test = PlannedSlope(run_alpha=0.05, frac=0.2, min_evals=6, rel_drop=0.2, planned_steps=700, power=power)
    total, prev = 0.0, 0
    for step in range(interval, 701, interval):
        test.add_planned(step, 0.5, 700)
        assert test.look_alpha() == pytest.approx(0.05 * ((step / 700) ** power - (prev / 700) ** power), rel=1e-9)
        total, prev = total + test.look_alpha(), step
    assert total == pytest.approx(0.05)  # the last eval is at the plan: the whole level, whatever the shape


def test_a_flatter_shape_spends_more_of_the_level_early():
    early = {}
    for power in (1.0, 1.5, 2.0):
        test = PlannedEvidence(0.05, 0.2, 6, 0.2, 100, evidence_alpha=0.1, power=power)
        for step in range(1, 21):
            test.add_evidence(step, 0.5, 100, None, None)
        early[power] = test.evidence_level()  # the look at 20% of the plan
        assert early[power] == pytest.approx(0.1 * (0.2**power - 0.19**power))
    assert early[1.0] > early[1.5] > early[2.0]


def test_the_detector_uses_its_spend_power_and_names_it_in_the_reason():
    rng = np.random.default_rng(5)
    steps = np.arange(1, 31)
    means = np.where(steps < 8, 0.2 + 0.05 * steps, 0.55 - 0.03 * (steps - 8)) + rng.normal(0, 0.01, 30)
    for power in (1.0, 1.5):
        mon = JobMonitor("j", "rlhf", detector_from_spec(_spec(spend_power=power)))
        stop = None
        for step, m in zip(steps, means):
            d = mon.observe(int(step), float(m), planned_steps=30)
            if d.should_stop:
                stop = d
                break
        assert stop is not None and f"level spent by progress^{power:g})" in stop.reason
        assert mon.detector._per_run.planned.power == power


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "2", True, None])
def test_a_bad_spend_power_is_refused_with_one_clear_line(bad):
    with pytest.raises(ValueError, match=r"^spend_power must be a finite number > 0"):
        make_detector("trend", spend_power=bad)


def test_a_spend_power_above_its_bound_is_refused_by_the_declared_table():
    with pytest.raises(ValueError, match=r"parameter spend_power must be in \[0, 10\]"):
        detector_from_spec(_spec(spend_power=11))


def test_spend_power_is_listed_only_off_its_default_and_round_trips():
    assert "spend_power" not in default_spec()["params"]
    assert "spend_power" not in detector_from_spec(_spec(spend_power=DEFAULT_POWER)).params()
    other = 1.25 if DEFAULT_POWER != 1.25 else 1.75
    spec = detector_from_spec(_spec(spend_power=other)).spec()
    assert spec["params"]["spend_power"] == other
    assert detector_from_spec(json.loads(json.dumps(spec))).spend_power == other
    assert "spend_power" not in detector_from_spec({"name": "trend", "params": {"means_test": "window"}}).params()


def _feed(mon, steps, means):
    return [mon.observe(int(s), float(m), planned_steps=40) for s, m in zip(steps, means)]


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_a_resumed_run_keeps_its_shape_and_decides_as_if_never_interrupted(power):
    rng = np.random.default_rng(11)
    steps = np.arange(1, 41)
    means = np.where(steps < 12, 0.2 + 0.03 * steps, 0.53 - 0.02 * (steps - 12)) + rng.normal(0, 0.01, 40)
    full = _feed(JobMonitor("j", "rlhf", detector_from_spec(_spec(spend_power=power))), steps, means)
    part = JobMonitor("j", "rlhf", detector_from_spec(_spec(spend_power=power)))
    head = _feed(part, steps[:15], means[:15])
    state = json.loads(json.dumps(part.state_dict()))
    planned = state["detector_state"]["planned"]["planned"]
    assert planned[2:] == ([] if power == 2.0 else [power])  # squared-shape states are as they always were
    tail = _feed(JobMonitor.from_state_dict(state), steps[15:], means[15:])
    assert [d.to_dict() for d in head + tail] == [d.to_dict() for d in full]
    assert any(d.should_stop for d in tail)  # the resumed run goes on to decide a stop


def test_a_state_keeps_its_own_shape_whatever_the_detector_is_built_with_and_old_states_are_squared():
    mon = JobMonitor("j", "rlhf", detector_from_spec(_spec(spend_power=1.0)))
    _feed(mon, range(1, 11), [0.5] * 10)
    state = json.loads(json.dumps(mon.state_dict()))
    state["detector"] = _spec(spend_power=1.5)  # a newer default: the run keeps the shape it was started with
    assert JobMonitor.from_state_dict(state).detector._per_run.planned.power == 1.0
    del state["detector_state"]["planned"]["planned"][2]  # a state written before the shape was a parameter
    assert JobMonitor.from_state_dict(state).detector._per_run.planned.power == 2.0
