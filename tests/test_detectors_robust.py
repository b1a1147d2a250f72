"""Noise-robust detectors: edge cases, fallback to the mean, state round trips, and the no-stop-on-increase property."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platform_sim.core import (
    DETECTORS,
    CusumDetector,
    InvalidReportError,
    JobMonitor,
    KDeclineSEDetector,
    PairedTestDetector,
    TrendDetector,
    detector_from_spec,
    make_detector,
)
from platform_sim.core.detectors import se_from_history, standard_error

ROBUST = ["k-decline-se", "paired-test", "cusum", "trend", "shape"]


def _per_example(mean: float, rng: np.random.Generator, n: int = 64, spread: float = 0.3) -> list[float]:
    """Per-example scores whose mean is exactly ``mean``."""
    dev = rng.normal(0.0, spread, n)
    return list(mean + dev - dev.mean())


def _feed(detector, means, per_example=True, seed=0):
    rng = np.random.default_rng(seed)
    monitor = JobMonitor("job", detector=detector)
    decisions = []
    for step, mean in enumerate(means):
        scores = _per_example(mean, rng) if per_example else None
        decisions.append(monitor.observe(step * 10, float(np.mean(scores)) if scores else mean, scores))
    return monitor, decisions


# -- registry and parameters -----------------------------------------------------------------------------------------


def test_all_robust_detectors_registered_by_importing_core():
    assert set(ROBUST) <= set(DETECTORS)
    for name in ROBUST:
        det = detector_from_spec({"name": name, "params": {}})
        assert det.name == name
        again = make_detector(det.name, **det.params())
        assert again.params() == det.params()
        assert json.loads(json.dumps(det.spec())) == det.spec()


@pytest.mark.parametrize(
    "name, params, word",
    [
        ("k-decline-se", {"k": 0}, "k"),
        ("k-decline-se", {"z": -1.0}, "z"),
        ("k-decline-se", {"min_delta": float("nan")}, "min_delta"),
        ("k-decline-se", {"se": -0.1}, "se"),
        ("paired-test", {"test": "anova"}, "test"),
        ("paired-test", {"alpha": 0.0}, "alpha"),
        ("paired-test", {"alpha": 1.5}, "alpha"),
        ("paired-test", {"min_effect": -0.01}, "min_effect"),
        ("paired-test", {"k": True}, "k"),
        ("cusum", {"slack": -1}, "slack"),
        ("cusum", {"threshold": float("inf")}, "threshold"),
        ("cusum", {"se": "x"}, "se"),
        ("cusum", {"bogus": 1}, "bogus"),
        ("shape", {"threshold": 1.0}, "threshold"),
        ("shape", {"threshold": 0}, "threshold"),
        ("shape", {"k": 0}, "k"),
        ("shape", {"min_evals": 2}, "min_evals"),
        ("shape", {"future": 1.0}, "future"),
        ("shape", {"future": float("inf")}, "future"),
        ("shape", {"min_tau": 50.0}, "min_tau"),
        ("shape", {"min_tau": -1.0}, "min_tau"),
        ("shape", {"behind": 2}, "behind"),
        ("shape", {"behind": -1}, "behind"),
        ("shape", {"behind": True}, "behind"),
        ("shape", {"se": -0.1}, "se"),
    ],
)
def test_bad_parameters_name_the_parameter(name, params, word):
    with pytest.raises(ValueError, match=word):
        make_detector(name, **params)


# -- edge cases --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ROBUST)
def test_one_eval_never_stops(name):
    det = make_detector(name)
    assert det.update(0, 0.5, [0.5, 0.4, 0.6]) is False
    det = make_detector(name)
    assert det.update(0, 0.5, None) is False


@pytest.mark.parametrize("name", ROBUST)
def test_constant_scores_never_stop(name):
    # Constant per-example scores: SE 0, every difference 0: no evidence of a decline, whatever the tolerance.
    det = make_detector(name)
    for step in range(30):
        assert det.update(step, 0.5, [0.5] * 16) is False


@pytest.mark.parametrize("name", ROBUST)
def test_clear_decline_stops(name):
    means = [0.1, 0.3, 0.5, 0.6, 0.6, 0.45, 0.3, 0.15, 0.0, -0.15]
    monitor, decisions = _feed(make_detector(name), means)
    assert monitor.stopped
    assert monitor.best_step == 30 or monitor.best_step == 40
    assert decisions[-1].action.value == "stop"
    assert monitor.stop_reason


@pytest.mark.parametrize("name", ROBUST)
def test_noise_sized_wiggle_does_not_stop(name):
    # Two drops of about one standard error (0.3/sqrt(64) = 0.0375): the paper's rule would stop; these must not.
    means = [0.1, 0.3, 0.5, 0.6, 0.57, 0.54, 0.58, 0.55, 0.52, 0.56]
    monitor, _ = _feed(make_detector(name), means)
    assert not monitor.stopped
    paper, _ = _feed(make_detector("k-decline"), means)
    assert paper.stopped  # the contrast this family exists for


def test_kdecline_se_with_z_zero_is_the_paper_rule():
    rng = np.random.default_rng(3)
    means = list(np.cumsum(rng.normal(0, 0.05, 40)))
    _, ours = _feed(make_detector("k-decline-se", z=0.0), means)
    _, paper = _feed(make_detector("k-decline"), means)
    assert [d.action for d in ours] == [d.action for d in paper]
    assert [d.declines for d in ours] == [d.declines for d in paper]


def test_kdecline_se_tolerance_is_the_paired_standard_error():
    # Examples differ a lot in difficulty (spread 1.0) but each moves little between checkpoints (noise 0.05):
    # the paired SE of the difference is the small one, not the spread of the scores.
    rng = np.random.default_rng(5)
    base = rng.normal(0.5, 1.0, 100)
    noise = rng.normal(0.0, 0.05, 100)
    det = KDeclineSEDetector(k=1, z=2.0)
    det.update(0, float(base.mean()), list(base))
    cur = base + noise - 0.03
    paired_se = float((cur - base).std(ddof=1) / 10.0)
    assert det.update(1, float(cur.mean()), list(cur)) is True  # 0.03 drop > 2 * 0.005
    assert det.last_tolerance == pytest.approx(2.0 * paired_se)
    assert det.last_tolerance < 0.2 * 2.0 * np.sqrt(2) * standard_error(base)


def test_kdecline_se_unpaired_when_the_examples_differ():
    a = [0.0, 1.0] * 8
    b = [0.0, 1.0] * 4
    det = KDeclineSEDetector(k=1, z=2.0)
    det.update(0, 0.5, a)
    tol = 2.0 * np.hypot(standard_error(a), standard_error(b))
    assert det.update(1, 0.5 - 0.9 * tol, [x - 0.9 * tol for x in b]) is False
    assert det.last_tolerance == pytest.approx(tol)
    det = KDeclineSEDetector(k=1, z=2.0)
    det.update(0, 0.5, a)
    assert det.update(1, 0.5 - 1.1 * tol, [x - 1.1 * tol for x in b]) is True


def test_paired_test_ties_are_no_evidence():
    # Every example equal to the best's except one, which is lower: the mean drops but the test cannot be significant.
    det = PairedTestDetector(test="wilcoxon", alpha=0.01, k=1)
    best = [0.2, 0.4, 0.6, 0.8] * 5
    assert det.update(0, float(np.mean(best)), best) is False
    cur = list(best)
    cur[0] -= 0.5
    assert det.update(1, float(np.mean(cur)), cur) is False
    assert det.last_p is not None and det.last_p >= 0.01


@pytest.mark.parametrize("test", ["wilcoxon", "sign", "t"])
def test_paired_test_uniform_drop_is_significant(test):
    det = PairedTestDetector(test=test, alpha=0.01, k=1)
    best = list(np.linspace(0, 1, 30))
    det.update(0, float(np.mean(best)), best)
    cur = [x - 0.1 for x in best]
    assert det.update(1, float(np.mean(cur)), cur) is True
    assert det.last_p < 0.01


def test_paired_test_too_few_examples_cannot_reach_significance():
    det = PairedTestDetector(test="wilcoxon", alpha=0.01, k=1)
    det.update(0, 1.0, [1.0, 1.0])
    assert det.update(1, 0.0, [0.0, 0.0]) is False  # two examples: the smallest one-sided p is 0.25
    assert det.last_p == pytest.approx(0.25)


def test_paired_test_min_effect_on_the_mean():
    det = PairedTestDetector(alpha=0.05, min_effect=0.2, k=1)
    best = list(np.linspace(0, 1, 30))
    det.update(0, float(np.mean(best)), best)
    cur = [x - 0.1 for x in best]
    assert det.update(1, float(np.mean(cur)), cur) is False  # significant but smaller than min_effect
    cur = [x - 0.3 for x in best]
    assert det.update(2, float(np.mean(cur)), cur) is True


def test_paired_test_keeps_best_per_example_scores_in_state():
    det = PairedTestDetector()
    best = [0.9, 0.8, 0.7]
    det.update(0, 0.8, best)
    det.update(1, 0.5, [0.5, 0.5, 0.5])
    state = json.loads(json.dumps(det.state_dict()))
    assert state["best_scores"] == best
    assert state["best_score"] == 0.8


def test_paired_test_rejects_a_different_number_of_examples():
    monitor = JobMonitor("job", detector=PairedTestDetector())
    monitor.observe(0, 0.5, [0.4, 0.6])
    with pytest.raises(InvalidReportError, match="same held-out examples"):
        monitor.observe(1, 0.4, [0.3, 0.5, 0.4])
    assert monitor.steps == [0]  # the rejected report changed nothing
    assert monitor.detector.state_dict()["best_scores"] == [0.4, 0.6]


def test_cusum_accumulates_a_slow_decline_that_k_decline_se_misses():
    # Drops of 1 SE each with a rise in between now and then: no 2 consecutive big declines, but a steady fall.
    se = 0.3 / 8
    means = [
        0.6,
        0.6 - se,
        0.6 - 2 * se,
        0.6 - 1.5 * se,
        0.6 - 3 * se,
        0.6 - 4 * se,
        0.6 - 3.5 * se,
        0.6 - 5 * se,
        0.6 - 6 * se,
        0.6 - 5.5 * se,
        0.6 - 7 * se,
        0.6 - 8 * se,
    ]
    monitor, _ = _feed(CusumDetector(slack=0.25, threshold=4.0), means)
    assert monitor.stopped
    assert not _feed(KDeclineSEDetector(k=2, z=1.0), means)[0].stopped


def test_se_from_history_ignores_a_linear_trend():
    assert se_from_history([0.1, 0.2, 0.3]) is None
    assert se_from_history([0.1 * i for i in range(10)]) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(1)
    noisy = 0.01 * np.arange(400) + rng.normal(0, 0.05, 400)
    assert se_from_history(list(noisy)) == pytest.approx(0.05, rel=0.15)


# -- fallback to the mean ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ROBUST)
def test_missing_per_example_scores_fall_back_with_one_warning(name, caplog):
    det = make_detector(name)
    means = [0.1, 0.3, 0.5, 0.6, 0.6, 0.3, 0.0, -0.3, -0.6, -0.9]
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        monitor = JobMonitor("job", detector=det)
        for step, m in enumerate(means):
            monitor.observe(step, m)
    warnings = [r for r in caplog.records if "falling back to the mean" in r.getMessage()]
    assert len(warnings) == 1
    assert name in warnings[0].getMessage()
    assert monitor.stopped  # the mean alone still catches a steep decline


def test_kdecline_se_fallback_uses_the_given_se():
    det = KDeclineSEDetector(k=1, z=2.0, se=0.1)  # tolerance 2 * sqrt(2) * 0.1 = 0.283
    det.update(0, 1.0)
    assert det.update(1, 0.75) is False
    assert det.update(2, 0.4) is True


def test_paired_test_fallback_is_the_k_decline_rule_on_the_mean():
    means = [0.1, 0.5, 0.45, 0.5, 0.4, 0.3, 0.35]
    _, ours = _feed(PairedTestDetector(min_effect=0.0, k=2), means, per_example=False)
    _, paper = _feed(make_detector("k-decline", k=2), means, per_example=False)
    assert [d.action for d in ours] == [d.action for d in paper]


# -- persistence -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ROBUST)
@pytest.mark.parametrize("per_example", [True, False])
def test_state_round_trip_resumes_identically(name, per_example):
    rng = np.random.default_rng(7)
    means = list(0.6 - np.abs(np.linspace(-0.5, 0.5, 24)) + rng.normal(0, 0.03, 24))
    scores = [_per_example(m, rng) if per_example else None for m in means]
    whole = JobMonitor("job", detector=make_detector(name))
    for step, (m, s) in enumerate(zip(means, scores)):
        whole.observe(step, m, s)
    first = JobMonitor("job", detector=make_detector(name))
    for step in range(10):
        first.observe(step, means[step], scores[step])
    resumed = JobMonitor.from_state_dict(json.loads(json.dumps(first.state_dict())))
    for step in range(10, 24):
        resumed.observe(step, means[step], scores[step])
    assert [d.to_dict() for d in resumed.decisions] == [d.to_dict() for d in whole.decisions]
    assert resumed.detector.state_dict() == whole.detector.state_dict()


# -- property: a strictly increasing score never stops a job, for every registered detector -------------------------

increments = st.lists(st.floats(min_value=1e-6, max_value=1.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(min_value=-10, max_value=10),
    steps=increments,
    spread=st.floats(min_value=0.0, max_value=2.0),
    seed=st.integers(0, 2**16),
    with_scores=st.booleans(),
)
@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_strictly_increasing_score_never_stops(name, start, steps, spread, seed, with_scores):
    rng = np.random.default_rng(seed)
    monitor = JobMonitor("job", detector=make_detector(name))
    score = start
    for i, inc in enumerate(steps):
        score += inc
        # Per-example scores may individually go down (a skewed spread) while the mean goes up.
        scores = list(score + rng.standard_t(2, 8) * spread) if with_scores else None
        decision = monitor.observe(i, score, scores)
        assert decision.action.value == "continue", decision.reason


# -- trend -------------------------------------------------------------------------------------------------------------


def test_trend_needs_a_full_window_before_deciding():
    det = TrendDetector(window=5, alpha=0.2, k=1)
    means = [1.0, 0.8, 0.6, 0.4]  # a steep fall, but only 4 evals
    rng = np.random.default_rng(0)
    for step, m in enumerate(means):
        assert det.update(step, m, _per_example(m, rng)) is False
    assert det.update(4, 0.2, _per_example(0.2, rng)) is True


def test_trend_short_window_reacts_earlier():
    means = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.75, 0.65, 0.5, 0.3, 0.1]
    long_only, _ = _feed(TrendDetector(window=8, alpha=0.05), means)
    both, _ = _feed(TrendDetector(window=8, short_window=4, alpha=0.05), means)
    assert both.stopped and long_only.stopped
    assert both.stopped_at < long_only.stopped_at


@pytest.mark.parametrize(
    "params, word",
    [
        ({"window": 2}, "window"),
        ({"short_window": 8}, "short_window"),
        ({"short_window": 2}, "short_window"),
        ({"test": "sign"}, "test"),
        ({"min_drop": -1}, "min_drop"),
    ],
)
def test_trend_bad_parameters(params, word):
    with pytest.raises(ValueError, match=word):
        TrendDetector(**params)


def test_trend_fallback_with_known_se_is_a_z_test_on_the_slope():
    # Slope -0.01 per eval over 5 evals (sum of squared positions 10): z = -0.01 / (se / sqrt(10)).
    means = [0.5, 0.49, 0.48, 0.47, 0.46]
    strict = TrendDetector(window=5, alpha=0.05, se=0.02)  # z = -1.58: p = 0.057, not significant
    loose = TrendDetector(window=5, alpha=0.1, se=0.02)
    for det in (strict, loose):
        for step, m in enumerate(means):
            det.update(step, m)
    assert strict.declines == 0 and loose.declines == 1
    assert loose.last_p == pytest.approx(0.0569, abs=1e-3)


def test_trend_slopes_of_a_uniform_fall_are_certain():
    det = TrendDetector(window=3, alpha=0.01)
    base = list(np.linspace(0, 1, 10))
    for step, shift in enumerate([0.0, -0.1, -0.2]):
        cur = [x + shift for x in base]
        stop = det.update(step, float(np.mean(cur)), cur)
    assert stop is True and det.last_p == 0.0


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**16), n=st.integers(2, 60), shift=st.floats(-2, 2), alpha=st.sampled_from([0.001, 0.05, 0.3])
)
def test_t_prescreen_never_changes_scipys_decision(seed, n, shift, alpha):
    from scipy import stats

    from platform_sim.core.detectors import one_sided_t_p

    values = np.random.default_rng(seed).standard_t(3, n) + shift
    if np.ptp(values) == 0:
        return
    ours = one_sided_t_p(values, alpha, {})
    theirs = stats.ttest_1samp(values, 0.0, alternative="less").pvalue
    assert (ours < alpha) == (theirs < alpha)
    if ours != 1.0:
        assert ours == theirs


@pytest.mark.parametrize("name", [n for n in ROBUST if n != "shape"])  # shape: its own warm-up test
def test_warmup_ignores_an_early_dip(name):
    # A real GRPO trace shape: the score collapses in the first evals, then rises and only later really declines.
    means = [
        1.0,
        0.5,
        0.0,
        0.0,
        1.0,
        3.0,
        3.0,
        3.9,
        4.0,
        4.4,
        4.5,
        4.6,
        4.7,
        4.7,
        4.6,
        4.4,
        4.2,
        3.8,
        3.5,
        3.2,
        2.9,
        2.7,
        2.4,
    ]
    plain, _ = _feed(
        make_detector(name, **({"short_window": 3, "alpha": 0.05} if name == "trend" else {})), [m / 5 for m in means]
    )
    warm, _ = _feed(
        make_detector(name, warmup=5, **({"short_window": 3, "alpha": 0.05} if name == "trend" else {})),
        [m / 5 for m in means],
    )
    assert plain.stopped and plain.stopped_at < 5 * 10  # the dip stops it without a warm-up
    assert warm.stopped and warm.stopped_at > 12 * 10  # with one, only the real decline does
    with pytest.raises(ValueError, match="warmup"):
        make_detector(name, warmup=-1)


@pytest.mark.parametrize("name", ["k-decline-se", "cusum"])
def test_unknown_noise_decides_nothing(name):
    # Means only, no `se`: the noise is unknown until 4 evals exist, so early drops are no evidence yet.
    det = make_detector(name, **({"k": 1} if name == "k-decline-se" else {"threshold": 0.0}))
    assert [det.update(i, m) for i, m in enumerate([1.0, 0.5, 0.0])] == [False, False, False]
    with_se = make_detector(name, se=0.01, **({"k": 1} if name == "k-decline-se" else {"threshold": 0.0}))
    assert [with_se.update(i, m) for i, m in enumerate([1.0, 0.5, 0.0])][1] is True


def _falling_after_a_noisy_best(best_noise: float, level_alpha: float | None) -> list[bool]:
    # Every example falls by the same amount over the last four evals (certain trend evidence), but the best eval's
    # per-example scores carry noise of sd ``best_noise`` around its mean, so the drop below the best is small
    # against the paired noise of that comparison when ``best_noise`` is large.
    rng = np.random.default_rng(0)
    difficulty = rng.normal(0.0, 0.1, 20)
    noise = rng.normal(0.0, best_noise, 20) if best_noise else np.zeros(20)
    evals = [1.0 + difficulty + noise - noise.mean()] + [m + difficulty for m in (0.99, 0.98, 0.97, 0.96)]
    det = TrendDetector(window=4, alpha=0.05, level_alpha=level_alpha)
    return [det.update(10 * (i + 1), float(np.mean(s)), list(s)) for i, s in enumerate(evals)]


def test_trend_level_alpha_requires_a_significant_drop_below_the_best_checkpoint():
    # Without the level condition the falling window stops the job; with it, the current checkpoint is not
    # significantly below the noisy best one, so it does not.
    assert _falling_after_a_noisy_best(1.0, None)[-1] is True
    assert not any(_falling_after_a_noisy_best(1.0, 0.05))
    # Far below a noise-free best: the condition holds and the job stops at the same eval as without it.
    assert _falling_after_a_noisy_best(0.0, 0.05) == _falling_after_a_noisy_best(0.0, None) == [False] * 3 + [True] * 2
