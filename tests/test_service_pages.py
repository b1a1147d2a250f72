"""The paged listings (jobs, a job's evals, events) under the fairness rules of ``platform_sim/service/fairness.py``:
the stores' streaming reads (on SQLite and PostgreSQL), the foreground gate and its pacer, the ASGI middleware that
counts foreground requests, and every listing charged by its rows on a real server process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port, postgres_database

from platform_sim.core import Report
from platform_sim.service.fairness import CountForeground, ForegroundGate, json_page, render_rows
from platform_sim.service.store import JobNotFound, JobRecord, Store
from platform_sim.service.store_sqlite import READ_BATCH, SQLiteStore

NEVER_STOPS = {"name": "k-decline", "params": {"k": 1000}}
N_JOBS = 2 * READ_BATCH + 22  # more than two of the SQLite store's read batches


def _fill(store: Store) -> int:
    """A tenant with N_JOBS jobs (every third finished, from the second on), and 150 reports on job a-00000; its id."""
    tenant, _ = store.add_tenant("t")
    store.add_tenant("other")
    for i in range(N_JOBS):
        store.register_job(tenant.tenant_id, JobRecord(f"a-{i:05d}", "rlhf", NEVER_STOPS))
    for i in range(1, N_JOBS, 3):
        store.finish_job(tenant.tenant_id, f"a-{i:05d}", "done")
    futures = [store.submit_report(tenant.tenant_id, Report("a-00000", "rlhf", s, 0.5)) for s in range(150)]
    for f in futures:
        f.result()
    return tenant.tenant_id


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, int]]:
    if request.param == "sqlite":
        store: Store = SQLiteStore(tmp_path / "s.db", synchronous="NORMAL")
        try:
            yield store, _fill(store)
        finally:
            store.close()
        return
    from platform_sim.service.store_postgres import PostgresStore

    with postgres_database("evalstop_pages") as url:
        store = PostgresStore(url, workers=2)
        try:
            yield store, _fill(store)
        finally:
            store.close()


def test_iterating_a_listing_pages_through_every_job_once_in_order(filled: tuple[Store, int]) -> None:
    store, tid = filled
    seen: list[str] = []
    after = None
    while True:
        page = [j.job_id for j in store.iter_jobs(tid, limit=50, after=after)]
        seen += page
        if len(page) < 50:
            break
        after = page[-1]
    assert seen == [f"a-{i:05d}" for i in range(N_JOBS)]
    assert [j.job_id for j in store.list_jobs(tid, limit=1000)] == seen
    finished = [j.job_id for j in store.iter_jobs(tid, status="finished", limit=1000)]
    assert finished == [f"a-{i:05d}" for i in range(1, N_JOBS, 3)]
    assert list(store.iter_jobs(tid, limit=1000)) == store.list_jobs(tid, limit=1000)  # the same records


def test_iterating_evals_and_events_equals_the_lists(filled: tuple[Store, int]) -> None:
    store, tid = filled
    newest = [r.step for r in store.iter_evals(tid, "a-00000", limit=1000)]
    assert newest == list(range(149, -1, -1))
    assert [r.step for r in store.iter_evals(tid, "a-00000", order="step", cursor=100, limit=5)] == [
        101,
        102,
        103,
        104,
        105,
    ]
    assert list(store.iter_evals(tid, "a-00000", limit=1000)) == store.list_evals(tid, "a-00000", limit=1000)
    events = list(store.iter_events(tid, limit=1000))
    assert events == store.list_events(tid, limit=1000)
    assert sum(e.type == "report.accepted" for e in events) == 150
    assert list(store.iter_events(tid, after=events[9].id, limit=3)) == events[10:13]
    assert len(list(store.iter_events(None, limit=1000))) == len(events) + 1  # the other tenant's tenant.added


def test_bad_arguments_and_missing_jobs_are_refused_at_the_call(filled: tuple[Store, int]) -> None:
    """Before anything is iterated: the route's error handling sees them where it calls the store."""
    store, tid = filled
    with pytest.raises(ValueError, match="status"):
        store.iter_jobs(tid, status="paused")
    with pytest.raises(ValueError, match="order"):
        store.iter_evals(tid, "a-00000", order="oldest")
    with pytest.raises(JobNotFound):
        store.iter_evals(tid, "no-such-job")


def test_an_abandoned_iteration_leaves_the_store_usable(filled: tuple[Store, int]) -> None:
    """A page given up halfway (a client gone, an error while rendering) releases its read: the same thread reads
    and writes on."""
    store, tid = filled
    it = store.iter_jobs(tid, limit=1000)
    assert next(it).job_id == "a-00000"
    it.close()
    assert store.get_job(tid, "a-00002").job_id == "a-00002"
    store.submit_report(tid, Report("a-00002", "rlhf", 0, 0.5)).result()
    assert store.get_job(tid, "a-00002").n_reports == 1


# -- the foreground gate ------------------------------------------------------------------------------------------
def _pace_in_thread(pace: Any) -> threading.Thread:
    t = threading.Thread(target=pace, daemon=True)
    t.start()
    return t


def test_a_page_waits_for_the_foreground_to_finish() -> None:
    gate = ForegroundGate(slice_s=0.0, max_pause_s=60.0)
    gate.enter()
    waiting = _pace_in_thread(gate.pacer())
    waiting.join(0.3)
    assert waiting.is_alive(), "the page went on while a foreground request was in progress"
    gate.leave()
    waiting.join(10)
    assert not waiting.is_alive()


def test_a_page_does_not_wait_when_nothing_is_in_progress_or_before_its_slice_is_done() -> None:
    gate = ForegroundGate(slice_s=0.5, max_pause_s=60.0)
    now = [0.0]
    pace = gate.pacer(clock=lambda: now[0])
    pace()  # idle: returns
    gate.enter()
    now[0] = 0.4
    done = _pace_in_thread(pace)  # busy, but only 0.4 s of the 0.5 s slice worked
    done.join(10)
    assert not done.is_alive()
    now[0] = 0.6
    waiting = _pace_in_thread(pace)  # the slice is done: it gives way
    waiting.join(0.3)
    assert waiting.is_alive()
    gate.leave()
    waiting.join(10)
    assert not waiting.is_alive()


def test_a_page_progresses_under_a_foreground_that_never_ends() -> None:
    gate = ForegroundGate(slice_s=0.0, max_pause_s=0.01)
    gate.enter()
    pace = gate.pacer()
    finished = _pace_in_thread(lambda: [pace() for _ in range(20)])
    finished.join(10)
    assert not finished.is_alive(), "a page waited for more than max_pause_s at a time"


def test_background_takes_the_request_out_of_the_count() -> None:
    gate = ForegroundGate()
    gate.enter()
    with gate.background():
        assert gate.in_progress == 0
    assert gate.in_progress == 1
    with pytest.raises(RuntimeError), gate.background():
        raise RuntimeError
    assert gate.in_progress == 1
    with pytest.raises(ValueError):
        ForegroundGate(slice_s=-1.0)


def test_the_middleware_counts_http_requests_while_they_are_served() -> None:
    gate = ForegroundGate()
    seen: list[tuple[str, int]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(0)  # the other request enters meanwhile
        seen.append((scope["type"], gate.in_progress))
        if scope.get("path") == "/boom":
            raise RuntimeError("boom")

    mw = CountForeground(app, gate)

    async def main() -> None:
        await asyncio.gather(
            mw({"type": "http", "path": "/a"}, None, None), mw({"type": "http", "path": "/b"}, None, None)
        )
        await mw({"type": "lifespan"}, None, None)
        with pytest.raises(RuntimeError):
            await mw({"type": "http", "path": "/boom"}, None, None)

    asyncio.run(main())
    assert seen == [("http", 2), ("http", 1), ("lifespan", 0), ("http", 1)]  # the first ended before the second looked
    assert gate.in_progress == 0


def test_a_rendered_page_is_the_json_of_its_rows() -> None:
    import json

    calls = []
    rows = render_rows(iter([{"a": 1}, {"b": "é"}]), lambda r: {**r, "x": None}, lambda: calls.append(1))
    assert len(calls) == 2 and rows.last == {"b": "é"}
    body = json_page({"job_id": "j"}, "evals", rows.parts, {"next_cursor": None})
    assert json.loads(body) == {
        "job_id": "j",
        "evals": [{"a": 1, "x": None}, {"b": "é", "x": None}],
        "next_cursor": None,
    }
    assert json.loads(json_page({}, "jobs", [], {"next_after": 3})) == {"jobs": [], "next_after": 3}
    assert render_rows(iter([]), dict, lambda: None).last is None


# -- every listing is charged by its rows, on a real server --------------------------------------------------------
@pytest.fixture(scope="module")
def heavy_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A tenant with a job of 1,000 reports (so 1,000+ events); its token and the admin token's file."""
    folder = tmp_path_factory.mktemp("pages")
    db = folder / "service.db"
    token = add_tenant(db, "heavy")
    store = SQLiteStore(db, synchronous="NORMAL")
    try:
        tenant = store.tenant_for_token(token)
        assert tenant is not None
        store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", NEVER_STOPS))
        for f in [store.submit_report(tenant.tenant_id, Report("j", "rlhf", s, 0.5)) for s in range(1000)]:
            f.result()
    finally:
        store.close()
    admin = folder / "admin-token"
    admin.write_text("admin-" + "y" * 40)
    return db, token, str(admin)


@pytest.mark.parametrize("path", ["/v1/jobs/j/evals", "/v1/events"])
def test_a_page_of_evals_or_events_is_charged_by_its_rows(heavy_db: tuple[Path, str, str], path: str) -> None:
    """With a burst of 13, two 1,000-row pages (11 tokens each, charged after the read) pass and the third is
    refused with 429, as for ``GET /v1/jobs``; the operator's admin token reads its pages uncharged."""
    db, token, admin = heavy_db
    srv = Server(db, free_port(), extra_args=("--rate-limit", "0.5", "--rate-burst", "13", "--admin-token-file", admin))
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=20) as c:
            answers = [c.get(path, params={"limit": "1000"}) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        key = "evals" if "evals" in path else "events"
        assert len(answers[0].json()[key]) == 1000
        if key == "events":
            with httpx.Client(base_url=srv.url, headers=auth(Path(admin).read_text()), timeout=20) as c:
                assert [c.get(path, params={"limit": "1000"}).status_code for _ in range(3)] == [200, 200, 200]
    finally:
        srv.stop()
