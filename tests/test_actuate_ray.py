"""The service ends a stopped job on a real local Ray cluster, through the Ray actuator and the actuate worker.

One module-scoped cluster (``ray start --head`` on loopback, see ``_ray_support.py``; starting Ray is slow), two
tests, one Ray job each: a job that ignores its decisions, registered by its client (and the registration's answers
that need the cluster: 200, 409, 404), stopped by the service after ``kill -9`` of the server after the decision and
of the worker between the stop's two phases, each phase recorded once; and ``evalstop watch --stop-with ray``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _ray_support import job_status, local_ray_cluster, ray
from _watch_helpers import CHILD, HACKING, embedded_stop, env, evals, last_json, trace_path, watch
from service_support import SERVER_CMD, Server, add_tenant, auth, cli, free_port

from platform_sim.service.sqlite_store import SQLiteStore

JOB = Path(__file__).with_name("_actuate_ray_job.py")
METRIC = "val-core/openai/gsm8k/reward/mean@1"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    with local_ray_cluster() as address:
        yield address


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _submit(address: str, submission_id: str, *entrypoint: str) -> None:
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": env()["PYTHONPATH"], "OMP_NUM_THREADS": "1"}})
    done = ray(
        "job", "submit", "--address", address, "--submission-id", submission_id, "--no-wait",
        "--runtime-env-json", runtime_env, "--", sys.executable, *entrypoint,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _end(address: str, submission_id: str) -> None:
    """Never leave a job running on the module's cluster (a failed test's job would hold its one CPU)."""
    if job_status(address, submission_id) in ("RUNNING", "PENDING"):
        ray("job", "stop", "--address", address, submission_id)


def _actuate(db: Path, address: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [*SERVER_CMD, "actuate", "--db", str(db), "--actuator", "ray", "--actuator-option", f"address={address}"]
    cmd += ["--actuator-option", "confirm_s=4", "--actuate-poll-s", "0.2", "--actuate-lease-s", "30"]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _actuation_events(db: Path) -> list[Any]:
    store = SQLiteStore(db)
    try:
        return [e for e in store.list_events(None, 0, 10_000) if e.type.startswith("actuation.")]
    finally:
        store.close()


def test_the_service_stops_a_ray_job_once_through_kill_9_of_server_and_worker(ray_cluster: str, tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    cli("tenant", "scope", "acme", "--ray-prefix", "acme-", "--db", str(db))
    srv = Server(db, free_port(), extra_args=("--actuator", "ray", "--actuator-option", f"address={ray_cluster}"))
    srv.start()
    submission, steps = f"acme-{os.getpid()}-e2e", tmp_path / "steps.txt"
    _submit(ray_cluster, submission, str(JOB), srv.url, token, "rlhf-1", submission, str(steps))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        h = auth(token)

        def stopped() -> Any:
            r = httpx.get(f"{srv.url}/v1/jobs/rlhf-1", headers=h)
            return r.status_code == 200 and r.json()["status"] == "stopped" and r.json()

        job = _wait("the service's stop decision", stopped, timeout=90)
        handle = httpx.get(f"{srv.url}/v1/jobs/rlhf-1/scheduler-handle", headers=h).json()
        assert (handle["kind"], handle["ref"]) == ("ray", submission)  # the client registered it by itself
        assert handle["actuation"]["state"] == "pending"  # written with the decision; no worker runs yet
        # The registration's answers that need the cluster: the same handle again, another one, an unknown job.
        url = f"{srv.url}/v1/jobs/rlhf-1/scheduler-handle"
        again = httpx.put(url, json={"kind": "ray", "ref": submission}, headers=h, timeout=30)
        assert (again.status_code, again.json()["ref"]) == (200, submission)
        other = httpx.put(url, json={"kind": "ray", "ref": "acme-else"}, headers=h, timeout=30)
        assert (other.status_code, other.json()["error"]) == (409, "conflict")
        httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "j2", "job_type": "rlhf"}, headers=h).raise_for_status()
        unknown = httpx.put(
            f"{srv.url}/v1/jobs/j2/scheduler-handle", json={"kind": "ray", "ref": "acme-none"}, headers=h, timeout=30
        )
        assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown_handle"), unknown.text
        assert "no such job on the Ray cluster" in unknown.json()["message"]
        srv.kill9()  # the server dies after the decision, before any action
        assert job_status(ray_cluster, submission) == "RUNNING"  # the job ignores its decisions

        workers.append(_actuate(db, ray_cluster, tmp_path / "actuate-1.log"))
        _wait(
            "phase 0's success",
            lambda: any(e.type == "actuation.succeeded" and e.details["phase"] == 0 for e in _actuation_events(db)),
        )
        workers[0].send_signal(signal.SIGKILL)  # between the phases: phase 1 is due confirm_s (4 s) later
        workers[0].wait(timeout=10)
        assert [e.type for e in _actuation_events(db)] == ["actuation.started", "actuation.succeeded"]  # mid-way
        _wait("Ray to end the job", lambda: job_status(ray_cluster, submission) == "STOPPED", timeout=30)

        workers.append(_actuate(db, ray_cluster, tmp_path / "actuate-2.log"))
        done = _wait(
            "the action to be done",
            lambda: [e for e in _actuation_events(db) if e.type == "actuation.succeeded" and e.details["phase"] == 1],
        )
        time.sleep(1.0)  # a worker that ran anything twice would have recorded it by now
        events = _actuation_events(db)
        assert [(e.type, e.details["phase"]) for e in events] == [
            ("actuation.started", 0),
            ("actuation.succeeded", 0),
            ("actuation.started", 1),
            ("actuation.succeeded", 1),
        ]
        assert events[1].details["detail"] == "stop requested"
        assert events[1].details["action"] == f"ray stop_job {submission} at {ray_cluster}"
        assert done[0].details["detail"] == "the job is STOPPED"
        store = SQLiteStore(db)
        try:
            [action] = store.list_actuations()
        finally:
            store.close()
        assert (action.state, action.phase) == ("done", 1)
        reported = [int(s) for s in steps.read_text().split()]
        assert job["stopped_at"] <= reported[-1] < 4000  # ended by the stop, far before its last report
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(timeout=10) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=10)
        srv.stop()
        _end(ray_cluster, submission)


def test_watch_stop_with_ray_ends_the_ray_job_at_the_stop(ray_cluster: str, tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    job = f"evalstop-watch-{os.getpid()}-stop-with"
    _submit(
        ray_cluster, job, str(CHILD), str(trace_path(HACKING)), str(log), "--format", "verl", "--metric", METRIC,
        "--pace", "0.6",  # 11 s of evaluations after the stop: the stop-with child (it imports Ray) needs some
    )  # fmt: skip
    try:
        done = watch(
            str(log), "--metric", METRIC, "--timeout", "60", "--stop-with", "ray", "--stop-handle", job,
            "--stop-option", f"address={ray_cluster}", "--stop-option", "confirm_s=2",
            timeout=120,
        )  # fmt: skip
        status = job_status(ray_cluster, job)
    finally:
        _end(ray_cluster, job)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert (result["stop_step"], result["best_step"]) == embedded_stop(HACKING)
    assert status == "STOPPED"
    assert f"ray stop_job {job} at {ray_cluster}: ok (stop requested)" in done.stderr
    assert f"ray get_job_status {job} at {ray_cluster}: ok (the job is STOPPED)" in done.stderr
    logged = [json.loads(line)["step"] for line in log.read_text().splitlines() if METRIC in line]
    assert logged[-1] < evals(HACKING)[-1]["step"]  # ended by the stop, not by its end
    missing = watch(str(log), "--metric", METRIC, "--stop-with", "ray", timeout=60)
    assert missing.returncode == 2 and "give --stop-handle REF" in missing.stderr
