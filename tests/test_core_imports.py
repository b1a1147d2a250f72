"""Importing the core or the clients does not import scipy (about a second); a detector imports it on first use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _run(repo_root, code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    return subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True
    )


@pytest.mark.parametrize(
    "module",
    ["platform_sim.core", "evalstop_callbacks", "evalstop_callbacks.client", "evalstop_callbacks.platform_client"],
)
def test_importing_lists_no_scipy_module(repo_root, module):
    out = _run(repo_root, f"import {module}", "-X", "importtime")
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert module in imported  # the check reads importtime's output, so make sure it has some
    assert not [name for name in imported if name.split(".")[0] == "scipy"]


def test_a_detector_that_runs_a_test_imports_scipy_then(repo_root):
    code = (
        "import sys\n"
        "from platform_sim.core import make_detector\n"
        "det = make_detector('paired-test', test='t', alpha=0.5, k=1)\n"
        "before = 'scipy.special' in sys.modules\n"
        "det.update(1, 1.0, [1.0, 1.2, 0.8]); stop = det.update(2, 0.5, [0.4, 0.7, 0.4])\n"
        "print(before, 'scipy.special' in sys.modules, stop)\n"
    )
    assert _run(repo_root, code).stdout.split() == ["False", "True", "True"]
