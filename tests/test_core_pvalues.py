"""The detectors' own p-value shortcuts agree with scipy's tests to the last bit (they decide stops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from platform_sim.core.detectors.pvalues import slope_less_p


def _scipy(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.linregress(x, y, alternative="less").pvalue)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _centered(n: int) -> np.ndarray:
    return np.arange(n, dtype=float) - (n - 1) / 2.0  # the trend detector's positions


def test_slope_p_value_equals_scipy_linregress_on_random_windows() -> None:
    rng = np.random.default_rng(0)
    for i in range(3000):
        n = int(rng.integers(2, 65))
        scale = 10.0 ** rng.uniform(-6, 6)
        y = rng.normal(rng.uniform(-1, 1), scale, size=n) + rng.uniform(-0.05, 0.05) * scale * np.arange(n)
        if i % 7 == 0:
            y = np.round(y, 1)  # ties
        x = _centered(n) if i % 2 else np.sort(rng.uniform(-5, 5, size=n))
        assert _same(slope_less_p(x, y), _scipy(x, y)), (x, y)


@pytest.mark.parametrize(
    "y",
    [
        [1.0, 1.0],  # two points: 1.0 when equal, 0.0 when not (scipy's special case)
        [2.0, 1.0],
        [1.0, 2.0],
        [0.5, 0.5, 0.5, 0.5],  # constant: r is NaN, so is the p-value
        [4.0, 3.0, 2.0, 1.0],  # an exact line: r clipped to -1
        [1.0, 2.0, 3.0, 4.0, 5.0],
        [1e200, -1e200, 1e200, -1e200],  # the covariance overflows: NaN in both
        [1e-300, 0.0, 2e-300, -1e-300],
        [0.3, 0.30000000000000004, 0.3, 0.29999999999999993],
    ],
)
def test_slope_p_value_equals_scipy_linregress_at_the_edges(y: list[float]) -> None:
    ys = np.asarray(y)
    x = _centered(ys.size)
    assert _same(slope_less_p(x, ys), _scipy(x, ys))


def test_trend_detector_without_per_example_scores_decides_as_with_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of mean-only reports through the trend detector: every p-value and decision is what scipy's linregress
    would give (the detector run again with the shortcut replaced by scipy's own test)."""
    from platform_sim.core import JobMonitor, detector_from_spec
    from platform_sim.core.detectors import trend

    rng = np.random.default_rng(3)
    scores = 0.5 + np.cumsum(rng.normal(0.0, 0.01, size=300))

    def run() -> list[tuple[str, int, str]]:
        monitor = JobMonitor("j", "rlhf", detector=detector_from_spec({"name": "trend", "params": {"window": 6}}))
        out = []
        for step, score in enumerate(scores):
            d = monitor.observe(step, float(score))
            out.append((d.action.value, d.declines, d.reason))
            if d.action.value == "stop":
                break
        return out

    fast = run()
    monkeypatch.setattr(trend, "slope_less_p", _scipy)
    assert run() == fast
    assert any("p=" in reason and "n/a" not in reason for _, _, reason in fast)  # tests did run


RACE = """
import threading
from platform_sim.core.detectors.pvalues import scipy_module

errors, barrier = [], threading.Barrier(8)


def first_use():
    barrier.wait()  # every thread asks at once, while scipy is not imported yet
    try:
        scipy_module("special").stdtr(3.0, -1.0)
        scipy_module("stats").t.cdf(-1.0, 3)
    except Exception as exc:
        errors.append(repr(exc))


threads = [threading.Thread(target=first_use) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
"""


def test_threads_that_first_use_scipy_at_once_all_get_the_whole_module() -> None:
    # The service applies reports on several threads: a thread that took scipy.stats from sys.modules while another
    # was still importing it got a partially initialized module (AttributeError: no attribute 't'). In a fresh
    # interpreter, so that scipy is not imported yet.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
