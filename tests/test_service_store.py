"""The SQLite store on a real file: restart gives the same decisions, concurrent reports are serialized."""

from __future__ import annotations

import random
import threading

import pytest

from evalstop_callbacks.client import EmbeddedClient
from platform_sim.core import ConflictError, Report
from platform_sim.service.store import JobFinished, JobNotFound, JobRecord
from platform_sim.service.store_sqlite import SQLiteStore


def _trace(seed: int, n: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    score, out = 0.0, []
    for i in range(n):
        score += rng.gauss(0.0, 0.1)
        out.append((i * 7, round(score, 6)))
    return out


def _job(job_id: str, k: int = 2) -> JobRecord:
    return JobRecord(job_id=job_id, job_type="rlhf", detector={"name": "k-decline", "params": {"k": k}})


@pytest.mark.parametrize("cut", [0, 3, 11])
def test_restart_gives_the_same_decisions(tmp_path, cut):
    trace = _trace(cut, 25)
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector={"name": "k-decline", "params": {"k": 3}}, job_id="j")
    expected = [embedded.report(Report("j", "rlhf", s, v)) for s, v in trace]

    store = SQLiteStore(tmp_path / "s.db")
    tenant, _ = store.add_tenant("t")
    store.register_job(tenant.tenant_id, _job("j", k=3))
    got = [store.submit_report(tenant.tenant_id, Report("j", "rlhf", s, v)).result().decision for s, v in trace[:cut]]
    store.close()

    reopened = SQLiteStore(tmp_path / "s.db")
    # A re-send of an already stored step after the restart answers the stored decision.
    if cut:
        s, v = trace[cut - 1]
        again = reopened.submit_report(tenant.tenant_id, Report("j", "rlhf", s, v)).result()
        assert again.resend and again.decision == expected[cut - 1]
    got += [
        reopened.submit_report(tenant.tenant_id, Report("j", "rlhf", s, v)).result().decision for s, v in trace[cut:]
    ]
    assert got == expected
    stored = reopened.reports(tenant.tenant_id, "j")
    assert [(r.step, r.eval_score) for r in stored] == trace
    assert [r.decision for r in stored] == expected
    reopened.close()


def test_two_store_instances_on_one_file_never_use_stale_state(tmp_path):
    """Two processes (here: two stores) writing one job alternately still follow the core exactly."""
    trace = _trace(7, 12)
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector={"name": "k-decline", "params": {"k": 2}}, job_id="j")  # the spec _job stores
    a = SQLiteStore(tmp_path / "shared.db")
    tenant, _ = a.add_tenant("t")
    a.register_job(tenant.tenant_id, _job("j"))
    b = SQLiteStore(tmp_path / "shared.db")
    for i, (s, v) in enumerate(trace):
        store = a if i % 3 else b  # a's cached monitor is stale after every report b took
        got = store.submit_report(tenant.tenant_id, Report("j", "rlhf", s, v)).result().decision
        assert got == embedded.report(Report("j", "rlhf", s, v)), f"step {s}"
    a.close()
    b.close()


def test_concurrent_reports_for_one_job_are_serialized(tmp_path):
    """Eight threads send the same report stream (retries racing): every step is stored once, decisions agree."""
    trace = _trace(3, 40)
    embedded = EmbeddedClient()
    embedded.register("rlhf", detector={"name": "k-decline", "params": {"k": 2}}, job_id="j")  # the spec _job stores
    expected = {s: embedded.report(Report("j", "rlhf", s, v)) for s, v in trace}
    store = SQLiteStore(tmp_path / "c.db", max_batch=16)
    tenant, _ = store.add_tenant("t")
    store.register_job(tenant.tenant_id, _job("j"))
    answers: dict[int, list] = {s: [] for s, _ in trace}
    errors: list[Exception] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for s, v in trace:
            try:
                answers[s].append(store.submit_report(tenant.tenant_id, Report("j", "rlhf", s, v)).result())
            except ConflictError as exc:  # a thread that lags behind another sees "older than the last step"
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all("older than the last" in str(e) for e in errors)
    for s, outcomes in answers.items():
        assert outcomes, f"step {s} never answered"
        assert all(o.decision == expected[s] for o in outcomes)
        assert sum(not o.resend for o in outcomes) <= 1
    stored = store.reports(tenant.tenant_id, "j")
    assert [(r.step, r.eval_score) for r in stored] == trace
    store.close()


def test_tenant_isolation_and_finished_jobs(tmp_path):
    store = SQLiteStore(tmp_path / "t.db")
    t1, tok1 = store.add_tenant("one")
    t2, _ = store.add_tenant("two")
    assert store.tenant_for_token(tok1) == t1
    store.register_job(t1.tenant_id, _job("j"))
    with pytest.raises(JobNotFound):
        store.get_job(t2.tenant_id, "j")
    with pytest.raises(JobNotFound):
        store.submit_report(t2.tenant_id, Report("j", "rlhf", 0, 1.0)).result()
    store.finish_job(t1.tenant_id, "j", "completed")
    with pytest.raises(JobFinished):
        store.submit_report(t1.tenant_id, Report("j", "rlhf", 0, 1.0)).result()
    store.revoke_tenant("one")
    assert store.tenant_for_token(tok1) is None
    store.close()


def test_database_settings_are_durable(tmp_path):
    store = SQLiteStore(tmp_path / "d.db")
    conn = store._reader()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "e.db", synchronous="OFF")


def test_tenant_detector_command_applies_the_fleet_rule_to_finished_jobs(tmp_path):
    # `evalstop-server tenant detector NAME`: the fleet rule over a tenant's jobs that finished unstopped, read from a
    # real SQLite file. Rising runs -> shape-sens; plateaued runs -> shape; stopped runs and other tenants don't count.
    import json

    import numpy as np
    from service_support import cli

    from platform_sim.sim.policies.stop_policies import FleetEvalStopPolicy

    db = tmp_path / "fleet.db"
    store = SQLiteStore(db)
    rising = list(np.linspace(0.1, 0.7, 20))
    flat = list(0.6 - 0.5 * np.exp(-np.linspace(0.05, 1.0, 20) / 0.1))
    ids = {}
    for name in ("climbers", "plateaus"):
        tenant, _ = store.add_tenant(name)
        ids[name] = tenant.tenant_id
    for name, runs in (("climbers", [rising] * 8), ("plateaus", [flat] * 8)):
        for i, scores in enumerate(runs):
            job = f"{name}-{i}"
            store.register_job(
                ids[name], JobRecord(job_id=job, job_type="rlhf", detector={"name": "k-decline", "params": {"k": 50}})
            )
            for step, score in enumerate(scores):
                store.submit_report(ids[name], Report(job, "rlhf", step * 10, float(score))).result()
            store.finish_job(ids[name], job, "completed")
    # A stopped run of the climbers (its monitor stopped it) must not count: with it, still 8 unstopped.
    store.register_job(
        ids["climbers"], JobRecord(job_id="hack", job_type="rlhf", detector={"name": "k-decline", "params": {"k": 1}})
    )
    for step, score in enumerate([0.5, 0.4]):
        store.submit_report(ids["climbers"], Report("hack", "rlhf", step, score)).result()
    store.finish_job(ids["climbers"], "hack", "stopped")
    store.close()

    defaults = FleetEvalStopPolicy().choice
    out = json.loads(cli("tenant", "detector", "climbers", "--db", str(db), "--json").stdout)
    assert out["regime"] == "aggressive" and out["detector"] == defaults.aggressive
    assert out["finished_unstopped"] == 8 and out["median_late_gain"] == pytest.approx(0.5, abs=0.01)
    out = json.loads(cli("tenant", "detector", "plateaus", "--db", str(db), "--json").stdout)
    assert out["regime"] == "conservative" and out["detector"] == defaults.conservative
    few = json.loads(cli("tenant", "detector", "climbers", "--db", str(db), "--json", "--min-runs", "9").stdout)
    assert few["regime"] == "conservative" and few["median_late_gain"] is None
    human = cli("tenant", "detector", "climbers", "--db", str(db)).stdout
    assert "aggressive (median late gain 0.50" in human and json.loads(human.splitlines()[-1]) == defaults.aggressive
    bad = cli("tenant", "detector", "nobody", "--db", str(db), check=False)
    assert bad.returncode == 2 and "no tenant 'nobody'" in bad.stderr
    bad = cli("tenant", "detector", "climbers", "--db", str(db), "--min-runs", "10", "--window", "5", check=False)
    assert bad.returncode == 2 and "window" in bad.stderr
