"""Speed of the simulator: one 64-GPU run, 1,024 GPUs / 10,000 jobs, 10,240 GPUs / 100,000 jobs, and the paper.

Targets (issue 2): one 64-GPU/200-job run <= 50 ms (median); 1,024 GPUs / 10,000 jobs <= 1 s; 10,240 GPUs /
100,000 jobs with SRTF-Est + EvalStop <= 60 s; ``evalstop-sim paper`` (30 seeds) < 3 min on 2 cores.

Each figure is printed as wall-clock time and as this process's CPU time: on a shared machine the wall time of a
single-threaded simulation is inflated by whatever else runs, the CPU time much less so. The load average at start
and end is printed so that a reader can judge how busy the machine was.

    python benchmarks/bench_sim.py                 # all but the paper
    python benchmarks/bench_sim.py --paper         # also time `evalstop-sim paper` (30 seeds, 2 workers)
    python benchmarks/bench_sim.py --skip-big --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from platform_sim.sim.engine import simulate
from platform_sim.sim.experiments import PolicySpec
from platform_sim.sim.metrics import run_metrics
from platform_sim.sim.workload import WorkloadConfig, generate_workload


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def one_run(gpus: int, jobs: int, seed: int, base: str = "srtf-est", stop: str = "evalstop"):
    """Generate, simulate and compute metrics: what one task of `evalstop-sim paper` does per policy."""
    wl = generate_workload(WorkloadConfig(n_jobs=jobs, gpus=gpus), seed)
    result = simulate(wl, PolicySpec(base=base, stop=stop).build(wl), gpus=gpus)
    return run_metrics(result)


def bench_case(name: str, gpus: int, jobs: int, reps: int, base: str = "srtf-est", stop: str = "evalstop") -> dict:
    walls, cpus, sims, events = [], [], [], 0
    for seed in range(reps):
        m, w, c = timed(lambda seed=seed: one_run(gpus, jobs, seed, base, stop))
        walls.append(w)
        cpus.append(c)
        sims.append(m["wall_s"])
        events = m["events"]
    row = {
        "case": name,
        "gpus": gpus,
        "jobs": jobs,
        "policy": f"{base}+{stop}",
        "reps": reps,
        "median_wall_s": statistics.median(walls),
        "median_cpu_s": statistics.median(cpus),
        "median_simulate_wall_s": statistics.median(sims),
        "events_last": events,
    }
    print(
        f"{name:28s} {base}+{stop:9s} reps {reps:3d}  median wall {row['median_wall_s'] * 1000:9.1f} ms  "
        f"cpu {row['median_cpu_s'] * 1000:9.1f} ms  (simulate only {row['median_simulate_wall_s'] * 1000:9.1f} ms,"
        f" {events} events)",
        flush=True,
    )
    return row


def bench_paper(seeds: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "platform_sim.cli",
            "paper",
            "--seeds",
            str(seeds),
            "--workers",
            str(workers),
            "--out",
            out,
            "--no-progress",
            "--json",
        ]
        w = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - w
    res = json.loads(proc.stdout)
    row = {"case": "paper", "seeds": seeds, "workers": workers, "wall_s": wall, "tasks": res["config"]["tasks"]}
    print(
        f"evalstop-sim paper --seeds {seeds} --workers {workers}: {wall:.1f} s wall ({row['tasks']} tasks)", flush=True
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-big", action="store_true", help="skip the 100,000-job case")
    ap.add_argument("--paper", action="store_true", help="also time `evalstop-sim paper` with 30 seeds")
    ap.add_argument("--workers", type=int, default=2, help="workers for the paper timing (default 2)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    args = ap.parse_args()
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs")
    rows = [
        bench_case("64 GPUs / 200 jobs", 64, 200, 30),
        bench_case("64 GPUs / 200 jobs", 64, 200, 30, stop="none"),
        bench_case("1,024 GPUs / 10,000 jobs", 1024, 10_000, 3),
        bench_case("1,024 GPUs / 10,000 jobs", 1024, 10_000, 3, base="fifo", stop="none"),
    ]
    if not args.skip_big:
        rows.append(bench_case("10,240 GPUs / 100,000 jobs", 10_240, 100_000, 1))
    if args.paper:
        rows.append(bench_paper(30, args.workers))
    load1 = os.getloadavg()
    print(f"load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        print(json.dumps({"rows": rows, "loadavg_start": load0, "loadavg_end": load1}, indent=2))


if __name__ == "__main__":
    main()
