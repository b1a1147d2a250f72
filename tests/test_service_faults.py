"""kill -9 of the server in the middle of a run, restart on the same database: nothing acknowledged is lost."""

from __future__ import annotations

import random
import threading
import time

from service_support import Server, add_tenant, free_port, overoptimization_reports

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, Report
from platform_sim.service.store_sqlite import SQLiteStore

N_JOBS = 8
N_EVALS = 150


def _trace(seed: int) -> list[tuple[int, float]]:
    # Noisy rise then a late decline, so some jobs stop before the kill, some after, some never.
    rng = random.Random(seed)
    peak = rng.randint(N_EVALS // 3, N_EVALS + 20)
    return [(10 * i, (i if i <= peak else 2 * peak - i) * 0.01 + rng.gauss(0, 0.004)) for i in range(N_EVALS)]


def test_kill9_mid_run_then_restart_loses_no_acknowledged_report(tmp_path):
    db = tmp_path / "faults.db"
    token = add_tenant(db, "acme")
    srv = Server(db, free_port()).start()
    detector = {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    traces = {f"job-{i}": _trace(i) for i in range(N_JOBS)}
    results: dict[str, list] = {job: [] for job in traces}
    killed = threading.Event()
    restarted = threading.Event()
    failures: list[BaseException] = []

    def run(job: str) -> None:
        try:
            with PlatformClient(
                srv.url, token, max_retries=1, backoff=0.02, connect_timeout=0.5, timeout=2.0
            ) as client:
                client.register("rlhf", detector=detector, job_id=job, gpus=1)
                during_outage = 0
                for step, score in traces[job]:
                    if killed.is_set() and not restarted.is_set():
                        during_outage += 1
                        if during_outage > 5:  # a few reports while the server is down, then wait for it
                            restarted.wait(60)
                    decision = client.report(Report(job, "rlhf", step, score))
                    results[job].append((step, decision, client.last_source, killed.is_set()))
                client.finish(job, "completed")
                assert client.pending(job) == 0, f"{job}: reports never reached the restarted server"
        except BaseException as exc:  # surfaced in the main thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in traces]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while sum(len(r) for r in results.values()) < N_JOBS * N_EVALS // 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # kill once about a third of the run is acknowledged, however fast the machine is
    srv.kill9()  # SIGKILL: no shutdown hook, no flush
    killed.set()
    acked_before_kill = {
        job: [(s, d) for s, d, src, after in results[job] if src == "service" and not after] for job in traces
    }
    time.sleep(0.5)
    srv.start()
    restarted.set()
    for t in threads:
        t.join(timeout=120)
    srv.stop()
    assert not failures, failures
    assert sum(len(v) for v in acked_before_kill.values()) > 0, "the kill came before any report was acknowledged"
    assert any(src == "fallback" for job in traces for _, _, src, _ in results[job]), "the kill missed the run"

    store = SQLiteStore(db)
    tenant = store.list_tenants()[0]
    for job, trace in traces.items():
        stored = {r.step: r for r in store.reports(tenant.tenant_id, job)}
        # Every report acknowledged before the kill is in the store with the decision that was answered.
        for step, decision in acked_before_kill[job]:
            assert step in stored and stored[step].decision == decision, f"{job} step {step} lost"
        # After the restart the backlog was re-sent: the store holds the whole trace, in order.
        assert [(s, r.eval_score) for s, r in sorted(stored.items())] == trace
        # Every decision the run saw (from the service or the fallback) is the core's decision on the trace.
        emb = EmbeddedClient()
        emb.register("rlhf", detector=detector, job_id=job)
        expected = [emb.report(Report(job, "rlhf", s, v)) for s, v in trace]
        assert [d for _, d, _, _ in results[job]] == expected
        assert store.get_job(tenant.tenant_id, job).status == "finished"
    assert any(d.action is Action.STOP for job in traces for _, d, _, _ in results[job])
    store.close()


def test_a_commit_that_fails_answers_503_records_nothing_and_the_resend_succeeds(tmp_path):
    # A real SQLite failure, not a mock: the writer connection's page limit is set to the database's current size, so
    # the next transaction that needs a new page fails with SQLITE_FULL ("database or disk is full"), as on a full disk.
    from fastapi.testclient import TestClient

    from platform_sim.service.app import create_app

    store = SQLiteStore(tmp_path / "full.db")
    _, token = store.add_tenant("acme")
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, close_store=True, max_eval_scores=20_000)) as c:
        assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "j"}, headers=headers).status_code == 201
        for step in range(3):
            body = {"job_id": "j", "job_type": "rlhf", "step": step, "eval_score": 0.1 * step}
            assert c.post("/v1/jobs/j/evals", json=body, headers=headers).status_code == 200
        writers = list(store._conns)  # the writer and this thread's readers; the limit only bites on writes
        pages = writers[0].execute("PRAGMA page_count").fetchone()[0]
        for conn in writers:
            conn.execute(f"PRAGMA max_page_count = {pages}")
        big = [0.5] * 20_000  # per-example scores: more than the free space of the last page
        body = {"job_id": "j", "job_type": "rlhf", "step": 3, "eval_score": 0.5, "eval_scores": big}
        failed = c.post("/v1/jobs/j/evals", json=body, headers=headers)
        assert failed.status_code == 503, failed.text
        assert failed.json()["error"] == "unavailable" and "full" in failed.json()["message"]
        view = c.get("/v1/jobs/j", headers=headers).json()
        assert view["n_reports"] == 3 and view["last_step"] == 2  # nothing of the failed report was kept
        for conn in writers:
            conn.execute("PRAGMA max_page_count = 1073741823")
        again = c.post("/v1/jobs/j/evals", json=body, headers=headers)  # the client's re-send
        assert again.status_code == 200, again.text
        assert c.get("/v1/jobs/j", headers=headers).json()["n_reports"] == 4


def test_restart_mid_run_keeps_a_per_example_detectors_state(tmp_path):
    # The shape detector's state (history, previous per-example scores, pooled paired noise) lives in the store:
    # after kill -9 and a restart on the same database, its decisions are those of an uninterrupted embedded run.
    import httpx

    db = tmp_path / "shape.db"
    token = add_tenant(db, "acme")
    port = free_port()
    srv = Server(db, port).start()
    detector = {"name": "shape", "params": {"threshold": 0.8}}
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector=detector, job_id="s")
    reports = overoptimization_reports("s", peak_eval=10, seed=3)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        assert (
            httpx.post(
                f"{srv.url}/v1/jobs", json={"job_type": "rlhf", "job_id": "s", "detector": detector}, headers=headers
            ).status_code
            == 201
        )
        got = []
        for i, rep in enumerate(reports):
            if i == 12:
                srv.kill9()
                srv = Server(db, port).start()
            resp = httpx.post(f"{srv.url}/v1/jobs/s/evals", json=rep.to_dict(), headers=headers)
            expected = embedded.report(rep).to_dict()
            assert resp.status_code == 200 and resp.json() == expected, (i, resp.text, expected)
            got.append(expected["action"])
            if expected["action"] == "stop":
                break
        assert got[-1] == "stop" and len(got) > 12  # the stop came after the restart
    finally:
        srv.stop()
