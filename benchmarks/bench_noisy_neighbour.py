"""Noisy-neighbour benchmark: does one tenant's load change another tenant's report latency?

A real ``evalstop-server serve`` process (SQLite, WAL, synchronous=FULL) on loopback, two tenants:

- *quiet*: ``--quiet-jobs`` jobs (k-decline), each sending small reports at a fixed pace (``--quiet-rate`` reports per
  second in all), one keep-alive connection per job. Its latency is what is measured.
- *noisy*: in a process of its own (a neighbour runs elsewhere; in the quiet client's event loop its large bodies
  would delay the quiet client itself), ``--noisy-conns`` connections sending, as fast as they can, reports with ``--noisy-scores`` per-example
  scores (about 100 kB of JSON each at 10,000) to ``k-decline-se`` jobs, mixed with reports of extreme scores (1e200,
  refused with 422).

Three phases in the same run, each ``--duration`` seconds on a fresh server: the quiet tenant alone; with the noisy
one and no rate limit; with the noisy one and ``--rate-limit`` requests per second per tenant (the quiet tenant sends
below it). Printed: the quiet tenant's p50/p99 latency per phase, its p99 as a multiple of the quiet-alone p99, its
errors, and what the noisy tenant got (by status).

    python benchmarks/bench_noisy_neighbour.py --duration 20 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from service_process import ServerProcess, add_tenants, pct  # this folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]


def _start(workdir: Path, extra: list[str]) -> tuple[ServerProcess, dict[str, str]]:
    db = workdir / f"bench-{time.monotonic_ns()}.db"
    tokens = add_tenants(db, ("quiet", "noisy"))
    return ServerProcess(db, ["--max-eval-scores", "100000", *extra]), tokens


async def _quiet(url: str, token: str, jobs: int, rate: float, t_end: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}

    async def job(j: int) -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
            job_id = f"q{j}"
            await c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job_id})
            period = jobs / rate
            step = 0
            nxt = time.monotonic() + period * j / jobs
            while time.monotonic() < t_end:
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                nxt += period
                step += 1
                body = {"job_id": job_id, "job_type": "rlhf", "step": step, "eval_score": 0.5 + 1e-6 * step}
                t0 = time.perf_counter()
                r = await c.post(f"/v1/jobs/{job_id}/evals", json=body)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

    await asyncio.gather(*(job(j) for j in range(jobs)))
    return latencies, errors


async def _noisy(url: str, token: str, conns: int, n_scores: int, t_end: float) -> Counter[int]:
    codes: Counter[int] = Counter()
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    scores = ",".join(f"{0.5 + 0.001 * (i % 97):.4f}" for i in range(n_scores))

    async def conn(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
            job_id = f"n{k}"
            await c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job_id, "detector": {"name": "k-decline-se"}})
            step = 0
            while time.monotonic() < t_end:
                step += 1
                if step % 4 == 0:  # an extreme score: refused
                    body = f'{{"job_id":"{job_id}","job_type":"rlhf","step":{step},"eval_score":1e200}}'
                else:
                    body = (
                        f'{{"job_id":"{job_id}","job_type":"rlhf","step":{step},"eval_score":0.5,'
                        f'"eval_scores":[{scores}]}}'
                    )
                try:
                    r = await c.post(f"/v1/jobs/{job_id}/evals", content=body.encode())
                    codes[r.status_code] += 1
                    if r.status_code == 429:
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                except httpx.TransportError:
                    codes[0] += 1

    await asyncio.gather(*(conn(k) for k in range(conns)))
    return codes


def _noisy_process(url: str, token: str, conns: int, n_scores: int, duration: float, out: Any) -> None:
    """The noisy tenant in its own process: a real neighbour runs on other machines, and in the quiet client's event
    loop its 100 kB bodies would delay the quiet tenant's own sends and reads, which is not the server's doing."""
    out.put(dict(asyncio.run(_noisy(url, token, conns, n_scores, time.monotonic() + duration))))


def phase(workdir: Path, args: argparse.Namespace, noisy: bool, rate_limit: float) -> dict:
    extra = ["--rate-limit", str(rate_limit), "--rate-burst", str(rate_limit)] if rate_limit > 0 else []
    server, tokens = _start(workdir, extra)
    url = server.url
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    neighbour = None
    try:
        if noisy:
            neighbour = ctx.Process(
                target=_noisy_process,
                args=(url, tokens["noisy"], args.noisy_conns, args.noisy_scores, args.duration, queue),
            )
            neighbour.start()
            time.sleep(1.0)  # let the neighbour's interpreter start and reach its send loop
        t_end = time.monotonic() + args.duration - (1.0 if noisy else 0.0)
        lat, errors = asyncio.run(_quiet(url, tokens["quiet"], args.quiet_jobs, args.quiet_rate, t_end))
        codes: Counter[int] = Counter(queue.get(timeout=120)) if neighbour is not None else Counter()
    finally:
        if neighbour is not None:
            neighbour.join(timeout=60)
        server.stop()
    return {
        "quiet_reports": len(lat),
        "quiet_errors": errors,
        "p50_ms": 1e3 * pct(lat, 0.5),
        "p99_ms": 1e3 * pct(lat, 0.99),
        "noisy_status": dict(sorted(codes.items())),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--quiet-jobs", type=int, default=8)
    p.add_argument("--quiet-rate", type=float, default=40.0, help="quiet tenant's reports per second, all jobs")
    p.add_argument("--noisy-conns", type=int, default=4)
    p.add_argument("--noisy-scores", type=int, default=10_000)
    p.add_argument(
        "--rate-limit",
        type=float,
        default=60.0,
        help="per-tenant limit of the third phase (tokens/s: one per request plus one per 10 kB of body)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="evalstop-noisy-"))
    try:
        results = {
            "quiet alone": phase(workdir, args, noisy=False, rate_limit=0.0),
            "with noisy, no limit": phase(workdir, args, noisy=True, rate_limit=0.0),
            f"with noisy, --rate-limit {args.rate_limit:g}": phase(
                workdir, args, noisy=True, rate_limit=args.rate_limit
            ),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    base = results["quiet alone"]["p99_ms"]
    for r in results.values():
        r["p99_vs_alone"] = r["p99_ms"] / base
    if args.json:
        print(json.dumps({"args": vars(args), "results": results}, indent=2))
        return 0
    print(
        f"quiet tenant: {args.quiet_jobs} jobs, {args.quiet_rate:g} small reports/s; noisy tenant: "
        f"{args.noisy_conns} connections, {args.noisy_scores} per-example scores per report, every 4th 1e200; "
        f"{args.duration:g} s per phase"
    )
    print(f"{'phase':<32} {'quiet n':>8} {'err':>4} {'p50 ms':>8} {'p99 ms':>8} {'p99/alone':>9}  noisy answers")
    for name, r in results.items():
        print(
            f"{name:<32} {r['quiet_reports']:>8} {r['quiet_errors']:>4} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['p99_vs_alone']:>9.2f}  {r['noisy_status']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
