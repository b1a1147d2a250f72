"""The scheduler side of tenant isolation, with a real ``evalstop-server`` process on loopback, a real SQLite file and
a stand-in Slurm (tests/slurm_standin.py: scripts that answer from files and record every call).

What is pinned: scheduler look-ups run on their own threads with a cap per tenant, so a flood of handle
registrations against a slow ``squeue`` is answered 429/503 and never keeps another tenant's reads and reports
waiting; ownership is checked again right before every phase of a stop, so a handle whose job changed owner (or
whose tenant lost its scope) is not acted on; a tenant without a Slurm scope is refused before ``squeue`` runs, and
no answer names another owner, Slurm's own messages or the operator's paths.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port
from slurm_standin import SlurmStandIn


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"db": tmp_path / "service.db", "slurm": SlurmStandIn(tmp_path / "slurm"), "servers": []}
    yield state
    for srv in state["servers"]:
        srv.stop()


def _serve(env: dict[str, Any], *extra: str) -> Server:
    srv = Server(env["db"], free_port(), extra_args=(*env["slurm"].serve_args(), *extra)).start()
    env["servers"].append(srv)
    return srv


def _tenant(env: dict[str, Any], name: str, *scope: str) -> str:
    token = add_tenant(env["db"], name)
    if scope:
        cli("tenant", "scope", name, *scope, "--db", str(env["db"]))
    return token


def _register(c: httpx.Client, job: str) -> None:
    assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job}).status_code == 201


def _until(what: str, cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_registration_flood_against_a_slow_squeue_never_stalls_another_tenant(env: dict[str, Any]) -> None:
    slurm = env["slurm"]
    floods = {f"t{i}": _tenant(env, f"t{i}", "--slurm-account", "ml") for i in range(4)}
    beta = _tenant(env, "beta", "--slurm-account", "ml")
    srv = _serve(env)
    per_tenant = 12  # 48 in all: more than the threads every route shares (40)
    clients = {name: httpx.Client(base_url=srv.url, headers=auth(tok), timeout=60) for name, tok in floods.items()}
    for n, (name, c) in enumerate(clients.items()):
        for i in range(per_tenant):
            _register(c, f"{name}-{i}")
            slurm.job(str(1000 * (n + 1) + i), "alice", "ml")
    slurm.delay(8)  # every squeue now takes 8 s: a busy slurmctld
    answers: list[httpx.Response] = []

    def put(c: httpx.Client, job: str, slurm_id: int) -> None:
        answers.append(c.put(f"/v1/jobs/{job}/scheduler-handle", json={"kind": "slurm", "ref": str(slurm_id)}))

    threads = [
        threading.Thread(target=put, args=(c, f"{name}-{i}", 1000 * (n + 1) + i))
        for n, (name, c) in enumerate(clients.items())
        for i in range(per_tenant)
    ]
    for t in threads:
        t.start()
    _until("the look-up pool full (8 squeue running)", lambda: slurm.squeue_started() >= 8)
    # While every look-up thread waits on squeue, another tenant is served: its reads, its registration and its
    # reports, and its own handle is refused at once (503, the pool is full) instead of waiting.
    b = httpx.Client(base_url=srv.url, headers=auth(beta), timeout=60)
    _register(b, "b1")
    assert b.get("/v1/jobs").status_code == 200
    report = {"job_id": "b1", "job_type": "rlhf", "step": 10, "eval_score": 0.5}
    assert b.post("/v1/jobs/b1/evals", json=report).status_code == 200
    assert slurm.squeue_ended() == 0, "the other tenant waited for a look-up to end"
    busy = b.put("/v1/jobs/b1/scheduler-handle", json={"kind": "slurm", "ref": "77"})
    assert busy.status_code == 503 and busy.json()["error"] == "scheduler_busy"
    assert busy.headers["Retry-After"]
    for t in threads:
        t.join(60)
    codes = Counter(a.status_code for a in answers)
    assert codes == {201: 8, 429: 40}, codes  # two look-ups per tenant; the rest refused at once, not queued
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"] == "lookups_busy" and refused.headers["Retry-After"]
    assert slurm.squeue_started() == 8  # nothing queued behind the pool


def _put(c: httpx.Client, job: str, ref: str) -> httpx.Response:
    return c.put(f"/v1/jobs/{job}/scheduler-handle", json={"kind": "slurm", "ref": ref})


def test_a_handle_whose_job_changed_owner_is_not_acted_on(env: dict[str, Any]) -> None:
    slurm, db = env["slurm"], str(env["db"])
    token = _tenant(env, "acme", "--slurm-account", "ml")
    srv = _serve(env)
    c = httpx.Client(base_url=srv.url, headers=auth(token), timeout=30)
    for ref in ("500", "501"):
        slurm.job(ref, "alice", "ml")
    for job, ref in (("moved", "500"), ("kept", "501")):
        k2 = {"name": "k-decline", "params": {"k": 2}}
        assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job, "detector": k2}).status_code == 201
        assert _put(c, job, ref).status_code == 201
    # Both jobs stop; then slurmctld's state is reset and id 500 now names another user's job.
    for job in ("moved", "kept"):
        for step, score in ((10, 0.5), (20, 0.6), (30, 0.55), (40, 0.5)):
            body = {"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score}
            d = c.post(f"/v1/jobs/{job}/evals", json=body)
        assert d.json()["action"] == "stop"
    slurm.job("500", "mallory", "physics")
    act = (*slurm.serve_args(), "--actuator-option", "grace_s=0", "--db", db, "--once")
    cli("actuate", *act)
    assert slurm.acted() == ["scancel --signal=TERM --full 501"]  # nothing at all on job 500
    view = c.get("/v1/jobs/moved/scheduler-handle").json()["actuation"]
    assert view["state"] == "given_up" and view["attempts"] == 1
    assert view["last_detail"] == (
        "not acted on: slurm job 500 is not one of this tenant's (its slurm users and accounts)"
    )
    # The operator takes the tenant's scope away before phase 1 of the other job: that phase acts on nothing.
    cli("tenant", "scope", "acme", "--remove", "--db", db)
    cli("actuate", *act)
    assert slurm.acted() == ["scancel --signal=TERM --full 501"]
    view = c.get("/v1/jobs/kept/scheduler-handle").json()["actuation"]
    assert (view["state"], view["phase"]) == ("given_up", 1) and "not acted on" in view["last_detail"]
    # What the tenant reads names neither the other owner nor the operator's command paths.
    seen = json.dumps(c.get("/v1/events", params={"limit": 1000}).json()) + json.dumps(view)
    assert "mallory" not in seen and "physics" not in seen and str(slurm.folder) not in seen
    assert "owner check of slurm job 500" in seen


def test_a_scopeless_tenant_is_refused_before_any_squeue(env: dict[str, Any]) -> None:
    slurm = env["slurm"]
    nobody = _tenant(env, "nobody")
    acme = _tenant(env, "acme", "--slurm-account", "ml")
    slurm.job("600", "alice", "ml")
    slurm.job("601", "bob", "physics")
    srv = _serve(env)
    n = httpx.Client(base_url=srv.url, headers=auth(nobody), timeout=30)
    a = httpx.Client(base_url=srv.url, headers=auth(acme), timeout=30)
    for c in (n, a):
        assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "j"}).status_code == 201
    for ref in ("600", "601", "999"):  # the tenant's kind of job, another's, none: one answer, Slurm never asked
        r = _put(n, "j", ref)
        assert (r.status_code, r.json()["error"]) == (403, "forbidden_handle")
        assert "no slurm scope" in r.json()["message"]
    assert slurm.squeue_started() == 0
    # A scoped tenant naming another's job is refused without its owner's name.
    r = _put(a, "j", "601")
    assert (r.status_code, r.json()["error"]) == (403, "forbidden_handle")
    assert "bob" not in r.text and "physics" not in r.text
    # One scheduler job, one service job: the tenant's second job naming it is a clear 409.
    assert _put(a, "j", "600").status_code == 201
    assert a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "k"}).status_code == 201
    r = _put(a, "k", "600")
    assert (r.status_code, r.json()["error"]) == (409, "conflict") and "already the handle of another" in r.text
    # Slurm's own error and the operator's paths stay in the server log: the 503 says only to retry.
    slurm.fail_with("squeue: error: slurm_receive_msg: Socket timed out on send/recv to ctld-7.internal:6817")
    r = _put(a, "k", "601")
    assert (r.status_code, r.json()["error"]) == (503, "scheduler_unavailable") and r.headers["Retry-After"]
    assert "ctld-7" not in r.text and str(slurm.folder) not in r.text
