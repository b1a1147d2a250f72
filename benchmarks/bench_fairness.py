"""Fairness benchmark of the scheduler service: one tenant's big listings against another tenant's reads.

Tenant A holds 5,000 jobs (one of them with 5,000 reports, so 10,000 events) and pages one listing with
``limit=1000`` in two loops as fast as it can (``--listing``: ``GET /v1/jobs``, the default, or that job's
``/evals``, or ``/v1/events``; honouring ``Retry-After`` after a 429; a separate process with a lean client, so that
its work does not slow the measuring one); tenant B reads one job, ``GET /v1/jobs/{id}``, 15 times a second (under
any rate limit used here). B's p50 and p99 are measured alone and while A pages, without a rate limit and with
``--rate-limit 20``, each on a real ``evalstop-server serve`` process (SQLite) on loopback; the ratio (with A / alone)
is the figure of issue 33 (it was 8-14x). With ``--before DIR`` (a checkout of an older commit) the same parts run on
its server too, and the report path's throughput (``bench_service.py``'s closed-loop load generator, 64 jobs) is
compared between the two, alternating runs, in the same run.

    python benchmarks/bench_fairness.py --duration 15 [--listing jobs|evals|events] [--before ../evalstop-before] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from service_process import ServerProcess, pct  # this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
A_JOBS = 5_000
A_REPORTS = 5_000  # on A's first job: its evals, and with the jobs' registrations 10,000 events
B_RATE = 15.0  # B's requests per second
# What A pages: the path, the query parameter that takes the next page's cursor, and the answer's field that holds it.
LISTINGS = {
    "jobs": ("/v1/jobs", "after", "next_after"),
    "evals": ("/v1/jobs/a-00000/evals", "cursor", "next_cursor"),
    "events": ("/v1/events", "after", "next_after"),
}


def _make_db(path: Path) -> tuple[str, str]:
    """A database with tenant A (5,000 jobs, the first with 5,000 reports) and tenant B (one job); their tokens."""
    from platform_sim.core import Report
    from platform_sim.service.store import JobRecord
    from platform_sim.service.store_sqlite import SQLiteStore

    store = SQLiteStore(path, synchronous="NORMAL")
    try:
        a, token_a = store.add_tenant("heavy")
        b, token_b = store.add_tenant("light")
        store.register_job(b.tenant_id, JobRecord("b-1", "rlhf", {"name": "k-decline"}))
        with ThreadPoolExecutor(32) as pool:  # concurrent registrations share group commits
            list(
                pool.map(
                    lambda i: store.register_job(a.tenant_id, JobRecord(f"a-{i:05d}", "rlhf", {"name": "k-decline"})),
                    range(A_JOBS),
                )
            )
        # A flat score: never a decline, so the job never stops (submitted at once: commits are grouped).
        pending = [store.submit_report(a.tenant_id, Report("a-00000", "rlhf", s, 0.5)) for s in range(A_REPORTS)]
        for f in pending:
            f.result()
    finally:
        store.close()
    return token_a, token_b


def _tenant_a(port: int, token: str, listing: str, seconds: float, out: multiprocessing.Queue) -> None:
    """Two loops paging one of A's listings, 1,000 rows at a time, as fast as they can (after a 429, once its
    Retry-After has passed), each over one keep-alive connection with a lean asyncio client (as
    ``bench_service.py``'s), so that the load generator takes little of the machine's cores. Past the last page a
    loop starts over (a null cursor, or for the events one that did not move)."""
    path, param, field = LISTINGS[listing]
    tail = f'"{field}":'.encode()
    counts: dict[str, Any] = {"pages": 0, "refused": 0, "error": None}

    async def loop(t_end: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        after = ""
        try:
            while time.monotonic() < t_end:
                query = "limit=1000" + (f"&{param}={after}" if after else "")
                writer.write(
                    f"GET {path}?{query} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
                )
                status = int((await reader.readline()).split()[1])
                length, retry_after = 0, 0.0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    elif line.lower().startswith(b"retry-after:"):
                        retry_after = float(line.split(b":")[1])
                body = await reader.readexactly(length)
                if status == 200:
                    counts["pages"] += 1
                    nxt = json.loads(body[body.rfind(tail) + len(tail) : -1])
                    # Past the last page (no cursor; for the events, one that did not move) start over.
                    after = "" if nxt is None or str(nxt) == str(after) else nxt
                elif status == 429:
                    counts["refused"] += 1
                    await asyncio.sleep(retry_after)  # as a client should (a 429 costs the server a request too)
                else:
                    counts["error"] = f"GET {path}: HTTP {status} {body[:200]!r}"
                    return
        finally:
            writer.close()

    async def main() -> None:
        t_end = time.monotonic() + seconds
        await asyncio.gather(loop(t_end), loop(t_end))

    asyncio.run(main())
    out.put(counts)


def _tenant_b(url: str, token: str, seconds: float) -> dict:
    """B's reads of its job, paced at B_RATE per second: latencies and statuses."""
    lat: list[float] = []
    bad = 0
    interval = 1.0 / B_RATE
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        c.get("/v1/jobs/b-1")  # warm the connection and the token cache
        next_at = time.monotonic()
        t_end = next_at + seconds
        while next_at < t_end:
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.perf_counter()
            status = c.get("/v1/jobs/b-1").status_code
            lat.append(time.perf_counter() - t0)
            bad += status != 200
            next_at += interval
    return {"n": len(lat), "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "not_200": bad}


def fairness(root: Path, db: Path, tokens: tuple[str, ...], listing: str, rate: float, seconds: float) -> dict:
    """B alone, then B while A pages ``listing``, on one server of the code at ``root``."""
    extra = ["--rate-limit", str(rate)] if rate else []
    srv = ServerProcess(db, extra, root)
    try:
        alone = _tenant_b(srv.url, tokens[1], seconds)
        queue: multiprocessing.Queue = multiprocessing.Queue()
        a = multiprocessing.get_context("fork").Process(
            target=_tenant_a, args=(srv.port, tokens[0], listing, seconds, queue)
        )
        a.start()
        time.sleep(0.5)  # A's loops are running
        loaded = _tenant_b(srv.url, tokens[1], seconds - 1.0)
        counts = queue.get(timeout=120)
        a.join()
    finally:
        srv.stop()
    if counts["error"]:
        raise RuntimeError(f"tenant A on the server of {root}: {counts['error']}")
    return {
        "code": root.name,
        "listing": listing,
        "rate_limit": rate,
        "alone": alone,
        "with_a": loaded,
        "a_pages": counts["pages"],
        "a_refused": counts["refused"],
        "p50_ratio": loaded["p50_ms"] / alone["p50_ms"],
        "p99_ratio": loaded["p99_ms"] / alone["p99_ms"],
    }


def report_throughput(root: Path, seconds: float) -> float:
    """Reports per second of ``bench_service.py``'s closed loop (64 jobs) on the code at ``root``."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_service.py"), "--duration", str(seconds)]
    cmd += ["--jobs", "64", "--skip-optuna", "--rate", "0", "--json"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True, timeout=seconds + 120)
    return float(json.loads(out.stdout)["peers"][0]["reports_per_s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=15.0, help="seconds of each part (default 15)")
    p.add_argument("--listing", choices=sorted(LISTINGS), default="jobs", help="what tenant A pages (default jobs)")
    p.add_argument("--before", type=Path, default=None, help="a checkout of an older commit to compare with")
    p.add_argument("--rounds", type=int, default=2, help="alternating report-throughput runs per code (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--make-db", type=Path, default=None, help=argparse.SUPPRESS)  # the seed database, by this code
    args = p.parse_args(argv)
    if args.make_db is not None:
        print(json.dumps(_make_db(args.make_db)))
        return 0
    if args.duration < 3 or args.rounds < 1:
        p.error("--duration must be >= 3 and --rounds >= 1")
    codes = [ROOT] + ([args.before.resolve()] if args.before else [])
    workdir = Path(tempfile.mkdtemp(prefix="evalstop-fairness-"))
    try:
        rows = []
        for root in codes:
            # Each code's database is made by that code (an older server refuses a newer schema).
            seed = workdir / f"{root.name}-seed.db"
            made = subprocess.run(
                [sys.executable, __file__, "--make-db", str(seed)],
                cwd=root,
                env={**os.environ, "PYTHONPATH": str(root)},
                capture_output=True,
                text=True,
                check=True,
            )
            tokens = tuple(json.loads(made.stdout))
            for rate in (0.0, 20.0):
                db = workdir / f"{root.name}-{rate:g}.db"
                shutil.copy(seed, db)
                rows.append(fairness(root, db, tokens, args.listing, rate, args.duration))
        throughput: dict[str, list[float]] = {str(r): [] for r in codes}
        if args.before:
            for _ in range(args.rounds):
                for root in (args.before.resolve(), ROOT):
                    throughput[str(root)].append(report_throughput(root, args.duration))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out: dict = {"duration_s": args.duration, "cpus": os.cpu_count(), "listing": args.listing, "fairness": rows}
    if args.before:
        now, before = throughput[str(ROOT)], throughput[str(args.before.resolve())]
        out["report_throughput"] = {
            "now_per_s": now,
            "before_per_s": before,
            "ratio": (sum(now) / len(now)) / (sum(before) / len(before)),
            "paired_ratios": [x / y for x, y in zip(now, before)],  # each round's two runs were back to back
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    path = LISTINGS[args.listing][0]
    print(f"{args.duration:g} s per part, {os.cpu_count()} CPUs; B reads its job {B_RATE:g}/s; A pages {path} x2")
    print(f"{'code':<16} {'limit':>5} {'alone p50/p99 ms':>17} {'with A p50/p99 ms':>18} {'p99 x':>6} {'A pages':>8}")
    for r in rows:
        al, wa = r["alone"], r["with_a"]
        print(
            f"{r['code']:<16} {r['rate_limit']:>5g} {al['p50_ms']:>8.2f}/{al['p99_ms']:<8.2f} "
            f"{wa['p50_ms']:>8.2f}/{wa['p99_ms']:<9.2f} {r['p99_ratio']:>6.2f} {r['a_pages']:>8} "
            f"(refused {r['a_refused']}, B not 200: {wa['not_200']})"
        )
    if args.before:
        t = out["report_throughput"]
        print(
            f"report path: now {', '.join(f'{x:.0f}' for x in t['now_per_s'])} reports/s, before "
            f"{', '.join(f'{x:.0f}' for x in t['before_per_s'])}: ratio {t['ratio']:.3f} "
            f"(each round: {', '.join(f'{x:.3f}' for x in t['paired_ratios'])})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
