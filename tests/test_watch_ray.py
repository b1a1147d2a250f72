"""``evalstop watch`` ending a job of a real local Ray cluster: ``ray start --head`` on loopback (own ports and temp
folder, one CPU), the stand-in trainer submitted with ``ray job submit``, and ``--on-stop 'ray job stop ...'`` ending
it at the step where the embedded core stops the same curve.

The cluster is started with ``ray start --block`` in its own process group and ended by signalling that group (not
with ``ray stop``, which ends every Ray cluster of the user on the machine, other tests' included). Ray's job API is
served by its dashboard process, so the dashboard runs, on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ray_support import RAY, local_ray_cluster
from _ray_support import ray as _ray
from _watch_helpers import CHILD, HACKING, embedded_stop, env, evals, last_json, trace_path, watch

METRIC = "val-core/openai/gsm8k/reward/mean@1"


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster on loopback (tests/_ray_support.py); yields its job API address."""
    with local_ray_cluster() as address:
        yield address


def test_on_stop_ray_job_stop_ends_the_ray_job_at_the_stop(ray_cluster: str, tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    job = f"evalstop-watch-{os.getpid()}"
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": env()["PYTHONPATH"], "OMP_NUM_THREADS": "1"}})
    submitted = _ray(
        "job",
        "submit",
        "--address",
        ray_cluster,
        "--submission-id",
        job,
        "--no-wait",
        "--runtime-env-json",
        runtime_env,
        "--",
        sys.executable,
        str(CHILD),
        str(trace_path(HACKING)),
        str(log),
        "--format",
        "verl",
        "--metric",
        METRIC,
        "--pace",
        "0.15",  # the 19 evaluations after the stop take 6 s: more than the decision and ray job stop need
    )
    assert submitted.returncode == 0, submitted.stderr
    try:
        done = watch(
            str(log),
            "--metric",
            METRIC,
            "--timeout",
            "60",
            "--on-stop",
            f"{RAY} job stop --address {ray_cluster} {job}",
            timeout=120,
        )
    finally:
        status = _ray("job", "status", "--address", ray_cluster, job)
        if "RUNNING" in status.stdout or "PENDING" in status.stdout:
            _ray("job", "stop", "--address", ray_cluster, job)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert (result["stop_step"], result["best_step"]) == embedded_stop(HACKING)
    assert f"Job '{job}' was stopped" in status.stdout, status.stdout
    assert result["ended"] == f"stop at step {result['stop_step']}: --on-stop command exit status 0"
    logged = [json.loads(line)["step"] for line in log.read_text().splitlines() if METRIC in line]
    assert logged[-1] < evals(HACKING)[-1]["step"]  # ended by the stop, not by its end
