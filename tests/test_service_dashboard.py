"""The dashboard over HTTP (no browser): sign-in and its cookies, the pages and what they show, escaping, tenant
isolation, security headers, sign-out. A real server process on loopback with a real SQLite file; the browser test is
``test_service_dashboard_browser.py``."""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_support import (
    FINISHED_JOB,
    HOSTILE_REASON,
    OTHER_TENANTS_JOB,
    RUNNING_JOB,
    STOPPED_JOB,
    STOPPED_SCORES,
    Scenario,
    dashboard_scenario,
    sign_in,
)
from service_support import auth, cli, postgres_database

from platform_sim.core import Report
from platform_sim.service.dashboard.sessions import SessionStore
from platform_sim.service.dashboard.svg import MAX_POINTS, eval_curve
from platform_sim.service.store import JobRecord, Store
from platform_sim.service.store_sqlite import SQLiteStore


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    with dashboard_scenario(tmp_path_factory.mktemp("dashboard")) as sc:
        yield sc


def grab(pattern: str, text: str, group: int = 1) -> str:
    """The ``group`` of ``pattern``'s first match in ``text`` (which must match)."""
    match = re.search(pattern, text, re.S)
    assert match is not None, pattern
    return match.group(group)


def job_ids(page: str) -> list[str]:
    """The job ids of the list's rows, in order."""
    return [html.unescape(m) for m in re.findall(r'<tr data-job="([^"]+)"', page)]


def test_pages_redirect_to_sign_in_without_a_session(scenario: Scenario) -> None:
    for path in ("/", f"/jobs/{STOPPED_JOB}", "/?status=stopped"):
        r = httpx.get(scenario.server.url + path)
        assert r.status_code == 303 and r.headers["location"] == "/login", path
    # A made-up session cookie is no session.
    r = httpx.get(scenario.server.url + "/", cookies={"evalstop_session": "made-up"})
    assert r.status_code == 303 and r.headers["location"] == "/login"


def test_sign_in_sets_a_strict_http_only_session_cookie_without_the_token(scenario: Scenario) -> None:
    client = httpx.Client(base_url=scenario.server.url)
    form = client.get("/login")
    assert 'name="token"' in form.text and 'type="password"' in form.text
    nonce = html.unescape(grab(r'name="login_nonce" value="([^"]+)"', form.text))
    r = client.post("/login", data={"token": scenario.alpha, "login_nonce": nonce})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("evalstop_session="))
    attrs = cookie.lower()
    assert "httponly" in attrs and "samesite=strict" in attrs and "max-age=" in attrs
    assert scenario.alpha not in cookie
    assert scenario.alpha not in str(r.url) and scenario.alpha not in r.headers["location"]
    assert client.get("/").status_code == 200
    client.close()


def test_sign_in_refuses_a_wrong_token_and_a_form_from_elsewhere(scenario: Scenario) -> None:
    with httpx.Client(base_url=scenario.server.url) as client:
        form = client.get("/login")
        nonce = html.unescape(grab(r'name="login_nonce" value="([^"]+)"', form.text))
        r = client.post("/login", data={"token": "es_not-a-token", "login_nonce": nonce})
        assert r.status_code == 401 and "Unknown or revoked token" in r.text
        assert "evalstop_session" not in client.cookies
    # A cross-site form post carries no SameSite=Strict nonce cookie: refused even with the right token.
    r = httpx.post(scenario.server.url + "/login", data={"token": scenario.alpha, "login_nonce": "x"})
    assert r.status_code == 400 and "evalstop_session" not in r.cookies
    # Not a form.
    r = httpx.post(scenario.server.url + "/login", json={"token": scenario.alpha})
    assert r.status_code == 400


def test_the_list_shows_the_tenants_jobs_only(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert sorted(job_ids(r.text)) == sorted([STOPPED_JOB, RUNNING_JOB, FINISHED_JOB])
    assert OTHER_TENANTS_JOB not in r.text
    row = grab(f'<tr data-job="{re.escape(STOPPED_JOB)}">(.*?)</tr>', r.text)
    cells = [html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
    n = scenario.stop_step // 10
    # Job, type, status, reports, last score, declines, best step, best score, stop step, stop reason, GPU-h freed.
    assert cells[:4] == [STOPPED_JOB, "rlhf", "stopped", str(n)]
    assert cells[4] == f"{STOPPED_SCORES[n - 1]:.4f}"
    assert cells[5] == "2"
    assert cells[6:9] == [str(scenario.best_step), f"{scenario.best_score:.4f}", str(scenario.stop_step)]
    assert "decline" in cells[9]
    api = httpx.get(f"{scenario.server.url}/v1/jobs/{STOPPED_JOB}", headers=auth(scenario.alpha)).json()
    assert api["gpu_hours_freed"] is not None and cells[10] == f"{api['gpu_hours_freed']:,.2f}"
    assert cells[9] == api["stop_reason"]
    running = grab(f'<tr data-job="{RUNNING_JOB}">(.*?)</tr>', r.text)
    assert running.endswith('<td class="num">\u2014</td>')  # declared no GPUs: no estimate
    assert 'id="totals"' in r.text and "tenant <strong>alpha</strong>" in r.text


def test_filter_and_sort(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        assert job_ids(client.get("/?status=stopped").text) == [STOPPED_JOB]
        assert job_ids(client.get("/?status=running").text) == [RUNNING_JOB]
        assert job_ids(client.get("/?status=finished").text) == [FINISHED_JOB]
        by_reports = job_ids(client.get("/?sort=reports&order=desc").text)
        assert by_reports == [STOPPED_JOB, RUNNING_JOB, FINISHED_JOB]
        assert job_ids(client.get("/?sort=reports&order=asc").text) == by_reports[::-1]
        # Jobs without a stop step come last in either order.
        assert job_ids(client.get("/?sort=stop_step&order=asc").text)[0] == STOPPED_JOB
        assert job_ids(client.get("/?sort=stop_step&order=desc").text)[0] == STOPPED_JOB
        for bad in ("/?sort=password", "/?order=up", "/?status=paused", "/?page=0"):
            r = client.get(bad)
            assert r.status_code == 422 and "must be" in r.text, bad
        assert client.get("/?nonsense=1").status_code == 422


def test_the_job_page_draws_the_curve_with_the_best_and_stop_steps(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        r = client.get(f"/jobs/{STOPPED_JOB}")
    assert r.status_code == 200
    svg = grab(r'<svg class="curve".*?</svg>', r.text, 0)
    points = grab(r'<polyline class="line" points="([^"]+)"', svg).split()
    assert len(points) == scenario.stop_step // 10
    xs = [float(p.split(",")[0]) for p in points]
    assert xs == sorted(xs)
    stop = re.search(r'<g class="stop-marker" data-step="(\d+)">.*?<text[^>]*>([^<]+)</text>', svg)
    best = re.search(r'<g class="best-marker" data-step="(\d+)">.*?<text[^>]*>([^<]+)</text>', svg)
    assert stop is not None and best is not None
    assert (int(stop.group(1)), stop.group(2)) == (scenario.stop_step, f"stop at step {scenario.stop_step}")
    assert int(best.group(1)) == scenario.best_step and best.group(2).startswith(f"best step {scenario.best_step}")
    # The reports table lists every report, newest first.
    reports = grab(r'<table id="reports">(.*?)</table>', r.text)
    steps = [int(s) for s in re.findall(r'<tr><td class="num">(\d+)</td>', reports)]
    assert steps == list(range(scenario.stop_step, 0, -10))


def test_another_tenants_job_and_a_hostile_id_are_404(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        other = client.get(f"/jobs/{OTHER_TENANTS_JOB}")
        unknown = client.get("/jobs/no-such-job")
        hostile = client.get("/jobs/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert other.status_code == unknown.status_code == hostile.status_code == 404

    # The same page whether the job is another tenant's or does not exist (existence never leaks).
    def same(page: str, job_id: str) -> str:
        return re.sub(r'nonce="[^"]+"', "", page.replace(job_id, "ID"))

    assert same(other.text, OTHER_TENANTS_JOB) == same(unknown.text, "no-such-job")
    assert "<script>alert(1)" not in hostile.text and "&lt;script&gt;alert(1)" in hostile.text
    with sign_in(scenario.server.url, scenario.beta) as client:
        assert client.get(f"/jobs/{OTHER_TENANTS_JOB}").status_code == 200
        assert client.get(f"/jobs/{STOPPED_JOB}").status_code == 404
        assert job_ids(client.get("/").text) == [OTHER_TENANTS_JOB]


def test_user_text_is_escaped(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        page = client.get(f"/jobs/{FINISHED_JOB}").text
    assert HOSTILE_REASON not in page and "<b>bold</b>" not in page
    assert html.escape(HOSTILE_REASON) in page
    assert "<script>" not in page  # the only script is the nonce'd refresh
    assert page.count("<script") == 1


def test_the_job_page_shows_the_tenants_recent_events_and_totals(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        page = client.get(f"/jobs/{FINISHED_JOB}").text
        listing = client.get("/").text
    events = grab(r'<table id="events">(.*?)</table>', page)
    ids = [int(i) for i in re.findall(r'<tr[^>]*><td class="num">(\d+)</td>', events)]
    assert ids == sorted(ids, reverse=True) and len(ids) == len(set(ids)) > 0  # newest first
    newest = grab(r"<tbody><tr([^>]*)>(.*?)</tr>", events, 0)
    assert 'class="this-job"' in newest and "job.finished" in newest  # the last thing alpha did
    assert OTHER_TENANTS_JOB not in page and OTHER_TENANTS_JOB not in listing
    summary = httpx.get(f"{scenario.server.url}/v1/summary", headers=auth(scenario.alpha)).json()
    cards = grab(r'<section class="cards" id="totals">(.*?)</section>', page)
    values = [html.unescape(v) for v in re.findall(r'<div class="value">([^<]*)</div>', cards)]
    expected = [summary["running"], summary["stopped"], summary["finished"]]
    assert values == [*map(str, expected), f"{summary['gpu_hours_freed']:,.2f}"]
    assert expected == [1, 1, 1]


def test_security_headers_and_no_inline_style_attributes(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        pages = [client.get("/"), client.get(f"/jobs/{STOPPED_JOB}"), client.get("/jobs/nope")]
    pages.append(httpx.get(scenario.server.url + "/login"))
    nonces = set()
    for r in pages:
        csp = r.headers["content-security-policy"]
        nonce = grab(r"style-src 'nonce-([^']+)'", csp)
        nonces.add(nonce)
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and f"script-src 'nonce-{nonce}'" in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
        # Every <style> and <script> carries this response's nonce; no style attribute (the CSP would block it).
        for tag in re.findall(r"<(?:style|script)\b[^>]*>", r.text):
            assert f'nonce="{nonce}"' in tag, tag
        assert " style=" not in r.text and "http://" not in r.text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert len(nonces) == len(pages)  # a fresh nonce per response


def test_sign_out_needs_the_form_token_and_ends_the_session(scenario: Scenario) -> None:
    with sign_in(scenario.server.url, scenario.alpha) as client:
        _sign_out(scenario, client)


def _sign_out(scenario: Scenario, client: httpx.Client) -> None:
    page = client.get("/").text
    csrf = html.unescape(grab(r'name="csrf" value="([^"]+)"', page))
    assert client.post("/logout", data={"csrf": "wrong"}).status_code == 403
    assert client.get("/").status_code == 200  # still signed in
    session = client.cookies["evalstop_session"]
    r = client.post("/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    # The old cookie is dead on the server, not only deleted in this browser.
    r = httpx.get(scenario.server.url + "/", cookies={"evalstop_session": session})
    assert r.status_code == 303 and r.headers["location"] == "/login"


def test_revoking_the_token_signs_the_browser_out(tmp_path: Path) -> None:
    with dashboard_scenario(tmp_path) as sc, sign_in(sc.server.url, sc.alpha) as client:
        assert client.get("/").status_code == 200
        cli("tenant", "revoke", "alpha", "--db", str(sc.server.db))
        # The server remembers a valid token for up to its cache TTL (1 s); poll past it.
        deadline = time.monotonic() + 20
        while (r := client.get("/")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert r.status_code == 303 and r.headers["location"] == "/login"


def test_session_store_bounds_its_size_and_checks_form_tokens() -> None:
    store = SessionStore(max_sessions=3)
    ids = [store.create(f"token-{i}")[0] for i in range(5)]
    assert len(store) == 3
    assert store.get(ids[0]) is None and store.get(ids[-1]) is not None
    session = store.get(ids[-1])
    assert session is not None and session.token == "token-4"
    assert session.form_token_ok(session.csrf) and not session.form_token_ok("x") and not session.form_token_ok(None)
    store.end(ids[-1])
    assert store.get(ids[-1]) is None
    with pytest.raises(ValueError):
        SessionStore(ttl_s=0)


def test_a_long_history_is_drawn_thinned_with_its_marked_points() -> None:
    points = [(step, math.sin(step / 500.0)) for step in range(1, 10_001)]
    svg = eval_curve(points, best_step=785, stop_step=9_999)
    drawn = grab(r'<polyline class="line" points="([^"]+)"', svg).split()
    assert 1000 < len(drawn) <= MAX_POINTS + 3
    assert 'data-step="785"' in svg and 'data-step="9999"' in svg and '<circle class="ring"' in svg
    assert '<circle class="dot"' not in svg  # no dots on a dense line
    assert "no reports yet" in eval_curve([])


def _recent_events(store: Store) -> None:
    tenant, _ = store.add_tenant("t")
    other, _ = store.add_tenant("o")
    store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {"k": 2}}))
    for step, value in ((10, 0.5), (20, 0.4), (30, 0.3)):
        store.submit_report(tenant.tenant_id, Report("j", "rlhf", step, value)).result()
    everything = store.list_events(tenant.tenant_id, limit=1000)
    newest = store.recent_events(tenant.tenant_id, limit=3)
    assert [e.id for e in newest] == [e.id for e in reversed(everything)][:3]
    assert [e.type for e in newest] == ["job.stopped", "report.accepted", "report.accepted"]
    assert [e.type for e in store.recent_events(other.tenant_id)] == ["tenant.added"]
    assert len(store.recent_events(tenant.tenant_id, limit=100)) == len(everything)


def test_recent_events_on_sqlite(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "service.db")
    try:
        _recent_events(store)
    finally:
        store.close()


@pytest.mark.postgres
def test_recent_events_on_postgres() -> None:
    from platform_sim.service.store_postgres import PostgresStore

    with postgres_database("evalstop_dashboard") as url:
        store = PostgresStore(url, workers=2)
        try:
            _recent_events(store)
        finally:
            store.close()
