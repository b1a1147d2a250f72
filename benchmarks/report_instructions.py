"""Instructions the scheduler service executes per report, counted by valgrind's callgrind: a figure of the report
path's cost that the machine's noise does not move (throughput on a shared 2-core machine varies by 15% from one
run to the next; this count by about 1%).

Each server (this checkout, and every ``--before`` checkout, each run from its own code) runs under
``valgrind --tool=callgrind`` on a fresh SQLite file. ``--jobs`` jobs are registered and warmed up (60 reports each:
the detectors' first tests import scipy), the counters are zeroed, then each job sends ``--reports / --jobs`` more
reports over its own keep-alive connection (the lean client of ``bench_service.py``: a score that drifts as a random
walk, no per-example scores, so the default detector runs its mean-only test), and the counters are dumped. Every
thread of the server is counted (event loop, writer, webhook worker, worker threads).

    python benchmarks/report_instructions.py [--before ../evalstop-before ...] [--reports 1600] [--jobs 16] [--json]

Needs valgrind (Debian: ``apt-get install valgrind``). About a minute per server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 60  # reports per job before counting


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_db(db: Path) -> str:
    """A fresh database with one tenant, made by this code; the tenant's token (run with ``--make-db``)."""
    from platform_sim.service.store_sqlite import SQLiteStore

    store = SQLiteStore(db)
    try:
        return store.add_tenant("bench")[1]
    finally:
        store.close()


async def _load(port: int, token: str, steps: dict[str, int], per_job: int, seed: int) -> None:
    """``per_job`` reports of each job of ``steps`` (its next step, advanced here), all jobs at once."""

    async def job(name: str, rng: random.Random) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            f"POST /v1/jobs/{name}/evals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
        )
        score, step = 0.5, steps[name]
        try:
            for _ in range(per_job):
                score += rng.gauss(0.0, 0.01)
                body = json.dumps({"job_id": name, "job_type": "rlhf", "step": step, "eval_score": score}).encode()
                writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
                status = int((await reader.readline()).split()[1])
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                answer = await reader.readexactly(length)
                if status != 200:
                    raise RuntimeError(f"{name} step {step}: HTTP {status} {answer[:200]!r}")
                step += 1
        finally:
            writer.close()
        steps[name] = step

    await asyncio.gather(*[job(n, random.Random(seed + i)) for i, n in enumerate(steps)])


def count(root: Path, reports: int, jobs: int) -> dict:
    """Instructions per report of the server of the code at ``root``."""
    work = Path(tempfile.mkdtemp(prefix="evalstop-instructions-"))
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:
        db = work / "service.db"
        made = subprocess.run(
            [sys.executable, __file__, "--make-db", str(db)], cwd=root, env=env, capture_output=True, text=True
        )
        if made.returncode != 0:
            raise RuntimeError(f"{root}: could not make the database: {made.stderr.strip()[-300:]}")
        token = made.stdout.strip()
        port, out = _free_port(), work / "callgrind.out"
        server = [sys.executable, "-m", "platform_sim.service.cli", "serve", "--db", str(db), "--port", str(port)]
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *server, "--log-level", "warning"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 600  # imports under valgrind take a while
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=10).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{root}: the server under valgrind did not start")
                time.sleep(0.5)
            steps = {f"job-{i:03d}": 0 for i in range(jobs)}
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600) as c:
                for name in steps:
                    c.post("/v1/jobs", json={"job_id": name, "job_type": "rlhf", "gpus": 8}).raise_for_status()
            asyncio.run(_load(port, token, steps, WARMUP, seed=1))
            subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
            per_job = reports // jobs
            asyncio.run(_load(port, token, steps, per_job, seed=2))
            subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
        finally:
            proc.terminate()
            proc.wait(timeout=300)
        dump = out.with_name(out.name + ".1")  # the first dump: the counted reports alone
        totals = [line for line in dump.read_text().splitlines() if line.startswith("totals:")]
        instructions = int(totals[0].split()[1])
        n = per_job * jobs
        return {"code": root.name, "reports": n, "instructions_per_report": instructions / n}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, action="append", default=[], help="an older checkout to count too")
    p.add_argument("--reports", type=int, default=1600, help="counted reports (default 1600)")
    p.add_argument("--jobs", type=int, default=16, help="concurrent jobs (default 16)")
    p.add_argument("--repeats", type=int, default=1, help="counts per server, alternating (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--make-db", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.make_db is not None:
        print(_make_db(args.make_db))
        return 0
    if args.jobs < 1 or args.reports < args.jobs or args.repeats < 1:
        p.error("--jobs must be >= 1, --reports >= --jobs and --repeats >= 1")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind)")
    codes = [ROOT] + [b.resolve() for b in args.before]
    rows = [count(root, args.reports, args.jobs) for _ in range(args.repeats) for root in codes]
    if args.json:
        print(json.dumps({"jobs": args.jobs, "rows": rows}, indent=2))
        return 0
    first = rows[0]["instructions_per_report"]
    print(f"{'code':<20} {'reports':>8} {'instructions/report':>20} {'vs this checkout':>17}")
    for r in rows:
        ratio = r["instructions_per_report"] / first
        print(f"{r['code']:<20} {r['reports']:>8} {r['instructions_per_report']:>20,.0f} {ratio:>17.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
