"""A report's spread (``eval_std``, ``eval_n``) through a real ``evalstop-server`` on loopback with a real SQLite file:
stored and read back (history API, job view, dashboard), bad ones refused with a 422 naming the field and nothing
stored, and kept across a restart (the history, and the decisions of the monitor rebuilt from the store, which equal
those of an embedded core fed the same reports without a restart)."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port, postgres_database

from evalstop_callbacks.client import EmbeddedClient, make_report
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import EvidenceMode, Report, default_spec
from platform_sim.service.store import JobRecord, Store
from platform_sim.service.store_sqlite import SQLiteStore

JOB = "spread-1"


def _body(step: int, mean: float, job: str = JOB, **extra: object) -> dict[str, object]:
    return {"job_id": job, "job_type": "rlhf", "step": step, "eval_score": mean, **extra}


def _reports(job: str) -> list[Report]:
    """A run that rises, peaks at the fifth eval and falls; each eval's spread from 64 examples."""
    means = [0.20, 0.35, 0.46, 0.52, 0.55, 0.50, 0.44, 0.37, 0.30, 0.24, 0.18, 0.12]
    return [make_report(job, "rlhf", 10 * (i + 1), m, std=0.15 + 0.01 * i, n=64) for i, m in enumerate(means)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("spread") / "service.db"
    token = add_tenant(db, "acme")
    srv = Server(db, free_port()).start()
    try:
        yield srv, token
    finally:
        srv.stop()


def _history(srv: Server, token: str, job: str) -> list[dict]:
    r = httpx.get(f"{srv.url}/v1/jobs/{job}/evals", params={"order": "step"}, headers=auth(token))
    assert r.status_code == 200, r.text
    return r.json()["evals"]


def test_a_report_with_its_spread_is_stored_and_read_back(server) -> None:
    srv, token = server
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
        assert http.post("/v1/jobs", json={"job_id": JOB, "job_type": "rlhf"}).status_code == 201
        assert http.get(f"/v1/jobs/{JOB}").json()["mode"] is None  # no report yet
        assert http.post(f"/v1/jobs/{JOB}/evals", json=_body(10, 0.4, eval_std=0.25, eval_n=128)).status_code == 200
        scores = [0.0, 0.5, 1.0]
        r = http.post(f"/v1/jobs/{JOB}/evals", json=_body(20, 0.5, eval_scores=scores, eval_std=0.5, eval_n=3))
        assert r.status_code == 200, r.text
        assert http.post(f"/v1/jobs/{JOB}/evals", json=_body(30, 0.45)).status_code == 200
        view = http.get(f"/v1/jobs/{JOB}").json()
    rows = _history(srv, token, JOB)
    assert [(e["step"], e["eval_std"], e["eval_n"], e["n_eval_scores"]) for e in rows] == [
        (10, 0.25, 128, None),
        (20, 0.5, 3, 3),
        (30, None, None, None),
    ]
    # The job view names the mode its detector's last decision names (None while the reason names none).
    assert view["mode"] is None or view["mode"] == EvidenceMode.of_reason(view["last_decision"]["reason"]).value


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"eval_std": 0.2}, "eval_std was given without eval_n"),
        ({"eval_n": 10}, "eval_n was given without eval_std"),
        ({"eval_std": 0.2, "eval_n": 1}, "eval_n"),
        ({"eval_std": -0.2, "eval_n": 10}, "eval_std"),
        ({"eval_std": "0.2", "eval_n": 10}, "eval_std"),
        ({"eval_std": 0.2, "eval_n": 10.5}, "eval_n"),
        ({"eval_std": 0.2, "eval_n": True}, "eval_n"),
        ({"eval_std": 0.2, "eval_n": 3, "eval_scores": [0.0, 0.5, 1.0]}, "disagrees with the sample standard"),
        ({"eval_std": 0.5, "eval_n": 4, "eval_scores": [0.0, 0.5, 1.0]}, "eval_n is 4 but eval_scores holds 3"),
    ],
)
def test_bad_spreads_are_refused_with_a_422_naming_the_field(server, extra, words) -> None:
    srv, token = server
    job = "refused"
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
        http.post("/v1/jobs", json={"job_id": job, "job_type": "rlhf"})
        r = http.post(f"/v1/jobs/{job}/evals", json=_body(10, 0.4, job, **extra))
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
        assert words in r.json()["message"], r.json()["message"]
        assert http.get(f"/v1/jobs/{job}").json()["n_reports"] == 0  # nothing stored


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_spread_is_refused(server, literal: str) -> None:
    srv, token = server
    job = "non-finite"
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
        http.post("/v1/jobs", json={"job_id": job, "job_type": "rlhf"})
        raw = f'{{"job_id": "{job}", "job_type": "rlhf", "step": 1, "eval_score": 0.5, "eval_std": {literal}, "eval_n": 9}}'
        r = http.post(f"/v1/jobs/{job}/evals", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "eval_std" in r.json()["message"], r.text
        assert http.get(f"/v1/jobs/{job}").json()["n_reports"] == 0


def test_the_spread_survives_a_restart_and_the_rebuilt_monitor_decides_as_the_embedded_core(tmp_path: Path) -> None:
    """Half the reports, a restart (the monitor is rebuilt from the store), the other half; a re-send of a stored step
    with its spread gets its decision again. Decisions equal an embedded core's fed the same reports, so whatever
    the detector keeps of the spread comes back from the store."""
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    srv = Server(db, free_port()).start()
    reports = _reports(JOB)
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector=default_spec(), job_id=JOB)
    want = [embedded.report(r).to_dict() for r in reports]
    try:
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
            assert http.post("/v1/jobs", json={"job_id": JOB, "job_type": "rlhf"}).status_code == 201
            got = [http.post(f"/v1/jobs/{JOB}/evals", json=r.to_dict()).json() for r in reports[:6]]
        srv.stop()
        srv.start()
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
            again = http.post(f"/v1/jobs/{JOB}/evals", json=reports[5].to_dict())
            assert again.status_code == 200 and again.json() == got[5]
            got += [http.post(f"/v1/jobs/{JOB}/evals", json=r.to_dict()).json() for r in reports[6:]]
            view = http.get(f"/v1/jobs/{JOB}").json()
        assert got == want
        rows = _history(srv, token, JOB)
        assert [(e["eval_std"], e["eval_n"]) for e in rows] == [(r.eval_std, r.eval_n) for r in reports]
        last = embedded.monitor(JOB)
        expect_mode = EvidenceMode.of_reason(last.stop_reason or last.decisions[-1].reason)
        assert view["mode"] == (None if expect_mode is None else expect_mode.value)
    finally:
        srv.stop()


def test_platform_client_sends_the_spread_after_an_outage(tmp_path: Path) -> None:
    """The re-send queue keeps each report's spread while the service is down and delivers it when it is back."""
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    srv = Server(db, free_port()).start()
    reports = _reports("outage")
    try:
        with PlatformClient(srv.url, token, max_retries=1, backoff=0.01, connect_timeout=0.5) as client:
            job = client.register("rlhf", job_id="outage")
            for r in reports[:3]:
                client.report(r)
            srv.stop()
            for r in reports[3:6]:
                client.report(r)
            assert client.pending(job) == 3 and client.last_source == "fallback"
            srv.start()
            for r in reports[6:]:
                client.report(r)
            assert client.pending(job) == 0 and client.last_source == "service"
        rows = _history(srv, token, "outage")
        assert [(e["step"], e["eval_std"], e["eval_n"]) for e in rows] == [
            (r.step, r.eval_std, r.eval_n) for r in reports
        ]
    finally:
        srv.stop()


def test_the_dashboard_job_page_shows_each_report_s_spread_and_the_mode(server) -> None:
    srv, token = server
    job = "dashboard"
    with httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as http:
        http.post("/v1/jobs", json={"job_id": job, "job_type": "rlhf"})
        http.post(f"/v1/jobs/{job}/evals", json=_body(10, 0.4, job, eval_std=0.25, eval_n=128))
        http.post(f"/v1/jobs/{job}/evals", json=_body(20, 0.45, job))
    with httpx.Client(base_url=srv.url, timeout=30) as browser:
        form = browser.get("/login")
        nonce = re.search(r'name="login_nonce" value="([^"]+)"', form.text)
        assert nonce is not None
        signed = browser.post("/login", data={"token": token, "login_nonce": html.unescape(nonce.group(1))})
        assert signed.status_code == 303
        page = browser.get(f"/jobs/{job}").text
    assert '<th class="num">Std (n)</th>' in page and "<dt>Decided on</dt>" in page
    # Registered without planned_steps: the default tests per look, and the page says so.
    assert "<dt>False stops bounded</dt><dd>per look: no planned steps declared</dd>" in page
    rows = re.findall(r'<tr><td class="num">(\d+)</td><td class="num">[^<]*</td><td class="num">([^<]*)</td>', page)
    assert dict(rows)["10"].endswith("(128)") and dict(rows)["20"] == "\u2014"
    assert math.isclose(float(dict(rows)["10"].split(" ")[0]), 0.25, rel_tol=1e-3)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_both_stores_keep_the_spread_and_rebuild_the_monitor_from_it(tmp_path: Path, kind: str) -> None:
    """Each store writes the spread into its report rows and reads it back; a store opened again on the same
    database (a restart: the monitor is rebuilt from the rows) goes on deciding as the embedded core."""
    reports = _reports(JOB)
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector=default_spec(), job_id=JOB)
    want = [embedded.report(r) for r in reports]

    def run(url: str) -> None:
        def open_store() -> Store:
            if kind == "sqlite":
                return SQLiteStore(url)
            from platform_sim.service.store_postgres import PostgresStore

            return PostgresStore(url, workers=1, readers=1)

        store = open_store()
        tenant, _ = store.add_tenant("acme")
        store.register_job(tenant.tenant_id, JobRecord(JOB, "rlhf", default_spec()))
        got = [store.submit_report(tenant.tenant_id, r).result().decision for r in reports[:6]]
        store.close()
        store = open_store()
        try:
            got += [store.submit_report(tenant.tenant_id, r).result().decision for r in reports[6:]]
            rows = store.reports(tenant.tenant_id, JOB)
        finally:
            store.close()
        assert got == want
        assert [(r.step, r.eval_std, r.eval_n) for r in rows] == [(r.step, r.eval_std, r.eval_n) for r in reports]

    if kind == "sqlite":
        run(str(tmp_path / "store.db"))
    else:
        with postgres_database("spread") as url:
            run(url)
