"""Sweep scaling: 200 simulations (64 GPUs, 200 jobs, SRTF-Est + EvalStop, seeds 0..199) on each runner backend.

For the process pool and for a local Ray instance, with 1 and 2 workers each, it prints:

- ``start_s``: bringing the backend up (Ray: ``ray.init`` plus one task per worker, so that worker processes exist
  and have imported the simulator; the pool: nothing, it forks on first use);
- ``wall_s``: the 200 simulations through ``runner.map`` (results in task order), median of ``--repeat`` rounds;
- ``x serial``: median over rounds of (serial in-process time / backend time), each serial run done right before
  the backend's in the same round, so that the shared machine's drifting load cancels out;
- ``stop_s``: shutting the backend down.

Serial in-process time is the reference; every backend's results are checked equal to it (the ``wall_s`` metric
of a run is a timing and is left out). Ray's per-task overhead is measured two ways: a round trip of an empty task
(many of them, 2 workers), and the 200 simulations' Ray wall time minus the pool's at the same worker count,
divided by 200.

    python benchmarks/bench_sweep.py [--sims 200] [--repeat 3] [--noop 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

# Ray runs each one-CPU task with OMP_NUM_THREADS=1; the serial run and the pool get the same, before numpy loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from platform_sim.sim.experiments import PolicySpec, SimTask, run_task  # noqa: E402
from platform_sim.sim.runner import ProcessRunner, Runner, SerialRunner  # noqa: E402
from platform_sim.sim.workload import WorkloadConfig  # noqa: E402


def _noop(x: int) -> int:
    return x


def _strip(results: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    return [[{k: v for k, v in m.items() if k != "wall_s"} for m in res] for res in results]


def _tasks(n: int) -> list[SimTask]:
    wl = WorkloadConfig(gpus=64, n_jobs=200)
    spec = PolicySpec(base="srtf-est", stop="evalstop")
    return [SimTask(wl, seed, (spec,)) for seed in range(n)]


def bench_backend(backend: str, workers: int, tasks: list[SimTask], repeat: int, reference: list) -> dict[str, Any]:
    """Start the backend once, then ``repeat`` rounds of: the 200 simulations serially in this process, then on the
    backend. The machine is shared and noisy; the per-round ratio to the serial run next to it is the robust figure."""
    t0 = time.perf_counter()
    runner: Runner
    if backend == "ray":
        from platform_sim.sim.ray_backend import RayRunner

        runner = RayRunner(workers=workers)
        # Warm-up: one task per worker, so worker processes exist and have imported the simulator.
        runner.map(run_task, tasks[:workers])
    else:
        runner = ProcessRunner(workers=workers)
    start = time.perf_counter() - t0
    walls, serials, same = [], [], True
    for _ in range(repeat):
        t1 = time.perf_counter()
        SerialRunner().map(run_task, tasks)
        serials.append(time.perf_counter() - t1)
        t1 = time.perf_counter()
        out = runner.map(run_task, tasks)
        walls.append(time.perf_counter() - t1)
        same = same and _strip(out) == reference
    t2 = time.perf_counter()
    runner.close()
    stop = time.perf_counter() - t2
    wall = statistics.median(walls)
    note = "runs in-process (the pool is serial with 1 worker)" if backend == "pool" and workers == 1 else ""
    return {
        "backend": backend,
        "workers": workers,
        "start_s": start,
        "wall_s": wall,
        "walls_s": walls,
        "serial_s": statistics.median(serials),
        "speedup_vs_serial": statistics.median([s_ / w for s_, w in zip(serials, walls)]),
        "ms_per_sim": 1e3 * wall / len(tasks),
        "stop_s": stop,
        "identical_to_serial": same,
        "note": note,
    }


def bench_ray_noop(n: int, workers: int) -> dict[str, Any]:
    import ray

    from platform_sim.sim.ray_backend import RayRunner

    runner = RayRunner(workers=workers)
    runner.map(_noop, list(range(workers)))  # warm-up
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        runner.map(_noop, list(range(n)))
        rounds.append((time.perf_counter() - t0) / n)
    # And one task at a time: the latency of a single round trip, no overlap.
    remote = ray.remote(num_cpus=1)(_noop)
    lat = []
    for i in range(200):
        t0 = time.perf_counter()
        ray.get(remote.remote(i))
        lat.append(time.perf_counter() - t0)
    runner.close()
    return {
        "tasks": n,
        "workers": workers,
        "ms_per_task_throughput": 1e3 * statistics.median(rounds),
        "ms_round_trip_p50": 1e3 * statistics.median(lat),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sims", type=int, default=200, help="simulations (seeds 0..N-1; default 200)")
    p.add_argument("--noop", type=int, default=2000, help="empty Ray tasks for the overhead figure (default 2000)")
    p.add_argument("--workers", default="1,2", help="worker counts to try (default 1,2)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per backend; medians are reported (default 3)")
    p.add_argument("--skip-ray", action="store_true", help="pool only")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.sims < 1 or args.noop < 1 or args.repeat < 1:
        p.error("--sims, --noop and --repeat must be >= 1")
    workers = [int(w) for w in args.workers.split(",")]
    tasks = _tasks(args.sims)

    t0 = time.perf_counter()
    reference = _strip(SerialRunner().map(run_task, tasks))
    serial_s = time.perf_counter() - t0
    rows = []
    for backend in ("pool",) + (() if args.skip_ray else ("ray",)):
        for w in workers:
            rows.append(bench_backend(backend, w, tasks, args.repeat, reference))
    result: dict[str, Any] = {
        "sims": args.sims,
        "gpus": 64,
        "jobs": 200,
        "cpus": os.cpu_count(),
        "serial_s": serial_s,
        "rows": rows,
    }
    if not args.skip_ray:
        result["ray_noop"] = bench_ray_noop(args.noop, 2)
        pool = {r["workers"]: r["wall_s"] for r in rows if r["backend"] == "pool"}
        result["ray_overhead_ms_per_sim"] = {
            w: 1e3 * (r["wall_s"] - pool[w]) / args.sims
            for r in rows
            if r["backend"] == "ray"
            for w in [r["workers"]]
            if w in pool
        }
    result["load_average"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.sims} simulations (64 GPUs, 200 jobs, srtf-est + evalstop), {os.cpu_count()} CPUs; "
        f"serial in-process: {serial_s:.2f} s ({1e3 * serial_s / args.sims:.1f} ms/sim)"
    )
    print(
        f"{'backend':<8} {'workers':>7} {'start s':>8} {'wall s':>7} {'ms/sim':>7} {'x serial':>8} {'stop s':>7} "
        f"{'same':>5}  note"
    )
    for r in rows:
        print(
            f"{r['backend']:<8} {r['workers']:>7} {r['start_s']:>8.2f} {r['wall_s']:>7.2f} {r['ms_per_sim']:>7.1f} "
            f"{r['speedup_vs_serial']:>8.2f} {r['stop_s']:>7.2f} {str(r['identical_to_serial']):>5}  {r['note']}"
        )
    if "ray_noop" in result:
        n = result["ray_noop"]
        print(
            f"Ray empty task, {n['workers']} workers: {n['ms_per_task_throughput']:.2f} ms/task in a batch of "
            f"{n['tasks']}, {n['ms_round_trip_p50']:.2f} ms one round trip (p50)"
        )
        for w, ms in result["ray_overhead_ms_per_sim"].items():
            print(f"Ray minus pool, {w} worker(s): {ms:+.2f} ms per simulation")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
