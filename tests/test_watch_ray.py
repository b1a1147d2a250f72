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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _watch_helpers import CHILD, HACKING, embedded_stop, env, evals, last_json, trace_path, watch
from service_support import free_port

RAY = str(Path(sys.executable).parent / "ray")
METRIC = "val-core/openai/gsm8k/reward/mean@1"


def ray_env() -> dict[str, str]:
    """No token authentication: Ray turns it on when it finds a token in ~/.ray, which another run may have left."""
    return {**env(), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _ray(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAY, *args], env=ray_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster on loopback; yields its job API address."""
    if not Path(RAY).exists():
        pytest.skip(f"no ray command beside {sys.executable} (pip install 'ray[default]')")
    temp = Path(tempfile.mkdtemp(prefix="ew", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    api = free_port()
    cmd = [
        RAY,
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--num-cpus",
        "1",
        "--include-dashboard",
        "true",
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(api),
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--temp-dir",
        str(temp),
        "--disable-usage-stats",
    ]
    log = open(temp / "ray-start.log", "wb")
    head = subprocess.Popen(cmd, env=ray_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{api}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if head.poll() is not None:
                pytest.skip(f"ray start exited {head.returncode}: {(temp / 'ray-start.log').read_text()[-400:]}")
            if _ray("job", "list", "--address", address).returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.skip(f"Ray's job API at {address} did not answer within 90 s")
            time.sleep(1)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # ray start --block ends the processes it started
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # Ray drains for up to 30 s on SIGTERM: not needed here
        except ProcessLookupError:
            pass
        head.wait(timeout=10)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


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
