"""The queue's gain measured on a real Slurm: N tiny TRL GRPO jobs sbatch'd to fewer "GPU" slots than jobs, each
reporting through its EvalStop callback to a real ``evalstop-server``; once without EvalStop (the callback observes,
the server has no actuator) and once with it (the callback enforces, the server ends the job through the Slurm
actuator), the same jobs in the same order with the same seeds. Beside the measured queue: the simulator's
prediction for the same workload (the measured durations and gold curves of the run without EvalStop).

    eval "$(bash tests/slurm.sh start)"        # as root: the single-node cluster (2 GPU slots by default)
    nice .venv/bin/python benchmarks/slurm_queue.py --steps 150 --eval-steps 5 --out slurm-queue [--json]

The jobs are the shipped bag-of-words world (``bow-proxy``, seed 0): GRPO against the learned proxy with no or a weak
KL at three learning rates (reward hacking: gold peaks, then falls) and healthy controls (GRPO on gold itself; GRPO
against the proxy with KL 0.2 or 1.0), interleaved. Each job asks Slurm for one GPU slot (``--gres=gpu:1``) and runs on one thread.

Printed per job: start, end, stopped or not, the best step restored; per queue: mean and p95 JCT, makespan,
slot-hours, and slot-hours after the true peak of the hacking jobs (the step of the highest held-out gold of the
job's full-length run). Results page: docs/results/slurm-queue.md.

Internal: ``slurm_queue.py job --spec JSON --url URL --mode observe|enforce --out DIR`` is what each Slurm job runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FINISHED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}


def lab() -> SimpleNamespace:
    """The tiny worlds this script uses: run specs and their trainers from the lab beside the benchmarks
    (``benchmarks/lab/``, importable as ``lab`` since this script's folder is on ``sys.path``), and the demo's
    bag-of-words environment."""
    from evalstop_callbacks.demo import overopt
    from lab import run_worlds, runs

    return SimpleNamespace(runs=runs, run_worlds=run_worlds, overopt=overopt)


def workload_specs(steps: int, eval_steps: int) -> list[Any]:
    """The queue, in submission order: hacking and healthy configurations interleaved, all in the world of seed 0
    (one world to build; the configurations differ in reward, KL and learning rate)."""
    RunSpec = lab().runs.RunSpec
    grid = [
        ("proxy", 0.0, 5e-4),  # hacks: gold peaks, then falls
        ("gold", 0.0, 5e-4),  # healthy: the reward is gold itself
        ("proxy", 0.0, 1e-3),  # hacks, sooner
        ("proxy", 0.2, 5e-4),  # healthy: a strong KL
        ("proxy", 0.05, 5e-4),  # a weak KL: still hacks
        ("gold", 0.0, 1e-3),
        ("proxy", 0.0, 7e-4),
        ("proxy", 1.0, 5e-4),  # flat
    ]
    return [RunSpec("grpo", reward, kl, 0, steps, eval_steps, lr=lr) for reward, kl, lr in grid]


def job_name(spec: Any) -> str:
    """The job's name here (its trace, its service job id, its Slurm job name): the lab's run name, which for this
    world leaves the learning rate out, with the learning rate."""
    return f"{spec.name}-lr{spec.lr:g}"


# -- one Slurm job ------------------------------------------------------------------------------------------


def run_job(args: argparse.Namespace) -> int:
    """One job: train the spec with the EvalStop callback reporting to the server, write its result and times."""
    import torch
    from transformers import TrainerCallback

    from evalstop_callbacks import EvalStopCallback
    from evalstop_callbacks.platform_client import PlatformClient

    torch.set_num_threads(1)
    research = lab()
    spec = research.runs.RunSpec(**json.loads(args.spec))
    out = Path(args.out)
    started = time.time()
    term: dict[str, float | None] = {"at": None}

    def on_term(signum: int, frame: object) -> None:
        # Slurm's phase-0 SIGTERM: end at the next step, as a trainer that checkpoints on TERM would.
        term["at"] = time.time()

    signal.signal(signal.SIGTERM, on_term)
    times = (out / f"{job_name(spec)}.times.jsonl").open("a", buffering=1)

    class Clock(TrainerCallback):  # type: ignore[misc]
        """The wall time of each eval step (for the slot-hours after the peak), and the stop on TERM."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step % spec.eval_steps == 0:
                times.write(json.dumps({"step": state.global_step, "t": time.time()}) + "\n")
            if term["at"] is not None:
                control.should_training_stop = True
            return control

    env = research.overopt.build_env(research.overopt.EnvConfig(seed=spec.seed))
    world = research.run_worlds.world_of(spec, env)
    client = PlatformClient(
        args.url,
        os.environ["EVALSTOP_TOKEN"],
        gpus=1,
        planned_steps=spec.steps,
        scheduler_handle="auto" if args.mode == "enforce" else None,
    )
    cb = EvalStopCallback(
        world.evaluator,
        eval_steps=spec.eval_steps,
        client=client,
        job_id=job_name(spec),
        job_type="rlhf",
        mode=args.mode,
        eval_on_start=False,
        trace_path=str(out / f"{job_name(spec)}.jsonl"),
        trace_extras=world.evaluator.trace_extras,
    )
    with tempfile.TemporaryDirectory(prefix="evalstop-queue-") as folder:
        world.trainer(spec, [cb, Clock()], folder).train()
    result = {
        "job": job_name(spec),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "started": started,
        "ended": time.time(),
        "stopped_at": cb.stopped_at,
        "would_stop_at": cb.would_stop_at,
        "best_step": cb.best_step,
        "best_score": cb.best_score,
        "restored": cb.restored_from is not None,
        "term_at": term["at"],
    }
    (out / f"{job_name(spec)}.result.json").write_text(json.dumps(result))
    client.close()
    return 0


# -- the queue ----------------------------------------------------------------------------------------------


def _server(db: Path, port: int, actuate: bool, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "platform_sim.service.cli", "serve", "--db", str(db), "--port", str(port)]
    cmd += ["--log-level", "warning"]
    if actuate:
        # grace 10 s: the job's TERM handler ends training at the next step; the scancel after it is the backstop.
        cmd += ["--actuator", "slurm", "--actuator-option", "grace_s=10", "--actuate", "--actuate-poll-s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")


def _cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "platform_sim.service.cli", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"evalstop-server {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _states(ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"], capture_output=True, text=True, timeout=20
    )
    states = {}
    for line in out.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        states[job] = state
    return states


def run_queue(mode: str, specs: list[Any], out: Path, timeout_s: float) -> dict[str, Any]:
    """Submit every spec at once, watch the queue until all ended; per job its Slurm times and its own result."""
    out.mkdir(parents=True, exist_ok=True)
    db = out / "service.db"
    token = _cli("tenant", "add", "lab", "--db", str(db)).strip().splitlines()[-1]
    _cli("tenant", "scope", "lab", "--slurm-user", os.environ.get("USER", "root"), "--db", str(db))
    port = _free_port()
    server = _server(db, port, actuate=mode == "enforce", log=out / "server.log")
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "EVALSTOP_TOKEN": token, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    ids: dict[str, str] = {}
    try:
        t0 = time.time()
        for spec in specs:
            script = out / f"{job_name(spec)}.sh"
            script.write_text(
                "#!/bin/bash\n"
                f"exec nice -n 5 {sys.executable} {Path(__file__).resolve()} job --spec '{json.dumps(spec.to_dict())}'"
                f" --url {url} --mode {mode} --out {out}\n"
            )
            proc = subprocess.run(
                ["sbatch", "--parsable", "--gres=gpu:1", "--cpus-per-task=1", f"--job-name={job_name(spec)}",
                 f"--output={out}/{job_name(spec)}.out", str(script)],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            ids[job_name(spec)] = proc.stdout.strip().split(";")[0]
        start: dict[str, float] = {}
        end: dict[str, float] = {}
        state: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        while len(end) < len(ids) and time.monotonic() < deadline:
            now = time.time()
            states = _states(list(ids.values()))
            for name, job in ids.items():
                s = states.get(job)
                if s in ("RUNNING", "COMPLETING") and name not in start:
                    start[name] = now
                if (s in FINISHED or s is None) and name not in end:
                    start.setdefault(name, now)
                    end[name] = now
                    state[name] = s or "GONE"
            time.sleep(0.25)
        if len(end) < len(ids):
            raise RuntimeError(f"{mode}: the queue did not drain in {timeout_s} s: ended {sorted(end)}")
    finally:
        subprocess.run(["scancel", *ids.values()], capture_output=True, check=False)
        server.terminate()
        server.wait(timeout=20)
    jobs = []
    for spec in specs:
        name = job_name(spec)
        result_path = out / f"{name}.result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        times = [json.loads(line) for line in (out / f"{name}.times.jsonl").read_text().splitlines() if line]
        jobs.append(
            {
                "job": name,
                "slurm_job_id": ids[name],
                "slurm_state": state[name],
                "start_s": start[name] - t0,
                "end_s": end[name] - t0,
                "stopped_at": result.get("stopped_at"),
                "best_step": result.get("best_step"),
                "restored": result.get("restored", False),
                "term": result.get("term_at") is not None,
                "step_times": {int(r["step"]): r["t"] - t0 for r in times},
            }
        )
    return {"mode": mode, "jobs": jobs}


def _trace_scores(out: Path, name: str) -> tuple[list[int], list[float]]:
    from platform_sim.sim.traces import load_trace

    trace = load_trace(out / f"{name}.jsonl")
    return list(trace.steps), list(trace.scores)


def _trace_examples(out: Path, name: str) -> list[tuple[float, ...] | None]:
    from platform_sim.sim.traces import load_trace

    return list(load_trace(out / f"{name}.jsonl").examples)


def queue_metrics(run: dict[str, Any], peaks: dict[str, int]) -> dict[str, Any]:
    """Mean/p95 JCT, makespan, slot-hours, slot-hours after the true peak of the hacking jobs (all in seconds)."""
    import numpy as np

    jobs = run["jobs"]
    jct = np.array([j["end_s"] for j in jobs])  # every job was submitted at 0
    after_peak = 0.0
    for j in jobs:
        if j["job"] in peaks:
            # int keys (a fresh run) or str keys (read back from results.json)
            t_peak = {int(k): v for k, v in j["step_times"].items()}.get(peaks[j["job"]])
            if t_peak is not None:
                after_peak += max(0.0, j["end_s"] - t_peak)
    return {
        "jct_mean_s": float(jct.mean()),
        "jct_p95_s": float(np.percentile(jct, 95)),
        "makespan_s": float(max(j["end_s"] for j in jobs)),
        "slot_s": float(sum(j["end_s"] - j["start_s"] for j in jobs)),
        "slot_s_after_peak": after_peak,
        "stopped": sum(1 for j in jobs if j["stopped_at"] is not None or j["slurm_state"] == "CANCELLED"),
    }


def speed_ratio(runs: dict[str, Any]) -> float:
    """Run time with EvalStop over run time without, summed over the jobs neither run stopped: how much faster the
    shared machine ran the same work in the second queue (1.0: the same load)."""
    obs = {j["job"]: j for j in runs["observe"]["jobs"]}
    both = [j for j in runs["enforce"]["jobs"] if j["stopped_at"] is None and obs[j["job"]]["stopped_at"] is None]
    enforce = sum(j["end_s"] - j["start_s"] for j in both)
    observe = sum(obs[j["job"]]["end_s"] - obs[j["job"]]["start_s"] for j in both)
    return enforce / observe if observe else float("nan")


def simulate(baseline: dict[str, Any], out: Path, slots: int, steps: int, eval_steps: int) -> dict[str, Any]:
    """The simulator's prediction: the same jobs (measured durations and gold curves of the run without EvalStop) on
    ``slots`` GPUs under FIFO, without and with EvalStop (the service's default detector), all submitted at 0."""
    import numpy as np

    from platform_sim.core import default_spec
    from platform_sim.sim.curves import ExpLossCurve, TabulatedCurve, eval_grid
    from platform_sim.sim.engine import simulate as sim_run
    from platform_sim.sim.metrics import run_metrics
    from platform_sim.sim.observe import ObservationModel
    from platform_sim.sim.policies.policies import FIFO
    from platform_sim.sim.policies.stop_policies import evalstop, with_stop
    from platform_sim.sim.traces import label_of
    from platform_sim.sim.workload import JobSpec, Workload

    n_evals = steps // eval_steps
    grid = eval_grid(n_evals)
    jobs, true_evals = [], []
    for i, j in enumerate(baseline["jobs"]):
        st, scores = _trace_scores(out, j["job"])
        curve = TabulatedCurve([s / steps for s in st], scores)
        duration_h = (j["end_s"] - j["start_s"]) / 3600.0
        loss = ExpLossCurve(1.0, 0.5, 0.3)
        jobs.append(
            JobSpec(
                i, j["job"], "rlhf", 1, 0.0, duration_h, duration_h, steps, label_of(scores) == "hacking", curve, loss
            )
        )
        true_evals.append(curve.values(grid))
    n = len(jobs)
    losses = np.array([[1.0] * n_evals for _ in range(n)])
    workload = Workload(jobs, n_evals, 0.0, np.array(true_evals), losses, np.zeros((n, n_evals)))
    examples = [_trace_examples(out, j["job"]) for j in baseline["jobs"]]

    class Recorded(ObservationModel):
        """The recorded evals, with their per-example scores: what the service's detector was sent."""

        per_example = True

        def observe_eval(self, job: Any, k: int, progress: float) -> tuple[float, tuple[float, ...] | None]:
            score, _ = super().observe_eval(job, k, progress)
            per = examples[job.index]
            return score, (tuple(per[k - 1]) if k - 1 < len(per) and per[k - 1] is not None else None)

    out_rows = {}
    for name, sched in (("observe", with_stop(FIFO(), None)), ("enforce", evalstop(FIFO(), default_spec()))):
        result = sim_run(
            workload, sched, gpus=slots, preemption_cost_h=0.0, eval_cost=0.0, observation=Recorded(workload)
        )
        m = run_metrics(result)
        out_rows[name] = {
            "slot_s": result.busy_gpu_hours * 3600,
            "jct_mean_s": m["jct_mean_h"] * 3600,
            "jct_p95_s": m["jct_p95_h"] * 3600,
            "makespan_s": m["makespan_h"] * 3600,
            # The hacking jobs' share only, as measured (a healthy job's run after its peak is a plateau's noise).
            "slot_s_after_peak": 3600 * sum(o.wasted_gpu_hours for o in result.outcomes if o.hacking),
            "stopped": m["stopped"],
            "hacking": m["hacking"],
        }
    return out_rows


def _slots() -> int:
    out = subprocess.run(["scontrol", "show", "node"], capture_output=True, text=True, check=True).stdout
    for field in out.split():
        if field.startswith("Gres=gpu:"):
            return int(field.split(":")[-1].split("(")[0])
    raise RuntimeError("the cluster's node has no gpu GRES: start it with tests/slurm.sh")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    job = sub.add_parser("job")
    job.add_argument("--spec", required=True)
    job.add_argument("--url", required=True)
    job.add_argument("--mode", choices=["observe", "enforce"], required=True)
    job.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=150, help="GRPO steps per job (default 150)")
    p.add_argument("--eval-steps", type=int, default=5, help="evaluate every this many steps (default 5)")
    p.add_argument("--jobs", type=int, default=8, help="jobs in the queue, the first N of the list (default 8)")
    p.add_argument("--out", default="slurm-queue", help="folder of the traces, logs and results.json")
    p.add_argument("--timeout-s", type=float, default=900, help="longest one queue may take (default 900)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--report-only", action="store_true", help="recompute the figures from the folder's traces of an earlier run"
    )
    args = p.parse_args(argv)
    if args.command == "job":
        return run_job(args)
    if not os.environ.get("SLURM_CONF"):
        print(
            'slurm_queue.py: no SLURM_CONF: start the cluster with `eval "$(bash tests/slurm.sh start)"`',
            file=sys.stderr,
        )
        return 2
    if args.steps % args.eval_steps:
        print("slurm_queue.py: --steps must be a multiple of --eval-steps", file=sys.stderr)
        return 2
    # A TERM ends the driver through its finally blocks: the queue's jobs are cancelled, the server stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    out = Path(args.out).resolve()
    specs = workload_specs(args.steps, args.eval_steps)[: args.jobs]
    slots = _slots()
    # The worlds once, before the clock starts: jobs then load them from the cache (well under a second).
    research = lab()
    for seed in sorted({s.seed for s in specs}):
        research.overopt.build_env(research.overopt.EnvConfig(seed=seed))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    earlier: dict[str, Any] = {}
    if args.report_only:
        earlier = json.loads((out / "results.json").read_text())
        runs, started = earlier["runs"], earlier["date"]
    else:
        runs = {mode: run_queue(mode, specs, out / mode, args.timeout_s) for mode in ("observe", "enforce")}
    from platform_sim.sim.traces import label_of

    labels, peaks = {}, {}
    for j in runs["observe"]["jobs"]:
        st, scores = _trace_scores(out / "observe", j["job"])
        labels[j["job"]] = label_of(scores)
        if labels[j["job"]] == "hacking":
            peaks[j["job"]] = st[max(range(len(scores)), key=lambda i: (scores[i], -i))]
    results = {
        "date": started,
        "command": earlier["command"] if args.report_only else "benchmarks/slurm_queue.py " + " ".join(sys.argv[1:]),
        "slots": slots,
        "steps": args.steps,
        "eval_steps": args.eval_steps,
        "labels": labels,
        "true_peak_step": peaks,
        "runs": runs,
        "measured": {mode: queue_metrics(run, peaks) for mode, run in runs.items()},
        "speed_ratio": speed_ratio(runs),
        "simulated": simulate(runs["observe"], out / "observe", slots, args.steps, args.eval_steps),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results))
    else:
        print(report(results))
    return 0


def report(r: dict[str, Any]) -> str:
    """The markdown tables of a results object."""
    lines = [f"{len(r['labels'])} jobs, {r['slots']} GPU slots, {r['steps']} GRPO steps each, {r['date']}", ""]
    lines += [f"Run time of the jobs neither queue stopped, with EvalStop / without: {r['speed_ratio']:.2f}", ""]
    lines += ["| job | label | mode | start s | end s | Slurm state | stopped at | best step restored |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode in ("observe", "enforce"):
        for j in r["runs"][mode]["jobs"]:
            restored = j["best_step"] if (mode == "enforce" and j["restored"]) else "-"
            lines.append(
                f"| {j['job']} | {r['labels'][j['job']]} | {mode} | {j['start_s']:.0f} | {j['end_s']:.0f} | "
                f"{j['slurm_state']} | {j['stopped_at'] or '-'} | {restored} |"
            )
    lines += ["", "| queue | mean JCT s | p95 JCT s | makespan s | slot-hours | slot-hours after the hacking peaks | stopped |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind in ("measured", "simulated"):
        for mode in ("observe", "enforce"):
            m = r[kind][mode]
            slot = f"{m['slot_s'] / 3600:.4f}" if "slot_s" in m else "-"
            lines.append(
                f"| {kind}, {'without' if mode == 'observe' else 'with'} EvalStop | {m['jct_mean_s']:.0f} | "
                f"{m['jct_p95_s']:.0f} | {m['makespan_s']:.0f} | {slot} | {m['slot_s_after_peak'] / 3600:.4f} | "
                f"{m['stopped']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
