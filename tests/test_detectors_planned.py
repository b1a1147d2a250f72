"""The default's means-only test with its false-stop rate bounded per run by the run's planned steps.

A report may carry ``planned_steps`` (the trainer's ``max_steps``). With it, ``trend`` (``means_test="auto"``, the
default) tests the means over the last fifth of *planned progress* (at least ``window`` evals) and spends the run's
level ``run_alpha`` by progress, ``run_alpha * (p**2 - p'**2)`` between looks; without it, the per-look window test
decides, and the reason says so.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform_sim.core import InvalidReportError, Report, default_spec, detector_from_spec
from platform_sim.core.boundary import Action, EvidenceMode
from platform_sim.core.detectors.progress import PlannedSlope, spent
from platform_sim.core.monitor import JobMonitor

PER_LOOK = {**default_spec(), "params": {**default_spec()["params"], "means_test": "window"}}


def _run(spec, steps, means, planned, examples=None):
    """Every decision of a monitor fed the run; the stop step (None: never) and the decisions."""
    mon = JobMonitor("j", "rlhf", detector_from_spec(spec))
    decisions = []
    for i, (step, m) in enumerate(zip(steps, means)):
        per = None if examples is None else list(examples[i])
        d = mon.observe(int(step), float(m), per, planned_steps=planned)
        decisions.append(d)
        if d.action is Action.STOP:
            return int(step), decisions
    return None, decisions


def _healthy(rng, evals, noise, total=300):
    """A saturating rise from 0.2 to 0.6 over ``total`` steps, seen every total/evals steps with Gaussian noise."""
    steps = np.linspace(total / evals, total, evals).round().astype(int)
    return steps, 0.2 + 0.4 * (1 - np.exp(-steps / (total / 5))) + rng.normal(0, noise, evals)


def _hacking(steps, peak, rng, noise=0.02):
    return np.where(steps < peak, 0.2 + 0.4 * steps / peak, 0.6 - 0.5 * (steps - peak) / peak) + rng.normal(
        0, noise, len(steps)
    )


# -- the boundary field ------------------------------------------------------------------------------------------
def test_a_report_carries_planned_steps_and_a_step_beyond_them_is_valid():
    r = Report("j", "rlhf", 500, 0.5, planned_steps=300)
    assert r.planned_steps == 300 and r.to_dict()["planned_steps"] == 300
    assert Report.from_dict(r.to_dict()) == r
    assert Report.from_dict({"job_id": "j", "job_type": "rlhf", "step": 1, "eval_score": 0.5, "planned_steps": 300.0})
    assert "planned_steps" not in Report("j", "rlhf", 1, 0.5).to_dict()


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "300", [300], float("nan")])
def test_bad_planned_steps_are_refused_with_one_clear_line_and_change_nothing(bad):
    with pytest.raises(InvalidReportError, match=r"^planned_steps must be an integer >= 1"):
        Report("j", "rlhf", 1, 0.5, planned_steps=bad)
    mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    mon.observe(1, 0.5, planned_steps=10)
    before = json.dumps(mon.state_dict())
    with pytest.raises(InvalidReportError, match="planned_steps"):
        mon.observe(2, 0.4, planned_steps=bad)
    assert json.dumps(mon.state_dict()) == before


# -- the spending ------------------------------------------------------------------------------------------------
def test_the_spending_function_is_p_squared_to_the_plan_then_bounded_by_twice_the_level():
    assert [spent(p) for p in (0.0, 0.5, 1.0)] == [0.0, 0.25, 1.0]
    assert spent(1.0 + 1e-9) == pytest.approx(1.0)  # continuous at the planned end
    assert spent(2.0) == 1.5 and spent(1e9) < 2.0
    assert all(spent(a) < spent(b) for a, b in [(0.1, 0.2), (0.9, 1.0), (1.0, 1.5), (3.0, 4.0)])


@pytest.mark.parametrize("interval", [1, 3, 15])
def test_the_looks_of_a_run_spend_exactly_run_alpha_by_its_planned_end_at_any_density(interval):
    p = PlannedSlope(run_alpha=0.05, frac=0.2, min_evals=6, rel_drop=0.2, planned_steps=3000)
    total, prev = 0.0, 0
    for step in range(interval, 3001, interval):
        p.add_planned(step, 0.5, 3000)
        assert p.look_alpha() == pytest.approx(0.05 * ((step / 3000) ** 2 - (prev / 3000) ** 2))
        total, prev = total + p.look_alpha(), step
    assert total == pytest.approx(0.05 * (3000 // interval * interval / 3000) ** 2)
    for step in range(3000 + interval, 12001, interval):  # extended to four times its plan
        p.add_planned(step, 0.5, None)  # None: the last plan stays
        total += p.look_alpha()
    assert 0.05 < total <= 0.05 * spent(4.0) + 1e-12 < 0.1


def test_a_plan_that_arrives_mid_run_spends_from_there_not_the_run_so_far():
    mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    for step in range(1, 51):
        mon.observe(step, 0.5)
    mon.observe(51, 0.5, planned_steps=100)
    planned = mon.detector._per_run.planned
    assert planned is not None and planned.look_alpha() == pytest.approx(0.0)
    mon.observe(52, 0.5)
    assert planned.look_alpha() == pytest.approx(0.05 * (0.52**2 - 0.51**2))


# -- the window --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interval", [1, 2, 10])
def test_the_window_is_the_last_fifth_of_planned_progress_and_at_least_window_evals(interval):
    p = PlannedSlope(run_alpha=0.05, frac=0.2, min_evals=6, rel_drop=0.2, planned_steps=300)
    for step in range(interval, 301, interval):
        p.add_planned(step, 0.5, 300)
        inside = [s for s in range(interval, step + 1, interval) if s > step - 60]
        assert p.steps == (inside if len(inside) >= 6 else list(range(interval, step + 1, interval))[-6:])


# -- decisions ---------------------------------------------------------------------------------------------------
def test_dense_noisy_healthy_runs_are_rarely_stopped_with_planned_steps_and_often_without():
    # Noise a quarter of the run's gain (0.1 against 0.4), one eval per step: the per-look test stops most such runs.
    rng = np.random.default_rng(7)
    dense = [_healthy(rng, 300, 0.1) for _ in range(20)]
    with_plan = sum(_run(default_spec(), s, m, 300)[0] is not None for s, m in dense)
    without = [_run(default_spec(), s, m, None) for s, m in dense]
    assert with_plan <= 1
    assert sum(stop is not None for stop, _ in without) >= 10
    # Without a plan the default is the per-look window test, and its reason says the planned steps were unknown.
    reasons = [ds[-1].reason for stop, ds in without if stop is not None]
    assert all("per look: planned steps unknown" in r for r in reasons)
    per_look = [_run(PER_LOOK, s, m, 300)[0] for s, m in dense]
    assert per_look == [stop for stop, _ in without]


@pytest.mark.parametrize("evals", [20, 300])
def test_a_run_that_falls_after_its_peak_is_stopped_at_any_density_and_says_how(evals):
    rng = np.random.default_rng(3)
    steps = np.linspace(300 / evals, 300, evals).round().astype(int)
    stop, decisions = _run(default_spec(), steps, _hacking(steps, 150, rng), 300)
    assert stop is not None and 150 < stop < 300
    reason = decisions[-1].reason
    assert EvidenceMode.of_reason(reason) is EvidenceMode.MEANS_ONLY
    assert "of planned progress (300 planned steps" in reason and "run_alpha=0.05" in reason, reason


def test_a_run_extended_past_its_plan_is_still_watched():
    # Planned 100 steps, trained 400: it peaks at step 200 (progress 2) and falls; the level beyond the plan is
    # 2 - 1/p, so the late looks still have some.
    rng = np.random.default_rng(5)
    steps = np.arange(4, 401, 4)
    stop, decisions = _run(default_spec(), steps, _hacking(steps, 200, rng), 100)
    assert stop is not None and 200 < stop <= 400
    assert "now at" in decisions[-1].reason


def test_per_example_decisions_use_the_plan_per_run_and_without_it_the_per_look_test():
    # (issue 47, 47modes: the per-example test is bounded per run too when a plan is known; its own tests are in
    # tests/test_detectors_planned_modes.py.)
    rng = np.random.default_rng(11)
    steps = np.arange(10, 301, 10)
    means = _hacking(steps, 150, rng)
    examples = [m + rng.normal(0, 0.05, 16) for m in means]
    means = [float(np.mean(e)) for e in examples]
    a = _run(default_spec(), steps, means, 300, examples)
    b = _run(default_spec(), steps, means, None, examples)
    assert a[0] is not None and a[0] == b[0]
    assert "paired t test" in a[1][-1].reason and "of planned progress" in a[1][-1].reason
    assert "last 6 evals" in b[1][-1].reason and "t test p=" in b[1][-1].reason
    assert EvidenceMode.of_reason(a[1][-1].reason) is EvidenceMode.PER_EXAMPLE


def test_the_default_spec_is_unchanged_and_the_state_holds_the_plan_only_once_given():
    assert "means_test" not in default_spec()["params"] and "run_alpha" not in default_spec()["params"]
    assert detector_from_spec(PER_LOOK).params()["means_test"] == "window"
    assert detector_from_spec({"name": "trend", "params": {"run_alpha": 0.1}}).params()["run_alpha"] == 0.1
    with pytest.raises(ValueError, match="means_test must be one of auto, window, progress"):
        detector_from_spec({"name": "trend", "params": {"means_test": "planned"}})
    plain = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    plain.observe(1, 0.5)
    assert "planned" not in plain.detector.state_dict()
    planned = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    planned.observe(1, 0.5, planned_steps=30)
    assert planned.detector.state_dict()["planned"]["planned"][0] == 30


@pytest.mark.parametrize("cut", [3, 10, 40, 61])
def test_a_monitor_rebuilt_from_its_state_continues_with_the_same_decisions(cut):
    rng = np.random.default_rng(2)
    steps = np.arange(1, 121)
    means = _hacking(steps, 70, rng, noise=0.05)
    full = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    want = [full.observe(int(s), float(m), planned_steps=120).to_dict() for s, m in zip(steps, means)]
    part = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    got = [part.observe(int(s), float(m), planned_steps=120).to_dict() for s, m in zip(steps[:cut], means[:cut])]
    part = JobMonitor.from_state_dict(json.loads(json.dumps(part.state_dict())))
    got += [part.observe(int(s), float(m), planned_steps=120).to_dict() for s, m in zip(steps[cut:], means[cut:])]
    assert got == want
    assert any(d["action"] == "stop" for d in want)


def test_noise_free_means_that_fall_materially_are_stopped_soon_after_the_peak():
    steps = list(range(1, 41))
    means = [min(s, 20) / 20 - max(0, s - 20) / 20 for s in steps]  # up to step 20, then down as fast
    stop, decisions = _run(default_spec(), steps, means, 40)
    assert stop is not None and 20 < stop <= 27, decisions[-1].reason
    assert decisions[-1].best_step == 20


def test_a_run_that_never_rose_needs_no_material_drop_but_a_risen_one_does():
    # Worse from its first evals (a fine-tune that overfits at once): no gain to lose, a significant fall stops it.
    rng = np.random.default_rng(4)
    steps = np.arange(2, 41, 2)
    falling = 0.6 - 0.01 * steps + rng.normal(0, 0.01, len(steps))
    assert _run(default_spec(), steps, falling, 40)[0] is not None
    # Risen by 0.4, then a significant but small slide (5% of the rise): not material, never stopped.
    risen = np.where(steps < 20, 0.2 + 0.4 * steps / 20, 0.6 - 0.02 * (steps - 20) / 20) + rng.normal(0, 0.001, 20)
    assert _run(default_spec(), steps, risen, 40)[0] is None
    assert _run(PER_LOOK, steps, risen, 40)[0] is not None
