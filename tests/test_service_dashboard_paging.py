"""The dashboard's pages are read like the API's listings (issue 45): a job's page shows one page of its reports with
a link to the next, charged to the tenant's rate limit by its rows; the job list is sorted and cut by the store.
A real server process on loopback with a real SQLite file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_support import sign_in
from service_support import Server, add_tenant, free_port, postgres_database

from platform_sim.core import Report
from platform_sim.service.routes.dashboard import REPORTS_PER_PAGE
from platform_sim.service.sql import JOB_SORTS
from platform_sim.service.store import JobRecord, Store
from platform_sim.service.store_sqlite import SQLiteStore

NEVER_STOPS = {"name": "k-decline", "params": {"k": 1000}}
N_REPORTS = 2 * REPORTS_PER_PAGE + 200


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """Tenant ``heavy`` with job ``long`` of :data:`N_REPORTS` reports (steps 0, 1, ...), tenant ``light`` with job
    ``short`` of 5; their tokens."""
    path = tmp_path_factory.mktemp("paging") / "service.db"
    heavy, light = add_tenant(path, "heavy"), add_tenant(path, "light")
    store = SQLiteStore(path, synchronous="NORMAL")
    try:
        for token, job, n in ((heavy, "long", N_REPORTS), (light, "short", 5)):
            tenant = store.tenant_for_token(token)
            assert tenant is not None
            store.register_job(tenant.tenant_id, JobRecord(job, "rlhf", NEVER_STOPS))
            futures = [store.submit_report(tenant.tenant_id, Report(job, "rlhf", s, 0.5)) for s in range(n)]
            for f in futures:
                f.result()
    finally:
        store.close()
    yield path, heavy, light


def _report_steps(page: str) -> list[int]:
    table = re.search(r'<table id="reports">(.*?)</table>', page, re.S)
    assert table is not None
    return [int(s) for s in re.findall(r'<tr><td class="num">(\d+)</td>', table.group(1))]


def _older(page: str) -> str | None:
    link = re.search(r'<a id="older-reports" href="([^"]+)"', page)
    return None if link is None else link.group(1).replace("&amp;", "&")


def test_a_long_history_is_shown_a_page_at_a_time(db: tuple[Path, str, str]) -> None:
    path, heavy, _ = db
    srv = Server(path, free_port()).start()
    try:
        with sign_in(srv.url, heavy) as browser:
            seen: list[int] = []
            url: str | None = "/jobs/long"
            pages = 0
            while url is not None and pages < 10:
                r = browser.get(url)
                assert r.status_code == 200, r.text
                steps = _report_steps(r.text)
                assert 0 < len(steps) <= REPORTS_PER_PAGE and steps == sorted(steps, reverse=True)
                points = re.search(r'<polyline class="line" points="([^"]+)"', r.text)
                assert points is not None and len(points.group(1).split()) == len(steps)  # the curve: this page
                if pages:
                    assert 'id="newest-reports"' in r.text
                seen += steps
                url, pages = _older(r.text), pages + 1
            assert pages == 3 and seen == list(range(N_REPORTS - 1, -1, -1))
            assert f"of {N_REPORTS}" in browser.get("/jobs/long").text
            assert browser.get("/jobs/long?before=x").status_code == 422
    finally:
        srv.stop()


def test_a_job_page_is_charged_by_its_rows(db: tuple[Path, str, str]) -> None:
    """Rate 0.01/s, burst 10: sign-in costs 1; a page of 500 reports costs 1 + 5, so the third is refused (429 with
    Retry-After), while another tenant's small job page (1 token and a few hundredths) loads on and on."""
    path, heavy, light = db
    srv = Server(path, free_port(), extra_args=("--rate-limit", "0.01", "--rate-burst", "10")).start()
    try:
        with sign_in(srv.url, heavy) as browser:
            answers = [browser.get("/jobs/long") for _ in range(3)]
            assert [a.status_code for a in answers] == [200, 200, 429]
            assert "Retry-After" in answers[2].headers and "too many requests" in answers[2].text
        with sign_in(srv.url, light) as browser:
            assert [browser.get("/jobs/short").status_code for _ in range(6)] == [200] * 6
    finally:
        srv.stop()


def _sorts_and_cuts(store: Store) -> None:
    """Every sort key, both orders: pages of 7 put together are every job once, in order of the key, jobs without a
    value last; the count follows the status filter."""
    try:
        tenant, _ = store.add_tenant("t")
        other, _ = store.add_tenant("o")
        store.register_job(other.tenant_id, JobRecord("other-tenants", "rlhf", NEVER_STOPS))
        for i in range(23):
            gpus = {"gpus": 8, "planned_steps": 100} if i % 3 else {}
            store.register_job(
                tenant.tenant_id,
                JobRecord(f"job-{i:02d}", ("rlhf", "sft")[i % 2], {"name": "k-decline", "params": {"k": 2}}, **gpus),
            )  # type: ignore[arg-type]
            for step, value in enumerate([0.5, 0.6, 0.4, 0.3][: i % 5]):
                store.submit_report(
                    tenant.tenant_id, Report(f"job-{i:02d}", ("rlhf", "sft")[i % 2], step, value)
                ).result()
            if i % 4 == 0:
                store.finish_job(tenant.tenant_id, f"job-{i:02d}", "done")
        assert store.count_jobs(tenant.tenant_id) == 23
        by_status = {s: store.count_jobs(tenant.tenant_id, s) for s in ("running", "stopped", "finished")}
        assert sum(by_status.values()) == 23 and all(by_status.values()), by_status
        everyone = {j.job_id: j for j in store.list_jobs(tenant.tenant_id, limit=100)}
        values = {
            "job": lambda j: j.job_id,
            "reports": lambda j: j.n_reports,
            "stop_step": lambda j: j.stopped_at,
            "gpu_hours": lambda j: j.gpu_hours_freed,
            "status": lambda j: j.status,
            "declines": lambda j: None if j.last_decision is None else j.last_decision.declines,
        }
        for sort in JOB_SORTS:
            for descending in (False, True):
                listed = []
                for offset in range(0, 28, 7):
                    listed += list(store.iter_sorted_jobs(tenant.tenant_id, None, sort, descending, 7, offset))
                assert sorted(j.job_id for j in listed) == sorted(everyone), sort
                if sort in values:
                    keys = [values[sort](j) for j in listed]
                    known = [k for k in keys if k is not None]
                    assert keys == known + [None] * (len(keys) - len(known)), (sort, keys)
                    assert known == sorted(known, reverse=descending), (sort, descending, keys)
        with pytest.raises(ValueError, match="sort must be"):
            store.iter_sorted_jobs(tenant.tenant_id, None, "password", False, 10)
    finally:
        store.close()


def test_sqlite_sorts_and_cuts_the_job_list(tmp_path: Path) -> None:
    _sorts_and_cuts(SQLiteStore(tmp_path / "s.db", synchronous="NORMAL"))


def test_postgres_sorts_and_cuts_the_job_list() -> None:
    from platform_sim.service.store_postgres import PostgresStore

    with postgres_database() as url:
        _sorts_and_cuts(PostgresStore(url))
