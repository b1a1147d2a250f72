"""End to end on the real Slurm cluster of tests/slurm.sh: a real ``evalstop-server`` on loopback ends a
reward-hacking Slurm job through the Slurm actuator at its stop, lets a healthy one run to its end, refuses a foreign
job's handle, and still ends the job, once, when it was killed -9 between the decision and the action.

The jobs are tests/_slurm_job.py: a few reports through the real PlatformClient (``scheduler_handle="auto"`` reads
``SLURM_JOB_ID``), then, after a stop, they keep running and ignore SIGTERM, so only the scheduler can end them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port
from slurm_support import FOREIGN_USER, cancel, job_state, requires_slurm, sbatch, slurm_conf, wait_file, wait_state

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "_slurm_job.py"
# k-decline k=2: the 2nd consecutive decline stops the job, at step 60 (best: step 40).
HACKING = "0.2,0.3,0.4,0.5,0.45,0.4,0.35,0.3,0.25,0.2"
HEALTHY = "0.2,0.3,0.4,0.5,0.55,0.6"
pytestmark = [pytest.mark.slurm, requires_slurm]


def _server(db: Path, actuate: bool) -> Server:
    args = ["--actuator", "slurm", "--actuator-option", "grace_s=1", "--actuator-option", f"slurm_conf={slurm_conf()}"]
    if actuate:
        args += ["--actuate", "--actuate-poll-s", "0.2", "--actuate-backoff-s", "0.5"]
    return Server(db, free_port(), extra_args=tuple(args)).start()


def _submit(tmp_path: Path, name: str, url: str, token: str, scores: str) -> tuple[str, Path]:
    marks = tmp_path / f"{name}.marks"
    script = tmp_path / f"{name}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} {JOB} --url {url} --job-id {name} --scores {scores} --marks {marks} --ignore-term\n"
    )
    env = {"EVALSTOP_TOKEN": token, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return sbatch(script, f"--output={tmp_path}/{name}.out", f"--job-name={name}", env=env), marks


def _handle(url: str, token: str, job: str) -> dict:
    r = httpx.get(f"{url}/v1/jobs/{job}/scheduler-handle", headers=auth(token), timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def _actuation_events(url: str, token: str, job: str) -> list[tuple[str, int | None]]:
    r = httpx.get(f"{url}/v1/events", params={"limit": 1000}, headers=auth(token), timeout=5)
    assert r.status_code == 200, r.text
    return [
        (e["type"], e["details"].get("phase"))
        for e in r.json()["events"]
        if e["job_id"] == job and e["type"].startswith("actuation.")
    ]


def _setup(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "service.db"
    token = add_tenant(db, "lab")
    cli("tenant", "scope", "lab", "--slurm-user", "root", "--db", str(db))
    return db, token


def test_the_service_ends_a_hacking_slurm_job_and_lets_a_healthy_one_finish(tmp_path: Path) -> None:
    db, token = _setup(tmp_path)
    srv = _server(db, actuate=True)
    jobs: list[str] = []
    try:
        hacking, hack_marks = _submit(tmp_path, "hacking", srv.url, token, HACKING)
        healthy, healthy_marks = _submit(tmp_path, "healthy", srv.url, token, HEALTHY)
        jobs += [hacking, healthy]
        # The hacking job is stopped at its 2nd decline, ignores the decision and the TERM, and the scancel of
        # phase 1 ends it.
        assert wait_state(hacking, {"CANCELLED"}, timeout=45) == "CANCELLED"
        marks = hack_marks.read_text().splitlines()
        assert marks[0] == f"start {hacking}" and "stopped 60 best 40" in marks and "term" in marks
        assert "lingered to the end" not in marks
        record = _handle(srv.url, token, "hacking")
        assert (record["kind"], record["ref"]) == ("slurm", hacking)
        assert record["actuation"]["state"] == "done"
        assert record["actuation"]["last_action"] == f"scancel {hacking}"
        # The healthy job ran to its end: Slurm completed it, the service never acted on it.
        assert wait_state(healthy, {"COMPLETED"}, timeout=30) == "COMPLETED"
        assert healthy_marks.read_text().splitlines()[-1] == "done"
        record = _handle(srv.url, token, "healthy")
        assert (record["ref"], record["actuation"]) == (healthy, None)

        # A foreign user's job cannot be named by this tenant; nor can a job Slurm does not know, nor nonsense.
        foreign = sbatch(tmp_path / "hacking.sh", "--chdir=/tmp", "--output=/dev/null", "--hold", user=FOREIGN_USER)
        jobs.append(foreign)
        client = httpx.Client(base_url=srv.url, headers=auth(token), timeout=10)
        client.post("/v1/jobs", json={"job_id": "thief", "job_type": "rlhf"}).raise_for_status()
        put = "/v1/jobs/thief/scheduler-handle"
        refused = client.put(put, json={"kind": "slurm", "ref": foreign})
        assert refused.status_code == 403 and FOREIGN_USER not in refused.text  # names no owner
        assert client.put(put, json={"kind": "slurm", "ref": "999999"}).status_code == 404
        assert client.put(put, json={"kind": "slurm", "ref": "12;rm -rf"}).status_code == 400
        assert job_state(foreign) == "PENDING"  # untouched
    finally:
        srv.stop()
        cancel(*jobs)


def test_a_stop_decided_before_a_kill_9_still_ends_the_job_after_restart_once(tmp_path: Path) -> None:
    db, token = _setup(tmp_path)
    # No actuate worker at first: the decision is recorded with its stop action, and nothing acts on it yet.
    srv = _server(db, actuate=False)
    job = ""
    try:
        job, marks = _submit(tmp_path, "hacking", srv.url, token, HACKING)
        text = wait_file(marks, timeout=30)
        deadline = time.monotonic() + 30
        while "stopped" not in text and time.monotonic() < deadline:
            time.sleep(0.2)
            text = marks.read_text()
        assert "stopped 60 best 40" in text
        assert _handle(srv.url, token, "hacking")["actuation"]["state"] == "pending"
        srv.kill9()
        time.sleep(1.0)
        assert job_state(job) == "RUNNING"  # the decision alone ended nothing
        srv = _server(db, actuate=True)
        assert wait_state(job, {"CANCELLED"}, timeout=30) == "CANCELLED"
        deadline = time.monotonic() + 10
        while _handle(srv.url, token, "hacking")["actuation"]["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
        events = _actuation_events(srv.url, token, "hacking")
        assert events == [
            ("actuation.started", 0),
            ("actuation.succeeded", 0),
            ("actuation.started", 1),
            ("actuation.succeeded", 1),
        ]
        # Once: a further restart runs nothing again.
        srv.stop()
        srv = _server(db, actuate=True)
        time.sleep(1.5)
        assert _actuation_events(srv.url, token, "hacking") == events
    finally:
        srv.stop()
        if job:
            cancel(job)
