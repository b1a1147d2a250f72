"""Shared fixtures: the repository root, the recorded detector states, and per-example eval scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (what subprocesses get on ``PYTHONPATH``)."""
    return REPO


@pytest.fixture(scope="session")
def detector_states() -> dict[str, Any]:
    """``tests/data/detector_states.json``: states and decisions written by the detectors before their restructure."""
    return json.loads((REPO / "tests" / "data" / "detector_states.json").read_text())


@pytest.fixture()
def per_example() -> Callable[..., list[float]]:
    """``per_example(mean, seed=0, n=64, spread=0.3)``: per-example scores whose mean is exactly ``mean``."""

    def make(mean: float, seed: int = 0, n: int = 64, spread: float = 0.3) -> list[float]:
        dev = np.random.default_rng(seed).normal(0.0, spread, n)
        return list(mean + dev - dev.mean())

    return make
