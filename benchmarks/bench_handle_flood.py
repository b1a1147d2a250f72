"""Handle-flood benchmark: does one tenant's flood of scheduler-handle registrations against a slow ``squeue`` change
another tenant's latency?

A real ``evalstop-server serve`` process (SQLite) on loopback with the Slurm actuator pointed at a stand-in ``squeue``
(a shell script in a temporary folder that sleeps ``--squeue-s`` seconds, then answers that the job belongs to the
flooding tenant's account: a busy slurmctld). Two phases in the same run, each on a fresh server:

- *alone*: the quiet tenant registers a job and sends ``--requests`` requests one after the other, alternating a
  report and a ``GET /v1/jobs``; their latency is what is measured;
- *flood*: the same while the noisy tenant keeps ``--flood`` registrations (``PUT /v1/jobs/{id}/scheduler-handle``)
  in flight at all times, each sent again as soon as it is answered.

Printed: the quiet tenant's p50/p99 per phase, its p99 as a multiple of the alone p99, and the noisy tenant's answers
by status (with look-ups on their own pool: 201 for the few look-ups that fit, 429 at once for the rest). Each noisy
registration also registers its own fresh job first (cheap).

    python benchmarks/bench_handle_flood.py [--requests 400] [--flood 60] [--squeue-s 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from service_process import ServerProcess, add_tenants, pct, server_cli  # this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
CMD = [sys.executable, "-m", "platform_sim.service.cli"]

SQUEUE = """#!/bin/sh
sleep {delay}
echo 'alice|ml'
"""


def _start(workdir: Path, delay: float) -> tuple[ServerProcess, dict[str, str]]:
    db = workdir / f"bench-{time.monotonic_ns()}.db"
    tokens = add_tenants(db, ("quiet", "noisy"))
    server_cli("tenant", "scope", "noisy", "--slurm-account", "ml", db=db)
    squeue = workdir / "squeue"
    squeue.write_text(SQUEUE.format(delay=delay))
    squeue.chmod(0o755)
    flags = ["--actuator", "slurm", "--actuator-option", f"squeue={squeue}", "--actuator-option", "timeout_s=60"]
    return ServerProcess(db, flags), tokens


def _flood(url: str, token: str, n: int, stop: threading.Event, answers: Counter[int]) -> list[threading.Thread]:
    """``n`` threads, each registering a handle for its own job again and again until ``stop``."""
    headers = {"Authorization": f"Bearer {token}"}

    def run(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            seq = 0
            while not stop.is_set():
                seq += 1  # a fresh job and slurm id each time: a stored handle would be answered without squeue
                job = f"n{i}-{seq}"
                c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job})
                r = c.put(
                    f"/v1/jobs/{job}/scheduler-handle", json={"kind": "slurm", "ref": str(100000 * (i + 1) + seq)}
                )
                answers[r.status_code] += 1
                if r.status_code in (429, 503):
                    time.sleep(0.5)  # what a client does with Retry-After (5 s), compressed

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def _quiet(url: str, token: str, requests: int) -> tuple[list[float], int]:
    """Latencies (ms) of ``requests`` sequential requests of the quiet tenant, and how many failed."""
    headers = {"Authorization": f"Bearer {token}"}
    out, errors = [], 0
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": "q"})
        for i in range(requests):
            t0 = time.perf_counter()
            if i % 2 == 0:
                body = {"job_id": "q", "job_type": "rlhf", "step": i + 1, "eval_score": 0.5}
                r = c.post("/v1/jobs/q/evals", json=body)
            else:
                r = c.get("/v1/jobs")
            out.append(1000 * (time.perf_counter() - t0))
            errors += r.status_code != 200
    return out, errors


def _phase(workdir: Path, args: argparse.Namespace, flood: bool) -> dict[str, Any]:
    server, tokens = _start(workdir, args.squeue_s)
    url = server.url
    stop, answers = threading.Event(), Counter[int]()
    try:
        threads = _flood(url, tokens["noisy"], args.flood, stop, answers) if flood else []
        if flood:
            time.sleep(1.0)  # the flood under way
        latencies, errors = _quiet(url, tokens["quiet"], args.requests)
        stop.set()
        for t in threads:
            t.join(args.squeue_s + 30)
    finally:
        server.stop()
    return {
        "phase": "flood" if flood else "alone",
        "requests": len(latencies),
        "errors": errors,
        "p50_ms": round(pct(latencies, 0.5), 2),
        "p99_ms": round(pct(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "noisy": dict(sorted(answers.items())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400, help="quiet tenant's requests per phase (default 400)")
    p.add_argument("--flood", type=int, default=60, help="registrations the noisy tenant keeps in flight (default 60)")
    p.add_argument("--squeue-s", type=float, default=2.0, help="seconds the stand-in squeue takes (default 2)")
    p.add_argument("--json", action="store_true", help="one JSON object per phase")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="evalstop-flood-") as tmp:
        rows = [_phase(Path(tmp), args, flood=False), _phase(Path(tmp), args, flood=True)]
    alone = rows[0]["p99_ms"]
    for row in rows:
        row["p99_vs_alone"] = round(row["p99_ms"] / alone, 2) if alone else None
        if args.json:
            print(json.dumps(row))
    if not args.json:
        print(
            f"{'phase':<6} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p99/alone':>9}  noisy"
        )
        for r in rows:
            print(
                f"{r['phase']:<6} {r['requests']:>8} {r['errors']:>6} {r['p50_ms']:>8} {r['p99_ms']:>8} "
                f"{r['max_ms']:>8} {r['p99_vs_alone']!s:>9}  {r['noisy']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
