"""Isolation: an error in one operation fails that operation alone, and every queued operation is answered.

A real server process on loopback with a real SQLite file; one job's detector (``faulty``, registered by
``tests/_service_faulty_server.py`` through the core's public registry) raises arbitrary exceptions while 32 other
jobs of two tenants report concurrently, so that their reports share group commits with the faulty ones.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port

from platform_sim.core import JobMonitor, Report, detector_from_spec
from platform_sim.service.store import JobRecord
from platform_sim.service.store_sqlite import SQLiteStore
from platform_sim.service.writer import OperationFailed

FAULTY_SERVER = (sys.executable, str(Path(__file__).with_name("_service_faulty_server.py")))
N_GOOD = 32  # jobs reporting beside the faulty one
N_EVALS = 12
BAD_STEPS = 192  # the faulty job reports steps 0..191: each entry of FAULTS (a cycle of 16) twelve times
TIMEOUT_S = 30.0


def _score(job: int, i: int) -> float:
    # Rises, then falls for some jobs, so that some stop and some do not.
    return 0.1 * i - (0.25 * (i - 6) if job % 3 == 0 and i > 6 else 0.0) + 0.001 * job


async def _drive(
    srv: Server, tokens: list[str]
) -> tuple[dict[str, list[httpx.Response]], list[tuple[int, httpx.Response]]]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT_S, limits=limits) as client:
        jobs = {f"good-{j:02d}": tokens[j % 2] for j in range(N_GOOD)}
        for j, (job_id, token) in enumerate(jobs.items()):
            spec = {"name": "k-decline", "params": {"k": 2}} if j % 2 else {"name": "shape"}
            r = await client.post(
                "/v1/jobs", json={"job_id": job_id, "job_type": "rlhf", "detector": spec}, headers=auth(token)
            )
            assert r.status_code == 201, r.text
        r = await client.post(
            "/v1/jobs",
            json={"job_id": "bad", "job_type": "rlhf", "detector": {"name": "faulty"}},
            headers=auth(tokens[0]),
        )
        assert r.status_code == 201, r.text

        async def good(j: int, job_id: str, token: str) -> list[httpx.Response]:
            out = []
            for i in range(N_EVALS):
                body = {"job_id": job_id, "job_type": "rlhf", "step": 10 * (i + 1), "eval_score": _score(j, i)}
                out.append(await client.post(f"/v1/jobs/{job_id}/evals", json=body, headers=auth(token)))
            return out

        async def bad(lane: int) -> list[tuple[int, httpx.Response]]:
            # Several lanes at once so that faulty reports land in the same batches as the good ones; each step
            # once per lane (a step answered 200 in one lane is a re-send or conflict in the others).
            out = []
            for step in range(lane, BAD_STEPS, 4):
                body = {"job_id": "bad", "job_type": "rlhf", "step": step, "eval_score": 0.5 - 0.001 * step}
                out.append((step, await client.post("/v1/jobs/bad/evals", json=body, headers=auth(tokens[0]))))
            return out

        answers = await asyncio.gather(
            *(good(j, job_id, tok) for j, (job_id, tok) in enumerate(jobs.items())), *(bad(lane) for lane in range(4))
        )
        return dict(zip(jobs, answers[:N_GOOD])), [r for lane in answers[N_GOOD:] for r in lane]


def test_one_jobs_faulty_detector_fails_its_reports_alone(tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    tokens = [add_tenant(db, "alpha"), add_tenant(db, "beta")]
    srv = Server(db, free_port(), cmd=FAULTY_SERVER).start()
    try:
        good, bad = asyncio.run(asyncio.wait_for(_drive(srv, tokens), timeout=300))
        # Every other job's reports succeed, with the decisions an embedded monitor gives for the same evals.
        for j, (job_id, answers) in enumerate(good.items()):
            spec = {"name": "k-decline", "params": {"k": 2}} if j % 2 else {"name": "shape"}
            monitor = JobMonitor(job_id, "rlhf", detector_from_spec(spec))
            for i, r in enumerate(answers):
                assert r.status_code == 200, (job_id, i, r.status_code, r.text)
                assert r.json() == monitor.observe(10 * (i + 1), _score(j, i)).to_dict(), (job_id, i)
        # The faulty job: a 500 naming an internal error for each injected fault, never a hang or a dropped
        # connection; what it stored is exactly the steps answered 200 (a failed report left nothing behind).
        codes = {r.status_code for _, r in bad}
        assert codes <= {200, 409, 500}, codes
        assert 500 in codes and 200 in codes
        assert all(r.json()["error"] == "internal_error" for _, r in bad if r.status_code == 500)
        accepted = sorted(step for step, r in bad if r.status_code == 200)
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            job = client.get("/v1/jobs/bad", headers=auth(tokens[0])).json()
            # The state the detector half-changed before raising was never kept: declines stay small.
            assert job["last_decision"]["declines"] < 1000
            assert client.get("/readyz").status_code == 200
    finally:
        srv.stop()
    store = SQLiteStore(db)
    try:
        stored = [r.step for r in store.reports(1, "bad")]
    finally:
        store.close()
    assert stored == sorted(stored) and set(accepted) <= set(stored), (accepted, stored)
    assert job["n_reports"] == len(stored)


def test_store_answers_every_queued_operation_when_one_raises(tmp_path: Path) -> None:
    """In-process, on the store: a batch holding one faulty report and many good ones commits the good ones and
    fails the faulty one alone with OperationFailed; nothing stays unanswered."""
    import _service_faulty_server  # noqa: F401 - registers the faulty detector in this process

    store = SQLiteStore(tmp_path / "s.db", max_batch=256)
    try:
        tenant, _ = store.add_tenant("t")
        store.register_job(tenant.tenant_id, JobRecord("bad", "rlhf", {"name": "faulty"}))
        for j in range(32):
            store.register_job(tenant.tenant_id, JobRecord(f"g{j}", "rlhf", {"name": "k-decline"}))
        # Queue everything before the writer can take it, so that the faults share batches with the good reports.
        futures = []
        for i in range(6):
            futures.append(("bad", i, store.submit_report(tenant.tenant_id, Report("bad", "rlhf", i, 0.5))))
            for j in range(32):
                futures.append((f"g{j}", i, store.submit_report(tenant.tenant_id, Report(f"g{j}", "rlhf", i, i))))
        for job_id, step, fut in futures:
            if job_id == "bad" and step in (1, 2, 4, 5):  # FAULTS of the faulty detector at these steps
                with pytest.raises(OperationFailed, match="internal error"):
                    fut.result(timeout=30)
            else:
                assert fut.result(timeout=30).decision.action.value == "continue", (job_id, step)
        assert [r.step for r in store.reports(tenant.tenant_id, "bad")] == [0, 3]
        assert all(len(store.reports(tenant.tenant_id, f"g{j}")) == 6 for j in range(32))
    finally:
        store.close()
