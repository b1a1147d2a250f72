"""The default's per-example and mean-and-spread tests with their false-stop rate bounded per run by planned progress.

With the reports' ``planned_steps`` known, ``trend`` (``means_test="auto"``, the default) runs each mode's own
statistic over the window of the last fifth of planned progress and at the look's share of the run's level (the
same spending as the means-only test): the paired slope t over the per-example scores, the known-variance z over the
means with their reported spread. Without a plan (or with ``means_test="window"``) both are the per-look tests of
before, unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from platform_sim.core import default_spec, detector_from_spec
from platform_sim.core.boundary import Action, EvidenceMode
from platform_sim.core.detectors.progress import PlannedEvidence
from platform_sim.core.monitor import JobMonitor

PER_LOOK = {**default_spec(), "params": {**default_spec()["params"], "means_test": "window"}}


def _examples(rng, means, n=32, rho=0.0):
    """Per-example scores whose mean is ``means`` (the simulator's rule: fixed difficulty, fresh noise per eval).
    The mean's noise comes from the caller; the deviations here are centred per eval."""
    sd = 0.3
    difficulty = rng.normal(0, sd * np.sqrt(rho / (1 - rho)), n) if rho > 0 else np.zeros(n)
    noise = rng.normal(0, sd, (len(means), n))
    block = (difficulty - difficulty.mean()) + (noise - noise.mean(axis=1, keepdims=True))
    return np.asarray(means)[:, None] + block


def _run(spec, steps, means, planned, examples, spread=False):
    """Every decision of a monitor fed the run per-example (or, with ``spread``, the scores' std and count)."""
    mon = JobMonitor("j", "rlhf", detector_from_spec(spec))
    decisions = []
    for step, m, row in zip(steps, means, examples):
        if spread:
            d = mon.observe(int(step), float(m), None, float(np.std(row, ddof=1)), len(row), planned)
        else:
            d = mon.observe(int(step), float(m), list(row), planned_steps=planned)
        decisions.append(d)
        if d.action is Action.STOP:
            return int(step), decisions
    return None, decisions


def _healthy(rng, evals, noise=0.05, total=300):
    steps = np.linspace(total / evals, total, evals).round().astype(int)
    means = 0.2 + 0.4 * (1 - np.exp(-steps / (total / 5))) + rng.normal(0, noise, evals)
    return steps, means, _examples(rng, means)


def _hacking(rng, evals, noise=0.02, total=300, peak=150):
    steps = np.linspace(total / evals, total, evals).round().astype(int)
    means = np.where(steps < peak, 0.2 + 0.4 * steps / peak, 0.6 - 0.5 * (steps - peak) / peak)
    means = means + rng.normal(0, noise, evals)
    return steps, means, _examples(rng, means)


@pytest.mark.parametrize("spread", [False, True], ids=["per-example", "mean-and-spread"])
def test_dense_healthy_runs_are_rarely_stopped_with_planned_steps_and_often_without(spread):
    # One eval per step for 300 steps, examples drawn afresh at every eval (the spread is the mean's whole noise, so
    # the known-variance test is exact, as the paired one is): the per-look tests stop most of these runs.
    rng = np.random.default_rng(17)
    dense = [_healthy(rng, 300) for _ in range(16)]
    with_plan = [_run(default_spec(), s, m, 300, e, spread)[0] for s, m, e in dense]
    without = [_run(default_spec(), s, m, None, e, spread)[0] for s, m, e in dense]
    assert sum(stop is not None for stop in with_plan) <= 1
    assert sum(stop is not None for stop in without) >= 8
    # Without a plan the decisions are the per-look test's, as with means_test="window" and a plan.
    assert without == [_run(PER_LOOK, s, m, 300, e, spread)[0] for s, m, e in dense]


@pytest.mark.parametrize("evals", [20, 300])
@pytest.mark.parametrize("spread", [False, True], ids=["per-example", "mean-and-spread"])
def test_a_fall_after_the_peak_is_stopped_at_any_density_and_the_reason_names_the_mode_and_test(evals, spread):
    rng = np.random.default_rng(3)
    steps, means, examples = _hacking(rng, evals)
    stop, decisions = _run(default_spec(), steps, means, 300, examples, spread)
    assert stop is not None and 150 < stop < 300
    reason = decisions[-1].reason
    mode = EvidenceMode.MEAN_AND_SPREAD if spread else EvidenceMode.PER_EXAMPLE
    assert EvidenceMode.of_reason(reason) is mode
    # The richer modes' own run level and materiality (chosen on tuning data, benchmarks/dense_modes.py).
    assert "of planned progress (300 planned steps" in reason and "run_alpha=0.1, rel_drop=0," in reason, reason
    assert ("known-variance z test" if spread else "paired t test") in reason, reason


def test_the_paired_p_value_is_scipys_one_sided_t_test_of_the_examples_slopes_over_the_progress_window():
    rng = np.random.default_rng(8)
    steps = np.arange(2, 101, 2)
    means = 0.5 - 0.001 * steps + rng.normal(0, 0.01, steps.size)
    rows = _examples(rng, means, n=12)
    test = PlannedEvidence(run_alpha=0.05, frac=0.2, min_evals=6, rel_drop=0.0, planned_steps=100)
    for s, m, row in zip(steps, means, rows):
        test.add_evidence(int(s), float(m), 100, [float(v) for v in row], None)
    test.paired()
    inside = steps > 100 - 20  # the last fifth of the planned steps
    slopes = [np.polyfit(steps[inside], rows[inside, j], 1)[0] for j in range(12)]
    assert test.steps == list(steps[inside])
    assert test.last_p == pytest.approx(stats.ttest_1samp(slopes, 0.0, alternative="less").pvalue, rel=1e-9)


def test_the_spread_test_uses_each_means_known_variance_and_the_trailing_evals_that_carry_one():
    # Two evals in the window carry no spread: the test uses the evals after them; a spread of 0 on a falling
    # window is certain evidence, a large spread none.
    test = PlannedEvidence(run_alpha=0.05, frac=0.5, min_evals=3, rel_drop=0.0, planned_steps=20)
    for step in range(1, 11):
        test.add_evidence(step, 1.0 - 0.01 * step, 20, None, None if step in (5, 6) else 0.0)
    assert test.steps == list(range(1, 11)) and test.spread_z() == (True, pytest.approx(-0.01))
    assert test.last_p == 0.0
    noisy = PlannedEvidence(run_alpha=0.05, frac=0.5, min_evals=3, rel_drop=0.0, planned_steps=20)
    for step in range(1, 11):
        noisy.add_evidence(step, 1.0 - 0.01 * step, 20, None, 1.0)
    assert noisy.spread_z()[0] is False and 0.3 < noisy.last_p < 0.5  # type: ignore[operator]
    only_two = PlannedEvidence(run_alpha=0.05, frac=0.5, min_evals=3, rel_drop=0.0, planned_steps=20)
    for step in range(1, 11):
        only_two.add_evidence(step, 1.0 - 0.01 * step, 20, None, None if step < 9 else 0.0)
    assert only_two.spread_z() == (False, None)  # two evals with a spread: no slope to test


@pytest.mark.parametrize("cut", [4, 30, 61])
@pytest.mark.parametrize("spread", [False, True], ids=["per-example", "mean-and-spread"])
def test_a_monitor_rebuilt_from_its_state_continues_with_the_same_decisions(cut, spread):
    rng = np.random.default_rng(2)
    steps, means, examples = _hacking(rng, 120, noise=0.03, total=120, peak=70)

    def feed(mon, i):
        row = examples[i]
        if spread:
            return mon.observe(int(steps[i]), float(means[i]), None, float(np.std(row, ddof=1)), len(row), 120)
        return mon.observe(int(steps[i]), float(means[i]), list(row), planned_steps=120)

    full = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    want = [feed(full, i).to_dict() for i in range(120)]
    part = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    got = [feed(part, i).to_dict() for i in range(cut)]
    state = json.loads(json.dumps(part.state_dict()))
    assert "evidence" in state["detector_state"]["planned"]  # the window's evidence travels with the state
    part = JobMonitor.from_state_dict(state)
    got += [feed(part, i).to_dict() for i in range(cut, 120)]
    assert got == want
    assert any(d["action"] == "stop" for d in want)


def test_a_state_written_before_the_richer_modes_held_evidence_loads_and_decides_on_the_means():
    mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    for step in range(1, 9):
        mon.observe(step, 0.1 * step, planned_steps=40)
    state = mon.state_dict()
    assert "evidence" not in json.dumps(state)  # means only: the planned state is as 47ctl wrote it
    again = JobMonitor.from_state_dict(json.loads(json.dumps(state)))
    assert again.observe(9, 0.9, planned_steps=40).to_dict() == mon.observe(9, 0.9, planned_steps=40).to_dict()


def test_the_richer_modes_parameters_are_checked_and_listed_only_off_their_defaults():
    assert "evidence_run_alpha" not in detector_from_spec(default_spec()).params()
    spec = {"name": "trend", "params": {"evidence_run_alpha": 0.05, "evidence_rel_drop": 0.2}}
    params = detector_from_spec(spec).params()
    assert params["evidence_run_alpha"] == 0.05 and params["evidence_rel_drop"] == 0.2
    assert detector_from_spec({"name": "trend", "params": params}).params() == params
    for bad, match in [
        ({"evidence_run_alpha": 0.0}, "evidence_run_alpha"),
        ({"evidence_run_alpha": 1.5}, "evidence_run_alpha"),
        ({"evidence_rel_drop": -0.1}, "evidence_rel_drop"),
        ({"evidence_rel_drop": 1e7}, "evidence_rel_drop"),
    ]:
        with pytest.raises(ValueError, match=match):
            detector_from_spec({"name": "trend", "params": bad})


def test_the_richer_modes_spend_their_own_run_level_by_planned_progress():
    # At every look the per-example test's level is evidence_run_alpha * (F(p) - F(p')), the means' run_alpha share
    # scaled: over a run that ends at its plan the looks spend exactly evidence_run_alpha.
    test = PlannedEvidence(0.05, 0.2, 6, 0.2, 300, evidence_alpha=0.1, evidence_drop=0.0)
    levels = []
    for step in range(3, 301, 3):
        test.add_evidence(step, 0.5, 300, [0.4, 0.6], None)
        levels.append(test.evidence_level())
        assert test.evidence_level() == pytest.approx(2 * test.look_alpha())
    assert sum(levels) == pytest.approx(0.1)
