"""The boundary clients run ``default_spec()`` when given no detector, and PlatformClient's local fallback core runs
the spec the service registered."""

from __future__ import annotations

import httpx
import pytest
from service_support import auth, free_port, tenant_server

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, Report, default_spec, detector_from_spec, paper_spec

# A run whose score falls once, by a little, after its peak: the paper's k=2 rule never stops it, so a local core
# that silently ran the paper's rule instead of the service's would decide otherwise.
SCORES = [(0, 0.1), (10, 0.3), (20, 0.5), (30, 0.7), (40, 0.9), (50, 0.2)]


DEFAULT = detector_from_spec(default_spec()).spec()  # normalized: every parameter filled in
PAPER = detector_from_spec(paper_spec()).spec()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with tenant_server(tmp_path_factory.mktemp("defaults")) as running:
        yield running


def test_embedded_client_registers_the_default_spec_when_given_none():
    client = EmbeddedClient()
    job = client.register("rlhf", job_id="plain")
    assert client.monitor(job).detector.spec() == DEFAULT != PAPER
    paper = client.register("rlhf", detector=paper_spec(), job_id="paper")
    assert client.monitor(paper).detector.spec() == PAPER
    assert client.register("rlhf", job_id="plain") == job  # a resume without a detector keeps the default


def test_platform_client_fallback_core_runs_the_spec_the_real_service_registered(server):
    srv, token = server
    with PlatformClient(srv.url, token) as client:
        job = client.register("rlhf", job_id="default-spec")
        view = httpx.get(f"{srv.url}/v1/jobs/{job}", headers=auth(token)).json()
        assert view["detector"] == DEFAULT
        assert client.monitor(job).detector.spec() == view["detector"]


def test_platform_client_offline_fallback_core_runs_the_default_spec():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with PlatformClient(url, "es_unused", max_retries=0, connect_timeout=0.5) as client:
        job = client.register("rlhf", job_id="offline")
        assert client.monitor(job).detector.spec() == DEFAULT
        decisions = [client.report(Report(job, "rlhf", s, v)) for s, v in SCORES]
    embedded = EmbeddedClient()
    embedded.register("rlhf", job_id="offline")
    assert decisions == [embedded.report(Report("offline", "rlhf", s, v)) for s, v in SCORES]


def test_platform_client_fallback_core_adopts_the_detector_named_in_the_registration_reply():
    # A service whose default is the paper's rule: its registration reply names that spec, then it goes away.
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return httpx.Response(201, json={"job_id": "svc", "job_type": "rlhf", "detector": paper_spec()})
        return httpx.Response(503, json={"error": "down", "message": "maintenance"})

    transport = httpx.MockTransport(handler)
    with PlatformClient("http://scheduler.invalid", "es_x", transport=transport, max_retries=0) as client:
        job = client.register("rlhf", job_id="svc")
        assert client.monitor(job).detector.spec() == PAPER
        decisions = [client.report(Report(job, "rlhf", s, v)) for s, v in SCORES]
    assert client.fallback_decisions == len(SCORES)
    paper = EmbeddedClient()
    paper.register("rlhf", detector=paper_spec(), job_id="svc")
    assert decisions == [paper.report(Report("svc", "rlhf", s, v)) for s, v in SCORES]
    assert decisions[-1].action is Action.CONTINUE  # one decline: the paper's rule waits for a second
