"""The per-example harness of the dense-and-noisy study (benchmarks/dense_modes.py): the scores it gives a run."""

from __future__ import annotations

import numpy as np
import pytest
from dense_modes import shipped, with_examples
from dense_noisy import healthy_cell, synthetic_healthy


@pytest.mark.parametrize("rho", [0.0, 0.85])
def test_the_scores_mean_is_the_runs_observed_mean_and_their_spread_follows_the_simulators_rule(rho):
    run = synthetic_healthy("plateau", 300, 0.1, 1, 0)[0]
    got = with_examples(run, 0.1, 64, seed=0, rho=rho)
    scores = np.asarray(got.examples)
    assert scores.shape == (300, 64)
    np.testing.assert_allclose(scores.mean(axis=1), run.observed, rtol=0, atol=1e-12)
    # Each example's deviation from its eval's mean: a fixed difficulty (correlation rho between two evals) plus
    # noise whose sd is the mean's noise (0.1 of the gain) times sqrt(64).
    dev = scores - scores.mean(axis=1, keepdims=True)
    corr = np.corrcoef(dev[:-1].ravel(), dev[1:].ravel())[0, 1]
    assert corr == pytest.approx(rho, abs=0.05)
    noise_sd = 0.1 * run.gain * 8
    assert np.diff(dev, axis=0).std() == pytest.approx(noise_sd * np.sqrt(2), rel=0.05)


def test_the_default_with_a_plan_stops_fewer_dense_healthy_runs_per_example_than_per_look():
    runs = [
        with_examples(r, 0.1, 32, seed=i, rho=0.0) for i, r in enumerate(synthetic_healthy("plateau", 300, 0.1, 6, 0))
    ]
    det = shipped()
    planned = healthy_cell(det["default"], runs, "per-example")
    per_look = healthy_cell(det["default, per look"], runs, "per-example")
    assert planned["stopped"] == 0 and per_look["stopped"] >= 3
