"""The model-based ``shape`` detector: its model comparison, invariances, fallbacks and parameters.

The edge cases it shares with the other noise-robust detectors (one eval, constant scores, a clear decline, a
noise-sized wiggle, the fallback warning, state round trips, the increasing-score property) are parametrized over
every detector in ``test_detectors_robust.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.core import JobMonitor, ShapeDetector, make_detector


def _gao(steps: np.ndarray, peak: float, height: float = 0.6, gamma: float = 2.0, s0: float = 0.1) -> np.ndarray:
    x = (steps / peak) ** gamma
    return s0 + height * x * (1.0 - np.log(x))


def _run(det: ShapeDetector, steps, means, rng=None, spread: float = 0.2, n: int = 48):
    """Feed ``means`` with per-example scores (fresh sampling noise per eval); return the first stopping step."""
    rng = rng or np.random.default_rng(0)
    monitor = JobMonitor("job", detector=det)
    for step, mean in zip(steps, means):
        dev = rng.normal(0.0, spread, n)
        scores = list(mean + dev - dev.mean())
        if monitor.observe(int(step), float(np.mean(scores)), scores).should_stop:
            return int(step)
    return None


STEPS = np.arange(1, 21) * 10.0


def test_overoptimization_past_its_peak_stops_soon_after_the_peak():
    means = _gao(STEPS, peak=120.0) + np.random.default_rng(1).normal(0, 0.01, STEPS.size)
    stop = _run(ShapeDetector(), STEPS, means)
    assert stop is not None and 120 < stop <= 170


def test_saturating_healthy_rise_with_noise_does_not_stop():
    rng = np.random.default_rng(2)
    for tau in (0.1, 0.3, 1.0, 3.0):  # from a plateau reached early to a near-linear rise
        truth = 0.1 + 0.6 * (1 - np.exp(-(STEPS / STEPS[-1]) / tau)) / (1 - np.exp(-1 / tau))
        means = truth + rng.normal(0, 0.02, STEPS.size)
        assert _run(ShapeDetector(), STEPS, means, rng) is None, tau


def test_s_shaped_healthy_rise_does_not_stop():
    # The real GRPO runs on gold rise slowly, then fast, then saturate (docs/reference/detectors.md); a plain saturating
    # exponential cannot fit the slow start, and the first version of the detector took them for overoptimization.
    u = STEPS / STEPS[-1]
    truth = 1.0 + 3.5 * (1 - np.exp(-((u / 0.3) ** 2)))
    for seed in range(5):  # the sampling noise of 48 examples of spread 0.5: 0.07 per eval mean
        assert _run(ShapeDetector(), STEPS, truth, np.random.default_rng(seed), spread=0.5) is None, seed


def test_posterior_is_invariant_to_the_score_scale_and_the_step_unit():
    rng = np.random.default_rng(4)
    means = _gao(STEPS, peak=140.0)
    devs = [rng.normal(0, 0.2, 24) for _ in STEPS]
    a, b = ShapeDetector(), ShapeDetector()
    for step, mean, dev in zip(STEPS, means, devs):
        scores = mean + dev - dev.mean()
        a.update(int(step), float(scores.mean()), list(scores))
        scaled = 3.0 + 10.0 * scores  # another score unit and offset, another step unit
        b.update(int(step * 7), float(scaled.mean()), list(scaled))
        assert (a.last_posterior is None) == (b.last_posterior is None)
        if a.last_posterior is not None:
            assert a.last_posterior == pytest.approx(b.last_posterior, abs=1e-9)


def test_too_few_evals_decide_nothing():
    det = ShapeDetector(min_evals=5)
    for i, m in enumerate([0.5, 0.9, 0.2, 0.1]):  # a collapse, but only four points
        assert det.update(i + 1, m, [m - 0.01, m + 0.01]) is False
        assert det.last_posterior is None


def test_noise_comes_from_paired_per_example_differences():
    # Examples with very different fixed difficulty: the plain standard error of one eval is large, the noise of a
    # difference between checkpoints small. The detector must use the latter.
    det = ShapeDetector()
    difficulty = np.linspace(-1.0, 1.0, 40)
    rng = np.random.default_rng(5)
    for i, m in enumerate([0.1, 0.2, 0.3]):
        det.update(i + 1, m, list(m + difficulty + rng.normal(0, 0.01, 40)))
    assert det.noise_sd() == pytest.approx(0.01 / np.sqrt(40), rel=0.5)


def test_means_only_use_se_or_the_history_with_one_warning(caplog):
    means = list(_gao(STEPS, peak=100.0))
    with caplog.at_level(logging.WARNING):
        given_se = ShapeDetector(se=0.005)
        stops_with_se = next((int(s) for s, m in zip(STEPS, means) if given_se.update(int(s), float(m))), None)
    assert stops_with_se is not None and stops_with_se > 100
    assert given_se.noise_sd() == 0.005
    assert sum("falling back to the mean" in r.getMessage() for r in caplog.records) == 1
    history = ShapeDetector()
    assert [history.update(i, m) for i, m in enumerate([0.5, 0.1, 0.0])] == [False, False, False]
    assert history.noise_sd() is None  # fewer than 4 means: noise unknown, nothing decided


def test_a_changed_example_set_is_not_paired_and_warns_once(caplog):
    det = ShapeDetector(se=0.01)
    with caplog.at_level(logging.WARNING):
        det.update(1, 0.1, [0.1, 0.1, 0.1])
        det.update(2, 0.2, [0.2, 0.2])  # two examples instead of three: no paired difference
        det.update(3, 0.3, [0.3, 0.3, 0.5])
    assert det.paired_pairs == 0 and det.noise_sd() == 0.01
    messages = [r.getMessage() for r in caplog.records if "falling back to the mean" in r.getMessage()]
    assert len(messages) == 1 and "cannot be paired" in messages[0]


def test_min_tau_makes_a_flattening_curve_evidence():
    # A run that saturates by mid-run and then sags by 0.03, about one eval's noise (0.2 / sqrt(48)): with healthy
    # runs allowed to plateau (the default) that is no evidence; assuming healthy runs keep rising (min_tau),
    # the flattening itself is.
    u = STEPS / STEPS[-1]
    truth = 0.1 + 0.45 * (1 - np.exp(-u / 0.15)) - 0.03 * np.clip((u - 0.6) / 0.4, 0, 1)
    for seed in range(4):
        assert _run(ShapeDetector(), STEPS, truth, np.random.default_rng(seed)) is None, seed
        assert _run(ShapeDetector(min_tau=2.0, threshold=0.65), STEPS, truth, np.random.default_rng(seed)) is not None


def test_behind_zero_places_the_peak_behind_the_current_eval():
    # Noise-free Gao curve peaking at step 120: by the shapes alone the peak lies behind step 130 at step 130 itself
    # (behind=0), but only behind the previous eval (behind=1, the default) one eval later; the evidence also needs a
    # score below the best, which the first post-peak eval has.
    means = _gao(STEPS, peak=120.0)
    det0, det1 = ShapeDetector(behind=0, se=0.005), ShapeDetector(se=0.005)
    post0, post1 = [], []
    for step, mean in zip(STEPS, means):
        det0.update(int(step), float(mean))
        det1.update(int(step), float(mean))
        post0.append(det0.last_posterior or 0.0)
        post1.append(det1.last_posterior or 0.0)
    at = int(np.flatnonzero(STEPS == 130)[0])
    assert post0[at] > 0.95 > post1[at]
    assert post1[at + 1] > 0.95
    assert all(p0 >= p1 - 1e-9 for p0, p1 in zip(post0, post1))  # "at or before the current eval" contains the other
    for seed in range(3):  # with a low sampling noise (0.05 / sqrt(48) per eval mean) the stop comes one eval sooner
        assert _run(ShapeDetector(behind=0), STEPS, means, np.random.default_rng(seed), spread=0.05) == 130
        assert _run(ShapeDetector(), STEPS, means, np.random.default_rng(seed), spread=0.05) == 140


def test_warmup_and_k():
    means = _gao(STEPS, peak=60.0, gamma=3.0)  # peaks at eval 6 and collapses
    plain = _run(ShapeDetector(), STEPS, means)
    assert plain is not None
    assert _run(ShapeDetector(warmup=12), STEPS, means) > 120
    assert _run(ShapeDetector(k=3), STEPS, means) >= plain + 20


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), spread=st.floats(0.0, 1.0))
def test_constant_mean_with_noisy_examples_never_stops(seed, spread):
    rng = np.random.default_rng(seed)
    det = ShapeDetector()
    for step in range(1, 25):
        dev = rng.normal(0, spread, 16)
        assert det.update(step, 0.3, list(0.3 + dev - dev.mean())) is False  # never below its best


def test_rebuilds_from_its_spec():
    det = make_detector("shape", threshold=0.8, min_tau=1.0, future=2.0, warmup=2, behind=0)
    again = make_detector(det.name, **det.params())
    assert again.params() == det.params()


@pytest.mark.parametrize("last, stops", [(0.63, False), (0.6299, True)])
def test_shape_stops_only_on_a_score_below_the_best(last, stops, caplog):
    # A rise that flattens at its best: at a low threshold the posterior of "past the peak" counts as evidence at
    # every late eval, but a score equal to the best so far never stops the job; one just below it does.
    det = ShapeDetector(threshold=0.01, se=0.01)
    means = [0.1, 0.3, 0.45, 0.55, 0.6, 0.62, 0.63, 0.63, last]
    with caplog.at_level(logging.ERROR, logger="platform_sim.core.detectors"):
        out = [det.update(10 * (i + 1), m) for i, m in enumerate(means)]
    assert det.last_posterior is not None and det.last_posterior > 0.1
    assert out == [False] * 8 + [stops]
