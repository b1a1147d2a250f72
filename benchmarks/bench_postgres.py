"""Load benchmark of the service on PostgreSQL with several replicas, beside the SQLite default in the same run.

Peers, one after the other, each for ``--duration`` seconds with the same load: ``--jobs`` concurrent jobs, each
reporting as fast as it can (the next report when the last decision came back), over keep-alive HTTP/1.1 with a lean
asyncio client so that the load generator takes little of the machine:

- ``sqlite``: one ``evalstop-server serve --db FILE`` process (WAL, synchronous=FULL), the embedded default;
- ``postgres x1``: one ``evalstop-server serve --db postgresql://...`` process;
- ``postgres xN``: ``--replicas`` processes on one database, every report sent to a random replica.

Every 200 answer is a decision committed durably (SQLite fsyncs its WAL; PostgreSQL runs with ``fsync=on`` and
``synchronous_commit=on``, its defaults). Afterwards the database is read back: every acknowledged report must be
stored (``lost``), and no request may have failed (``errors``).

The PostgreSQL server: ``$EVALSTOP_PG_URL`` if set (a role that may create databases), else a throw-away one started
with ``tests/pg.sh`` for this run. Each peer gets a fresh database.

    python benchmarks/bench_postgres.py --duration 30 --jobs 64 --replicas 3 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent

# The same port, percentile and process-CPU helpers as the SQLite benchmark, so both tables count alike.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import _proc_cpu  # noqa: E402
from service_process import free_port, pct  # noqa: E402


def _pg_cpu() -> float:
    """CPU seconds of the PostgreSQL server started by tests/pg.sh (postmaster, its exited children, live backends),
    or NaN when this run did not start it (EVALSTOP_PG_DIR unset)."""
    pg_dir = os.environ.get("EVALSTOP_PG_DIR")
    if not pg_dir:
        return float("nan")
    try:
        root = int(Path(pg_dir, "data", "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == root:
            total += sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
        elif ppid == root:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class _Conn:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads the status and body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return status, await self.reader.readexactly(length)


async def _job(
    ports: list[int],
    token: str,
    job: str,
    t_end: float,
    seed: int,
    latencies: list[float],
    acked: list[int],
    errors: list[str],
) -> None:
    conns = [_Conn(*await asyncio.open_connection("127.0.0.1", p)) for p in ports]
    rng = random.Random(seed)
    head = (
        f"POST /v1/jobs/{job}/evals HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    step, score = 0, 0.5
    try:
        while time.perf_counter() < t_end:
            score += rng.gauss(0.0, 0.01)
            body = json.dumps({"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score}).encode()
            t0 = time.perf_counter()
            status, payload = await rng.choice(conns).post(head, body)
            latencies.append(time.perf_counter() - t0)
            if status == 200:
                acked.append(step)
            else:
                errors.append(f"{job} step {step}: HTTP {status} {payload[:200]!r}")
            step += 1
    finally:
        for c in conns:
            c.writer.close()


def _start_servers(db: str, n: int, workdir: Path) -> tuple[list[subprocess.Popen], list[int]]:
    ports = [free_port() for _ in range(n)]
    procs = []
    for port in ports:
        log = open(workdir / f"server-{port}.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "platform_sim.service.cli",
                    "serve",
                    "--db",
                    db,
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    for port, proc in zip(ports, procs):
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {(workdir / f'server-{port}.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"server on port {port} not ready")
    return procs, ports


def run_peer(
    name: str, db: str, open_store: Any, replicas: int, duration: float, jobs: int, workdir: Path
) -> dict[str, Any]:
    store = open_store()
    tenant, token = store.add_tenant("bench")
    store.close()
    procs, ports = _start_servers(db, replicas, workdir)
    names = [f"bench-{i:03d}" for i in range(jobs)]
    latencies: list[float] = []
    acked: dict[str, list[int]] = {n: [] for n in names}
    errors: list[str] = []
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as c:
            for i, n in enumerate(names):
                r = c.post(
                    f"http://127.0.0.1:{ports[i % replicas]}/v1/jobs", json={"job_type": "rlhf", "job_id": n, "gpus": 8}
                )
                r.raise_for_status()
        cpu0 = [_proc_cpu(p.pid) for p in procs]
        pg0 = _pg_cpu()

        async def main() -> float:
            t_start = time.perf_counter()
            t_end = t_start + duration
            await asyncio.gather(
                *[_job(ports, token, n, t_end, i, latencies, acked[n], errors) for i, n in enumerate(names)]
            )
            return time.perf_counter() - t_start

        elapsed = asyncio.run(main())
        server_cpu = sum(_proc_cpu(p.pid) - c0 for p, c0 in zip(procs, cpu0))
        db_cpu = _pg_cpu() - pg0 if db.startswith("postgresql://") else float("nan")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    store = open_store()
    lost = 0
    try:
        for n in names:
            stored = {r.step for r in store.reports(tenant.tenant_id, n)}
            lost += sum(1 for s in acked[n] if s not in stored)
    finally:
        store.close()
    total = sum(len(v) for v in acked.values())
    return {
        "peer": name,
        "replicas": replicas,
        "reports": total,
        "seconds": elapsed,
        "reports_per_s": total / elapsed,
        "p50_ms": pct(latencies, 0.50) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "errors": len(errors),
        "lost": lost,
        "server_cpu_s": server_cpu,
        "db_cpu_s": db_cpu,
        "first_error": errors[0] if errors else None,
    }


def _pg_server() -> tuple[str, Any]:
    """The admin URL of a PostgreSQL server, and a function that stops it if this run started it."""
    if os.environ.get("EVALSTOP_PG_URL"):
        return os.environ["EVALSTOP_PG_URL"], lambda: None
    out = subprocess.run(
        ["bash", str(REPO / "tests" / "pg.sh"), "start"], capture_output=True, text=True, check=True
    ).stdout
    env = dict(os.environ)
    for part in shlex.split(out.replace("export ", "")):
        if "=" in part:
            k, v = part.split("=", 1)
            env[k] = v
    if "EVALSTOP_PG_URL" not in env:
        raise SystemExit("no PostgreSQL server: set EVALSTOP_PG_URL or install postgresql (tests/pg.sh)")
    os.environ["EVALSTOP_PG_DIR"] = env["EVALSTOP_PG_DIR"]  # for _pg_cpu

    def stop() -> None:
        subprocess.run(["bash", str(REPO / "tests" / "pg.sh"), "stop"], env=env, check=False)

    return env["EVALSTOP_PG_URL"], stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per peer (default 30)")
    p.add_argument("--jobs", type=int, default=64, help="concurrent jobs (default 64)")
    p.add_argument("--replicas", type=int, default=3, help="service processes of the multi-replica peer (default 3)")
    p.add_argument("--skip-sqlite", action="store_true", help="PostgreSQL peers only")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.jobs < 1 or args.replicas < 1:
        p.error("--duration must be > 0, --jobs and --replicas >= 1")
    import psycopg

    from platform_sim.service.store_postgres import PostgresStore
    from platform_sim.service.store_sqlite import SQLiteStore

    admin_url, stop_pg = _pg_server()
    made: list[str] = []

    def fresh_db() -> str:
        name = f"evalstop_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            row = conn.execute("SHOW server_version").fetchone()
            assert row is not None  # SHOW answers one row
            version = row[0]
            settings: dict[str, str] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')"
                ).fetchall()
            )
        made.append(name)
        info["postgres"] = {"version": version, **settings}
        return admin_url.partition("?")[0].rsplit("/", 1)[0] + "/" + name

    info: dict[str, Any] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="evalstop-bench-pg-") as tmp:
        workdir = Path(tmp)
        try:
            if not args.skip_sqlite:
                db = str(workdir / "evalstop.db")
                rows.append(run_peer("sqlite", db, lambda: SQLiteStore(db), 1, args.duration, args.jobs, workdir))
            for n in sorted({1, args.replicas}):
                url = fresh_db()
                rows.append(
                    run_peer(
                        f"postgres x{n}",
                        url,
                        lambda u=url: PostgresStore(u, workers=1),
                        n,
                        args.duration,
                        args.jobs,
                        workdir,
                    )
                )
        finally:
            try:
                with psycopg.connect(admin_url, autocommit=True) as conn:
                    for name in made:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                stop_pg()
    out = {
        "jobs": args.jobs,
        "duration_s": args.duration,
        "cpus": os.cpu_count(),
        **info,
        "peers": rows,
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    pg = info.get("postgres", {})
    print(
        f"{args.jobs} concurrent jobs, {args.duration:g} s per peer, {os.cpu_count()} CPUs; PostgreSQL "
        f"{pg.get('version')} (fsync={pg.get('fsync')}, synchronous_commit={pg.get('synchronous_commit')})"
    )
    print(
        f"{'peer':<14} {'reports':>8} {'reports/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'lost':>5} "
        f"{'service CPU s':>13} {'db CPU s':>9}"
    )
    for r in rows:
        print(
            f"{r['peer']:<14} {r['reports']:>8} {r['reports_per_s']:>10.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['errors']:>7} {r['lost']:>5} {r['server_cpu_s']:>13.1f} {r['db_cpu_s']:>9.1f}"
        )
        if r.get("first_error"):
            print(f"  first error: {r['first_error']}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
