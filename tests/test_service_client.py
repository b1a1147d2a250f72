"""PlatformClient against a real server: same decisions as embedded, retries, fail-open with the embedded fallback."""

from __future__ import annotations

import logging
import random
import time

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port, tenant_server

from evalstop_callbacks.client import BoundaryClient, EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, ConflictError, InvalidReportError, Report, paper_spec

HACKING = [(0, 0.2), (10, 0.5), (20, 0.9), (30, 1.1), (40, 1.0), (50, 0.7), (60, 0.4), (70, 0.1)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with tenant_server(tmp_path_factory.mktemp("cli")) as running:
        yield running


def _embedded(job: str, trace, detector=None):
    emb = EmbeddedClient()
    emb.register("rlhf", detector=detector, job_id=job)
    return [emb.report(Report(job, "rlhf", s, v)) for s, v in trace]


def test_platform_client_is_a_boundary_client_with_embedded_decisions(server):
    srv, token = server
    with PlatformClient(srv.url, token, gpus=2, planned_steps=200) as client:
        assert isinstance(client, BoundaryClient)
        job = client.register("rlhf", detector={"name": "k-decline", "params": {"k": 2}}, job_id="pc-1")
        assert client.register("rlhf", detector={"name": "k-decline", "params": {"k": 2}}, job_id="pc-1", gpus=2) == job
        got = [client.report(Report(job, "rlhf", s, v)) for s, v in HACKING]
        assert client.last_source == "service" and client.fallback_decisions == 0
        assert got == _embedded(job, HACKING, paper_spec())
        assert got[5].action is Action.STOP and got[5].best_step == 30
        # A retry of the same report is idempotent.
        assert client.report(Report(job, "rlhf", *HACKING[-1])) == got[-1]
        client.finish(job, "stopped")
    view = httpx.get(f"{srv.url}/v1/jobs/pc-1", headers=auth(token)).json()
    assert view["status"] == "finished" and view["n_reports"] == len(HACKING) and view["stopped_at"] == 50
    assert (view["gpus"], view["planned_steps"]) == (2, 200)  # declared through the client's defaults


def test_contract_errors_are_raised_like_embedded(server):
    srv, token = server
    with PlatformClient(srv.url, token) as client:
        job = client.register("rlhf", job_id="pc-err")
        client.report(Report(job, "rlhf", 10, 0.5))
        with pytest.raises(ConflictError):
            client.report(Report(job, "rlhf", 10, 0.6))
        with pytest.raises(ConflictError):
            client.report(Report(job, "rlhf", 5, 0.6))
        with pytest.raises(InvalidReportError):
            Report(job, "rlhf", 20, float("nan"))
        with pytest.raises(KeyError):
            client.report(Report("never-registered", "rlhf", 0, 0.1))
        with pytest.raises(ValueError, match="already registered"):
            client.register("rlhf", detector={"name": "k-decline", "params": {"k": 5}}, job_id="pc-err")
        with pytest.raises(ValueError):
            client.register("rlhf", detector={"name": "nope"})
    with pytest.raises(ValueError, match="url"):
        PlatformClient("localhost:8080", token)
    with pytest.raises(ValueError, match="gpus"):
        PlatformClient(srv.url, token, gpus=0)


def test_retries_on_5xx_then_succeeds(server):
    srv, token = server
    real = httpx.HTTPTransport()
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if request.url.path.endswith("/evals") and calls["n"] % 3 != 0:
            return httpx.Response(503, json={"error": "unavailable", "message": "try later"})
        return real.handle_request(request)

    with PlatformClient(srv.url, token, transport=httpx.MockTransport(flaky), backoff=0.01) as client:
        job = client.register("rlhf", paper_spec(), job_id="pc-retry")  # the k=2 rule HACKING is written for
        got = [client.report(Report(job, "rlhf", s, v)) for s, v in HACKING]
        assert client.fallback_decisions == 0
    assert got == _embedded(job, HACKING, paper_spec())
    assert calls["n"] > 2 * len(HACKING)


def test_server_down_for_the_whole_run_fails_open_to_the_embedded_core(caplog):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    caplog.set_level(logging.WARNING, logger="evalstop_callbacks.platform_client")
    t0 = time.monotonic()
    with PlatformClient(url, "es_unused", max_retries=2, backoff=0.01, connect_timeout=0.5) as client:
        job = client.register("rlhf", job_id="offline")
        got = [client.report(Report(job, "rlhf", s, v)) for s, v in HACKING]
        assert client.fallback_decisions == len(HACKING) and client.last_source == "fallback"
        assert client.pending(job) == len(HACKING)
        client.finish(job, "stopped")  # never raises on a network fault
    assert got == _embedded(job, HACKING)  # the job stays protected: the fallback (default detector) stops it
    assert time.monotonic() - t0 < 10
    assert any("unreachable" in r.getMessage() for r in caplog.records)

    with PlatformClient(url, "es_unused", max_retries=0, fallback=False) as bare:
        job = bare.register("rlhf")
        decisions = [bare.report(Report(job, "rlhf", s, v)) for s, v in HACKING]
    assert all(d.action is Action.CONTINUE for d in decisions)  # fail-open, unprotected: never a stop


def test_outage_then_recovery_replays_the_backlog(tmp_path):
    db = tmp_path / "outage.db"
    token = add_tenant(db, "acme")
    port = free_port()
    srv = Server(db, port).start()
    rng = random.Random(5)
    trace = [(i * 5, rng.random()) for i in range(12)]
    try:
        with PlatformClient(srv.url, token, max_retries=1, backoff=0.01, connect_timeout=0.5) as client:
            job = client.register("rlhf", detector={"name": "k-decline", "params": {"k": 4}}, job_id="outage")
            got = [client.report(Report(job, "rlhf", s, v)) for s, v in trace[:4]]
            srv.stop()
            got += [client.report(Report(job, "rlhf", s, v)) for s, v in trace[4:8]]
            assert client.pending(job) == 4
            srv.start()
            got += [client.report(Report(job, "rlhf", s, v)) for s, v in trace[8:]]
            assert client.pending(job) == 0 and client.last_source == "service"
        assert got == _embedded(job, trace, {"name": "k-decline", "params": {"k": 4}})
        view = httpx.get(f"{srv.url}/v1/jobs/outage", headers=auth(token)).json()
        assert view["n_reports"] == len(trace)  # the service holds the whole history, in order
    finally:
        srv.stop()


def test_garbage_replies_fail_open_instead_of_raising():
    """A proxy's HTML page, a 429 or a malformed decision never reach the trainer as an exception."""
    replies = iter(
        [
            httpx.Response(201, json={"job_id": "g"}),  # register
            httpx.Response(200, text="<html>gateway</html>"),  # not JSON: retried, then fail open
            httpx.Response(200, text="<html>gateway</html>"),
            httpx.Response(429, json={"error": "slow down", "message": "x"}),  # degraded now: one attempt per report
            httpx.Response(200, json={"action": "explode"}),  # not a decision
        ]
    )
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return next(replies)

    with PlatformClient(
        "http://scheduler.invalid", "es_x", transport=httpx.MockTransport(handler), max_retries=1, backoff=0.001
    ) as client:
        job = client.register("rlhf", job_id="g")
        decisions = [client.report(Report(job, "rlhf", s, v)) for s, v in HACKING[:3]]
    assert client.fallback_decisions == 3 and len(seen) == 5  # every scripted reply was consumed
    assert decisions == _embedded(job, HACKING[:3])


def test_resumed_run_whose_history_differs_from_the_service_keeps_training(server):
    """A run resumed from an older checkpoint re-reports a step with another score: the service says 409, the client
    logs it and lets the local core decide instead of crashing the resumed training."""
    srv, token = server
    with PlatformClient(srv.url, token) as first:
        job = first.register("rlhf", job_id="pc-resume")
        for s, v in HACKING[:4]:
            first.report(Report(job, "rlhf", s, v))
    with PlatformClient(srv.url, token) as resumed:  # fresh local state, as if resumed from the step-10 checkpoint
        resumed.register("rlhf", job_id="pc-resume")
        again = [resumed.report(Report(job, "rlhf", s, v)) for s, v in HACKING[:2]]
        assert again == _embedded(job, HACKING[:2]) and resumed.last_source == "service"  # idempotent re-sends
        d = resumed.report(Report(job, "rlhf", 20, 0.3))  # the service holds 0.9 for step 20
        assert resumed.last_source == "fallback" and d.action is Action.CONTINUE
        later = resumed.report(Report(job, "rlhf", 40, 0.2))  # past the service's last step: accepted again
        assert resumed.last_source == "service" and later.action is Action.CONTINUE
