"""Load benchmark of the scheduler service, side by side with Optuna's RDB storage on SQLite.

Both peers do the same work for the same time in the same run:

- evalstop: a real ``evalstop-server serve`` process (SQLite, WAL, synchronous=FULL) on loopback; ``--jobs``
  concurrent jobs each report as fast as they can over one keep-alive HTTP/1.1 connection (a lean asyncio client, so
  that the load generator takes little of the two cores). Every 200 answer is a durably committed decision.
- Optuna: ``--jobs`` trials of one study in ``optuna.storages.RDBStorage("sqlite:///...")``, one thread per trial,
  each doing ``trial.report(value, step)`` then ``trial.should_prune()`` with ``PatientPruner(None, patience=2)``
  (stop after 2 evals without improvement: the nearest Optuna rule to k-decline) as fast as it can. In process, no
  HTTP: the peer is the storage layer alone.

After the evalstop run the server is stopped and the database is read back: every acknowledged report must be there
(lost reports) and no request may have failed (errors).

    python benchmarks/bench_service.py --duration 30 --jobs 64 [--json]

``--fastapi-route`` also runs the closed loop with the server's report fast path off (every report through the
FastAPI route, which parses it with the same function), right after the fast path's run, and prints the ratio: the
figure that decides whether the fast path earns its place (docs/benchmarks-service.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from service_process import free_port, pct  # this folder is on sys.path


async def _job_worker(
    host: str,
    port: int,
    token: str,
    job: str,
    t_end: float,
    seed: int,
    latencies: list[float],
    acked: list[int],
    errors: list[str],
    interval: float = 0.0,
) -> None:
    """One job on one keep-alive connection: as fast as it can (``interval=0``) or one report every ``interval`` s.

    With an interval (open loop) the latency is measured from the report's scheduled time, so a slow answer also
    counts against the reports that had to wait for it (no coordinated omission).
    """
    reader, writer = await asyncio.open_connection(host, port)
    rng = random.Random(seed)
    step, score = 0, 0.5
    next_at = time.perf_counter() + rng.random() * interval
    head = (
        f"POST /v1/jobs/{job}/evals HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n"
    )
    try:
        while time.perf_counter() < t_end:
            score += rng.gauss(0.0, 0.01)
            body = json.dumps({"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score}).encode()
            if interval:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t0 = next_at
                next_at += interval
            else:
                t0 = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = int((await reader.readline()).split()[1])
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            payload = await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status == 200:
                acked.append(step)
            else:
                errors.append(f"{job} step {step}: HTTP {status} {payload[:200]!r}")
            step += 1
    finally:
        writer.close()


# `evalstop-server serve` with create_app(fast_path=False): the same server, every report through the FastAPI route.
_SERVE_WITHOUT_FAST_PATH = (
    "import functools, sys; import platform_sim.service.app as app; "
    "app.create_app = functools.partial(app.create_app, fast_path=False); "
    "from platform_sim.service.cli import main; sys.exit(main(sys.argv[1:]))"
)


def bench_evalstop(
    duration: float, jobs: int, workdir: Path, synchronous: str, rate: float = 0.0, fast_path: bool = True
) -> dict:
    from platform_sim.service.store_sqlite import SQLiteStore

    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "evalstop.db"
    store = SQLiteStore(db)
    tenant, token = store.add_tenant("bench")
    store.close()
    port = free_port()
    log = open(workdir / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            *(["-m", "platform_sim.service.cli"] if fast_path else ["-c", _SERVE_WITHOUT_FAST_PATH]),
            "serve",
            "--db",
            str(db),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--synchronous",
            synchronous,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not start: " + (workdir / "server.log").read_text())
        names = [f"bench-{i:03d}" for i in range(jobs)]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            for name in names:
                c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": name, "gpus": 8}).raise_for_status()
        latencies: list[float] = []
        acked: dict[str, list[int]] = {n: [] for n in names}
        errors: list[str] = []
        cpu0 = _proc_cpu(proc.pid)
        client0 = time.process_time()

        async def main() -> float:
            t_start = time.perf_counter()
            t_end = t_start + duration
            interval = jobs / rate if rate else 0.0
            await asyncio.gather(
                *[
                    _job_worker("127.0.0.1", port, token, n, t_end, i, latencies, acked[n], errors, interval)
                    for i, n in enumerate(names)
                ]
            )
            return time.perf_counter() - t_start

        elapsed = asyncio.run(main())
        server_cpu = _proc_cpu(proc.pid) - cpu0
        client_cpu = time.process_time() - client0
        server_hist = _server_histogram(httpx.get(f"{url}/metrics", timeout=10).text)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    store = SQLiteStore(db)
    lost = 0
    for name in names:
        stored = {r.step for r in store.reports(tenant.tenant_id, name)}
        lost += sum(1 for s in acked[name] if s not in stored)
    store.close()
    n = sum(len(v) for v in acked.values())
    return {
        "peer": "evalstop-server" + (f" @{rate:g}/s" if rate else "") + ("" if fast_path else " (FastAPI route)"),
        "reports": n,
        "seconds": elapsed,
        "reports_per_s": n / elapsed,
        "p50_ms": pct(latencies, 0.50) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "p90_ms": pct(latencies, 0.90) * 1e3,
        "p999_ms": pct(latencies, 0.999) * 1e3,
        "max_ms": max(latencies, default=float("nan")) * 1e3,
        "errors": len(errors),
        "lost": lost,
        "server_cpu_s": server_cpu,
        "load_generator_cpu_s": client_cpu,
        "server_p50_ms_upper": _hist_quantile(server_hist, 0.50) * 1e3,
        "server_p99_ms_upper": _hist_quantile(server_hist, 0.99) * 1e3,
        "first_error": errors[0] if errors else None,
    }


def _server_histogram(text: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the server's own report-latency histogram (arrival to commit)."""
    out = []
    for line in text.splitlines():
        if line.startswith("evalstop_report_latency_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    return out


def _hist_quantile(hist: list[tuple[float, float]], q: float) -> float:
    """The smallest bucket bound that holds at least a fraction q of the observations (an upper bound)."""
    total = hist[-1][1] if hist else 0
    for bound, count in hist:
        if total and count >= q * total:
            return bound
    return float("nan")


def _proc_cpu(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc), to show what the server itself used."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def bench_optuna(duration: float, jobs: int, workdir: Path) -> dict:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = optuna.storages.RDBStorage(f"sqlite:///{workdir / 'optuna.db'}")
    study = optuna.create_study(
        storage=storage, study_name="bench", pruner=optuna.pruners.PatientPruner(None, patience=2)
    )
    trials = [study.ask() for _ in range(jobs)]
    latencies: list[float] = []
    counts = [0] * jobs
    errors: list[str] = []
    t_end = time.perf_counter() + duration
    lock = threading.Lock()

    def run(i: int) -> None:
        rng = random.Random(i)
        trial, score, step, local = trials[i], 0.5, 0, []
        while time.perf_counter() < t_end:
            score += rng.gauss(0.0, 0.01)
            t0 = time.perf_counter()
            try:
                trial.report(score, step)
                trial.should_prune()
            except Exception as exc:  # noqa: BLE001 - counted, shown in the output
                with lock:
                    errors.append(f"trial {i} step {step}: {type(exc).__name__}: {exc}"[:300])
            else:
                counts[i] += 1
            local.append(time.perf_counter() - t0)
            step += 1
        with lock:
            latencies.extend(local)

    t_start, cpu0 = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - t_start, time.process_time() - cpu0
    n = sum(counts)
    stored = sum(len(t.intermediate_values) for t in study.get_trials(deepcopy=False))
    return {
        "peer": "optuna RDBStorage (sqlite)",
        "reports": n,
        "seconds": elapsed,
        "reports_per_s": n / elapsed,
        "p50_ms": pct(latencies, 0.50) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
        "errors": len(errors),
        "lost": n - stored if stored < n else 0,
        "cpu_s": cpu,
        "first_error": errors[0] if errors else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per peer (default 30)")
    p.add_argument("--jobs", type=int, default=64, help="concurrent jobs (default 64)")
    p.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL", help="server's SQLite durability")
    p.add_argument("--skip-optuna", action="store_true", help="run the evalstop peer only")
    p.add_argument(
        "--rate",
        type=float,
        default=1000.0,
        help="also run evalstop open-loop at this many reports/s in total, latency measured from each "
        "report's scheduled time (default 1000; 0 skips)",
    )
    p.add_argument(
        "--fastapi-route",
        action="store_true",
        help="also run the closed loop with the report fast path off (every report through the FastAPI route)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.jobs < 1 or args.rate < 0:
        p.error("--duration must be > 0, --jobs >= 1 and --rate >= 0")
    workdir = Path(tempfile.mkdtemp(prefix="evalstop-bench-"))
    try:
        rows = [bench_evalstop(args.duration, args.jobs, workdir / "closed", args.synchronous)]
        if args.fastapi_route:
            rows.append(bench_evalstop(args.duration, args.jobs, workdir / "route", args.synchronous, fast_path=False))
        if not args.skip_optuna:
            rows.append(bench_optuna(args.duration, args.jobs, workdir))
        if args.rate:
            rows.append(bench_evalstop(args.duration, args.jobs, workdir / "open", args.synchronous, args.rate))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {"jobs": args.jobs, "duration_s": args.duration, "cpus": os.cpu_count(), "peers": rows}
    optuna_rows = [r for r in rows if r["peer"].startswith("optuna")]
    if optuna_rows and optuna_rows[0]["reports_per_s"] > 0:
        # Both peers closed-loop (as fast as they can) in the same run: the figure to trust on a noisy machine.
        out["throughput_ratio"] = rows[0]["reports_per_s"] / optuna_rows[0]["reports_per_s"]
        out["p99_ratio"] = optuna_rows[0]["p99_ms"] / rows[0]["p99_ms"]
    route_rows = [r for r in rows if r["peer"].endswith("(FastAPI route)")]
    if route_rows and route_rows[0]["reports"]:
        fast, route = rows[0], route_rows[0]
        out["fast_path_throughput_ratio"] = fast["reports_per_s"] / route["reports_per_s"]
        out["fast_path_cpu_per_report_ratio"] = (route["server_cpu_s"] / route["reports"]) / (
            fast["server_cpu_s"] / max(fast["reports"], 1)
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.jobs} concurrent jobs, {args.duration:g} s per peer, {os.cpu_count()} CPUs")
    print(f"{'peer':<28} {'reports':>9} {'reports/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'lost':>5}")
    for r in rows:
        print(
            f"{r['peer']:<28} {r['reports']:>9} {r['reports_per_s']:>10.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {r['errors']:>7} {r['lost']:>5}"
        )
        if r.get("first_error"):
            print(f"  first error: {r['first_error']}")
    for r in rows:
        if "server_cpu_s" not in r:
            continue
        print(
            f"{r['peer']}: server CPU {r['server_cpu_s']:.1f} s, load generator CPU "
            f"{r['load_generator_cpu_s']:.1f} s over {r['seconds']:.1f} s "
            f"({r['server_cpu_s'] / max(r['reports'], 1) * 1e3:.2f} ms CPU per report); its own histogram "
            f"(arrival to commit): p50 <= {r['server_p50_ms_upper']:g} ms, p99 <= {r['server_p99_ms_upper']:g} ms"
        )
    for r in optuna_rows:
        print(
            f"{r['peer']}: CPU {r['cpu_s']:.1f} s over {r['seconds']:.1f} s "
            f"({r['cpu_s'] / max(r['reports'], 1) * 1e3:.2f} ms CPU per report)"
        )
    if "throughput_ratio" in out:
        print(f"evalstop / optuna: {out['throughput_ratio']:.1f}x reports/s, p99 {out['p99_ratio']:.1f}x lower")
    if "fast_path_throughput_ratio" in out:
        print(
            f"fast path / FastAPI route: {out['fast_path_throughput_ratio']:.2f}x reports/s, "
            f"{out['fast_path_cpu_per_report_ratio']:.2f}x less server CPU per report"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
