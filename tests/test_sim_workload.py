"""Workload generator and curves: determinism, the defaults of docs/design.md section 5, and the curve shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from platform_sim.sim.curves import (
    ExpLossCurve,
    GaoHackingCurve,
    PlateauCurve,
    SaturatingCurve,
    TabulatedCurve,
    eval_grid,
)
from platform_sim.sim.observe import ObservationModel, make_observation_model, register_observation_model
from platform_sim.sim.workload import MIXES, PROFILES, WorkloadConfig, generate_workload


@pytest.fixture(scope="module")
def big():
    return generate_workload(WorkloadConfig(n_jobs=3000), seed=11)


def test_same_seed_same_workload():
    a, b = (generate_workload(WorkloadConfig(n_jobs=50), 4) for _ in range(2))
    assert [(j.job_id, j.gpus, j.submit_time, j.duration_h, j.hacking) for j in a.jobs] == [
        (j.job_id, j.gpus, j.submit_time, j.duration_h, j.hacking) for j in b.jobs
    ]
    assert np.array_equal(a.true_evals, b.true_evals) and np.array_equal(a.noise, b.noise)
    c = generate_workload(WorkloadConfig(n_jobs=50), 5)
    assert not np.array_equal(a.noise, c.noise)


def test_sigma_does_not_change_the_draws():
    # common random numbers: a sigma sweep scales the same standard-normal draws
    a = generate_workload(WorkloadConfig(n_jobs=30, sigma=0.01), 1)
    b = generate_workload(WorkloadConfig(n_jobs=30, sigma=0.12), 1)
    assert np.array_equal(a.noise, b.noise) and np.array_equal(a.true_evals, b.true_evals)


def test_mix_hack_rate_and_types(big):
    types = [j.job_type for j in big.jobs]
    for t, frac in MIXES["rlhf-heavy"].items():
        assert types.count(t) / len(types) == pytest.approx(frac, abs=0.03)
    rlhf = [j for j in big.jobs if j.job_type == "rlhf"]
    assert sum(j.hacking for j in rlhf) / len(rlhf) == pytest.approx(0.6, abs=0.03)
    assert not any(j.hacking for j in big.jobs if j.job_type != "rlhf")
    for j in big.jobs:
        assert j.gpus in PROFILES[j.job_type].gpu_choices


def test_arrivals_poisson_at_the_offered_load(big):
    submit = np.array([j.submit_time for j in big.jobs])
    assert submit[0] == 0.0 and np.all(np.diff(submit) >= 0)
    rate = (len(submit) - 1) / submit[-1]
    assert rate == pytest.approx(WorkloadConfig().arrival_rate(), rel=0.06)
    gh = sum(j.gpus * j.duration_h for j in big.jobs) / submit[-1]
    assert gh / 64 == pytest.approx(0.8, rel=0.15)  # offered load


def test_estimates_are_noisy_but_unbiased_in_log(big):
    ratio = np.log([j.est_duration_h / j.duration_h for j in big.jobs])
    assert abs(ratio.mean()) < 0.03 and ratio.std() == pytest.approx(0.3, rel=0.1)


def test_curve_shapes(big):
    grid = eval_grid(20)
    for j in big.jobs:
        vals = big.true_evals[j.index]
        loss = big.losses[j.index]
        assert np.all(np.diff(loss) < 0), "training loss falls monotonically for every job, hacking ones included"
        if j.hacking:
            peak = int(np.argmax(vals))
            assert 0.5 <= grid[peak] <= 0.8 and vals[-1] < vals[peak] - 0.05
        elif j.job_type == "dpo":
            assert np.all(np.diff(vals) >= 0)
        else:
            assert np.all(np.diff(vals) > 0), "healthy RLHF and LoRA curves strictly improve"
        assert np.all(vals >= 0) and np.all(vals <= 1.0 + 1e-9)


def test_gao_curve_peak_and_steepness():
    c1 = GaoHackingCurve(0.1, 0.6, 0.6, gamma=1.0)
    c2 = GaoHackingCurve(0.1, 0.6, 0.6, gamma=2.0)
    assert c1.value(0.6) == pytest.approx(0.7) and c2.value(0.6) == pytest.approx(0.7)
    assert c2.value(1.0) < c1.value(1.0) < 0.7  # larger gamma: steeper decline after the peak
    assert c1.value(0.0) == 0.1
    assert np.allclose(c2.values(np.array([0.0, 0.3, 0.6, 1.0])), [c2.value(p) for p in (0.0, 0.3, 0.6, 1.0)])
    idx, p, v = c2.peak(eval_grid(20))
    assert p == pytest.approx(0.6) and v == pytest.approx(0.7) and idx == 11


def test_vectorized_values_match_scalar_values():
    grid = eval_grid(20)
    for c in (
        SaturatingCurve(0.1, 0.6, 2.0),
        PlateauCurve(0.2, 0.3, 0.3, 0.7),
        ExpLossCurve(2.0, 1.0, 0.3),
        TabulatedCurve([0.0, 0.5, 1.0], [0.0, 1.0, 0.5]),
    ):
        assert np.allclose(c.values(grid), [c.value(float(p)) for p in grid])
    assert PlateauCurve(0.2, 0.3, 0.3, 0.7).peak(grid)[1] == pytest.approx(0.7)  # plateau: earliest on ties


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"hack_rate": 1.5}, "hack_rate"),
        ({"hack_rate": -0.1}, "hack_rate"),
        ({"sigma": -0.01}, "sigma"),
        ({"sigma": math.nan}, "sigma"),
        ({"mix": "gpu-heavy"}, "mix"),
        ({"n_jobs": 0}, "n_jobs"),
        ({"gpus": 8}, "gpus"),
        ({"n_evals": 1}, "n_evals"),
        ({"load": 0}, "load"),
    ],
)
def test_bad_workload_config_names_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        WorkloadConfig(**bad)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed"):
        generate_workload(WorkloadConfig(n_jobs=2), seed)


def test_config_round_trip():
    cfg = WorkloadConfig(sigma=0.05, healthy_tau=(1.0, 2.0))
    assert WorkloadConfig.from_dict(cfg.to_dict()) == cfg


def test_observation_model_default_and_registry():
    wl = generate_workload(WorkloadConfig(n_jobs=5, sigma=0.05), 2)
    obs = make_observation_model(wl)
    job = wl.jobs[3]
    score, examples = obs.observe_eval(job, 4, 0.2)
    assert examples is None
    assert score == pytest.approx(wl.true_evals[3, 3] + 0.05 * wl.noise[3, 3])

    @register_observation_model("test-shifted")
    class Shifted(ObservationModel):
        def __init__(self, workload, shift=0.0):
            super().__init__(workload)
            self.shift = shift

        def observe_eval(self, job, k, progress):
            s, _ = super().observe_eval(job, k, progress)
            return s + self.shift, (s,)

    try:
        model = make_observation_model(wl, {"name": "test-shifted", "params": {"shift": 1.0}})
        assert model.observe_eval(job, 4, 0.2)[0] == pytest.approx(score + 1.0)
        # per-job generators are reproducible and independent of evaluation order
        assert obs.job_rng(job).random() == make_observation_model(wl).job_rng(job).random()
    finally:
        from platform_sim.sim.observe import OBSERVATION_MODELS

        OBSERVATION_MODELS.pop("test-shifted")
    with pytest.raises(ValueError, match="unknown observation model"):
        make_observation_model(wl, "nope")


def test_per_example_scores_are_dropped_when_a_job_ends_and_drawn_the_same_again():
    from platform_sim.core import default_spec
    from platform_sim.sim.engine import simulate
    from platform_sim.sim.eval_scores import DEFAULT_EXAMPLES, PerExampleObservation
    from platform_sim.sim.experiments import PolicySpec

    wl = generate_workload(WorkloadConfig(n_jobs=40, sigma=0.05), 4)
    obs = PerExampleObservation(wl)
    job = wl.jobs[5]
    first = [obs.observe_eval(job, k, k / wl.n_evals) for k in range(1, wl.n_evals + 1)]
    for score, scores in first:
        assert scores is not None and len(scores) == DEFAULT_EXAMPLES
        assert math.fsum(scores) / len(scores) == pytest.approx(score, abs=1e-12)  # the mean is the observation
    obs.forget(job)
    assert not obs._rows and not obs._blocks and not obs._difficulty  # nothing kept for an ended job
    assert [obs.observe_eval(job, k, k / wl.n_evals) for k in range(1, wl.n_evals + 1)] == first

    # The engine tells the model when each job ends: after a run it holds no job's draws (memory grows with the jobs
    # alive, not with all the jobs of a 100,000-job run), and some jobs were observed with per-example scores.
    spec = PolicySpec(stop="evalstop", detector=default_spec())
    sim_obs = PerExampleObservation(wl)
    result = simulate(wl, spec.build(wl), observation=sim_obs)
    assert any(o.stopped for o in result.outcomes)
    assert not sim_obs._rows and not sim_obs._blocks and not sim_obs._difficulty


def test_the_engine_reads_per_example_rows_as_read_only_arrays_of_the_same_scores():
    from platform_sim.sim.eval_scores import PerExampleObservation

    wl = generate_workload(WorkloadConfig(n_jobs=20, sigma=0.05), 2)
    obs = PerExampleObservation(wl)
    for job in wl.jobs[:5]:
        for k in range(1, wl.n_evals + 1):
            score, row = obs.observe_row(job, k, k / wl.n_evals)
            assert isinstance(row, np.ndarray) and row.dtype == np.float64 and not row.flags.writeable
            assert (score, tuple(row.tolist())) == obs.observe_eval(job, k, k / wl.n_evals)
            assert all(type(v) is float for v in obs.observe_eval(job, k, k / wl.n_evals)[1] or ())

    class Shifted(PerExampleObservation):  # a subclass's observe_eval is what the engine reads
        def observe_eval(self, job, k, progress):
            score, row = super().observe_eval(job, k, progress)
            return score + 1.0, row

    shifted = Shifted(wl)
    assert shifted.observe_row(wl.jobs[0], 3, 0.15) == shifted.observe_eval(wl.jobs[0], 3, 0.15)
    assert shifted.observe_row(wl.jobs[0], 3, 0.15)[0] == obs.observe_eval(wl.jobs[0], 3, 0.15)[0] + 1.0
