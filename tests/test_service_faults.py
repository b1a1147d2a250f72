"""kill -9 of the server in the middle of a run, restart on the same database: nothing acknowledged is lost."""

from __future__ import annotations

import random
import threading
import time

from service_support import Server, add_tenant, free_port

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, Report
from platform_sim.service.sqlite_store import SQLiteStore

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
            with PlatformClient(srv.url, token, max_retries=1, backoff=0.02, connect_timeout=0.5,
                                timeout=2.0) as client:
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
    acked_before_kill = {job: [(s, d) for s, d, src, after in results[job] if src == "service" and not after]
                         for job in traces}
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
