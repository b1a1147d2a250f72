"""The service's API against a real ``evalstop-server`` process and SQLite file: same decisions as the core."""

from __future__ import annotations

import random

import httpx
import pytest
from service_support import auth, overoptimization_reports, tenant_server

from evalstop_callbacks.client import EmbeddedClient
from platform_sim.core import Report, default_spec, detector_from_spec

# The paper's rule, named explicitly where a test drives a hand-made score sequence built for k=2.
PAPER = {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with tenant_server(tmp_path_factory.mktemp("svc")) as running:
        yield running


@pytest.fixture()
def http(server):
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as c:
        yield c


def _register(http: httpx.Client, job_id: str, **extra) -> httpx.Response:
    return http.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job_id, **extra})


def _report(http: httpx.Client, job_id: str, step: int, score: float, job_type: str = "rlhf") -> httpx.Response:
    return http.post(
        f"/v1/jobs/{job_id}/evals", json={"job_id": job_id, "job_type": job_type, "step": step, "eval_score": score}
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decisions_equal_embedded_core(http, seed):
    rng = random.Random(seed)
    detector = {"name": "k-decline", "params": {"k": rng.choice([1, 2, 3]), "min_delta": rng.choice([0.0, 0.05])}}
    job = f"eq-{seed}"
    assert _register(http, job, detector=detector).status_code == 201
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector=detector, job_id=job)
    score = 0.0
    saw_stop = False
    for i in range(30):
        score += rng.gauss(0.02, 0.05)
        resp = _report(http, job, 10 * i, score)
        assert resp.status_code == 200, resp.text
        expected = embedded.report(Report(job, "rlhf", 10 * i, score)).to_dict()
        assert resp.json() == expected
        saw_stop |= expected["action"] == "stop"
    job_view = http.get(f"/v1/jobs/{job}").json()
    monitor = embedded.monitor(job)
    assert job_view["n_reports"] == 30
    assert (job_view["best_step"], job_view["best_score"]) == (monitor.best_step, monitor.best_score)
    assert job_view["status"] == ("stopped" if saw_stop else "running")
    assert job_view["stopped_at"] == monitor.stopped_at


def test_register_defaults_idempotency_and_conflicts(http):
    resp = http.post("/v1/jobs", json={"job_type": "dpo"})
    assert resp.status_code == 201
    made_up = resp.json()
    assert made_up["job_id"].startswith("job-")
    assert made_up["detector"] == detector_from_spec(default_spec()).spec()

    first = _register(http, "reg-1", gpus=8, detector={"name": "k-decline", "params": {"k": 2}})
    assert first.status_code == 201
    # The answer names the full spec the job runs (every parameter filled in): what a client's fallback core runs.
    assert first.json()["detector"] == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
    again = _register(http, "reg-1", gpus=8, detector={"name": "k-decline", "params": {"k": 2, "min_delta": 0}})
    assert again.status_code == 200 and again.json()["job_id"] == "reg-1"
    other = _register(http, "reg-1", gpus=8, detector={"name": "k-decline", "params": {"k": 3}})
    assert other.status_code == 409
    assert "already registered" in other.json()["message"]

    bad_param = _register(http, "reg-2", detector={"name": "k-decline", "params": {"k": 0}})
    assert bad_param.status_code == 422 and "k must be an integer >= 1" in bad_param.json()["message"]
    unknown = _register(http, "reg-3", detector={"name": "no-such-rule"})
    assert unknown.status_code == 422 and "unknown detector 'no-such-rule'" in unknown.json()["message"]
    stray = _register(http, "reg-4", detector={"name": "k-decline", "params": {"window": 3}})
    assert stray.status_code == 422 and "bad parameters" in stray.json()["message"]
    bad_type = http.post("/v1/jobs", json={"job_type": "pretraining"})
    assert bad_type.status_code == 422 and "job_type" in bad_type.json()["message"]


def test_resend_conflicts_and_stop_latch(http):
    job = "latch"
    assert _register(http, job, detector=PAPER).status_code == 201
    decisions = [_report(http, job, s, v).json() for s, v in [(0, 0.5), (5, 0.9), (10, 0.8), (15, 0.7)]]
    assert [d["action"] for d in decisions] == ["continue", "continue", "continue", "stop"]
    assert decisions[-1]["best_step"] == 5

    # Re-send of a stored step with the same score: the same decision it got then, nothing stored twice.
    assert _report(http, job, 10, 0.8).json() == decisions[2]
    different = _report(http, job, 10, 0.81)
    assert different.status_code == 409 and "already reported step 10" in different.json()["message"]
    older = _report(http, job, 7, 0.8)
    assert older.status_code == 409 and "older than the last reported step 15" in older.json()["message"]
    wrong_type = _report(http, job, 20, 0.9, job_type="sft")
    assert wrong_type.status_code == 409 and "is of type 'rlhf'" in wrong_type.json()["message"]

    # A stopped job stays stopped, even when its score recovers; its best stays the one before the stop.
    later = _report(http, job, 20, 5.0).json()
    assert later["action"] == "stop" and later["declines"] == 0 and later["best_step"] == 5
    assert http.get(f"/v1/jobs/{job}").json()["n_reports"] == 5


def test_finish_then_reports_refused(http):
    job = "fin"
    assert _register(http, job).status_code == 201
    assert _report(http, job, 0, 0.1).status_code == 200
    done = http.post(f"/v1/jobs/{job}/finish", json={"reason": "completed"})
    assert done.status_code == 200 and done.json()["status"] == "finished"
    assert done.json()["finish_reason"] == "completed"
    again = http.post(f"/v1/jobs/{job}/finish", json={"reason": "failed"})  # idempotent, first reason kept
    assert again.status_code == 200 and again.json()["finish_reason"] == "completed"
    late = _report(http, job, 1, 0.2)
    assert late.status_code == 409 and "finished" in late.json()["message"]
    assert http.post("/v1/jobs/nope/finish").status_code == 404


def test_list_pagination_and_status_filter(http):
    for i in range(5):
        assert _register(http, f"page-{i}").status_code == 201
    assert _report(http, "page-0", 0, 1.0).status_code == 200
    http.post("/v1/jobs/page-1/finish")
    seen, after = [], None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = http.get("/v1/jobs", params=params).json()
        seen += [j["job_id"] for j in page["jobs"]]
        after = page["next_after"]
        if after is None:
            break
    assert [s for s in seen if s.startswith("page-")] == [f"page-{i}" for i in range(5)]
    assert seen == sorted(seen)
    finished = [j["job_id"] for j in http.get("/v1/jobs", params={"status": "finished"}).json()["jobs"]]
    assert "page-1" in finished and "page-0" not in finished
    assert http.get("/v1/jobs", params={"status": "bogus"}).status_code == 422


def test_operator_endpoints_and_metrics(server, http):
    srv, _ = server
    assert httpx.get(f"{srv.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{srv.url}/readyz").status_code == 200

    def counter(text: str, name: str) -> float:
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        )

    before = httpx.get(f"{srv.url}/metrics").text
    job = "metered"
    assert _register(http, job, gpus=4, planned_steps=1000, detector=PAPER).status_code == 201
    for step, score in [(0, 1.0), (100, 2.0), (200, 1.0), (300, 0.5)]:
        _report(http, job, step, score)
    after = httpx.get(f"{srv.url}/metrics").text
    assert (
        counter(after, 'evalstop_reports_total{outcome="accepted"}')
        - counter(before, 'evalstop_reports_total{outcome="accepted"}')
        == 4
    )
    assert counter(after, "evalstop_stops_total") - counter(before, "evalstop_stops_total") == 1
    assert counter(after, "evalstop_gpus_freed_total") - counter(before, "evalstop_gpus_freed_total") == 4
    assert counter(after, "evalstop_gpu_hours_reclaimed_total") > counter(before, "evalstop_gpu_hours_reclaimed_total")
    assert (
        counter(after, "evalstop_report_latency_seconds_count")
        - counter(before, "evalstop_report_latency_seconds_count")
        == 4
    )
    assert "metered" not in after  # no job ids or tenant names in metrics


def test_openapi_spec_is_versioned_and_declares_bearer_auth(server):
    srv, _ = server
    spec = httpx.get(f"{srv.url}/openapi.json").json()
    paths = {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/evals", "/v1/jobs/{job_id}/finish"}
    assert paths <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    report = spec["components"]["schemas"]["ReportIn"]
    assert report["additionalProperties"] is False
    assert set(report["properties"]) == {
        "job_id",
        "job_type",
        "step",
        "eval_score",
        "eval_scores",
        "eval_std",
        "eval_n",
    }
    detector = spec["components"]["schemas"]["JobOut"]["properties"]["detector"]
    assert detector["$ref"].endswith("/DetectorSpec") and "default detector" in detector["description"]
    # The description says what a job registered without a detector runs: the default spec, in its own numbers.
    from platform_sim.core import default_spec

    params = default_spec()["params"]
    named = f"`{default_spec()['name']}` (window {params['window']}, alpha {params['alpha']}, k {params['k']})"
    assert named in spec["info"]["description"] and '"k-decline"' in spec["info"]["description"]


def test_report_fast_path_answers_exactly_like_the_fastapi_route(tmp_path):
    """The report endpoint is served by a lean ASGI fast path; the FastAPI route it shadows must answer the same."""
    from fastapi.testclient import TestClient

    from platform_sim.service.app import create_app
    from platform_sim.service.store_sqlite import SQLiteStore

    requests = [
        ("good", {"job_id": "j", "job_type": "rlhf", "step": 0, "eval_score": 1.0}, None),
        ("good", {"job_id": "j", "job_type": "rlhf", "step": 5, "eval_score": 0.5}, None),
        ("resend", {"job_id": "j", "job_type": "rlhf", "step": 5, "eval_score": 0.5}, None),
        ("conflict", {"job_id": "j", "job_type": "rlhf", "step": 5, "eval_score": 0.6}, None),
        ("older", {"job_id": "j", "job_type": "rlhf", "step": 1, "eval_score": 0.6}, None),
        ("unknown field", {"job_id": "j", "job_type": "rlhf", "step": 9, "eval_score": 0.6, "loss": 1.0}, None),
        ("negative step", {"job_id": "j", "job_type": "rlhf", "step": -1, "eval_score": 0.6}, None),
        ("path mismatch", {"job_id": "k", "job_type": "rlhf", "step": 9, "eval_score": 0.6}, None),
        ("stop", {"job_id": "j", "job_type": "rlhf", "step": 10, "eval_score": 0.1}, None),
        ("no token", {"job_id": "j", "job_type": "rlhf", "step": 11, "eval_score": 0.1}, "none"),
        ("bad token", {"job_id": "j", "job_type": "rlhf", "step": 11, "eval_score": 0.1}, "bad"),
        ("unknown job", {"job_id": "zz", "job_type": "rlhf", "step": 0, "eval_score": 0.1}, "zz"),
    ]
    answers = {}
    for fast in (True, False):
        store = SQLiteStore(tmp_path / f"fast-{fast}.db")
        _, token = store.add_tenant("t")
        with TestClient(create_app(store, fast_path=fast, close_store=True)) as c:
            assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "j"}, headers=auth(token)).status_code == 201
            got = []
            for name, body, special in requests:
                headers = {} if special == "none" else auth("es_wrong" if special == "bad" else token)
                job = "zz" if special == "zz" else "j"
                resp = c.post(f"/v1/jobs/{job}/evals", json=body, headers=headers)
                got.append((name, resp.status_code, resp.json()))
            answers[fast] = got
    assert answers[True] == answers[False]
    assert [s for _, s, _ in answers[True]] == [200, 200, 200, 409, 409, 422, 422, 422, 200, 401, 401, 404]


@pytest.mark.parametrize("name", ["k-decline-se", "paired-test", "cusum", "trend", "shape"])
def test_noise_robust_detectors_by_name_with_per_example_scores(http, name):
    # Every detector is selected by name and parameters through the service, reads the per-example scores of the
    # report, and decides exactly as the embedded core; a clear overoptimization curve is stopped.
    detector = {"name": name, "params": {"warmup": 1}}
    job = f"robust-{name}"
    assert _register(http, job, detector=detector).status_code == 201
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector=detector, job_id=job)
    decisions = []
    for rep in overoptimization_reports(job, peak_eval=8, examples=32, seed=7):
        resp = http.post(f"/v1/jobs/{job}/evals", json=rep.to_dict())
        assert resp.status_code == 200, resp.text
        expected = embedded.report(rep)
        assert resp.json() == expected.to_dict()
        decisions.append(expected.action.value)
        if expected.action.value == "stop":
            break
    assert decisions[-1] == "stop", name
    assert http.get(f"/v1/jobs/{job}").json()["detector"] == embedded.monitor(job).detector.spec()


def test_the_job_view_says_whether_its_false_stops_are_bounded_per_run(http):
    # The default detector bounds its false stops over the run with the job's planned_steps; without them it tests
    # every report on its own. The registration's answer, the job view and the listing say which; a detector whose
    # decisions do not depend on a plan (the paper's rule, the per-look trend) gets null.
    cases = {
        "bound-plan": ({"planned_steps": 300}, True),
        "bound-none": ({}, False),
        "bound-paper": ({"planned_steps": 300, "detector": PAPER}, None),
        "bound-window": ({"detector": {"name": "trend", "params": {"means_test": "window"}}}, None),
    }
    for job, (extra, want) in cases.items():
        created = _register(http, job, **extra)
        assert created.status_code == 201, created.text
        assert created.json()["per_run_bound"] is want, job
        assert http.get(f"/v1/jobs/{job}").json()["per_run_bound"] is want, job
    listed = {j["job_id"]: j["per_run_bound"] for j in http.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}
    assert {job: listed[job] for job in cases} == {job: want for job, (_, want) in cases.items()}
    # A decision of the job without a plan names the per-look test, as the view said.
    for step, score in enumerate([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6]):
        decision = _report(http, "bound-none", 10 * step, score).json()
    assert "per look: planned steps unknown" in decision["reason"]
