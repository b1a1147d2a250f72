"""Each defect an adversarial probe of ``evalstop-server`` found gets the answer the operator guide documents.

Real server processes on loopback with real SQLite files (``tests/service_support.py``).
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port

from platform_sim.core import JobMonitor, Report, detector_from_spec
from platform_sim.service.store import JobRecord
from platform_sim.service.store_sqlite import SQLiteStore


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    db = tmp_path_factory.mktemp("hardening") / "service.db"
    tokens = {name: add_tenant(db, name) for name in ("alice", "bob")}
    srv = Server(db, free_port(), extra_args=("--max-eval-scores", "1000")).start()
    try:
        yield {"srv": srv, "db": db, **tokens}
    finally:
        srv.stop()


def _client(env: dict, who: str) -> httpx.Client:
    return httpx.Client(base_url=env["srv"].url, headers=auth(env[who]), timeout=20)


def _report(job: str, step: int, score: object, **extra: object) -> dict:
    return {"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score, **extra}


def test_extreme_scores_are_422_and_other_tenants_are_unaffected(env: dict) -> None:
    with _client(env, "alice") as a, _client(env, "bob") as b:
        assert (
            a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "huge", "detector": {"name": "shape"}}).status_code
            == 201
        )
        assert (
            b.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "calm", "detector": {"name": "shape"}}).status_code
            == 201
        )
        for step in range(5):
            r = a.post("/v1/jobs/huge/evals", json=_report("huge", step, 1e200))
            assert r.status_code == 422 and "magnitude" in r.json()["message"], r.text
            r = a.post("/v1/jobs/huge/evals", json=_report("huge", 100 + step, 0.5, eval_scores=[0.5, -1.7e308]))
            assert r.status_code == 422, r.text
            assert b.post("/v1/jobs/calm/evals", json=_report("calm", step, 0.1 * step)).status_code == 200
        # Scores within the bound, however large, are taken by every detector.
        assert a.post("/v1/jobs/huge/evals", json=_report("huge", 200, 1e100)).status_code == 200
        assert a.post("/v1/jobs/huge/evals", json=_report("huge", 201, -1e100)).status_code == 200
        assert httpx.get(f"{env['srv'].url}/readyz").status_code == 200


@pytest.mark.parametrize(
    "body, where",
    [
        ({"step": True, "eval_score": 0.5}, "step"),
        ({"step": 4, "eval_score": True}, "eval_score"),
        ({"step": "4", "eval_score": 0.5}, "step"),
        ({"step": 4, "eval_score": "0.25"}, "eval_score"),
        ({"step": 4, "eval_score": 0.5, "eval_scores": [True, "3"]}, "eval_scores.0"),
    ],
)
def test_booleans_and_strings_are_not_numbers(env: dict, body: dict, where: str) -> None:
    with _client(env, "alice") as a:
        a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "types"})
        r = a.post("/v1/jobs/types/evals", json={"job_id": "types", "job_type": "rlhf", **body})
        assert r.status_code == 422 and where in r.json()["message"], r.text
        assert a.get("/v1/jobs/types").json()["n_reports"] == 0
        r = a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "types2", "gpus": True})
        assert r.status_code == 422 and "gpus" in r.json()["message"], r.text


def test_names_are_matched_whole(env: dict, tmp_path: Path) -> None:
    with _client(env, "alice") as a:
        r = a.post("/v1/jobs/types%0A/evals", json=_report("types\n", 1, 0.5))
        assert r.status_code == 422 and "job_id" in r.json()["message"], r.text
        assert a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "x\n"}).status_code == 422
    db = tmp_path / "names.db"
    add_tenant(db, "evil")
    proc = cli("tenant", "add", "evil\n", "--db", str(db), check=False)
    assert proc.returncode == 2 and "not a valid tenant name" in proc.stderr
    listed = json.loads(cli("tenant", "list", "--db", str(db), "--json").stdout)
    assert [t["name"] for t in listed] == ["evil"]


def _metric(env: dict, name: str) -> float:
    text = httpx.get(f"{env['srv'].url}/metrics").text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


def test_metrics_count_once_and_claims_are_bounded(env: dict) -> None:
    with _client(env, "alice") as a:
        before = _metric(env, "evalstop_jobs_finished_total")
        a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "fin"})
        for _ in range(3):
            assert a.post("/v1/jobs/fin/finish", json={"reason": "completed"}).status_code == 200
        assert _metric(env, "evalstop_jobs_finished_total") == before + 1
        for claim in ({"gpus": 1_000_000}, {"planned_steps": 10**12}):
            r = a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "claims", **claim})
            assert r.status_code == 422 and next(iter(claim)) in r.json()["message"], r.text
        # The largest claims allowed: a stop is credited at most 30 days per GPU.
        a.post(
            "/v1/jobs",
            json={
                "job_type": "rlhf",
                "job_id": "big",
                "gpus": 65_536,
                "planned_steps": 10**9,
                "detector": {"name": "k-decline", "params": {"k": 2}},
            },
        )  # stops at the 2nd decline
        for step, score in enumerate([0.5, 0.6, 0.5, 0.4]):
            last = a.post("/v1/jobs/big/evals", json=_report("big", step, score)).json()
        assert last["action"] == "stop"
        assert 0 < _metric(env, "evalstop_gpu_hours_reclaimed_total") <= 65_536 * 720


def test_http_details(env: dict) -> None:
    url = env["srv"].url
    for path in ("/v1/jobs", "/v1/jobs/x/finish", "/v1/jobs/x/evals"):
        r = httpx.post(
            url + path, content=b"\xff\xfe{", headers={"content-type": "application/json", **auth(env["alice"])}
        )
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", (path, r.text)
    r = httpx.post(
        url + "/v1/jobs", content=b'{"job_type": ', headers={"content-type": "application/json", **auth(env["alice"])}
    )
    assert r.status_code == 422 and "Invalid JSON" in r.json()["message"] and ": 12:" not in r.json()["message"]
    r = httpx.put(url + "/v1/jobs", headers=auth(env["alice"]))
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}


def test_eval_scores_over_the_limit_are_422(env: dict) -> None:
    with _client(env, "alice") as a:
        a.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "long", "detector": {"name": "k-decline-se"}})
        r = a.post("/v1/jobs/long/evals", json=_report("long", 1, 0.5, eval_scores=[0.5] * 1001))
        assert r.status_code == 422 and "at most 1000" in r.json()["message"], r.text
        assert a.post("/v1/jobs/long/evals", json=_report("long", 1, 0.5, eval_scores=[0.5] * 1000)).status_code == 200


def test_rate_limit_answers_429_with_retry_after_for_that_tenant_only(tmp_path: Path) -> None:
    db = tmp_path / "rate.db"
    noisy, quiet = add_tenant(db, "noisy"), add_tenant(db, "quiet")
    srv = Server(db, free_port(), extra_args=("--rate-limit", "1", "--rate-burst", "5")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            codes = [c.get("/v1/jobs", headers=auth(noisy)).status_code for _ in range(8)]
            assert codes[:5] == [200] * 5 and 429 in codes[5:], codes
            r = c.get("/v1/jobs", headers=auth(noisy))
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and r.json()["error"] == "rate_limited"
            assert c.post("/v1/jobs/x/evals", json=_report("x", 1, 0.5), headers=auth(noisy)).status_code == 429
            assert c.get("/v1/jobs", headers=auth(quiet)).status_code == 200
    finally:
        srv.stop()


def _one_line_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert err.startswith("evalstop-server: error: ") and "\n" not in err and fragment in err, err
    assert "Traceback" not in proc.stderr


def test_start_up_and_cli_errors_are_one_line(tmp_path: Path) -> None:
    db = str(tmp_path / "ok.db")
    add_tenant(Path(db), "t")
    for value in ("", ":memory:"):
        _one_line_error(cli("tenant", "list", "--db", value, check=False), "--db")
        _one_line_error(cli("serve", "--db", value, check=False), "--db")
    _one_line_error(cli("serve", "--db", "mysql://x", check=False), "unsupported database URL scheme 'mysql'")
    _one_line_error(cli("serve", "--db", db, "--host", "256.0.0.1", check=False), "--host 256.0.0.1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_line_error(cli("serve", "--db", db, "--port", str(port), check=False), f"--port {port}")


def test_a_read_only_database_is_refused_at_start(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    add_tenant(db, "t")
    # Root ignores file modes; the immutable flag holds for root too (a read-only mount in miniature).
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file read-only here (chattr +i refused)")
    try:
        _one_line_error(cli("serve", "--db", str(db), "--port", str(free_port()), check=False), "cannot be written")
        _one_line_error(cli("tenant", "add", "u", "--db", str(db), check=False), "readonly")
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)


def test_the_cache_stays_within_its_memory_budget(tmp_path: Path) -> None:
    budget = 400_000
    store = SQLiteStore(tmp_path / "c.db", cache_bytes=budget)
    spec = {"name": "k-decline-se"}
    try:
        tenant, _ = store.add_tenant("t")
        monitors = {}
        for j in range(12):
            store.register_job(tenant.tenant_id, JobRecord(f"j{j}", "rlhf", spec))
            monitors[f"j{j}"] = JobMonitor(f"j{j}", "rlhf", detector_from_spec(spec))
        for step in range(4):
            for job, monitor in monitors.items():
                scores = tuple(0.5 + 0.01 * ((i * 7 + step) % 13) - 0.02 * step for i in range(5000))
                report = Report(job, "rlhf", step, sum(scores) / len(scores), eval_scores=scores)
                got = store.submit_report(tenant.tenant_id, report).result(timeout=60).decision
                assert got == monitor.observe_report(report), (job, step)  # evicted jobs are rebuilt exactly
                assert store._cache_size <= budget or len(store._cache) == 1
        assert len(store._cache) < len(monitors)
    finally:
        store.close()


def test_readyz_says_why_it_is_not_ready(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from platform_sim.service.app import create_app

    store = SQLiteStore(tmp_path / "r.db")
    with TestClient(create_app(store)) as c:
        assert c.get("/readyz").json() == {"status": "ready"}
        store.close()
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["message"] == "the store is closed"
