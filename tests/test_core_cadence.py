"""The cadence hint: the pure policy, and the monitor's decisions that carry it (and still load old states)."""

from __future__ import annotations

import json

import pytest

from platform_sim.core import Action, CadencePolicy, Decision, JobMonitor, cadence_from_spec, make_detector
from platform_sim.core.boundary import BoundaryError


def test_policy_hints_only_while_evidence_builds_up() -> None:
    pol = CadencePolicy(fraction=0.25)
    steps = [20, 40, 60]
    assert pol.next_eval_step(steps, evidence=0, needed=2) is None  # no evidence: regular cadence
    assert pol.next_eval_step(steps, evidence=1, needed=2) == 65  # a quarter of the 20-step interval
    assert pol.next_eval_step(steps, evidence=2, needed=2) is None  # enough to stop: nothing more to ask
    assert pol.next_eval_step(steps, evidence=1, needed=None) == 65  # a detector without k: any evidence
    assert pol.next_eval_step([], evidence=1, needed=2) is None


def test_a_small_p_value_of_a_testing_detector_is_evidence() -> None:
    pol = CadencePolicy(fraction=0.25, p_hint=0.3)
    steps = [20, 40, 60]
    # k=1 (a detector that stops at its first significant eval): no count, but a p-value below p_hint hints
    assert pol.next_eval_step(steps, evidence=0, needed=1, p_value=0.1) == 65
    assert pol.next_eval_step(steps, evidence=0, needed=1, p_value=0.3) is None  # not below p_hint
    assert pol.next_eval_step(steps, evidence=0, needed=1, p_value=None) is None  # no test ran
    assert pol.next_eval_step(steps, evidence=1, needed=1, p_value=0.001) is None  # significant: it stops
    assert CadencePolicy(p_hint=0.0).next_eval_step(steps, evidence=0, needed=1, p_value=0.01) is None  # off


def test_trend_detector_hints_on_a_fall_that_is_not_yet_significant() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    difficulty = rng.normal(0.0, 1.0, 48)
    mon = JobMonitor("j", "rlhf", make_detector("trend", window=4, alpha=0.01), cadence=CadencePolicy(0.25))
    means = [0.4, 0.8, 1.2, 1.2, 1.2, 1.0]  # a rise, a plateau, then a first fall of the last window
    hints = []
    for i, m in enumerate(means):
        scores = (m + difficulty + rng.normal(0.0, 0.8, 48)).tolist()
        d = mon.observe(10 * (i + 1), float(np.mean(scores)), scores)
        hints.append(d.next_eval_step)
    p = mon.detector.doubt()
    assert mon.detector.last_p == 1.0  # the significance test skipped scipy: it could not reach alpha
    assert d.action is Action.CONTINUE and p is not None and mon.detector.alpha <= p < 0.5  # the exact p
    assert hints[:-1] == [None] * 5 and hints[-1] == 62  # a quarter of the 10-step interval after step 60


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), True])
def test_bad_p_hint_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="p_hint"):
        CadencePolicy(p_hint=bad)  # type: ignore[arg-type]


def test_regular_interval_survives_hinted_evals() -> None:
    # After a hinted eval at 65 the largest gap is still the regular 20, so a k=3 rule gets the same spacing again.
    pol = CadencePolicy(fraction=0.5)
    assert CadencePolicy.regular_interval([20, 40, 60, 65]) == 20
    assert pol.next_eval_step([20, 40, 60, 65], evidence=2, needed=3) == 75
    assert CadencePolicy.regular_interval([0]) is None
    # A 1-step cadence cannot get any sooner: no hint.
    assert pol.next_eval_step([1, 2, 3], evidence=1, needed=2) is None


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan"), True, "0.3"])
def test_bad_fraction_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="fraction"):
        CadencePolicy(fraction=bad)  # type: ignore[arg-type]


def test_specs() -> None:
    assert cadence_from_spec(None) is None
    assert cadence_from_spec("fixed") is None
    assert cadence_from_spec("adaptive") == CadencePolicy()
    pol = cadence_from_spec({"name": "adaptive", "params": {"fraction": 0.5}})
    assert pol == CadencePolicy(0.5) and cadence_from_spec(pol.spec()) == pol
    assert pol.spec() == {"name": "adaptive", "params": {"fraction": 0.5}}  # the default p_hint is left out
    odd = CadencePolicy(0.5, p_hint=0.1)
    assert odd.spec()["params"]["p_hint"] == 0.1 and cadence_from_spec(odd.spec()) == odd
    for bad, match in (
        ("sometimes", "unknown cadence"),
        ({"name": "adaptive", "x": 1}, "unknown cadence spec"),
        ({"name": "adaptive", "params": {"speed": 2}}, "bad parameters"),
        (3, "a cadence spec"),
    ):
        with pytest.raises(ValueError, match=match):
            cadence_from_spec(bad)  # type: ignore[arg-type]


def test_monitor_decisions_carry_the_hint() -> None:
    mon = JobMonitor("j", "rlhf", make_detector("k-decline", k=2), cadence=CadencePolicy(0.25))
    hints = [mon.observe(s, v).next_eval_step for s, v in ((20, 0.5), (40, 0.6), (60, 0.55))]
    assert hints == [None, None, 65]  # the first decline at 60 asks for 65
    d = mon.observe(65, 0.50)
    assert d.action is Action.STOP and d.next_eval_step is None  # a stopped job gets no hint
    # A re-send of the hinted eval's predecessor gets the decision it got then, hint included.
    assert mon.observe(60, 0.55).next_eval_step == 65


def test_no_cadence_means_no_hint_and_unchanged_state() -> None:
    mon = JobMonitor("j", "rlhf")
    for s, v in ((20, 0.5), (40, 0.4)):
        d = mon.observe(s, v)
    assert d.next_eval_step is None and "next_eval_step" not in d.to_dict()
    assert "cadence" not in mon.state_dict()


def test_state_round_trip_with_cadence_and_old_states_load() -> None:
    mon = JobMonitor("j", "rlhf", cadence=CadencePolicy(0.25))
    mon.observe(20, 0.5)
    mon.observe(40, 0.4)
    state = json.loads(json.dumps(mon.state_dict()))
    back = JobMonitor.from_state_dict(state)
    assert back.cadence == CadencePolicy(0.25) and back.last_decision == mon.last_decision
    assert back.observe(45, 0.3).action is Action.STOP
    # A state written before hints existed (no "cadence", decisions without next_eval_step) still loads.
    old = dict(state)
    del old["cadence"]
    old["decisions"] = [{k: v for k, v in d.items() if k != "next_eval_step"} for d in old["decisions"]]
    assert JobMonitor.from_state_dict(old).cadence is None


def test_decision_round_trip_and_bad_hint() -> None:
    d = Decision(Action.CONTINUE, "no stop signal", 1, 20, 0.5, 65)
    assert Decision.from_dict(d.to_dict()) == d and d.to_dict()["next_eval_step"] == 65
    with pytest.raises(BoundaryError, match="next_eval_step"):
        Decision.from_dict({**d.to_dict(), "next_eval_step": -3})


def test_service_decision_schema_passes_the_hint_through() -> None:
    from platform_sim.service.schemas import DecisionOut

    with_hint = Decision(Action.CONTINUE, "no stop signal", 1, 20, 0.5, 65).to_dict()
    assert DecisionOut.model_validate(with_hint).next_eval_step == 65
    # Without a hint the field is absent from the core's dict and None in the schema: clients keep their cadence.
    plain = Decision(Action.CONTINUE, "no stop signal", 0, 20, 0.5).to_dict()
    assert DecisionOut.model_validate(plain).next_eval_step is None
    assert Decision.from_dict(DecisionOut.model_validate(with_hint).model_dump()) == Decision.from_dict(with_hint)


def _follow(mon: JobMonitor, every: int = 10) -> tuple[int, list[tuple[int, float | None]]]:
    """Feed Gao's overoptimization curve (peak at step 200) every ``every`` steps, plus the hinted steps that come
    before the next regular one; return the stop step and (hinted step, doubt when it was asked) pairs."""
    import math

    step, hints = every, []
    while True:
        x = (step / 200) ** 2
        d = mon.observe(step, 0.2 + 0.5 * x * (1 - math.log(x)))
        if d.action is Action.STOP:
            return step, hints
        regular = (step // every + 1) * every
        if d.next_eval_step is not None and d.next_eval_step < regular:
            hints.append((d.next_eval_step, mon.detector.doubt()))
            step = d.next_eval_step
        else:
            step = regular


def test_shape_detector_hints_while_its_posterior_of_a_passed_peak_rises() -> None:
    fixed_stop, none = _follow(JobMonitor("a", "rlhf", make_detector("shape", se=0.03)))
    stop, hints = _follow(
        JobMonitor("b", "rlhf", make_detector("shape", se=0.03), cadence=CadencePolicy(0.5, p_hint=0.95))
    )
    assert none == [] and hints  # the rising posterior asked for sooner evals
    assert all(doubt is not None and doubt < 0.95 for _, doubt in hints)
    assert all(h % 10 == 5 for h, _ in hints)  # half of the 10-step interval after a regular eval
    assert 200 < stop < fixed_stop  # past the peak, and sooner than at the regular cadence
