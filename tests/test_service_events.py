"""History, outcome, summary and the audit trail against a real ``evalstop-server`` process on a real SQLite file.

Reports go in until the core stops a job; then the job's history (``GET /v1/jobs/{id}/evals``), its outcome (``GET
/v1/jobs/{id}``), the tenant's totals (``GET /v1/summary``, ``/metrics``) and the events (``GET /v1/events``,
``evalstop-server events``) are read back. Every new route is checked between two tenants; the admin token reads
every tenant's events and nothing else; retention prunes old events and ids stay monotone. The PostgreSQL store's
events and outbox methods run in the ``postgres``-marked test.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port, postgres_database

from platform_sim.core import Report
from platform_sim.service.store import JobRecord

ADMIN = "admin-" + "x" * 40
KDECLINE = {"name": "k-decline", "params": {"k": 2}}
TRACE = ((10, 0.5), (20, 0.6), (30, 0.55), (40, 0.5), (50, 0.45))  # stops at 40 (two declines)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    db = tmp_path / "service.db"
    alice, bob = add_tenant(db, "alice"), add_tenant(db, "bob")
    (tmp_path / "admin.token").write_text(ADMIN + "\n")
    srv = Server(db, free_port(), extra_args=("--admin-token-file", str(tmp_path / "admin.token"))).start()
    try:
        yield {"db": db, "srv": srv, "alice": alice, "bob": bob}
    finally:
        srv.stop()


def _client(env: dict[str, Any], who: str) -> httpx.Client:
    token = ADMIN if who == "admin" else env[who]
    return httpx.Client(base_url=env["srv"].url, headers=auth(token), timeout=10)


def _report(c: httpx.Client, job: str, step: int, score: float) -> httpx.Response:
    return c.post(f"/v1/jobs/{job}/evals", json={"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score})


def _run(c: httpx.Client, job: str, gpus: int | None = 8, planned: int | None = 1000) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"job_type": "rlhf", "job_id": job, "detector": KDECLINE}
    body |= {k: v for k, v in (("gpus", gpus), ("planned_steps", planned)) if v is not None}
    assert c.post("/v1/jobs", json=body).status_code == 201
    out = []
    for step, score in TRACE:
        time.sleep(0.02)  # a measurable step rate
        r = _report(c, job, step, score)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def test_history_outcome_summary_and_events_read_back(env: dict[str, Any]) -> None:
    with _client(env, "alice") as a:
        decisions = _run(a, "j1")
        assert [d["action"] for d in decisions] == ["continue"] * 3 + ["stop"] * 2

        # History: every report, newest first by default, with its decision and receive time; then by step.
        newest = a.get("/v1/jobs/j1/evals").json()
        assert [e["step"] for e in newest["evals"]] == [50, 40, 30, 20, 10] and newest["next_cursor"] is None
        assert [e["decision"] for e in newest["evals"]] == decisions[::-1]
        assert [e["eval_score"] for e in newest["evals"]] == [s for _, s in TRACE][::-1]
        received = [e["received_at"] for e in newest["evals"]]
        assert received == sorted(received, reverse=True) and received[-1] > 1e9
        pages, cursor = [], None
        while True:
            page = a.get(
                "/v1/jobs/j1/evals",
                params={"order": "step", "limit": 2, **({"cursor": cursor} if cursor is not None else {})},
            ).json()
            pages.append([e["step"] for e in page["evals"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == [[10, 20], [30, 40], [50]]
        newest_page = a.get("/v1/jobs/j1/evals", params={"limit": 2, "cursor": 40}).json()
        assert [e["step"] for e in newest_page["evals"]] == [30, 20]

        # Outcome: stop step, best step and score, reason, detector, GPU-hours freed at the measured step rate.
        job = a.get("/v1/jobs/j1").json()
        assert job["status"] == "stopped" and job["stopped_at"] == 40
        assert (job["best_step"], job["best_score"]) == (20, 0.6)
        assert job["stop_reason"] and "2 consecutive declines" in job["stop_reason"]
        assert job["detector"] == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
        by_step = {e["step"]: e["received_at"] for e in newest["evals"]}
        rate = (by_step[40] - by_step[10]) / 30  # seconds per step, as the server measured it
        assert job["gpu_hours_freed"] == pytest.approx(8 * (1000 - 40) * rate / 3600, rel=1e-6)

        # A job that never said its GPUs: null; one that did and runs on: 0.
        _run(a, "nogpus", gpus=None)
        assert a.get("/v1/jobs/nogpus").json()["gpu_hours_freed"] is None
        assert (
            a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "r", "gpus": 2, "planned_steps": 10}).status_code
            == 201
        )
        assert a.get("/v1/jobs/r").json()["gpu_hours_freed"] == 0.0
        assert a.post("/v1/jobs/nogpus/finish", json={"reason": "done"}).status_code == 200

        summary = a.get("/v1/summary").json()
        assert summary == {
            "running": 1,
            "stopped": 1,
            "finished": 1,
            "stopped_total": 2,
            "gpu_hours_freed": pytest.approx(job["gpu_hours_freed"]),
        }

        # The audit trail, in order, followed with `after`.
        events = a.get("/v1/events", params={"limit": 1000}).json()["events"]
        kinds = [(e["type"], e["job_id"]) for e in events]
        assert kinds[0] == ("tenant.added", None)
        j1 = [k for k, job_id in kinds if job_id == "j1"]
        assert j1 == [
            "job.registered",
            "report.accepted",
            "report.accepted",
            "report.accepted",
            "report.accepted",
            "job.stopped",
            "report.accepted",
        ]
        assert kinds[-1] == ("job.finished", "nogpus")
        ids = [e["id"] for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        stop = next(e for e in events if e["type"] == "job.stopped" and e["job_id"] == "j1")
        assert stop["details"]["stop_step"] == 40 and stop["details"]["gpu_hours_freed"] == pytest.approx(
            job["gpu_hours_freed"]
        )
        finished = events[-1]["details"]
        assert finished["reason"] == "done" and finished["stopped"] and finished["gpu_hours_freed"] is None
        half = a.get("/v1/events", params={"after": ids[4], "limit": 3}).json()
        assert [e["id"] for e in half["events"]] == ids[5:8] and half["next_after"] == ids[7]
        assert a.get("/v1/events", params={"after": ids[-1]}).json() == {"events": [], "next_after": ids[-1]}

    # Without the admin token /metrics names no tenant (nor runs the all-tenant summary); with it, each one's totals.
    anonymous = httpx.get(env["srv"].url + "/metrics")
    as_tenant = httpx.get(env["srv"].url + "/metrics", headers={"Authorization": f"Bearer {env['alice']}"})
    for text in (anonymous.text, as_tenant.text):
        assert "alice" not in text and "evalstop_tenant_" not in text and "evalstop_stops_total" in text
    metrics = httpx.get(env["srv"].url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    assert 'evalstop_tenant_jobs{status="stopped",tenant="alice"} 1.0' in metrics
    assert 'evalstop_tenant_jobs{status="finished",tenant="alice"} 1.0' in metrics
    line = next(m for m in metrics.splitlines() if m.startswith('evalstop_tenant_gpu_hours_freed{tenant="alice"}'))
    assert float(line.split()[-1]) == pytest.approx(job["gpu_hours_freed"])


def test_refused_and_repeated_reports_write_no_event(env: dict[str, Any]) -> None:
    with _client(env, "alice") as a:
        assert a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "j", "detector": KDECLINE}).status_code == 201
        assert _report(a, "j", 10, 0.5).status_code == 200
        assert _report(a, "j", 10, 0.5).status_code == 200  # a re-send: the same decision, nothing new
        assert _report(a, "j", 10, 0.7).status_code == 409  # a conflict: refused
        assert _report(a, "j", 5, 0.7).status_code == 409  # older than the last step
        assert a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "j", "detector": KDECLINE}).status_code == 200
        assert a.post("/v1/jobs/j/finish").status_code == 200
        assert a.post("/v1/jobs/j/finish").status_code == 200  # idempotent: one event
        kinds = [e["type"] for e in a.get("/v1/events").json()["events"]]
    assert kinds == ["tenant.added", "job.registered", "report.accepted", "job.finished"]


def test_every_new_route_is_isolated_between_tenants(env: dict[str, Any]) -> None:
    with _client(env, "alice") as a, _client(env, "bob") as b, _client(env, "admin") as admin:
        _run(a, "secret-job")
        r = b.get("/v1/jobs/secret-job/evals")
        assert r.status_code == 404 and r.json() == b.get("/v1/jobs/no-such-job/evals").json() | {
            "message": "no job 'secret-job' for this tenant"
        }
        assert b.get("/v1/summary").json() == {
            "running": 0,
            "stopped": 0,
            "finished": 0,
            "stopped_total": 0,
            "gpu_hours_freed": 0.0,
        }
        bob_events = b.get("/v1/events", params={"limit": 1000}).json()["events"]
        assert [(e["type"], e["details"]) for e in bob_events] == [("tenant.added", {"name": "bob"})]
        assert "secret-job" not in json.dumps(bob_events)
        # The admin token reads every tenant's events, named, and opens no other route.
        every = admin.get("/v1/events", params={"limit": 1000}).json()["events"]
        assert {e["tenant"] for e in every} == {"alice", "bob"}
        assert len(every) == len(a.get("/v1/events", params={"limit": 1000}).json()["events"]) + len(bob_events)
        for path in ("/v1/jobs", "/v1/summary", "/v1/jobs/secret-job", "/v1/jobs/secret-job/evals"):
            assert admin.get(path).status_code == 401, path
    for path in ("/v1/events", "/v1/summary", "/v1/jobs/secret-job/evals"):
        assert httpx.get(env["srv"].url + path).status_code == 401, path
        assert httpx.get(env["srv"].url + path, headers=auth("es_" + "x" * 43)).status_code == 401, path
    with _client(env, "alice") as a:
        assert a.get("/v1/events", params={"tenant": "bob"}).status_code == 422  # no such parameter
        assert a.get("/v1/jobs/secret-job/evals", params={"order": "random"}).status_code == 422
        assert a.get("/v1/jobs/secret-job/evals", params={"limit": 0}).status_code == 422


def test_the_events_cli_reads_the_database(env: dict[str, Any]) -> None:
    with _client(env, "alice") as a:
        _run(a, "j1")
    db = str(env["db"])
    lines = [json.loads(x) for x in cli("events", "--json", "--db", db).stdout.splitlines()]
    assert {x["tenant"] for x in lines} == {"alice", "bob"}
    only = [json.loads(x) for x in cli("events", "--tenant", "bob", "--json", "--db", db).stdout.splitlines()]
    assert [x["type"] for x in only] == ["tenant.added"]
    after = [
        json.loads(x)
        for x in cli("events", "--after", str(lines[2]["id"]), "--limit", "2", "--json", "--db", db).stdout.splitlines()
    ]
    assert [x["id"] for x in after] == [lines[3]["id"], lines[4]["id"]]
    table = cli("events", "--tenant", "alice", "--db", db).stdout
    assert "job.stopped" in table and "j1" in table
    bad = cli("events", "--tenant", "carol", "--db", db, check=False)
    assert bad.returncode == 2 and "no tenant 'carol'" in bad.stderr


def test_bad_serve_flags_are_refused_with_one_line(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    (tmp_path / "short").write_text("abc\n")
    for args, said in (
        (("--admin-token-file", str(tmp_path / "short")), ">= 32 characters"),
        (("--admin-token-file", str(tmp_path / "missing")), "--admin-token-file"),
        (("--event-retention-days", "-1"), "event_retention_days must be >= 0"),
        (("--webhook-backoff-s", "0"), "backoff_s must be a positive number"),
        (("--webhook-max-attempts", "0"), "max_attempts"),
    ):
        proc = cli("serve", "--db", db, "--port", str(free_port()), *args, check=False)
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_retention_prunes_old_events_and_ids_stay_monotone(tmp_path: Path) -> None:
    from platform_sim.service.store_sqlite import SQLiteStore

    db = tmp_path / "s.db"
    store = SQLiteStore(db)
    tenant, _ = store.add_tenant("t")
    store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", KDECLINE))
    hook = store.add_webhook(tenant.tenant_id, "http://127.0.0.1:9/", ("job.finished",))
    for step, score in TRACE:
        store.submit_report(tenant.tenant_id, Report("j", "rlhf", step, score)).result()
    store.finish_job(tenant.tenant_id, "j", "done")  # its event has a pending delivery: kept
    before = store.list_events(None, limit=1000)
    assert len(before) == 9
    assert store.prune_events(time.time() + 60, batch=3) == 8  # everything is "old"; in batches of 3
    kept = store.list_events(None, limit=1000)
    assert [e.type for e in kept] == ["job.finished"] and kept[0].id == before[-1].id
    store.remove_webhook(hook.webhook_id)  # drops the pending delivery
    assert store.prune_events(time.time() + 60) == 0  # the newest event is never pruned
    store.revoke_tenant("t")
    assert store.list_events(None)[-1].id > before[-1].id  # a new id after the largest ever given
    store.close()
    # The serve flag: a server started with a tiny retention prunes at start.
    time.sleep(0.2)
    srv = Server(db, free_port(), extra_args=("--event-retention-days", "0.000001")).start()
    try:
        with sqlite3.connect(db) as conn:
            deadline = time.monotonic() + 10
            while conn.execute("SELECT count(*) FROM events").fetchone()[0] > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert conn.execute("SELECT type FROM events").fetchall() == [("tenant.revoked",)]
    finally:
        srv.stop()


@pytest.mark.postgres
def test_postgres_events_outbox_history_and_summary() -> None:
    with postgres_database("evalstop_events") as url:
        _postgres_events(url)


def _postgres_events(url: str) -> None:
    from platform_sim.service.store_postgres import PostgresStore

    store = PostgresStore(url, workers=2)
    try:
        tenant, _ = store.add_tenant("t")
        other, _ = store.add_tenant("o")
        hook = store.add_webhook(tenant.tenant_id, "http://127.0.0.1:9/", ("job.stopped", "job.finished"))
        store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", KDECLINE, gpus=4, planned_steps=1000))
        for step, score in TRACE:
            time.sleep(0.01)
            store.submit_report(tenant.tenant_id, Report("j", "rlhf", step, score)).result()
        store.finish_job(tenant.tenant_id, "j", "done")
        kinds = [e.type for e in store.list_events(tenant.tenant_id)]
        assert kinds == [
            "tenant.added",
            "job.registered",
            *["report.accepted"] * 4,
            "job.stopped",
            "report.accepted",
            "job.finished",
        ]
        assert [e.type for e in store.list_events(other.tenant_id)] == ["tenant.added"]
        assert len(store.list_events(None)) == len(kinds) + 1
        job = store.get_job(tenant.tenant_id, "j")
        assert job.stopped_at == 40 and job.gpu_hours_freed is not None and job.gpu_hours_freed > 0
        assert [r.step for r in store.list_evals(tenant.tenant_id, "j", limit=2, cursor=40)] == [30, 20]
        assert [r.step for r in store.list_evals(tenant.tenant_id, "j", order="step", limit=2)] == [10, 20]
        s = store.summary(tenant.tenant_id)
        assert (s.running, s.stopped, s.finished, s.stopped_total) == (0, 0, 1, 1)
        assert s.gpu_hours_freed == pytest.approx(job.gpu_hours_freed)
        assert store.summaries() == {tenant.tenant_id: s}
        # The outbox: both events are due; a claim hides them for its lease; a failure reschedules, success deletes.
        now = time.time()
        claimed = store.claim_deliveries(now, lease_s=60)
        assert [d.event.type for d in claimed] == ["job.stopped", "job.finished"] and claimed[
            0
        ].webhook.secret == hook.secret
        assert store.claim_deliveries(now + 1, lease_s=60) == []
        store.finish_delivery(claimed[0], False, {"status": 500}, now + 5, now)
        store.finish_delivery(claimed[1], True, {"status": 204}, None, now)
        (again,) = store.claim_deliveries(now + 61, lease_s=60)
        assert again.outbox_id == claimed[0].outbox_id and again.attempts == 1
        tail = store.list_events(tenant.tenant_id, after=store.list_events(tenant.tenant_id)[-3].id)
        assert [e.type for e in tail] == ["webhook.failed", "webhook.delivered"]
        assert store.prune_events(time.time() + 60) == len(kinds) + 2 - 1  # all but the newest and the pending one
        store.revoke_tenant("o")
        assert store.list_events(None)[-1].type == "tenant.revoked"
        store.remove_webhook(hook.webhook_id)
        assert store.list_webhooks() == []
    finally:
        store.close()
