"""Job cadences on the service: registered, stored in a real SQLite file, and used by a real server process.

A job registered with ``cadence="adaptive"`` gets the decisions the embedded client gives for the same reports, the
``next_eval_step`` hint included, also after the server restarts and rebuilds the job from the file. A bad cadence is
a 422 naming the problem, another cadence for a registered job id a 409, and a database written before cadences
existed (schema version 1, ``tests/data/service_db_v1.sql``) opens with its jobs on the fixed cadence.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, auth, free_port, tenant_server

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Report
from platform_sim.service import tables

V1_DUMP = Path(__file__).parent / "data" / "service_db_v1.sql"
V1_TOKEN = "es_v1-fixture-token"  # the fixture tenant's test token (its hash is in the dump)

# Rises to step 20, a first decline at 30 (the hint), a recovery at the hinted step (an extra eval, which the detector
# then forgets), a new best at 40 and a first decline again at 50 (the hint).
HISTORY = [(0, 0.30), (10, 0.50), (20, 0.60), (30, 0.55), (35, 0.58), (40, 0.62), (50, 0.58)]
DETECTOR = {"name": "k-decline", "params": {"k": 2}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """One server for the tests that neither restart it nor open a file of their own (each uses its own job ids)."""
    with tenant_server(tmp_path_factory.mktemp("cadence")) as (srv, token):
        yield srv, token


def _register(http: httpx.Client, job_id: str, **extra: Any) -> httpx.Response:
    return http.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job_id, "detector": DETECTOR, **extra})


def _post(http: httpx.Client, job_id: str, step: int, score: float) -> dict[str, Any]:
    resp = http.post(
        f"/v1/jobs/{job_id}/evals", json={"job_id": job_id, "job_type": "rlhf", "step": step, "eval_score": score}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def _embedded(cadence: Any, history: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """The embedded client's decisions (as the service serializes them) for ``history`` of one job."""
    client = EmbeddedClient()
    job = client.register("rlhf", DETECTOR, job_id="j", cadence=cadence)
    return [client.report(Report(job, "rlhf", step, score)).to_dict() for step, score in history]


# One job per cadence, all in one server's life and its restart.
ADAPTIVE = [
    "adaptive",
    {"name": "adaptive", "params": {"fraction": 0.5}},
    {"name": "adaptive", "params": {"min_drop": 0.5}},
]


def test_adaptive_cadence_over_http_gives_the_embedded_clients_decisions(tmp_path: Path) -> None:
    # min_drop reads the noise of the whole history of scores: its hint (at step 50, after the restart) holds only
    # if the server rebuilt the job from all of its stored reports. Step 35 comes after the restart: whether it is
    # an extra eval (which the detector forgets) must be read from the stored rows too.
    expected = {f"job-{i}": _embedded(cadence, HISTORY) for i, cadence in enumerate(ADAPTIVE)}
    for job_id, decisions in expected.items():
        assert decisions[6].get("next_eval_step") is not None, job_id  # a history where this cadence hints
    with tenant_server(tmp_path) as (srv, token):
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as http:
            for i, cadence in enumerate(ADAPTIVE):
                created = _register(http, f"job-{i}", cadence=cadence)
                assert created.status_code == 201, created.text
            for job_id, want in expected.items():
                got = [_post(http, job_id, step, score) for step, score in HISTORY[:4]]
                assert got == want[:4], job_id
                assert http.get(f"/v1/jobs/{job_id}").json()["last_decision"] == want[3], job_id
                # A re-send of the declining step is answered the same decision, its hint included.
                assert _post(http, job_id, *HISTORY[3]) == want[3], job_id
        srv.stop()  # a new process rebuilds the jobs (and their cadences) from the file
        srv.port = free_port()
        srv.start()
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as http:
            for job_id, want in expected.items():
                assert [_post(http, job_id, step, score) for step, score in HISTORY[4:]] == want[4:], job_id
            views = {job_id: http.get(f"/v1/jobs/{job_id}").json() for job_id in expected}
    for i, cadence in enumerate(ADAPTIVE):
        assert views[f"job-{i}"]["cadence"] == {"name": "adaptive", "params": {"fraction": 0.25, **_params(cadence)}}
    # The one-decline evaluations carry the hint: a quarter of the regular interval of 10 later.
    assert [d.get("next_eval_step") for d in expected["job-0"]] == [None, None, None, 32, None, None, 52]


def _params(cadence: Any) -> dict[str, Any]:
    return cadence["params"] if isinstance(cadence, dict) else {}


def test_the_fixed_cadence_gives_no_hint_and_reads_as_fixed(server: tuple[Server, str]) -> None:
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token)) as http:
        for job_id, extra in (("no-cadence", {}), ("fixed", {"cadence": "fixed"}), ("null", {"cadence": None})):
            view = _register(http, job_id, **extra).json()
            assert view["cadence"] == {"name": "fixed", "params": {}}
            decisions = [_post(http, job_id, step, score) for step, score in HISTORY[:4]]
            assert decisions == _embedded(None, HISTORY[:4])
            assert all("next_eval_step" not in d for d in decisions)


@pytest.mark.parametrize(
    ("cadence", "message"),
    [
        ("often", "cadence.name: Input should be 'fixed' or 'adaptive'"),  # the schema's enum (issue 33)
        ({"name": "adaptive", "params": {"fraction": 1.5}}, "cadence: cadence fraction must be a number strictly"),
        ({"name": "adaptive", "params": {"speed": 2}}, "cadence: bad parameters for cadence 'adaptive'"),
        ({"name": "fixed", "params": {"fraction": 0.5}}, "cadence: the fixed cadence takes no parameters"),
        ({"name": "adaptive", "every": 3}, "cadence.spec.every: unknown field"),
        (3, "cadence.spec: Input should be a valid dictionary"),
    ],
)
def test_a_bad_cadence_is_a_422_naming_the_problem(server: tuple[Server, str], cadence: Any, message: str) -> None:
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token)) as http:
        resp = _register(http, "bad", cadence=cadence)
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"] == "invalid_request"
        assert message in resp.json()["message"]
        assert http.get("/v1/jobs/bad").status_code == 404  # nothing was registered


def test_another_cadence_for_a_registered_job_is_a_conflict(server: tuple[Server, str]) -> None:
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token)) as http:
        assert _register(http, "a", cadence="adaptive").status_code == 201
        # The same cadence, however it is spelled (a name, or the normalized spec): idempotent.
        assert _register(http, "a", cadence="adaptive").status_code == 200
        same = {"name": "adaptive", "params": {"fraction": 0.25}}
        assert _register(http, "a", cadence=same).status_code == 200
        for other in ("fixed", None, {"name": "adaptive", "params": {"fraction": 0.5}}):
            resp = _register(http, "a", **({} if other is None else {"cadence": other}))
            assert resp.status_code == 409, resp.text
            assert resp.json()["error"] == "conflict"
            assert 'cadence={"name": "adaptive", "params": {"fraction": 0.25}}' in resp.json()["message"]
        assert _register(http, "f").status_code == 201  # no cadence: fixed
        assert _register(http, "f", cadence="fixed").status_code == 200
        resp = _register(http, "f", cadence="adaptive")
        assert resp.status_code == 409 and 'cadence="fixed"' in resp.json()["message"]


def test_the_http_client_registers_the_cadence_and_returns_the_services_hints(server: tuple[Server, str]) -> None:
    cadence = {"name": "adaptive", "params": {"fraction": 0.5}}
    expected = _embedded(cadence, HISTORY)
    srv, token = server
    with PlatformClient(srv.url, token, max_retries=0) as client:
        job = client.register("rlhf", DETECTOR, job_id="via-client", cadence=cadence)
        got = []
        for step, score in HISTORY:
            got.append(client.report(Report(job, "rlhf", step, score)).to_dict())
            assert client.last_source == "service"  # the service decided, not the local fallback
        view = httpx.get(f"{srv.url}/v1/jobs/via-client", headers=auth(token)).json()
    assert got == expected
    assert view["cadence"] == cadence
    with pytest.raises(ValueError, match="unknown cadence"):
        PlatformClient("http://127.0.0.1:9", "token").register("rlhf", cadence="often")  # refused before any request


def test_a_version_1_database_opens_and_its_jobs_read_as_fixed(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(V1_DUMP.read_text())
    conn.close()
    srv = Server(db, free_port()).start()  # the server opens (and upgrades) the file
    try:
        with httpx.Client(base_url=srv.url, headers=auth(V1_TOKEN), timeout=10) as http:
            view = http.get("/v1/jobs/old-job").json()
            assert view["cadence"] == {"name": "fixed", "params": {}}
            assert (view["n_reports"], view["last_step"], view["best_step"]) == (4, 60, 40)
            assert view["last_decision"] == {
                "action": "continue",
                "reason": "no stop signal",
                "declines": 1,
                "best_step": 40,
                "best_score": 0.47,
            }
            # The job goes on as before: the second decline stops it (k=2), as the embedded client decides.
            history = [(0, 0.30), (20, 0.42), (40, 0.47), (60, 0.44), (80, 0.40)]
            client = EmbeddedClient()
            client.register("rlhf", DETECTOR, job_id="old-job")
            expected = [client.report(Report("old-job", "rlhf", s, x)).to_dict() for s, x in history]
            # A re-send of a version-1 row gets the decision it got then, whose reason names no evidence mode.
            assert _post(http, "old-job", 60, 0.44) == {**expected[3], "reason": "no stop signal"}
            assert _post(http, "old-job", 80, 0.40) == expected[4]
            assert expected[4]["action"] == "stop"
            # The same job id registered again with its old settings is idempotent; with a cadence it is not.
            same = {"gpus": 2, "planned_steps": 400}
            assert _register(http, "old-job", **same).status_code == 200
            assert _register(http, "old-job", **same, cadence="adaptive").status_code == 409
    finally:
        srv.stop()
    with sqlite3.connect(db) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        jobs_cols = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
        report_cols = [r[1] for r in conn.execute("PRAGMA table_info(reports)")]
        hints = conn.execute("SELECT step, next_eval_step, eval_std, eval_n FROM reports ORDER BY step").fetchall()
    conn.close()
    assert version == (str(tables.SCHEMA_VERSION),) and tables.SCHEMA_VERSION == 5
    assert jobs_cols[-2:] == ["cadence", "gpu_hours_freed"]
    assert report_cols[-3:] == ["next_eval_step", "eval_std", "eval_n"]
    assert hints == [(step, None, None, None) for step in (0, 20, 40, 60, 80)]


def test_a_confirmed_stop_survives_a_server_restart_between_the_two_looks(tmp_path: Path) -> None:
    # The service keeps no "confirming" flag: the second look's decision is read from the stored report rows, so a
    # server that restarts between a weak stop and its confirmation still takes the stop there, as the core does.
    import math

    detector = {"name": "shape", "params": {"se": 0.03}}
    cadence = {"name": "adaptive", "params": {"fraction": 0.5, "p_hint": 0.0, "confirm": 0.0}}

    def gao(step: int) -> float:  # Gao's overoptimization curve, peak at step 200
        x = (step / 200) ** 2
        return round(0.2 + 0.5 * x * (1 - math.log(x)), 4)

    history = [(s, gao(s)) for s in (*range(10, 270, 10), 265)]  # shape stops at 260 and is confirmed at 265
    client = EmbeddedClient()
    job = client.register("rlhf", detector, job_id="j", cadence=cadence)
    expected = [client.report(Report(job, "rlhf", step, score)).to_dict() for step, score in history]
    assert expected[-2]["action"] == "continue" and expected[-2]["next_eval_step"] == 265
    assert "confirming a stop" in expected[-2]["reason"] and expected[-1]["action"] == "stop"
    with tenant_server(tmp_path) as (srv, token):
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as http:
            body = {"job_type": "rlhf", "job_id": "c", "detector": detector, "cadence": cadence}
            assert http.post("/v1/jobs", json=body).status_code == 201
            assert [_post(http, "c", step, score) for step, score in history[:-1]] == expected[:-1]
        srv.stop()
        srv.port = free_port()
        srv.start()
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=10) as http:
            assert _post(http, "c", *history[-1]) == expected[-1]
