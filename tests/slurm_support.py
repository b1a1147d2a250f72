"""Shared pieces of the tests that run on the real single-node Slurm cluster of tests/slurm.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

#: The second Unix user tests/slurm.sh creates: its jobs are "foreign" to a tenant whose owners are root's.
FOREIGN_USER = "evalstop-foreign"


def slurm_conf() -> str | None:
    """The test cluster's slurm.conf: $SLURM_CONF, else the default state folder of tests/slurm.sh."""
    conf = os.environ.get("SLURM_CONF")
    if conf:
        return conf
    base = os.environ.get("EVALSTOP_SLURM_DIR") or os.path.join(
        os.environ.get("TMPDIR", tempfile.gettempdir()), "evalstop-slurm"
    )
    path = os.path.join(base, "slurm.conf")
    return path if os.path.exists(path) else None


def cluster_missing() -> str | None:
    """Why the slurm tests cannot run here, or ``None`` when the cluster answers with a usable node."""
    if shutil.which("sinfo") is None:
        return 'no Slurm client (sinfo) on PATH: run `eval "$(bash tests/slurm.sh start)"` as root'
    conf = slurm_conf()
    if conf is None:
        return 'no test cluster: run `eval "$(bash tests/slurm.sh start)"` as root (tests/run.sh does)'
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            env={**os.environ, "SLURM_CONF": conf},
            capture_output=True,
            text=True,
            timeout=10,
        )
    except subprocess.TimeoutExpired:
        return f"the Slurm cluster of {conf} does not answer"
    if not any(s in out.stdout for s in ("idle", "mixed", "allocated")):
        return f"the Slurm cluster of {conf} has no usable node: {out.stdout.strip() or out.stderr.strip()}"
    return None


requires_slurm = pytest.mark.skipif(cluster_missing() is not None, reason=str(cluster_missing()))


def slurm_env() -> dict[str, str]:
    """The environment for Slurm commands and for processes that run them (the service, the actuator)."""
    conf = slurm_conf()
    assert conf is not None
    return {**os.environ, "SLURM_CONF": conf}


def sbatch(
    script: Path | str,
    *args: str,
    user: str | None = None,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Submit ``script`` (a path) with extra sbatch ``args``, as ``user`` when given; returns the job id.

    Another user's submission reads the script on stdin: that user cannot open the test's private temp folder.
    ``env`` adds variables to the submission's environment, which the job inherits (sbatch --export=ALL).
    """
    argv = ["sbatch", "--parsable", *args]
    stdin = None
    if user is None:
        argv.append(str(script))
    else:
        argv = ["runuser", "-u", user, "--", *argv]
        stdin = Path(script).read_text()
    out = subprocess.run(
        argv,
        input=stdin,
        env={**slurm_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
        check=False,
    )
    assert out.returncode == 0, f"sbatch failed: {out.stderr.strip()}"
    return out.stdout.strip().split(";")[0]


def job_state(job_id: str) -> str | None:
    """The job's state as ``squeue`` shows it, ``None`` when Slurm no longer knows it."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=10,
    )
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def wait_state(job_id: str, states: set[str], timeout: float = 30.0) -> str:
    """Poll until the job is in one of ``states``; fails the test with the last state seen after ``timeout``."""
    deadline = time.monotonic() + timeout
    state = job_state(job_id)
    while state not in states and time.monotonic() < deadline:
        time.sleep(0.2)
        state = job_state(job_id)
    expected = sorted(states, key=str)  # None (the job has left squeue and sacct) sorts beside the names
    assert state in states, f"job {job_id} is {state}, expected one of {expected} within {timeout} s"
    return state


def wait_file(path: Path, timeout: float = 30.0) -> str:
    """Poll until ``path`` exists and is not empty; returns its text."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def cancel(*job_ids: str) -> None:
    """Best-effort cleanup of jobs a test submitted."""
    if job_ids:
        subprocess.run(["scancel", *job_ids], env=slurm_env(), capture_output=True, timeout=10, check=False)


def restarts(job_id: str) -> int:
    """How often Slurm requeued the job (``Restarts=`` of ``scontrol show job``)."""
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env=slurm_env(), capture_output=True, text=True, timeout=10
    )
    for field in out.stdout.split():
        if field.startswith("Restarts="):
            return int(field.split("=", 1)[1])
    raise AssertionError(f"no Restarts= for job {job_id}: {out.stdout.strip() or out.stderr.strip()}")
