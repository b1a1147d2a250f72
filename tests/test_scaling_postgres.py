"""The service on PostgreSQL: versioned migrations, row-lock serialization, and three replicas on one database.

Needs a PostgreSQL server: ``tests/run.sh`` starts one on loopback (tests/pg.sh) and exports ``EVALSTOP_PG_URL``
(a URL of a role that may create databases). Each test makes its own database and drops it at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from platform_sim.core import default_spec, detector_from_spec

PG_URL = os.environ.get("EVALSTOP_PG_URL", "")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not PG_URL, reason="EVALSTOP_PG_URL is not set: no PostgreSQL server (tests/run.sh starts one with tests/pg.sh)"
    ),
]

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from platform_sim.core import Action, ConflictError, JobMonitor, Report  # noqa: E402
from platform_sim.service.postgres_migrations import upgrade_schema  # noqa: E402
from platform_sim.service.store import JobRecord  # noqa: E402
from platform_sim.service.store_postgres import PostgresStore  # noqa: E402

PLANNED_STEPS = 1000  # what the replicas test's jobs register (the service's detector sees it with every report)


def _db_url(name: str) -> str:
    base, _, _query = PG_URL.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A fresh, empty database on the test server; dropped afterwards."""
    name = f"evalstop_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _db_url(name)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- migrations ------------------------------------------------------------------------------------------------------


def test_migrations_are_versioned_and_concurrent_replicas_migrate_once(pg_db: str) -> None:
    # Three replicas (processes) starting at once: the advisory lock lets one migrate; the others find the schema
    # at head. Without the lock two would try to create the same tables and fail.
    code = (
        "import sys; from platform_sim.service.postgres_migrations import upgrade_schema; "
        "print(upgrade_schema(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, pg_db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["0005_spread"] * 3
    # Threads of one process take turns (Alembic's context is process-global).
    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(lambda _: upgrade_schema(pg_db), range(3))) == ["0005_spread"] * 3
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0005_spread",)]
        tables = {
            r[0] for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }
    assert {"tenants", "jobs", "reports", "alembic_version"} <= tables
    # Downgrade to nothing and back: the migration is reversible.
    assert upgrade_schema(pg_db) == "0005_spread"
    from alembic import command
    from alembic.config import Config

    from platform_sim.service import postgres_migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(postgres_migrations.MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", postgres_migrations._sqlalchemy_url(pg_db))
    command.downgrade(cfg, "base")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)
    assert upgrade_schema(pg_db) == "0005_spread"


def test_unknown_schema_revision_and_unmigrated_database_are_refused(pg_db: str) -> None:
    with pytest.raises(ValueError, match="run the migrations first"):
        PostgresStore(pg_db, migrate=False)
    upgrade_schema(pg_db)
    PostgresStore(pg_db, migrate=False).close()  # at head: accepted
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(ValueError, match="'9999'.*upgrade evalstop"):
        PostgresStore(pg_db)


def test_not_a_postgres_url_is_refused() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        PostgresStore("evalstop.db")


# -- the store, two replicas in one process ----------------------------------------------------------------------


def test_concurrent_reports_for_one_job_at_two_replicas_are_serialized(pg_db: str) -> None:
    a, b = PostgresStore(pg_db, workers=2), PostgresStore(pg_db, workers=2)
    try:
        tenant, _ = a.add_tenant("t")
        assert b.register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {}}))[1]
        assert not a.register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {}}))[1]
        rng = random.Random(7)
        expected = JobMonitor("j", "rlhf")
        for step in range(0, 200, 10):
            # The same step at both replicas at once with different scores: the row lock lets exactly one in; the
            # other sees a stored step with another score, a conflict, whatever order they commit in.
            ra, rb = Report("j", "rlhf", step, rng.random()), Report("j", "rlhf", step, rng.random())
            barrier = threading.Barrier(2)

            def send(store: PostgresStore, report: Report, barrier=barrier):  # noqa: ANN202
                barrier.wait()
                try:
                    return store.submit_report(tenant.tenant_id, report).result(timeout=30)
                except ConflictError as exc:
                    return exc

            with ThreadPoolExecutor(2) as pool:
                out_a, out_b = pool.map(send, (a, b), (ra, rb))
            errors = [o for o in (out_a, out_b) if isinstance(o, ConflictError)]
            assert len(errors) == 1, (out_a, out_b)
            winner = rb if isinstance(out_a, ConflictError) else ra
            outcome = out_b if winner is rb else out_a
            assert outcome.decision == expected.observe_report(winner)
        stored = a.reports(tenant.tenant_id, "j")
        assert [(r.step, r.eval_score) for r in stored] == list(zip(expected.steps, expected.scores))
        assert [r.decision for r in stored] == expected.decisions
        job = b.get_job(tenant.tenant_id, "j")
        assert (job.n_reports, job.stopped_at, job.best_step) == (20, expected.stopped_at, expected.best_step)
    finally:
        a.close()
        b.close()


# -- three evalstop-server processes on one database ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scores(rng: random.Random, n: int) -> list[float]:
    """A job's eval curve: rises, then (for most jobs) declines after a random peak, with noise."""
    peak = rng.randint(2, n + 3)
    return [0.5 + 0.02 * min(i, peak) - 0.03 * max(0, i - peak) + rng.gauss(0, 0.01) for i in range(n)]


def test_three_replicas_on_one_database_match_the_embedded_core(pg_db: str, tmp_path) -> None:
    httpx = pytest.importorskip("httpx")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "platform_sim.service.cli"]
    add = subprocess.run(
        [*cli, "tenant", "add", "team-a", "--db", pg_db], capture_output=True, text=True, env=env, timeout=120
    )
    assert add.returncode == 0, add.stderr
    token = add.stdout.strip().splitlines()[-1]
    ports = [_free_port() for _ in range(3)]
    logs = [open(tmp_path / f"replica-{p}.log", "w") for p in ports]  # a file: a full pipe would block a server
    procs = [
        subprocess.Popen(
            [*cli, "serve", "--port", str(p), "--db", pg_db, "--log-level", "warning"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for p, log in zip(ports, logs)
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        deadline = time.monotonic() + 90
        for url, proc, log in zip(urls, procs, logs):
            while True:
                assert proc.poll() is None, open(log.name).read()[-3000:]
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"replica {url} not ready"
                time.sleep(0.2)
        results = asyncio.run(_drive(urls, token, n_jobs=64, n_evals=12, seed=1))
        metrics = [httpx.get(f"{url}/metrics", timeout=10).text for url in urls]
        # A revocation through the CLI reaches every replica (within the app's 1 s token cache).
        auth = {"Authorization": f"Bearer {token}"}
        assert all(httpx.get(f"{url}/v1/jobs", headers=auth, timeout=10).status_code == 200 for url in urls)
        rev = subprocess.run(
            [*cli, "tenant", "revoke", "team-a", "--db", pg_db], capture_output=True, text=True, env=env, timeout=120
        )
        assert rev.returncode == 0, rev.stderr
        time.sleep(1.2)
        assert [httpx.get(f"{url}/v1/jobs", headers=auth, timeout=10).status_code for url in urls] == [401] * 3
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()

    # Every decision equals the embedded core's on the same reports, in the order the database applied them.
    n_stopped = 0
    store = PostgresStore(pg_db, migrate=False, workers=1)
    try:
        tenant = next(t for t in store.list_tenants() if t.name == "team-a")
        for job_id, sent in results.items():
            # registered without a detector: the service's default, the project's default detector; the service
            # hands it the job's registered planned steps with every report, and so does the reference here
            monitor = JobMonitor(job_id, "rlhf", detector=detector_from_spec(default_spec()))
            for report, status, body in sent:
                planned = dataclasses.replace(report, planned_steps=PLANNED_STEPS)
                if status == 409:
                    with pytest.raises(ConflictError):
                        monitor.observe_report(planned)
                    continue
                assert status == 200, (job_id, report, status, body)
                assert body == monitor.observe_report(planned).to_dict(), (job_id, report)
            # No acknowledged report lost, nothing stored that was not acknowledged.
            stored = store.reports(tenant.tenant_id, job_id)
            assert [(r.step, r.eval_score) for r in stored] == list(zip(monitor.steps, monitor.scores)), job_id
            assert [r.decision for r in stored] == monitor.decisions
            job = store.get_job(tenant.tenant_id, job_id)
            assert job.stopped_at == monitor.stopped_at
            n_stopped += monitor.stopped
    finally:
        store.close()
    assert 0 < n_stopped < 64, "the workload must have both stopped and running jobs to test anything"
    # No duplicate stop: each stopped job was counted by exactly one replica.
    stops = [float(re.search(r"^evalstop_stops_total (\S+)$", m, re.M).group(1)) for m in metrics]
    assert sum(stops) == n_stopped, stops
    assert sum(1 for s in stops if s > 0) >= 2, "stops should land on several replicas"


async def _drive(
    urls: list[str], token: str, n_jobs: int, n_evals: int, seed: int
) -> dict[str, list[tuple[Report, int, dict]]]:
    """64 concurrent jobs; each sends its evals in order, every one to a random replica.

    At one eval per job the same report goes to two replicas at once (a client retry landing elsewhere), and at
    another eval two different scores for one step race at two replicas (a conflict only the database can settle).
    The list per job holds what was sent, in the order the database applied it (a race's loser after its winner).
    """
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    # No kept-alive connections: under load a pooled connection can sit past uvicorn's keep-alive timeout, and the
    # server's close then reaches the next request as a ReadError (seen once in CI); a fresh connection each time is
    # what 64 separate trainers would open anyway.
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as client:

        async def post(url: str, report: Report) -> tuple[int, dict]:
            r = await client.post(f"{url}/v1/jobs/{report.job_id}/evals", json=report.to_dict())
            return r.status_code, r.json()

        async def job(i: int) -> tuple[str, list[tuple[Report, int, dict]]]:
            rng = random.Random(seed * 1000 + i)
            job_id = f"job-{i:03d}"
            r = await client.post(
                f"{rng.choice(urls)}/v1/jobs",
                json={"job_type": "rlhf", "job_id": job_id, "gpus": 8, "planned_steps": PLANNED_STEPS},
            )
            assert r.status_code == 201, r.text
            sent: list[tuple[Report, int, dict]] = []
            dup_at, race_at = rng.sample(range(1, n_evals), 2)
            for k, score in enumerate(_scores(rng, n_evals)):
                report = Report(job_id, "rlhf", 10 * (k + 1), score)
                if k == dup_at:
                    u1, u2 = rng.sample(urls, 2)
                    (s1, b1), (s2, b2) = await asyncio.gather(post(u1, report), post(u2, report))
                    assert (s1, s2) == (200, 200) and b1 == b2, (b1, b2)
                    sent += [(report, s1, b1), (report, s2, b2)]
                elif k == race_at:
                    other = Report(job_id, "rlhf", report.step, score + 0.05)
                    u1, u2 = rng.sample(urls, 2)
                    (s1, b1), (s2, b2) = await asyncio.gather(post(u1, report), post(u2, other))
                    assert sorted((s1, s2)) == [200, 409], (s1, b1, s2, b2)
                    first, second = (
                        ((report, s1, b1), (other, s2, b2)) if s1 == 200 else ((other, s2, b2), (report, s1, b1))
                    )
                    sent += [first, second]
                else:
                    status, body = await post(rng.choice(urls), report)
                    sent.append((report, status, body))
            return job_id, sent

        return dict(await asyncio.gather(*(job(i) for i in range(n_jobs))))


def test_a_decision_is_stop_once_stopped_whichever_replica_answers(pg_db: str) -> None:
    stores = [PostgresStore(pg_db, workers=1) for _ in range(3)]
    try:
        tenant, _ = stores[0].add_tenant("t")
        stores[1].register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {"k": 2}}))
        outcomes = [
            stores[i % 3].submit_report(tenant.tenant_id, Report("j", "rlhf", 10 * i, s)).result()
            for i, s in enumerate([0.5, 0.6, 0.55, 0.5, 0.9, 0.95])
        ]
        assert [o.decision.action for o in outcomes] == [Action.CONTINUE] * 3 + [Action.STOP] * 3
        assert [o.stopped_now for o in outcomes] == [False, False, False, True, False, False]
        # The best stays the one before the stop: later reports never move it.
        assert [o.decision.best_step for o in outcomes] == [0, 10, 10, 10, 10, 10]
    finally:
        for s in stores:
            s.close()


def test_a_batch_of_queued_reports_applies_each_in_order_like_the_core(pg_db: str) -> None:
    # One writer, everything submitted before any result is awaited: the reports reach the database as a few
    # batches, with several reports of one job, re-sends, conflicts and unknown or finished jobs mixed in.
    from platform_sim.service.store import JobFinished, JobNotFound

    store = PostgresStore(pg_db, workers=1)
    try:
        tenant, _ = store.add_tenant("t")
        for job in ("a", "b", "done"):
            store.register_job(
                tenant.tenant_id, JobRecord(job, "rlhf", {"name": "k-decline", "params": {}}, gpus=4, planned_steps=100)
            )
        store.finish_job(tenant.tenant_id, "done", "completed")
        rng = random.Random(3)
        plan: list[Report] = []
        for step in range(0, 60, 5):
            for job in ("a", "b"):
                plan.append(Report(job, "rlhf", step, round(rng.random(), 3)))
            if step == 20:
                plan += [
                    Report("a", "rlhf", 10, plan[4].eval_score),  # a re-send of a's step 10
                    Report("b", "rlhf", 10, 2.0),  # a conflicting score for b's step 10
                    Report("b", "rlhf", 3, 0.1),  # older than b's last step
                    Report("ghost", "rlhf", 5, 0.5),
                    Report("done", "rlhf", 5, 0.5),
                ]
        futures = [store.submit_report(tenant.tenant_id, r) for r in plan]
        expected = {"a": JobMonitor("a", "rlhf"), "b": JobMonitor("b", "rlhf")}
        stops = 0
        for report, fut in zip(plan, futures):
            if report.job_id == "ghost":
                with pytest.raises(JobNotFound):
                    fut.result(timeout=30)
            elif report.job_id == "done":
                with pytest.raises(JobFinished):
                    fut.result(timeout=30)
            else:
                try:
                    want = expected[report.job_id].observe_report(report)
                except ConflictError:
                    with pytest.raises(ConflictError):
                        fut.result(timeout=30)
                    continue
                outcome = fut.result(timeout=30)
                assert outcome.decision == want, report
                stops += outcome.stopped_now
        assert stops == sum(m.stopped for m in expected.values()) >= 1
        for job, monitor in expected.items():
            stored = store.reports(tenant.tenant_id, job)
            assert [(r.step, r.eval_score, r.decision) for r in stored] == list(
                zip(monitor.steps, monitor.scores, monitor.decisions)
            )
            record = store.get_job(tenant.tenant_id, job)
            assert (record.n_reports, record.last_step, record.best_step, record.stopped_at) == (
                len(monitor.steps),
                monitor.steps[-1],
                monitor.best_step,
                monitor.stopped_at,
            )
    finally:
        store.close()


def test_a_job_with_a_cadence_gets_the_cores_hints_at_any_replica(pg_db: str) -> None:
    # Reports of a job with a cadence, sent alternately to two replicas and queued together with a job without one:
    # every decision equals the core's with the same cadence, hints included. The min_drop policy reads the noise of
    # all of the job's scores, so this holds only if each transaction rebuilt the job from all of its reports.
    from platform_sim.core import cadence_from_spec
    from platform_sim.service.store import JobExists

    cadence = {"name": "adaptive", "params": {"fraction": 0.25, "min_drop": 0.5}}
    spec = {"name": "k-decline", "params": {"k": 3}}
    a, b = PostgresStore(pg_db, workers=1), PostgresStore(pg_db, workers=1)
    try:
        tenant, _ = a.add_tenant("t")
        assert a.register_job(tenant.tenant_id, JobRecord("c", "rlhf", spec, cadence="adaptive"))[1]
        assert not b.register_job(tenant.tenant_id, JobRecord("c", "rlhf", spec, cadence="adaptive"))[1]
        with pytest.raises(JobExists, match="cadence="):
            b.register_job(tenant.tenant_id, JobRecord("c", "rlhf", spec, cadence=cadence))
        with pytest.raises(JobExists, match="cadence="):
            b.register_job(tenant.tenant_id, JobRecord("c", "rlhf", spec))
        assert a.register_job(tenant.tenant_id, JobRecord("m", "rlhf", spec, cadence=cadence))[1]
        assert a.register_job(tenant.tenant_id, JobRecord("plain", "rlhf", spec))[1]
        assert b.get_job(tenant.tenant_id, "m").cadence == cadence
        assert b.get_job(tenant.tenant_id, "plain").cadence is None
        expected = {
            "c": JobMonitor("c", "rlhf", detector_from_spec(spec), cadence=cadence_from_spec("adaptive")),
            "m": JobMonitor("m", "rlhf", detector_from_spec(spec), cadence=cadence_from_spec(cadence)),
            "plain": JobMonitor("plain", "rlhf", detector_from_spec(spec)),
        }
        scores = [0.30, 0.50, 0.60, 0.55, 0.58, 0.52, 0.57, 0.50, 0.45]
        hints = 0
        for i, score in enumerate(scores):
            futures = [
                ((a, b)[(i + n) % 2].submit_report(tenant.tenant_id, Report(job, "rlhf", 10 * i, score)), job)
                for n, job in enumerate(expected)
            ]
            for fut, job in futures:
                want = expected[job].observe(10 * i, score)
                assert fut.result(timeout=30).decision == want, (job, i)
                hints += job != "plain" and want.next_eval_step is not None
        assert hints >= 2  # the history is one where both cadences hint
        for job, monitor in expected.items():
            assert [r.decision for r in a.reports(tenant.tenant_id, job)] == monitor.decisions
        # A re-send of a hinted step is answered its stored decision, hint included.
        hinted = next(i for i, d in enumerate(expected["m"].decisions) if d.next_eval_step is not None)
        resend = Report("m", "rlhf", 10 * hinted, scores[hinted])
        assert b.submit_report(tenant.tenant_id, resend).result(timeout=30).decision == expected["m"].decisions[hinted]
    finally:
        a.close()
        b.close()


def test_a_database_at_revision_0001_upgrades_and_its_jobs_read_as_fixed(pg_db: str) -> None:
    # A database migrated by the version before cadences, with a job and reports written as that version did.
    assert upgrade_schema(pg_db, "0001") == "0001"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (name, token_hash, created_at) VALUES ('t', 'h', 0)")
        conn.execute(
            "INSERT INTO jobs (tenant_id, job_id, job_type, detector, detector_state, created_at, n_reports, "
            "first_step, first_report_at, last_step, best_step, best_score) VALUES (1, 'old', 'rlhf', "
            '\'{"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}\', '
            '\'{"prev_score": 0.5, "declines": 0}\', 0, 2, 0, 0, 10, 10, 0.5)'
        )
        conn.execute(
            "INSERT INTO reports (tenant_id, job_id, step, eval_score, action, reason, declines, best_step, "
            "best_score, received_at) VALUES (1, 'old', 0, 0.4, 'continue', 'no stop signal', 0, 0, 0.4, 0), "
            "(1, 'old', 10, 0.5, 'continue', 'no stop signal', 0, 10, 0.5, 0)"
        )
    store = PostgresStore(pg_db)  # migrates to the head
    try:
        job = store.get_job(1, "old")
        assert job.cadence is None and job.last_decision is not None and job.last_decision.next_eval_step is None
        expected = JobMonitor("old", "rlhf", detector_from_spec({"name": "k-decline", "params": {"k": 2}}))
        for step, score in ((0, 0.4), (10, 0.5), (20, 0.45)):
            want = expected.observe(step, score)
        assert store.submit_report(1, Report("old", "rlhf", 20, 0.45)).result(timeout=30).decision == want
        # A re-send of a revision-0001 row gets the decision it got then, whose reason names no evidence mode.
        again = store.submit_report(1, Report("old", "rlhf", 10, 0.5)).result(timeout=30).decision
        assert again == dataclasses.replace(expected.decisions[1], reason="no stop signal")
    finally:
        store.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("0005_spread",)]


def test_serve_with_an_unreachable_postgres_url_exits_2_with_one_line() -> None:
    port = _free_port()  # nothing listens there
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "platform_sim.service.cli",
            "serve",
            "--db",
            f"postgresql://nobody@127.0.0.1:{port}/none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("evalstop-server: error: --db postgresql://") and "\n" not in err, err


def _pg_bindir() -> str | None:
    """The server binaries tests/pg.sh used (``EVALSTOP_PG_BINDIR``), else the newest installed, else None."""
    found = os.environ.get("EVALSTOP_PG_BINDIR") or ""
    if not found:
        dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda d: int(d.parent.name), reverse=True)
        found = str(dirs[0]) if dirs and dirs[0].parent.name.isdigit() else ""
    return found if found and os.access(os.path.join(found, "pg_ctl"), os.X_OK) else None


class PrivateServer:
    """A PostgreSQL server of one test's own (initdb into a temporary folder, loopback, a free port), for a test that
    restarts its server: restarting the shared one of tests/pg.sh broke the connections of tests running beside it
    on the other xdist workers ("the database system is shutting down")."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        # As root the server runs as the package's postgres user (PostgreSQL refuses root), who must own the folder.
        self.owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.dir = tempfile.mkdtemp(prefix="evalstop-pg-restart-")
        if self.owner:
            shutil.chown(self.dir, "postgres", "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        # The server must not inherit pipes of ours: its output goes to its log (-l).
        subprocess.run(
            [*self.owner, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120
        )

    def pg_ctl(self, action: str) -> None:
        data, log = os.path.join(self.dir, "data"), os.path.join(self.dir, "server.log")
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.dir}"
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", data, "-l", log, "-o", opts, "-m", "fast", "-w", action)

    def __enter__(self) -> PrivateServer:
        initdb = os.path.join(self.bindir, "initdb")
        self._run(initdb, "-D", os.path.join(self.dir, "data"), "-U", "postgres", "--auth=trust", "--no-sync")
        self.pg_ctl("start")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.pg_ctl("stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.skipif(_pg_bindir() is None, reason="needs PostgreSQL's server binaries (pg_ctl) to restart a server")
def test_the_store_survives_a_database_restart() -> None:
    # A replica's connections break when PostgreSQL restarts. The store notices at the next use and runs the
    # transaction or read again on a new connection, so nothing fails once the server is back.
    with PrivateServer(_pg_bindir() or "") as server:
        store = PostgresStore(server.url, workers=1, readers=1)
        try:
            tenant, _ = store.add_tenant("t")
            store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {}}))
            expected = JobMonitor("j", "rlhf")
            first = Report("j", "rlhf", 0, 0.5)
            decision = store.submit_report(tenant.tenant_id, first).result(timeout=30).decision
            assert decision == expected.observe_report(first)
            server.pg_ctl("restart")
            assert store.ready()  # the pooled reader connection died: read again on a new one
            for step, score in ((10, 0.4), (20, 0.3)):  # the writer's connection died: reconnect and apply
                report = Report("j", "rlhf", step, score)
                outcome = store.submit_report(tenant.tenant_id, report).result(timeout=30)
                assert outcome.decision == expected.observe_report(report)
            assert outcome.decision.action is Action.STOP and outcome.stopped_now
            assert [r.step for r in store.reports(tenant.tenant_id, "j")] == [0, 10, 20]
        finally:
            store.close()


def test_a_row_lock_held_elsewhere_fails_the_report_after_lock_timeout_not_forever(pg_db: str) -> None:
    from platform_sim.service.store import StoreUnavailable

    store = PostgresStore(pg_db, workers=1, lock_timeout_s=0.5)
    try:
        tenant, _ = store.add_tenant("t")
        store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", {"name": "k-decline", "params": {}}))
        with psycopg.connect(pg_db) as other:  # a stuck replica in the middle of its transaction
            other.execute("SELECT 1 FROM jobs WHERE job_id = 'j' FOR UPDATE")
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable, match="lock timeout"):
                store.submit_report(tenant.tenant_id, Report("j", "rlhf", 0, 0.5)).result(timeout=30)
            assert time.monotonic() - t0 < 10
            other.rollback()
        # The lock is free again: the same report goes through, on the same connection.
        assert store.submit_report(tenant.tenant_id, Report("j", "rlhf", 0, 0.5)).result(timeout=30).resend is False
    finally:
        store.close()


def test_one_faulty_report_fails_alone_and_every_queued_report_is_answered(pg_db: str) -> None:
    """A batch holding a report whose detector raises (``tests/_service_faulty_server.py``) and many good ones: the
    good ones commit, the faulty one fails alone with OperationFailed and stores nothing, the writer lives on."""
    import _service_faulty_server  # noqa: F401 - registers the faulty detector in this process

    from platform_sim.service.writer import OperationFailed

    store = PostgresStore(pg_db, workers=1, max_batch=256)
    try:
        tenant, _ = store.add_tenant("t")
        store.register_job(tenant.tenant_id, JobRecord("bad", "rlhf", {"name": "faulty"}))
        for j in range(32):
            store.register_job(tenant.tenant_id, JobRecord(f"g{j}", "rlhf", {"name": "k-decline"}))
        futures = []
        for i in range(6):
            futures.append(("bad", i, store.submit_report(tenant.tenant_id, Report("bad", "rlhf", i, 0.5))))
            for j in range(32):
                futures.append((f"g{j}", i, store.submit_report(tenant.tenant_id, Report(f"g{j}", "rlhf", i, i))))
        for job_id, step, fut in futures:
            if job_id == "bad" and step in (1, 2, 4, 5):  # the faulty detector's FAULTS at these steps
                with pytest.raises(OperationFailed, match="internal error"):
                    fut.result(timeout=60)
            else:
                assert fut.result(timeout=60).decision.action.value == "continue", (job_id, step)
        assert [r.step for r in store.reports(tenant.tenant_id, "bad")] == [0, 3]
        assert all(len(store.reports(tenant.tenant_id, f"g{j}")) == 6 for j in range(32))
        assert store.ready()
    finally:
        store.close()
