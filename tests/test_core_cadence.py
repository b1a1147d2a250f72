"""The cadence hint: the pure policy, and the monitor's decisions that carry it (and still load old states)."""

from __future__ import annotations

import json
import random

import pytest

from platform_sim.core import (
    Action,
    CadencePolicy,
    Decision,
    EvalBudget,
    JobMonitor,
    cadence_from_spec,
    make_detector,
)
from platform_sim.core.boundary import BoundaryError
from platform_sim.core.detectors import DETECTORS


def test_policy_hints_only_while_evidence_builds_up() -> None:
    pol = CadencePolicy(fraction=0.25)
    steps = [20, 40, 60]
    assert pol.next_eval_step(steps, evidence=0, needed=2) is None  # no evidence: regular interval
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
    from platform_sim.service.wire import DecisionOut

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
    assert 200 < stop < fixed_stop  # past the peak, and sooner than at the regular interval


def test_p_hint_at_best_sets_the_bar_after_a_new_best() -> None:
    pol = CadencePolicy(0.25, p_hint=0.8, p_hint_at_best=0.5)
    steps = [20, 40, 60]
    rising, dropped = [0.5, 0.6, 0.7], [0.5, 0.7, 0.6]
    # A new best with a doubt of 0.6: below p_hint, not below p_hint_at_best -> the regular interval.
    assert pol.next_eval_step(steps, 0, 1, rising, p_value=0.6) is None
    assert pol.next_eval_step(steps, 0, 1, rising, p_value=0.4) == 65  # strong enough at the best too
    assert pol.next_eval_step(steps, 0, 1, dropped, p_value=0.6) == 65  # below the best: p_hint applies
    assert pol.next_eval_step(steps, 0, 1, [0.5, 0.7, 0.7], p_value=0.6) is None  # a tie is no drop
    # Unset, every eval has the one bar (and scores of another length are not read).
    assert CadencePolicy(0.25, p_hint=0.8).next_eval_step(steps, 0, 1, rising, p_value=0.6) == 65


def test_confirm_step_asks_for_a_second_look_only_at_a_weak_stop() -> None:
    pol = CadencePolicy(0.25, confirm=0.1)
    steps = [20, 40, 60]
    assert pol.confirm_step(steps, 0.2) == 65  # doubt above confirm: look again a quarter interval later
    assert pol.confirm_step(steps, 0.1) is None  # at or below confirm: stop now
    assert pol.confirm_step(steps, None) is None  # a detector without a doubt: stop now
    assert CadencePolicy(0.25).confirm_step(steps, 0.9) is None  # confirm unset
    assert pol.confirm_step([1, 2, 3], 0.9) is None  # a 1-step cadence: no sooner look to ask for


@pytest.mark.parametrize("name", ["p_hint_at_best", "confirm"])
@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), True, "0.3"])
def test_bad_p_hint_at_best_and_confirm_are_rejected(name: str, bad: object) -> None:
    with pytest.raises(ValueError, match=name):
        CadencePolicy(**{name: bad})  # type: ignore[arg-type]


def test_new_cadence_params_are_in_the_spec_only_when_set() -> None:
    pol = CadencePolicy(0.25, p_hint=0.8, p_hint_at_best=0.7, confirm=0.3)
    assert pol.spec() == {
        "name": "adaptive",
        "params": {"fraction": 0.25, "p_hint": 0.8, "p_hint_at_best": 0.7, "confirm": 0.3},
    }
    assert cadence_from_spec(pol.spec()) == pol
    assert "confirm" not in CadencePolicy(0.25).spec()["params"]


def _gao(step: int) -> float:
    import math

    x = (step / 200) ** 2
    return round(0.2 + 0.5 * x * (1 - math.log(x)), 4)


def test_monitor_confirms_a_weak_stop_with_a_sooner_eval_and_takes_it_there() -> None:
    # Gao's curve past its peak at 200: shape (se given) stops at 260 at the regular interval of 10 steps.
    fixed = JobMonitor("f", "rlhf", make_detector("shape", se=0.03))
    stop = next(s for s in range(10, 400, 10) if fixed.observe(s, _gao(s)).action is Action.STOP)
    assert stop == 260 and 0.0 < fixed.detector.doubt() < 0.01  # type: ignore[operator]
    # confirm=0: every stop with a doubt above 0 is first confirmed, half an interval later.
    mon = JobMonitor("c", "rlhf", make_detector("shape", se=0.03), cadence=CadencePolicy(0.5, p_hint=0.0, confirm=0.0))
    for s in range(10, stop, 10):
        assert mon.observe(s, _gao(s)).action is Action.CONTINUE
    d = mon.observe(stop, _gao(stop))
    assert d.action is Action.CONTINUE and d.next_eval_step == stop + 5 and "confirming a stop" in d.reason
    assert not mon.stopped and mon.observe(stop, _gao(stop)) == d  # a re-send gets the same answer
    # The second look comes from a monitor rebuilt from its state (a restarted service): it knows it is confirming.
    back = JobMonitor.from_state_dict(json.loads(json.dumps(mon.state_dict())))
    d2 = back.observe(stop + 5, _gao(stop + 5))
    assert d2.action is Action.STOP and back.stopped_at == stop + 5 and d2.next_eval_step is None


def test_a_weak_stop_that_is_not_confirmed_goes_on_and_a_strong_one_is_taken_at_once() -> None:
    pol = CadencePolicy(0.25, p_hint=0.0, confirm=0.0)
    mon = JobMonitor("j", "rlhf", make_detector("shape", se=0.03), cadence=pol)
    for s in range(10, 260, 10):
        mon.observe(s, _gao(s))
    assert "confirming a stop" in mon.observe(260, _gao(260)).reason
    d = mon.observe(262, 0.75)  # the second look is a new best: no stop
    assert d.action is Action.CONTINUE and not mon.stopped and not d.reason.startswith("confirming")
    # The next weak stop is confirmed again: one second look per stop, not per job.
    d = mon.observe(270, _gao(270))
    assert d.action is Action.CONTINUE and "confirming a stop" in d.reason
    # A stop whose doubt is at or under confirm is taken at once: here at 260, as at the fixed cadence.
    strong = JobMonitor("s", "rlhf", make_detector("shape", se=0.03), cadence=CadencePolicy(0.25, confirm=0.5))
    assert next(s for s in range(10, 400, 10) if strong.observe(s, _gao(s)).action is Action.STOP) == 260


def test_eval_budget_counts_extra_evals_and_time_spent_evaluating() -> None:
    assert EvalBudget().unlimited and EvalBudget().allows(10**6, eval_time=99.0, wall_time=1.0)
    count = EvalBudget(max_extra_evals=2)
    assert not count.unlimited
    assert count.allows(1) and not count.allows(2) and not count.allows(3)
    assert not EvalBudget(max_extra_evals=0).allows(0)  # 0: no hint is ever followed
    share = EvalBudget(max_eval_share=0.1)
    assert share.allows(50, eval_time=1.0, wall_time=10.0)  # at the share: still allowed (spent, not to spend)
    assert not share.allows(0, eval_time=1.01, wall_time=10.0)
    assert not share.allows(0, eval_time=0.5, wall_time=0.0)  # nothing trained yet, time already spent
    both = EvalBudget(max_extra_evals=1, max_eval_share=0.5)
    assert both.allows(0, 1.0, 10.0) and not both.allows(1, 1.0, 10.0) and not both.allows(0, 6.0, 10.0)
    assert both.to_dict() == {"max_extra_evals": 1, "max_eval_share": 0.5}
    assert EvalBudget().to_dict() == {"max_extra_evals": None, "max_eval_share": None}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_extra_evals": -1}, "max_extra_evals"),
        ({"max_extra_evals": 1.5}, "max_extra_evals"),
        ({"max_extra_evals": True}, "max_extra_evals"),
        ({"max_eval_share": 0.0}, "max_eval_share"),
        ({"max_eval_share": 1.0}, "max_eval_share"),
        ({"max_eval_share": float("nan")}, "max_eval_share"),
        ({"max_eval_share": "0.1"}, "max_eval_share"),
    ],
)
def test_a_bad_eval_budget_names_its_field(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        EvalBudget(**kwargs)  # type: ignore[arg-type]


# -- extra evals: a look, not a point of the history (platform_sim.core.monitor) -------------------------------------


def test_extra_evals_are_the_hinted_ones_before_the_next_regular_eval() -> None:
    from platform_sim.core.monitor import extra_evals

    # regular every 10; a hint after 30 (at 32) taken; after 32 another hint (34) taken; 40 is the regular one again
    assert extra_evals([10, 20, 30, 32, 34, 40], [None, None, 32, 34, None, None]) == [
        False,
        False,
        False,
        True,
        True,
        False,
    ]
    # a hint that the client could not follow: its next eval is the regular one
    assert extra_evals([10, 20, 30, 40], [None, 25, None, None]) == [False] * 4
    # no hint, no extra eval, whatever the spacing (a job evaluated at irregular steps)
    assert extra_evals([10, 13, 30], [None, None, None]) == [False] * 3
    assert extra_evals([], []) == []


def test_an_extra_eval_that_does_not_stop_is_forgotten_by_the_detector() -> None:
    # k-decline k=2: a first decline at 30 asks for 32; 32 recovers; 40 declines again below 30's score.
    mon = JobMonitor("j", "rlhf", make_detector("k-decline", k=2), cadence=CadencePolicy(0.25))
    for s, v in ((10, 0.5), (20, 0.6)):
        mon.observe(s, v)
    assert mon.observe(30, 0.55).next_eval_step == 32
    before = json.dumps(mon.detector.state_dict(), sort_keys=True)
    d = mon.observe(32, 0.58)  # judged: a rise from 0.55, no second decline; no hint
    assert d.action is Action.CONTINUE and d.declines == 0 and d.next_eval_step is None
    assert json.dumps(mon.detector.state_dict(), sort_keys=True) == before  # and then forgotten
    # 40 is judged against 30, as at the fixed cadence: the second consecutive regular decline stops the job.
    fixed = JobMonitor("f", "rlhf", make_detector("k-decline", k=2))
    for s, v in ((10, 0.5), (20, 0.6), (30, 0.55)):
        fixed.observe(s, v)
    assert fixed.observe(40, 0.54).action is Action.STOP
    assert mon.observe(40, 0.54).action is Action.STOP and mon.best_step == 20
    # The extra eval still counts where a checkpoint exists: it is in the steps, and could have been the best.
    assert mon.steps == [10, 20, 30, 32, 40]


def test_an_extra_eval_that_stops_the_job_stops_it() -> None:
    mon = JobMonitor("j", "rlhf", make_detector("k-decline", k=2), cadence=CadencePolicy(0.25))
    for s, v in ((10, 0.5), (20, 0.6), (30, 0.55)):
        mon.observe(s, v)
    d = mon.observe(32, 0.50)
    assert d.action is Action.STOP and mon.stopped_at == 32


def test_a_monitor_rebuilt_from_its_state_knows_which_eval_is_extra() -> None:
    def run(split: int | None) -> list[Decision]:
        mon = JobMonitor("j", "rlhf", make_detector("k-decline", k=3), cadence=CadencePolicy(0.25))
        out = []
        # declines at 30 and 40 (hints), a rise at each hinted eval (32, 42; forgotten), a third decline at 50
        for i, (s, v) in enumerate(((10, 0.5), (20, 0.6), (30, 0.55), (32, 0.56), (40, 0.54), (42, 0.545), (50, 0.53))):
            if i == split:
                mon = JobMonitor.from_state_dict(json.loads(json.dumps(mon.state_dict())))
            out.append(mon.observe(s, v))
        return out

    whole = run(None)
    assert [d.next_eval_step for d in whole] == [None, None, 32, None, 42, None, None]
    assert whole[-1].action is Action.STOP  # counted on the regular evals: 0.6 > 0.55 > 0.54 > 0.53
    # rebuilt before any eval: had it taken 32 or 42 for a regular eval, the rise there would reset the count
    assert [run(i) for i in range(1, 7)] == [whole] * 6


def test_a_model_of_the_whole_curve_keeps_its_extra_evals() -> None:
    assert make_detector("shape").keeps_extra_evals and not make_detector("trend").keeps_extra_evals
    mon = JobMonitor("j", "rlhf", make_detector("shape", se=0.03), cadence=CadencePolicy(0.5, p_hint=0.99))
    for s in range(10, 200, 10):
        mon.observe(s, _gao(s))
    hinted = mon.last_decision.next_eval_step  # type: ignore[union-attr]
    assert hinted is not None
    before = mon.detector.state_dict()
    mon.observe(hinted, _gao(hinted))
    assert mon.detector.state_dict() != before  # the extra eval is one more point of its curve


def test_one_look_per_regular_interval() -> None:
    # k=3: a first decline at 30 asks for 32; the look at 32 is a second decline, not a stop: no second look (it
    # would ask the same question a step later), the job waits for 40, judged on the regular evals.
    mon = JobMonitor("j", "rlhf", make_detector("k-decline", k=3), cadence=CadencePolicy(0.25))
    for s, v in ((10, 0.5), (20, 0.6)):
        mon.observe(s, v)
    assert mon.observe(30, 0.55).next_eval_step == 32
    d = mon.observe(32, 0.54)
    assert d.action is Action.CONTINUE and d.declines == 2 and d.next_eval_step is None
    assert mon.detector.declines == 1  # the look is forgotten
    assert mon.observe(40, 0.53).next_eval_step == 42  # a second regular decline: a look again


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_every_detector_forgets_an_eval_completely_when_its_state_is_restored(name: str) -> None:
    # The monitor forgets an extra eval by restoring the detector's state_dict from before it: that must leave no
    # trace, so the detector then decides exactly as one that never saw the eval.
    rng = random.Random(7)
    curve = [0.2 + 0.6 * min(i, 12) / 12 - 0.05 * max(0, i - 12) for i in range(24)]
    evals = [(10 * (i + 1), [c + rng.gauss(0, 0.05) for _ in range(16)]) for i, c in enumerate(curve)]
    seen, looked = make_detector(name), make_detector(name)
    for i, (step, per) in enumerate(evals):
        if i % 3 == 2:  # a look between two regular evals, forgotten
            snapshot = looked.state_dict()
            looked.update(step - 5, sum(per) / len(per) - 0.3, [p - 0.3 for p in per])
            looked.load_state_dict(snapshot)
        a = seen.update(step, sum(per) / len(per), per)
        b = looked.update(step, sum(per) / len(per), per)
        assert a == b and seen.declines == looked.declines, (name, step)
        assert json.dumps(seen.state_dict(), sort_keys=True) == json.dumps(looked.state_dict(), sort_keys=True)
