"""The service's actuator plumbing without a scheduler to act on: tenant scopes, the stop action written in the stop
decision's transaction, the actuate worker's claim, lease, backoff and giving up, and the refusals of
``PUT /v1/jobs/{id}/scheduler-handle`` that need no scheduler (its 201/404 against a live one are in
``test_actuate_ray.py``).

The failing actuator is the real Ray actuator pointed at a loopback port where nothing listens: every call is a
real connection refused. Both stores: a real SQLite file, and a fresh database on the test PostgreSQL server
(marked ``postgres``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port, postgres_database

from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.actuators import ActuatorUnavailable, SchedulerHandle, make_actuator
from platform_sim.actuators.base import ActionResult, HandleRefused, TenantScope
from platform_sim.core import Report, default_spec
from platform_sim.service.actuate import ActuateSettings, ActuationWorker, parse_actuators
from platform_sim.service.store import JobRecord
from platform_sim.service.store_actuation import HandleConflict
from platform_sim.service.store_sqlite import SQLiteStore

pytest.importorskip("ray.job_submission", reason="the Ray actuator needs ray[default]")

# Rises, then falls: the default detector stops it after a few declines.
CURVE = [0.30, 0.42, 0.50, 0.55, 0.57, 0.56, 0.52, 0.47, 0.41, 0.35, 0.30, 0.25]


def _dead_address() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a port just freed: nothing listens there


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "service.db")
        try:
            yield s
        finally:
            s.close()
        return
    from platform_sim.service.store_postgres import PostgresStore

    with postgres_database("evalstop_act") as url:
        s = PostgresStore(url, workers=2)
        try:
            yield s
        finally:
            s.close()


def _stop(store: Any, tenant_id: int, job_id: str) -> int:
    """Report CURVE until the core stops the job; the stopping step."""
    store.register_job(tenant_id, JobRecord(job_id, "rlhf", default_spec()))
    for i, score in enumerate(CURVE):
        outcome = store.submit_report(tenant_id, Report(job_id, "rlhf", 10 * (i + 1), score)).result()
        if outcome.stopped_now:
            return 10 * (i + 1)
    raise AssertionError("the curve never stopped")


def _events(store: Any, kind_prefix: str) -> list[Any]:
    return [e for e in store.list_events(None, 0, 1000) if e.type.startswith(kind_prefix)]


def test_a_stop_queues_its_action_in_the_transaction_of_the_decision(store: Any) -> None:
    tenant, _ = store.add_tenant("acme")
    tid = tenant.tenant_id
    for job in ("with-handle", "before-stop"):
        store.register_job(tid, JobRecord(job, "rlhf", default_spec()))
    record, created = store.register_handle(tid, "with-handle", SchedulerHandle("ray", "acme-1"))
    assert created and record.actuation is None  # not stopped yet: nothing to do
    assert store.register_handle(tid, "with-handle", SchedulerHandle("ray", "acme-1"))[1] is False  # idempotent
    with pytest.raises(HandleConflict, match="registered once"):
        store.register_handle(tid, "with-handle", SchedulerHandle("ray", "acme-2"))

    step = _stop(store, tid, "with-handle")
    _stop(store, tid, "no-handle")
    [action] = store.list_actuations()
    assert (action.job_id, action.handle, action.state, action.phase) == (
        "with-handle",
        SchedulerHandle("ray", "acme-1"),
        "pending",
        0,
    )
    # Written by the report that stopped the job, in its transaction: the same server time as its job.stopped event.
    [stopped] = [e for e in _events(store, "job.stopped") if e.job_id == "with-handle"]
    assert stopped.details["stop_step"] == step and action.created_at == stopped.time
    # A re-send of the stopping step, and the reports after the stop, queue nothing more.
    store.submit_report(tid, Report("with-handle", "rlhf", step, CURVE[step // 10 - 1])).result()
    store.submit_report(tid, Report("with-handle", "rlhf", 1000, 0.1)).result()
    assert len(store.list_actuations()) == 1

    # A job that stopped before it registered its handle gets its action at the registration.
    _stop(store, tid, "stopped-first")
    record, created = store.register_handle(tid, "stopped-first", SchedulerHandle("ray", "acme-3"))
    assert created and record.actuation is not None and record.actuation.state == "pending"
    assert [a.job_id for a in store.list_actuations()] == ["with-handle", "stopped-first"]
    assert store.scheduler_handle(tid, "no-handle") is None


def test_a_failing_actuator_is_retried_with_backoff_then_given_up(store: Any) -> None:
    tenant, _ = store.add_tenant("acme")
    store.add_tenant_scope(tenant.tenant_id, [("ray", "acme-")])
    _stop(store, tenant.tenant_id, "j")
    store.register_handle(tenant.tenant_id, "j", SchedulerHandle("ray", "acme-1"))
    settings = ActuateSettings(lease_s=30, backoff_s=0.2, backoff_max_s=0.3, max_attempts=4)
    worker = ActuationWorker(store, {"ray": make_actuator("ray", {"address": _dead_address()})}, settings)
    runs = []
    deadline = time.monotonic() + 30
    while store.list_actuations()[0].state == "pending":
        assert time.monotonic() < deadline, "never given up"
        runs.append(worker.run_once())
        time.sleep(0.02)
    assert sum(runs) == 4 and runs.count(0) > 0  # four attempts, and rounds in between when none was due
    types = [e.type for e in _events(store, "actuation.")]
    assert types == ["actuation.started", "actuation.failed"] * 4 + ["actuation.given_up"]
    failed = [e for e in _events(store, "actuation.failed")]
    # Backoff doubles from backoff_s and is capped at backoff_max_s; the last failure schedules nothing.
    gaps = [None if e.details["next_attempt_at"] is None else e.details["next_attempt_at"] - e.time for e in failed]
    assert [g if g is None else round(g, 6) for g in gaps] == [0.2, 0.3, 0.3, None]
    assert [e.details["attempt"] for e in failed] == [1, 2, 3, 4]
    assert all("Failed to connect to Ray" in e.details["detail"] and e.details["retryable"] for e in failed)
    assert failed[0].details["action"].startswith("ray stop_job acme-1 at http://127.0.0.1:")
    [action] = store.list_actuations()
    assert (action.state, action.attempts) == ("given_up", 4)
    assert worker.run_once() == 0  # given up: never claimed again


def test_a_claim_holds_its_lease_and_a_lost_claim_records_nothing(store: Any) -> None:
    tenant, _ = store.add_tenant("acme")
    _stop(store, tenant.tenant_id, "j")
    store.register_handle(tenant.tenant_id, "j", SchedulerHandle("ray", "acme-1"))
    [first] = store.claim_actuations(time.time(), lease_s=0.5)
    assert store.claim_actuations(time.time(), lease_s=0.5) == []  # held by the first claim
    time.sleep(0.6)
    [second] = store.claim_actuations(time.time(), lease_s=30)  # the first worker "died": its lease ran out
    assert (first.claims, second.claims) == (1, 2)
    done = ActionResult(True, "ray stop_job acme-1", "stop requested")
    assert store.finish_actuation(first, done, None, time.time()) is False  # the late worker cannot overwrite
    assert store.finish_actuation(second, done, None, time.time()) is True
    assert store.finish_actuation(second, done, None, time.time()) is False  # recorded once
    [action] = store.list_actuations()
    assert (action.state, action.last_detail) == ("done", "stop requested")
    assert [e.type for e in _events(store, "actuation.")] == ["actuation.started"] * 2 + ["actuation.succeeded"]
    assert store.claim_actuations(time.time() + 3600, lease_s=30) == []  # a phase done is never run again


def test_one_scheduler_job_is_the_handle_of_one_service_job(store: Any) -> None:
    a, _ = store.add_tenant("a")
    b, _ = store.add_tenant("b")
    for tenant, job in ((a, "first"), (a, "second"), (b, "theirs")):
        store.register_job(tenant.tenant_id, JobRecord(job, "rlhf", default_spec()))
    store.register_handle(a.tenant_id, "first", SchedulerHandle("slurm", "1234"))
    for tenant, job in ((a, "second"), (b, "theirs")):  # the same tenant's other job, or another tenant's
        with pytest.raises(HandleConflict, match="'1234' is already the handle of another service job") as err:
            store.register_handle(tenant.tenant_id, job, SchedulerHandle("slurm", "1234"))
        assert "first" not in str(err.value)  # whose is not said
    assert store.register_handle(a.tenant_id, "first", SchedulerHandle("slurm", "1234"))[1] is False  # a re-send
    store.register_handle(a.tenant_id, "second", SchedulerHandle("ray", "1234"))  # another scheduler's 1234
    # Once its service job finished, the scheduler's id is free again (schedulers reuse ids).
    store.finish_job(a.tenant_id, "first", "done")
    assert store.register_handle(b.tenant_id, "theirs", SchedulerHandle("slurm", "1234"))[1] is True


def test_a_ray_prefix_covers_ids_at_a_word_end_and_overlaps_are_warned(tmp_path: Path) -> None:
    ray = make_actuator("ray", {"address": _dead_address()})
    scope = TenantScope("acme", {"ray": frozenset({"acme"})})
    for ref in ("acme", "acme-7", "acme.7", "acme_7", "acme:7"):
        ray.check_owner(SchedulerHandle("ray", ref), scope)  # asks nothing of the (dead) cluster
    for ref in ("acmecorp-7", "acme7", "acm"):
        with pytest.raises(HandleRefused, match="does not start with one of this tenant's prefixes"):
            ray.check_owner(SchedulerHandle("ray", ref), scope)
    db = tmp_path / "service.db"
    add_tenant(db, "acme")
    add_tenant(db, "acmecorp")
    first = cli("tenant", "scope", "acme", "--ray-prefix", "acme", "--db", str(db))
    assert first.stderr == ""
    apart = cli("tenant", "scope", "acmecorp", "--ray-prefix", "acmecorp-", "--db", str(db))
    assert apart.stderr == ""  # acme covers none of acmecorp-'s ids
    both = cli("tenant", "scope", "acmecorp", "--ray-prefix", "acme-team-", "--db", str(db))
    assert "warning: --ray-prefix 'acme-team-' overlaps tenant 'acme''s 'acme'" in both.stderr
    assert '"acme-team-"' not in both.stdout and "acme-team-" in both.stdout  # added all the same


def test_tenant_scopes_in_the_store(store: Any) -> None:
    a, _ = store.add_tenant("a")
    b, _ = store.add_tenant("b")
    store.add_tenant_scope(a.tenant_id, [("ray", "a-"), ("slurm", "account:alpha"), ("ray", "a-")])
    store.add_tenant_scope(b.tenant_id, [("ray", "b-")])
    scope = store.tenant_scope(a.tenant_id, "a")
    assert scope.owners("ray") == {"a-"} and scope.owners("slurm") == {"account:alpha"}
    assert scope.owners("kubernetes") == frozenset() and scope.tenant == "a"
    assert store.remove_tenant_scope(a.tenant_id, [("ray", "a-"), ("ray", "zzz")]) == 1
    assert dict(store.tenant_scope(a.tenant_id).allowed) == {"slurm": {"account:alpha"}}
    assert store.remove_tenant_scope(a.tenant_id) == 1
    assert dict(store.tenant_scope(a.tenant_id).allowed) == {}
    assert store.tenant_scope(b.tenant_id).owners("ray") == {"b-"}  # another tenant's scope is its own


def test_the_registry_names_what_is_wrong() -> None:
    with pytest.raises(ActuatorUnavailable, match="unknown actuator kind 'lsf': choose from slurm, kubernetes, ray"):
        make_actuator("lsf", {})
    with pytest.raises(ActuatorUnavailable, match="give address="):
        make_actuator("ray", {})
    with pytest.raises(ActuatorUnavailable, match="unknown option.*colour"):
        make_actuator("ray", {"address": "http://x:1", "colour": "red"})
    with pytest.raises(ValueError, match="with 2 actuators name the kind"):
        parse_actuators(["ray", "slurm"], ["address=http://x:1"])
    with pytest.raises(ValueError, match="no --actuator kubernetes given"):
        parse_actuators(["ray"], ["kubernetes.namespace=x"])
    assert parse_actuators(["ray"], ["ray.address=http://x:1", "timeout_s=3"])["ray"].timeout_s == 3.0  # type: ignore[attr-defined]
    for bad in (("ray",), ("ray", ""), "slurm:1"):
        with pytest.raises(ValueError, match="scheduler_handle must be 'auto', \\(kind, ref\\) or None"):
            PlatformClient("http://127.0.0.1:1", "t", scheduler_handle=bad)  # type: ignore[arg-type]


def _server_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``evalstop-server ARGS`` in this process (its exit code, stdout, stderr): the same command line as the
    installed script, without an interpreter start per call (the servers of these tests run as processes)."""
    from platform_sim.service.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_scope_cli_and_the_handle_refusals_of_a_real_server(tmp_path: Path, caplog: Any, capsys: Any) -> None:
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    add_tenant(db, "other")
    code, out, _ = _server_cli(
        capsys, "tenant", "scope", "acme", "--ray-prefix", "acme-", "--slurm-account", "ml", "--db", str(db), "--json"
    )
    assert code == 0 and json.loads(out) == {"tenant": "acme", "allowed": {"ray": ["acme-"], "slurm": ["account:ml"]}}
    code, shown, _ = _server_cli(capsys, "tenant", "scope", "acme", "--db", str(db))
    assert code == 0 and "ray          acme-" in shown and "slurm        account:ml" in shown
    code, removed, _ = _server_cli(
        capsys, "tenant", "scope", "acme", "--slurm-account", "ml", "--remove", "--db", str(db), "--json"
    )
    assert code == 0 and json.loads(removed)["allowed"] == {"ray": ["acme-"]}
    code, _, err = _server_cli(capsys, "tenant", "scope", "nobody", "--db", str(db))
    assert code == 2 and "no tenant named 'nobody'" in err
    code, _, err = _server_cli(capsys, "serve", "--db", str(db), "--actuator", "ray")
    assert code == 2 and "--actuator ray: the ray actuator refused its options: give address=" in err
    code, _, err = _server_cli(capsys, "serve", "--db", str(db), "--actuate")
    assert code == 2 and "--actuate needs at least one --actuator" in err

    dead = _dead_address()
    srv = Server(db, free_port(), extra_args=("--actuator", "ray", "--actuator-option", f"address={dead}")).start()
    try:
        h = auth(token)
        assert httpx.post(f"{srv.url}/v1/jobs", json={"job_id": "j", "job_type": "rlhf"}, headers=h).status_code == 201
        url = f"{srv.url}/v1/jobs/j/scheduler-handle"

        def put(body: dict[str, Any], path: str = url) -> tuple[int, str, str]:
            r = httpx.put(path, json=body, headers=h, timeout=30)
            return r.status_code, r.json()["error"], r.json()["message"]

        assert put({"kind": "slurm", "ref": "1234"}) == (
            422,
            "unknown_kind",
            "kind 'slurm': this server has no such actuator (configured: ray)",
        )
        assert put({"kind": "ray", "ref": "acme 1"})[:2] == (400, "malformed_handle")
        assert put({"kind": "ray", "ref": "other-1"}) == (
            403,
            "forbidden_handle",
            "ray job 'other-1': the submission id does not start with one of this tenant's prefixes (1)",
        )
        assert put({"kind": "ray", "ref": "acme-1"}, f"{srv.url}/v1/jobs/nope/scheduler-handle")[:2] == (
            404,
            "not_found",
        )
        status, code, message = put({"kind": "ray", "ref": "acme-1"})  # in scope, but the cluster is down
        # Why it failed is the operator's (the server log): the tenant learns nothing of the cluster's address.
        assert (status, code, message) == (
            503,
            "scheduler_unavailable",
            "the ray scheduler could not be asked now; try again later",
        )
        assert put({"kind": "ray", "ref": "acme-1", "extra": 1})[:2] == (422, "invalid_request")
        r = httpx.get(url, headers=h)
        assert (r.status_code, r.json()["error"]) == (404, "no_handle")

        # The client registers its handle once; refused, it logs why and the job still reports to the service.
        with caplog.at_level(logging.ERROR), PlatformClient(srv.url, token, scheduler_handle=("ray", "other-7")) as c:
            c.register("rlhf", job_id="k")
            c.report(Report("k", "rlhf", 10, 0.5))
            c.report(Report("k", "rlhf", 20, 0.6))
            assert c.last_source == "service"
        refusals = [r.getMessage() for r in caplog.records if "refused the ray handle" in r.getMessage()]
        assert len(refusals) == 1 and "403" in refusals[0]
    finally:
        srv.stop()


def test_serve_actuate_runs_the_worker_inside_the_server(tmp_path: Path) -> None:
    # The handle is stored through the store (a dead cluster cannot authorize it over HTTP): this pins that
    # `serve --actuate` runs the worker and that its failures reach the tenant's events and handle view.
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    store = SQLiteStore(db)
    try:
        [tenant] = store.list_tenants()
        store.add_tenant_scope(tenant.tenant_id, [("ray", "acme-")])
        _stop(store, tenant.tenant_id, "j")
        store.register_handle(tenant.tenant_id, "j", SchedulerHandle("ray", "acme-1"))
    finally:
        store.close()
    flags = ("--actuator", "ray", "--actuator-option", f"address={_dead_address()}", "--actuate")
    flags += ("--actuate-backoff-s", "0.1", "--actuate-max-attempts", "2", "--actuate-poll-s", "0.1")
    srv = Server(db, free_port(), extra_args=flags).start()
    try:
        h = auth(token)
        deadline = time.monotonic() + 30
        while True:
            view = httpx.get(f"{srv.url}/v1/jobs/j/scheduler-handle", headers=h).json()
            if view["actuation"]["state"] != "pending" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert view["actuation"]["state"] == "given_up" and view["actuation"]["attempts"] == 2
        assert "Failed to connect to Ray" in view["actuation"]["last_detail"]
        types = [e["type"] for e in httpx.get(f"{srv.url}/v1/events?limit=1000", headers=h).json()["events"]]
        assert [t for t in types if t.startswith("actuation.")] == [
            "actuation.started",
            "actuation.failed",
            "actuation.started",
            "actuation.failed",
            "actuation.given_up",
        ]
    finally:
        srv.stop()
