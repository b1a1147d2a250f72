"""``trend``'s means-only test with its false-stop rate bounded per run (``means_test="progress"``).

The window is the last ``frac`` of training progress, the noise is pooled from the run's second differences, and
the run's level is spent over geometric epochs of steps: a healthy run evaluated at every step is no more likely to
be stopped than one evaluated 20 times.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform_sim.core import detector_from_spec
from platform_sim.core.boundary import Action, EvidenceMode
from platform_sim.core.detectors import TrendDetector
from platform_sim.core.detectors.progress import ProgressSlope
from platform_sim.core.monitor import JobMonitor

PROGRESS = {"name": "trend", "params": {"window": 6, "alpha": 0.01, "means_test": "progress"}}
WINDOW = {"name": "trend", "params": {"window": 6, "alpha": 0.01}}


def _stop(spec, steps, means):
    mon = JobMonitor("j", "rlhf", detector_from_spec(spec))
    for step, m in zip(steps, means):
        d = mon.observe(int(step), float(m))
        if d.action is Action.STOP:
            return int(step), d
    return None, None


def _healthy(rng, evals, noise):
    """A saturating rise from 0.2 to 0.6 over 300 steps, seen every 300/evals steps with Gaussian noise."""
    steps = np.linspace(300 / evals, 300, evals).round().astype(int)
    return steps, 0.2 + 0.4 * (1 - np.exp(-steps / 60)) + rng.normal(0, noise, evals)


def test_the_spent_level_of_a_run_never_exceeds_run_alpha_however_dense():
    for interval in (1, 3, 15):
        p = ProgressSlope(run_alpha=0.05, frac=0.2, min_evals=6, rel_drop=0.0)
        spent = 0.0
        for step in range(interval, 30000, interval):
            p.add(step, 0.5)
            if p.count >= 6:
                spent += p.look_alpha()
        assert 0.0 < spent <= 0.05, interval


def test_dense_noisy_healthy_runs_are_not_stopped_more_than_sparse_ones():
    # Noise a quarter of the run's gain (0.1 against 0.4), one eval per step: the per-look window test stops most
    # such runs; the per-run test stops at most 1 of 20, as at 20 evals per run.
    rng = np.random.default_rng(7)
    dense = [_healthy(rng, 300, 0.1) for _ in range(20)]
    sparse = [_healthy(rng, 20, 0.1) for _ in range(20)]
    assert sum(_stop(PROGRESS, s, m)[0] is not None for s, m in dense) <= 1
    assert sum(_stop(PROGRESS, s, m)[0] is not None for s, m in sparse) <= 1
    assert sum(_stop(WINDOW, s, m)[0] is not None for s, m in dense) >= 10


@pytest.mark.parametrize("evals", [20, 300])
def test_a_run_that_falls_after_its_peak_is_stopped_at_any_density(evals):
    rng = np.random.default_rng(3)
    steps = np.linspace(300 / evals, 300, evals).round().astype(int)
    curve = np.where(steps < 150, 0.2 + 0.4 * steps / 150, 0.6 - 0.5 * (steps - 150) / 150)
    stop, decision = _stop(PROGRESS, steps, curve + rng.normal(0, 0.02, evals))
    assert stop is not None and 150 < stop < 300
    assert EvidenceMode.of_reason(decision.reason) is EvidenceMode.MEANS_ONLY


def test_its_parameters_and_state_exist_only_when_it_is_chosen():
    plain = TrendDetector(window=6)
    assert not {"means_test", "run_alpha", "frac", "rel_drop"} & set(plain.params())
    det = detector_from_spec(PROGRESS)
    assert det.params()["means_test"] == "progress" and det.params()["run_alpha"] == 0.05
    assert detector_from_spec(det.spec()).spec() == det.spec()
    det.update(1, 0.5)
    assert "progress" in det.state_dict() and "progress" not in plain.state_dict()
    for bad, name in (
        ({"means_test": "bayes"}, "means_test"),
        ({"frac": 1.0}, "frac"),
        ({"run_alpha": 0}, "run_alpha"),
    ):
        with pytest.raises(ValueError, match=name):
            detector_from_spec({"name": "trend", "params": {"means_test": "progress", **bad}})


def test_resume_from_state_at_every_eval_decides_the_same():
    rng = np.random.default_rng(5)
    steps = np.arange(1, 121)
    means = np.where(steps < 70, 0.3 + 0.004 * steps, 0.58 - 0.006 * (steps - 70)) + rng.normal(0, 0.03, 120)
    whole = JobMonitor("j", "rlhf", detector_from_spec(PROGRESS))
    expected = [whole.observe(int(s), float(m)) for s, m in zip(steps, means)]
    assert any(d.action is Action.STOP for d in expected)
    for cut in (3, 10, 40, 80):
        first = JobMonitor("j", "rlhf", detector_from_spec(PROGRESS))
        got = [first.observe(int(s), float(m)) for s, m in zip(steps[:cut], means[:cut])]
        resumed = JobMonitor.from_state_dict(json.loads(json.dumps(first.state_dict())))
        got += [resumed.observe(int(s), float(m)) for s, m in zip(steps[cut:], means[cut:])]
        assert got == expected, cut


def test_per_example_and_spread_modes_are_unchanged_by_it():
    rng = np.random.default_rng(2)
    per = rng.normal(0, 0.2, (12, 32)) + np.r_[np.linspace(0.3, 0.6, 6), np.linspace(0.58, 0.4, 6)][:, None]
    for kind in ("scores", "spread"):
        decisions = []
        for spec in (WINDOW, PROGRESS):
            mon = JobMonitor("j", "rlhf", detector_from_spec(spec))
            for i, row in enumerate(per):
                args = (list(row),) if kind == "scores" else (None, float(np.std(row, ddof=1)), 32)
                decisions.append(mon.observe(10 * i, float(row.mean()), *args).to_dict())
        # The default ("auto") says that its per-look test ran because the planned steps were unknown (47modes).
        for d in decisions[:12]:
            d["reason"] = d["reason"] and d["reason"].replace(" per look: planned steps unknown", "")
        assert decisions[:12] == decisions[12:], kind
