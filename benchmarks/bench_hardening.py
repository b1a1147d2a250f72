"""What one tenant or client can take from another at the service's edge and in its dashboard (issue 45).

Two parts, each on a real ``evalstop-server serve`` process (SQLite) on loopback, for this checkout and, with
``--before DIR`` (a checkout of an older commit), for that one too, in the same run:

- **dashboard**: tenant A holds a job of 20,000 reports, and 8 browsers of A (signed in, a separate process) load its
  dashboard page in loops as fast as they can (after a 429, once its Retry-After has passed); tenant B reads one of its
  jobs, ``GET /v1/jobs/{id}``, 15 times a second (``bench_fairness.py``'s reader). B's p50 and p99 alone and while A
  loads; the issue measured B's median going from 2.7 ms to 161 ms. **api**, its peer: the same with A's 8 clients
  reading the job's reports through ``GET /v1/jobs/{id}/evals?limit=500`` instead.
- **flood**: one client opens 1,000 silent sockets as fast as it can (from 127.0.0.1); meanwhile another client (from
  127.0.0.2) sends 15 requests a second for the part's duration. How many of its answers were not 200, and its p50;
  the issue saw every request answered 503 for 30 s.

    python benchmarks/bench_hardening.py --duration 10 [--before ../evalstop-before] [--json]
"""

from __future__ import annotations

import argparse
import html
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

# Tenant B's paced reader from bench_fairness.py, the server runner (this directory is on sys.path when run as a script).
from bench_fairness import _tenant_b
from service_process import ServerProcess, pct

ROOT = Path(__file__).resolve().parents[1]
A_REPORTS = 20_000
BROWSERS = 8
FLOOD_SOCKETS = 1_000
RATE = 15.0  # B's requests per second


def _make_db(path: Path) -> tuple[str, str]:
    """Tenant A with job ``long`` of 20,000 reports, tenant B with job ``b-1``; their tokens."""
    from platform_sim.core import Report
    from platform_sim.service.store import JobRecord
    from platform_sim.service.store_sqlite import SQLiteStore

    store = SQLiteStore(path, synchronous="NORMAL")
    try:
        a, token_a = store.add_tenant("heavy")
        b, token_b = store.add_tenant("light")
        store.register_job(b.tenant_id, JobRecord("b-1", "rlhf", {"name": "k-decline"}))
        store.register_job(a.tenant_id, JobRecord("long", "rlhf", {"name": "k-decline", "params": {"k": 1000}}))
        pending = [store.submit_report(a.tenant_id, Report("long", "rlhf", s, 0.5)) for s in range(A_REPORTS)]
        for f in pending:
            f.result()
    finally:
        store.close()
    return token_a, token_b


def _browser(url: str, token: str) -> httpx.Client:
    """A client signed in to the dashboard with ``token`` (through the sign-in form)."""
    client = httpx.Client(base_url=url, timeout=120)
    form = client.get("/login")
    nonce = re.search(r'name="login_nonce" value="([^"]+)"', form.text)
    assert nonce is not None, form.text[:200]
    r = client.post("/login", data={"token": token, "login_nonce": html.unescape(nonce.group(1))})
    assert r.status_code == 303, r.text[:200]
    return client


def _tenant_a(url: str, token: str, path: str, seconds: float, out: multiprocessing.Queue) -> None:
    """8 browsers (or, for an API path, 8 API clients) loading ``path`` in loops; the pages served and refused."""
    counts = {"pages": 0, "refused": 0, "errors": 0}
    lock = threading.Lock()
    if path.startswith("/v1/"):
        auth = {"Authorization": f"Bearer {token}"}
        browsers = [httpx.Client(base_url=url, timeout=120, headers=auth) for _ in range(BROWSERS)]
    else:
        browsers = [_browser(url, token) for _ in range(BROWSERS)]
    t_end = time.monotonic() + seconds

    def loop(client: httpx.Client) -> None:
        while time.monotonic() < t_end:
            r = client.get(path)
            with lock:
                key = "pages" if r.status_code == 200 else "refused" if r.status_code == 429 else "errors"
                counts[key] += 1
            if r.status_code == 429:
                time.sleep(float(r.headers.get("Retry-After", "1")))

    threads = [threading.Thread(target=loop, args=(b,)) for b in browsers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for b in browsers:
        b.close()
    out.put(counts)


A_PATHS = {"dashboard": "/jobs/long", "api": "/v1/jobs/long/evals?limit=500"}
"""What A loads: the job's dashboard page, or (its peer) the API's page of as many of its reports."""


def dashboard(root: Path, db: Path, tokens: tuple[str, ...], seconds: float, what: str = "dashboard") -> dict:
    srv = ServerProcess(db, [], root)
    try:
        alone = _tenant_b(srv.url, tokens[1], seconds)
        queue: multiprocessing.Queue = multiprocessing.Queue()
        args = (srv.url, tokens[0], A_PATHS[what], seconds, queue)
        a = multiprocessing.get_context("fork").Process(target=_tenant_a, args=args)
        a.start()
        time.sleep(1.5)  # the browsers are signed in and loading
        loaded = _tenant_b(srv.url, tokens[1], seconds - 1.5)
        counts = queue.get(timeout=300)
        a.join()
    finally:
        srv.stop()
    return {"code": root.name, "a_loads": what, "alone": alone, "with_a": loaded, "a": counts}


def api(root: Path, db: Path, tokens: tuple[str, ...], seconds: float) -> dict:
    """:func:`dashboard` with A's clients reading the same job's reports through the API, 500 a page."""
    return dashboard(root, db, tokens, seconds, "api")


def flood(root: Path, db: Path, tokens: tuple[str, ...], seconds: float) -> dict:
    srv = ServerProcess(db, [], root)
    sockets: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for _ in range(FLOOD_SOCKETS):
            try:
                sockets.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
            except OSError:
                break
        opened_s = time.monotonic() - t0
        lat: list[float] = []
        statuses: dict[int, int] = {}
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=srv.url, transport=transport, timeout=60) as c:
            next_at = time.monotonic()
            t_end = next_at + seconds
            while next_at < t_end:
                time.sleep(max(0.0, next_at - time.monotonic()))
                t1 = time.perf_counter()
                try:
                    status = c.get("/v1/jobs/b-1", headers={"Authorization": f"Bearer {tokens[1]}"}).status_code
                except httpx.TransportError:
                    status = 0
                lat.append(time.perf_counter() - t1)
                statuses[status] = statuses.get(status, 0) + 1
                next_at += 1.0 / RATE
    finally:
        for s in sockets:
            s.close()
        srv.stop()
    n = sum(statuses.values())
    return {
        "code": root.name,
        "sockets": len(sockets),
        "opened_s": opened_s,
        "requests": n,
        "not_200": n - statuses.get(200, 0),
        "statuses": statuses,
        "p50_ms": pct(lat, 0.5) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=10.0, help="seconds of each part (default 10)")
    p.add_argument("--before", type=Path, default=None, help="a checkout of an older commit to compare with")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--make-db", type=Path, default=None, help=argparse.SUPPRESS)  # the seed database, by this code
    args = p.parse_args(argv)
    if args.make_db is not None:
        print(json.dumps(_make_db(args.make_db)))
        return 0
    if args.duration < 4:
        p.error("--duration must be >= 4")
    codes = [ROOT] + ([args.before.resolve()] if args.before else [])
    workdir = Path(tempfile.mkdtemp(prefix="evalstop-hardening-"))
    dash: list[dict] = []
    floods: list[dict] = []
    try:
        for root in codes:
            seed = workdir / f"{root.name}-seed.db"  # made by that code (an older server refuses a newer schema)
            env = {**os.environ, "PYTHONPATH": str(root)}
            made = subprocess.run(
                [sys.executable, __file__, "--make-db", str(seed)], cwd=root, env=env, capture_output=True, text=True
            )
            if made.returncode != 0:
                raise RuntimeError(made.stderr)
            tokens = tuple(json.loads(made.stdout))
            for part, rows in ((dashboard, dash), (api, dash), (flood, floods)):
                db = workdir / f"{root.name}-{part.__name__}.db"
                shutil.copy(seed, db)
                rows.append(part(root, db, tokens, args.duration))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"duration_s": args.duration, "cpus": os.cpu_count(), "dashboard": dash, "flood": floods}))
        return 0
    print(f"{args.duration:g} s per part, {os.cpu_count()} CPUs; B reads its job {RATE:g}/s")
    print(f"{BROWSERS} clients of A load, in loops, a {A_REPORTS}-report job's dashboard page or its API page")
    print(
        f"{'code':<20} {'A loads':<10} {'alone p50/p99 ms':>17} {'with A p50/p99 ms':>18} {'p50 x':>6} {'A pages':>8}"
    )
    for r in dash:
        al, wa = r["alone"], r["with_a"]
        print(
            f"{r['code']:<20} {r['a_loads']:<10} {al['p50_ms']:>8.2f}/{al['p99_ms']:<8.2f} {wa['p50_ms']:>8.2f}/{wa['p99_ms']:<9.2f} "
            f"{wa['p50_ms'] / al['p50_ms']:>6.2f} {r['a']['pages']:>8} (refused {r['a']['refused']}, "
            f"errors {r['a']['errors']}, B not 200: {wa['not_200']})"
        )
    print(f"flood: {FLOOD_SOCKETS} silent sockets from 127.0.0.1; B from 127.0.0.2")
    for r in floods:
        print(
            f"{r['code']:<20} {r['sockets']} sockets in {r['opened_s']:.2f} s; B: {r['not_200']} of "
            f"{r['requests']} not 200 {r['statuses']}, p50 {r['p50_ms']:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
