"""A real ``evalstop-server``: a report's ``planned_steps`` is not a wire field (422), and a job that declared its
planned steps at registration is decided with them, as the embedded core decides a report that carries them; the
``PlatformClient`` sends reports without the field and decides locally with the registered plan too."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from service_support import auth, tenant_server

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Report


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with tenant_server(tmp_path_factory.mktemp("svc")) as running:
        yield running


def _scores(n: int = 60) -> list[float]:
    rng = np.random.default_rng(1)
    steps = np.arange(1, n + 1)
    return [float(v) for v in np.where(steps < 30, steps / 30, 1 - (steps - 30) / 30) + rng.normal(0, 0.05, n)]


def test_planned_steps_on_the_wire_is_refused_and_the_registered_plan_decides(server):
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as http:
        assert http.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "p", "planned_steps": 60}).status_code == 201
        body = {"job_id": "p", "job_type": "rlhf", "step": 1, "eval_score": 0.5, "planned_steps": 60}
        refused = http.post("/v1/jobs/p/evals", json=body)
        assert refused.status_code == 422 and "planned_steps" in refused.text
        embedded = EmbeddedClient()
        embedded.register("rlhf", job_id="p")
        decisions = []
        for step, score in enumerate(_scores(), start=1):
            got = http.post(
                "/v1/jobs/p/evals", json={"job_id": "p", "job_type": "rlhf", "step": step, "eval_score": score}
            )
            assert got.status_code == 200, got.text
            want = embedded.report(Report("p", "rlhf", step, score, planned_steps=60)).to_dict()
            assert got.json() == want
            decisions.append(want)
            if want["action"] == "stop":
                break
    assert decisions[-1]["action"] == "stop" and "planned progress (60 planned steps" in decisions[-1]["reason"]


def test_the_platform_client_sends_no_planned_steps_and_its_local_core_uses_the_registered_plan(server):
    srv, token = server
    with PlatformClient(srv.url, token, planned_steps=60) as client:
        job = client.register("rlhf", job_id="pc")
        for step, score in enumerate(_scores(), start=1):
            decision = client.report(Report(job, "rlhf", step, score, planned_steps=999))
            assert client.last_source == "service"
            if decision.should_stop:
                break
    assert decision.should_stop and "60 planned steps" in decision.reason
