"""What ``evalstop watch`` costs and how fast it decides, with many logs followed at once.

A writer (this process) appends verl file-logger lines to N logs: per evaluation of a shipped real trace, a training
line and the eval line, one evaluation per log every ``--interval`` seconds, the logs' curves taken from the real
traces that the embedded default detector stops (cycled). The logs are followed either by N ``evalstop watch``
processes (``python -m evalstop_callbacks.watch LOG --metric ... --on-stop true``) or by ONE process through the
Python API (N :class:`~evalstop_callbacks.watch.Watcher` objects polled in one loop with one backoff).

Figures:
- delay: from the write of the line whose evaluation stops a log to the decision (a watch process's result file's
  mtime, written at the stop; the API process's clock when ``watcher.stopped`` turns true), p50/p99 over the logs.
- CPU: per watcher (a process, or the API process divided by N), idle (every log complete up to a first line, nothing
  written for ``--idle`` seconds: the backoff's ceiling of 1 s is reached) and active (the writing phase until the
  last stop), as a share of one core; also the total CPU of a watch process over its life (start-up included).
Every decision is checked equal to the embedded core's on the same curve.

    .venv/bin/python benchmarks/bench_watch.py --logs 100 --mode procs api --json bench_watch.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METRIC = "val-core/openai/gsm8k/reward/mean@1"
TICK = os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def stopping_curves(count: int) -> list[tuple[str, list[tuple[int, float]], int]]:
    """(name, [(step, score)], embedded stop step) for ``count`` logs, from the real traces the default stops."""
    from evalstop_callbacks.client import EmbeddedClient
    from platform_sim.core import Report, default_spec

    folder = REPO / "platform_sim" / "data" / "corpora" / "real"
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        curve = [(e["step"], float(e["eval_score"])) for e in lines if e.get("kind") == "eval"]
        client = EmbeddedClient(warn_without_plan=False)  # per look, as the watch without --planned-steps
        job = client.register("rlhf", detector=default_spec(), job_id="ref")
        for step, score in curve:
            if client.report(Report(job, "rlhf", step, score)).should_stop:
                found.append((path.stem, curve, step))
                break
    return [found[i % len(found)] for i in range(count)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def write_line(path: Path, step: int, data: dict[str, float]) -> None:
    with open(path, "ab") as fh:
        fh.write(json.dumps({"step": step, "data": data}).encode() + b"\n")


def drive(logs: list[Path], curves: list[Any], interval: float, done: Any) -> dict[int, float]:
    """Write every log's evaluations at the pace; the write time of each log's stop line. ``done(i)`` says whether
    log i's watcher has decided (its log then gets no more lines)."""
    written: dict[int, float] = {}
    longest = max(len(c[1]) for c in curves)
    for k in range(longest):
        tick = time.monotonic()
        for i, (_name, curve, stop) in enumerate(curves):
            if k >= len(curve) or done(i):
                continue
            step, score = curve[k]
            write_line(logs[i], step, {"actor/loss": 0.1})
            write_line(logs[i], step, {METRIC: score})
            if step == stop:
                written[i] = time.time()
        if all(done(i) for i in range(len(curves))):
            break
        time.sleep(max(0.0, interval - (time.monotonic() - tick)))
    return written


def prepare(folder: Path, count: int) -> list[Path]:
    logs = [folder / f"run{i:03d}.jsonl" for i in range(count)]
    for log in logs:
        write_line(log, 0, {"actor/loss": 0.2})  # a first line: the format is told before the measurement
    return logs


def bench_procs(folder: Path, curves: list[Any], idle: float, interval: float) -> dict[str, Any]:
    logs = prepare(folder, len(curves))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    for log in logs:
        err = open(log.with_suffix(".err"), "wb")
        cmd = [sys.executable, "-m", "evalstop_callbacks.watch", str(log), "--metric", METRIC, "--on-stop", "true"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # started: every watcher has read the first line and chosen the format
        if all(b"format verl chosen" in log.with_suffix(".err").read_bytes() for log in logs):
            break
        time.sleep(0.5)
    time.sleep(3.0)  # let the backoff reach its ceiling
    before = [cpu_seconds(p.pid) for p in procs]
    time.sleep(idle)
    idle_cpu = [(cpu_seconds(p.pid) - b) / idle for p, b in zip(procs, before, strict=True)]
    results = [log.with_name(log.name + ".evalstop.json") for log in logs]
    start_active = time.monotonic()
    active_before = [cpu_seconds(p.pid) for p in procs]
    written = drive(logs, curves, interval, lambda i: results[i].exists())
    usage = []
    for p in procs:
        _pid, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        usage.append(ru.ru_utime + ru.ru_stime)
    active_s = time.monotonic() - start_active
    active_cpu = [(u - b) / active_s for u, b in zip(usage, active_before, strict=True)]
    delays, wrong = [], 0
    for i, path in enumerate(results):
        result = json.loads(path.read_text())
        wrong += result["stop_step"] != curves[i][2]
        delays.append(path.stat().st_mtime - written[i])
    return {
        "watchers": len(procs),
        "exit_codes": sorted({p.returncode for p in procs}),
        "wrong_decisions": wrong,
        "delay_p50_s": _pct(delays, 0.5),
        "delay_p99_s": _pct(delays, 0.99),
        "idle_cpu_per_watcher_pct": 100 * statistics.mean(idle_cpu),
        "idle_cpu_max_watcher_pct": 100 * max(idle_cpu),
        "active_cpu_per_watcher_pct": 100 * statistics.mean(active_cpu),
        "active_s": active_s,
        "cpu_s_per_watcher_lifetime": statistics.mean(usage),
    }


def api_follower(folder: Path, count: int, out: Path) -> None:
    """The API process: follow ``count`` logs in one loop until every one stops; write decision times to ``out``."""
    from evalstop_callbacks.watch import Backoff, Watcher

    logs = [folder / f"run{i:03d}.jsonl" for i in range(count)]
    watchers = [Watcher(log, METRIC) for log in logs]
    decided: dict[int, float] = {}
    backoff = Backoff()
    (folder / "ready").write_text("")
    while len(decided) < count:
        found = False
        for i, watcher in enumerate(watchers):
            if i in decided:
                continue
            found |= watcher.poll()
            if watcher.stopped:
                decided[i] = time.time()
                (folder / f"decided-{i}").write_text("")
        time.sleep(backoff.next(found))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    stops = [w.result().stop_step for w in watchers]
    out.write_text(json.dumps({"decided": decided, "stops": stops, "cpu_s": ru.ru_utime + ru.ru_stime}))


def bench_api(folder: Path, curves: list[Any], idle: float, interval: float) -> dict[str, Any]:
    logs = prepare(folder, len(curves))
    out = folder / "api.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "api-follower", str(folder), str(len(curves)), str(out)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    while not (folder / "ready").exists():
        time.sleep(0.2)
    time.sleep(3.0)
    before = cpu_seconds(proc.pid)
    time.sleep(idle)
    idle_cpu = (cpu_seconds(proc.pid) - before) / idle
    start_active, active_before = time.monotonic(), cpu_seconds(proc.pid)
    written = drive(logs, curves, interval, lambda i: (folder / f"decided-{i}").exists())
    active_after = cpu_seconds(proc.pid)
    active_s = time.monotonic() - start_active
    proc.wait()
    got = json.loads(out.read_text())
    delays = [got["decided"][str(i)] - written[i] for i in range(len(curves))]
    wrong = sum(stop != curves[i][2] for i, stop in enumerate(got["stops"]))
    n = len(curves)
    return {
        "logs": n,
        "exit_code": proc.returncode,
        "wrong_decisions": wrong,
        "delay_p50_s": _pct(delays, 0.5),
        "delay_p99_s": _pct(delays, 0.99),
        "idle_cpu_process_pct": 100 * idle_cpu,
        "idle_cpu_per_log_pct": 100 * idle_cpu / n,
        "active_cpu_process_pct": 100 * (active_after - active_before) / active_s,
        "active_cpu_per_log_pct": 100 * (active_after - active_before) / active_s / n,
        "active_s": active_s,
        "cpu_s_process_lifetime": got["cpu_s"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "api-follower":
        api_follower(Path(argv[1]), int(argv[2]), Path(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", type=int, default=100)
    parser.add_argument("--mode", nargs="+", choices=("procs", "api"), default=["procs", "api"])
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle measurement")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two evaluations of a log")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.getLogger("platform_sim").setLevel(logging.ERROR)  # the reference runs' "means alone" warnings
    curves = stopping_curves(args.logs)
    report: dict[str, Any] = {
        "logs": args.logs,
        "interval_s": args.interval,
        "idle_s": args.idle,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    for mode in args.mode:
        with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
            bench = bench_procs if mode == "procs" else bench_api
            report[mode] = bench(Path(tmp), curves, args.idle, args.interval)
        print(f"{mode}: {json.dumps(report[mode])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
