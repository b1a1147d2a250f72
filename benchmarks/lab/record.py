"""Recording real training runs of the overoptimization environments as JSONL traces (``python -m lab traces record``).

Each run is one :class:`~lab.runs.RunSpec` of one environment
(:mod:`lab.envs`): GRPO or RLOO (TRL >= 1.13), PPO (TRL 1.12's ``trl.experimental.ppo``, ``bow-proxy`` only), DPO or SFT, of a GPT-2 or Llama-style policy,
rewarded by the environment's proxy or by gold itself, with a KL coefficient (DPO: beta), for a seed. It trains to
its full length with :class:`~evalstop_callbacks.EvalStopCallback` in ``observe`` mode (never stops), which writes
the trace: held-out gold (``eval_score``, per-example ``eval_scores``), the held-out proxy of the same completions
(``proxy_reward``), the trainer's loss and KL, and wall time. The header gets the environment, its split and the
run's spec.

Runs execute one at a time, each in its own Python process (:func:`run_in_subprocess`), because PPO needs the TRL
1.12 environment while GRPO runs on the newest TRL, and because a fresh process per run keeps runs independent.
``python -m lab.record --spec JSON --trace PATH`` runs one spec in the current interpreter.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalstop_callbacks.demo.overopt import EnvConfig, OveroptEnv, build_env

from .envs import Environment, get
from .run_worlds import World, world_of
from .runs import RunSpec
from .trainers import ppo_available


@dataclass
class RunResult:
    """What a run left behind (the trace is the real output)."""

    name: str
    trace: str
    wall_s: float
    evals: int
    would_stop_at: int | None = None


def record_run(
    spec: RunSpec, trace_path: str | os.PathLike, cache_dir: str | None = None, env_config: Any = None
) -> RunResult:
    """Train ``spec`` to its full length in observe mode in this process, writing the trace to ``trace_path``.

    Args:
        spec: The run.
        trace_path: Where the JSONL trace goes (replaced if it exists).
        cache_dir: Environment cache (default: :func:`~evalstop_callbacks.demo.overopt.default_cache_dir`).
        env_config: An :class:`~evalstop_callbacks.demo.overopt.EnvConfig` to use instead of the default one of
            ``spec.seed`` (smaller environments for tests).
    """
    # Loaded here, not at import: transformers takes seconds, and only a recording process needs it (not the CLI).
    import torch

    from evalstop_callbacks import EvalStopCallback

    torch.set_num_threads(int(os.environ.get("EVALSTOP_THREADS", "1")))
    if spec.algo == "ppo" and not ppo_available():
        raise RuntimeError(
            f"{spec.name}: this Python has no trl.experimental.ppo.PPOTrainer (needs trl==1.12.0); pass --ppo-python"
        )
    registered = get(spec.env)
    env = build_env(env_config or EnvConfig(seed=spec.seed), cache_dir=cache_dir)
    world = world_of(spec, env, cache_dir)
    evaluator: Any = world.evaluator  # an Evaluator with trace_extras (see run_worlds.World)
    # No step-0 baseline: the shipped corpus starts at the first regular eval, and a re-recording must match it.
    cb = EvalStopCallback(
        evaluator,
        eval_steps=spec.eval_steps,
        job_id=spec.name,
        job_type=registered.job_type,
        eval_on_start=False,
        mode="observe",
        trace_path=str(trace_path),
        trace_extras=evaluator.trace_extras,
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalstop-rec-") as out:
        trainer = world.trainer(spec, [cb], out)
        trainer.train()
    _annotate_header(Path(trace_path), spec, env, registered, world)
    return RunResult(spec.name, str(trace_path), time.perf_counter() - t0, len(cb.history), cb.would_stop_at)


#: Significant digits kept of the floats of a recorded trace (the corpus ships in the repository: small on disk).
TRACE_DIGITS = 4


def _round(value: Any, digits: int = TRACE_DIGITS) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [_round(v, digits) for v in value]
    return value


def _annotate_header(path: Path, spec: RunSpec, env: OveroptEnv, registered: Environment, world: World) -> None:
    # The callback writes a generic header; the recording adds what re-creates the run (spec, environment, versions),
    # and rounds the eval lines' floats (4 significant digits: far below the evaluation's own sampling noise).
    import transformers
    import trl

    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header.setdefault("config", {})
    header["config"].update(
        {
            "run": spec.to_dict(),
            "env": env.config.key(),
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            **world.header_config,
        }
    )
    header["model"] = world.model_name
    header["environment"] = registered.name
    header["split"] = registered.split
    out = [json.dumps(header)]
    for raw in lines[1:]:
        obj = json.loads(raw)
        if obj.get("kind") == "eval":
            obj = {k: (v if k == "step" else _round(v)) for k, v in obj.items()}
        out.append(json.dumps(obj))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def run_in_subprocess(
    spec: RunSpec,
    trace_path: str | os.PathLike,
    python: str | None = None,
    cache_dir: str | None = None,
    timeout: float | None = 1800,
) -> RunResult:
    """Run :func:`record_run` in a fresh interpreter (``python``, default this one) and return its result."""
    cmd = [
        python or sys.executable,
        "-m",
        "lab.record",
        "--spec",
        json.dumps(spec.to_dict()),
        "--trace",
        str(trace_path),
    ]
    if cache_dir:
        cmd += ["--cache-dir", str(cache_dir)]
    env = dict(os.environ)
    # The child (maybe another interpreter: --ppo-python) imports this package from the folder that holds it.
    lab_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (lab_root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"run {spec.name} failed (exit {proc.returncode}):\n{tail}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    return RunResult(**json.loads(last))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.record",
        description="Record one run of the overoptimization environment (internal).",
    )
    parser.add_argument("--spec", required=True, help="RunSpec as JSON")
    parser.add_argument("--trace", required=True, help="trace file to write")
    parser.add_argument("--cache-dir", default=None)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spec = RunSpec(**json.loads(ns.spec))
    result = record_run(spec, ns.trace, ns.cache_dir)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
