"""A local Ray cluster for the tests that act on one (``test_actuate_ray.py``), started as ``test_watch_ray.py``
starts its own: ``ray start --head --block`` on loopback, own ports and temp folder, one CPU, the dashboard (which
serves the job API) on 127.0.0.1 only; ended by signalling its process group, never with ``ray stop`` (which ends
every Ray cluster of the user on the machine)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _watch_helpers import env
from service_support import free_port

RAY = str(Path(sys.executable).parent / "ray")


def ray_env() -> dict[str, str]:
    """No token authentication: Ray turns it on when it finds a token in ~/.ray, which another run may have left."""
    return {**env(), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def ray(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the ``ray`` command beside this interpreter."""
    return subprocess.run([RAY, *args], env=ray_env(), capture_output=True, text=True, timeout=timeout)


@contextmanager
def local_ray_cluster() -> Iterator[str]:
    """A local Ray cluster on loopback; yields its job API address. Skips the test when Ray cannot start here."""
    if not Path(RAY).exists():
        pytest.skip(f"no ray command beside {sys.executable} (pip install 'ray[default]')")
    temp = Path(tempfile.mkdtemp(prefix="ea", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    api = free_port()
    cmd = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(free_port())]
    cmd += ["--num-cpus", "1", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1"]
    cmd += ["--dashboard-port", str(api), "--ray-client-server-port", str(free_port())]
    cmd += ["--dashboard-agent-listen-port", str(free_port()), "--temp-dir", str(temp), "--disable-usage-stats"]
    log = open(temp / "ray-start.log", "wb")
    head = subprocess.Popen(cmd, env=ray_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{api}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if head.poll() is not None:
                pytest.skip(f"ray start exited {head.returncode}: {(temp / 'ray-start.log').read_text()[-400:]}")
            if ray("job", "list", "--address", address).returncode == 0:
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


def job_status(address: str, submission_id: str) -> str:
    """The Ray job's status word (``RUNNING``, ``STOPPED``, ...) from the job API."""
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(address).get_job_status(submission_id)).rsplit(".", 1)[-1]
