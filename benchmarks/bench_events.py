"""The report path before and after the audit trail and the webhook outbox, side by side in one run.

Three servers take the same closed-loop load (``--jobs`` concurrent jobs, each reporting as fast as it can over one
keep-alive connection, the load generator of ``bench_service.py``), one after the other, in ``--rounds`` interleaved
rounds (each starting with another server) so that the machine's noise falls on all of them alike:

- ``before``: the service as it was before the events (``--before``: a checkout of that commit, e.g.
  ``git worktree add ../evalstop-before 3d10cdf``), run from that checkout's code;
- ``events``: this checkout: every accepted report also appends its ``report.accepted`` event (and a stop its
  ``job.stopped``) in the same transaction;
- ``events+webhook``: the same with a webhook subscribed to ``stop,finish`` (the outbox fan-out on, the delivery
  worker POSTing each stop to a receiver in this process).

Each server gets a fresh SQLite file (WAL, synchronous=FULL) made by its own code's ``tenant add``. After each run
the acknowledged reports are counted in the file (lost) and, for this checkout, the events (one per stored report).

    python benchmarks/bench_events.py --before ../evalstop-before --duration 20 --jobs 64 --rounds 2 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from bench_service import _job_worker, _proc_cpu
from service_process import free_port, pct

REPO = Path(__file__).resolve().parents[1]


def _cli(code: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "platform_sim.service.cli", *args]
    # cwd=code: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
    return subprocess.run(cmd, env=env, cwd=code, check=True, capture_output=True, text=True).stdout


def _receiver() -> tuple[http.server.ThreadingHTTPServer, list[int]]:
    got: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            got.append(1)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def run(label: str, code: Path, duration: float, jobs: int, workdir: Path, webhook: bool) -> dict:
    """One server from ``code`` under the closed-loop load; its row."""
    workdir.mkdir(parents=True)
    db = workdir / "evalstop.db"
    token = _cli(code, "tenant", "add", "bench", "--db", str(db)).strip().splitlines()[-1]
    receiver, delivered = _receiver() if webhook else (None, [])
    if receiver is not None:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        _cli(code, "webhook", "add", url, "--tenant", "bench", "--events", "stop,finish", "--db", str(db))
    port = free_port()
    with open(workdir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "platform_sim.service.cli", "serve", "--db", str(db), "--port", str(port)]
            + ["--log-level", "warning"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(code)},
            cwd=code,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{label}: server did not start: {(workdir / 'server.log').read_text()}")
        names = [f"bench-{i:03d}" for i in range(jobs)]
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as c:
            for name in names:
                body = {"job_type": "rlhf", "job_id": name, "gpus": 8, "planned_steps": 10**6}
                c.post("/v1/jobs", json=body).raise_for_status()
        latencies: list[float] = []
        acked: dict[str, list[int]] = {n: [] for n in names}
        errors: list[str] = []
        cpu0 = _proc_cpu(proc.pid)

        async def load() -> float:
            t0 = time.perf_counter()
            t_end = t0 + duration
            await asyncio.gather(
                *[
                    _job_worker("127.0.0.1", port, token, n, t_end, i, latencies, acked[n], errors)
                    for i, n in enumerate(names)
                ]
            )
            return time.perf_counter() - t0

        elapsed = asyncio.run(load())
        server_cpu = _proc_cpu(proc.pid) - cpu0
        time.sleep(1.0)  # let the worker deliver the last stops
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if receiver is not None:
            receiver.shutdown()
            receiver.server_close()
    with sqlite3.connect(db) as conn:
        stored = set(conn.execute("SELECT job_id, step FROM reports").fetchall())
        has_events = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone() is not None
        n_events = (
            conn.execute("SELECT count(*) FROM events WHERE type = 'report.accepted'").fetchone()[0]
            if has_events
            else None
        )
        stops = conn.execute("SELECT count(*) FROM jobs WHERE stopped_at IS NOT NULL").fetchone()[0]
    conn.close()
    n = sum(len(v) for v in acked.values())
    return {
        "peer": label,
        "reports": n,
        "reports_per_s": n / elapsed,
        "p50_ms": pct(latencies, 0.50) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "server_cpu_ms_per_report": server_cpu / max(n, 1) * 1e3,
        "errors": len(errors),
        "lost": sum(1 for name, steps in acked.items() for s in steps if (name, s) not in stored),
        "stored_reports": len(stored),
        "report_events": n_events,
        "stops": stops,
        "webhooks_delivered": len(delivered) if webhook else None,
        "first_error": errors[0] if errors else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="checkout of the service before the events")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per server and round (default 20)")
    p.add_argument("--jobs", type=int, default=64, help="concurrent jobs (default 64)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if not (args.before / "platform_sim" / "service" / "cli.py").is_file():
        p.error(f"--before {args.before}: not a checkout of evalstop (no platform_sim/service/cli.py)")
    if args.duration <= 0 or args.jobs < 1 or args.rounds < 1:
        p.error("--duration must be > 0, --jobs and --rounds >= 1")
    peers = (("before", args.before.resolve(), False), ("events", REPO, False), ("events+webhook", REPO, True))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="evalstop-bench-events-") as tmp:
        for r in range(args.rounds):
            for label, code, webhook in peers[r % 3 :] + peers[: r % 3]:  # each round starts with another one
                row = run(label, code, args.duration, args.jobs, Path(tmp) / f"{label}-{r}", webhook)
                rows.append({**row, "round": r})
    summary = {}
    for label, _, _ in peers:
        mine = [x for x in rows if x["peer"] == label]
        summary[label] = {
            "reports_per_s": statistics.median(x["reports_per_s"] for x in mine),
            "p99_ms": statistics.median(x["p99_ms"] for x in mine),
        }
    base = summary["before"]["reports_per_s"]
    for label in summary:
        summary[label]["vs_before"] = summary[label]["reports_per_s"] / base
    out = {"jobs": args.jobs, "duration_s": args.duration, "rounds": args.rounds, "cpus": os.cpu_count(), "runs": rows}
    out["median"] = summary
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{args.jobs} concurrent jobs, {args.duration:g} s per server and round, {args.rounds} rounds, {os.cpu_count()} CPUs"
    )
    print(
        f"{'round':>5} {'server':<16} {'reports':>8} {'reports/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/rep':>10} "
        f"{'errors':>6} {'lost':>4} {'events':>8} {'stops':>5} {'hooks':>5}"
    )
    for x in rows:
        print(
            f"{x['round']:>5} {x['peer']:<16} {x['reports']:>8} {x['reports_per_s']:>10.0f} {x['p50_ms']:>7.2f} "
            f"{x['p99_ms']:>7.2f} {x['server_cpu_ms_per_report']:>10.3f} {x['errors']:>6} {x['lost']:>4} "
            f"{x['report_events'] if x['report_events'] is not None else '-':>8} {x['stops']:>5} "
            f"{x['webhooks_delivered'] if x['webhooks_delivered'] is not None else '-':>5}"
        )
    for label, s in summary.items():
        print(
            f"median {label:<16} {s['reports_per_s']:>8.0f} reports/s  p99 {s['p99_ms']:.2f} ms  ({s['vs_before']:.0%} of before)"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
