"""The dense-and-noisy harness (benchmarks/dense_noisy.py) and its error-control design (benchmarks/error_control.py)."""

from __future__ import annotations

import numpy as np
import pytest
from dense_noisy import Run, cost_of, healthy_cell, replay, shipped, synthetic_healthy, trace_run
from error_control import ProgressTrend

from platform_sim.sim.traces import RealTrace


def _design(run: Run) -> ProgressTrend:
    return ProgressTrend(spend="planned", planned_evals=len(run.steps), rho=2.0, window_basis="planned", rel_drop=0.2)


def test_noise_free_healthy_curves_are_never_stopped() -> None:
    runs = synthetic_healthy("plateau", 120, 0.0, 5, 0)
    for name, make in {**shipped(), "design": _design}.items():
        cell = healthy_cell(make, runs)
        assert cell["stopped"] == 0, name


def test_cost_of_a_stop_is_the_gain_given_up() -> None:
    run = synthetic_healthy("saturating", 20, 0.0, 1, 3)[0]
    assert cost_of(run, len(run.steps) - 1) == pytest.approx(0.0)
    assert cost_of(run, 0) == pytest.approx(float(run.true[-1] - run.true[0]) / run.gain)


def test_the_design_stops_a_clear_decline_after_its_peak() -> None:
    steps = tuple(range(1, 61))
    true = np.concatenate([np.linspace(0.1, 0.8, 30), np.linspace(0.8, 0.2, 30)])
    noise = np.random.default_rng(0).standard_normal(60) * 0.02
    run = Run("decline", steps, true + noise, true, 0.7)
    stop, best = replay(_design(run), run)
    assert stop is not None and stop > 29
    assert cost_of(run, best) < 0.1


def test_the_design_resumes_from_its_state() -> None:
    run = synthetic_healthy("plateau", 50, 0.25, 1, 7)[0]
    evals = [(int(s), float(y)) for s, y in zip(run.steps, run.observed)]
    whole = _design(run)
    for step, y in evals[:25]:
        whole.update(step, y)
    resumed = _design(run)
    resumed.load_state_dict(whole.state_dict())
    assert [whole.update(s, y) for s, y in evals[25:]] == [resumed.update(s, y) for s, y in evals[25:]]
    assert whole.state_dict() == resumed.state_dict()


def test_a_recorded_trace_is_read_every_nth_step() -> None:
    scores = tuple(float(v) for v in np.linspace(0.0, 1.0, 20))
    t = RealTrace("t", "t.jsonl", {"job_type": "rlhf"}, tuple(range(1, 21)), scores, (None,) * 20, (None,) * 20)
    run = trace_run(t, 5)
    assert run.steps == (5, 10, 15, 20)
    assert run.gain > 0


@pytest.mark.parametrize("evidence", ["per-example", "mean-and-spread", False])
def test_replay_hands_the_detector_the_evidence_asked_for_and_the_runs_plan(evidence) -> None:
    from platform_sim.core import EvidenceMode, default_spec, detector_from_spec

    rng = np.random.default_rng(1)
    steps = tuple(range(1, 13))
    examples = tuple(tuple(float(v) for v in 0.5 + rng.normal(0, 0.1, 8)) for _ in steps)
    observed = np.asarray([np.mean(e) for e in examples])
    run = Run("r", steps, observed, observed, 0.1, examples, planned_steps=40)
    det = detector_from_spec(default_spec())
    replay(det, run, evidence)
    want = {"per-example": EvidenceMode.PER_EXAMPLE, "mean-and-spread": EvidenceMode.MEAN_AND_SPREAD}
    assert det.mode() is want.get(evidence, EvidenceMode.MEANS_ONLY)
    assert det.state_dict()["planned"]["planned"][0] == 40
