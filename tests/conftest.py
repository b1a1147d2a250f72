"""Shared fixtures: the repository root and the recorded detector states."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
