"""Helpers for the watch tests: the shipped real traces, what the embedded core decides on them, and commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from evalstop_callbacks.client import EmbeddedClient
from platform_sim.core import Report, default_spec

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "tests" / "_watch_child.py"
WATCH = [sys.executable, "-m", "evalstop_callbacks.watch"]

HACKING = "bow-proxy-grpo-proxy-kl0-s1"  # the embedded default detector stops it (means alone or per example)
HEALTHY = "bow-proxy-grpo-gold-kl0-s0"  # it never stops this one
PER_EXAMPLE = "dpo-noisy-dpo-gpt2-beta0.1-lr0.001-n64-flip0-s1"  # stopped with per-example scores, not on means


def trace_path(name: str) -> Path:
    """A shipped real trace, wherever the corpus lives (``data/corpora/real/`` after the move, ``data/traces/``)."""
    for folder in ("corpora/real", "traces"):
        path = REPO / "platform_sim" / "data" / folder / f"{name}.jsonl"
        if path.exists():
            return path
    raise FileNotFoundError(f"no shipped real trace {name!r}")


def evals(name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in trace_path(name).read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("kind") == "eval"]


def embedded_stop(name: str, per_example: bool = False, spec: dict[str, Any] | None = None) -> tuple[int | None, int]:
    """(stop step or None, best step) of the embedded core with the default spec on the trace's curve."""
    client = EmbeddedClient()
    job = client.register("rlhf", detector=spec or default_spec(), job_id="ref")
    decision = None
    for ev in evals(name):
        scores = tuple(ev["eval_scores"]) if per_example else None
        decision = client.report(Report(job, "rlhf", ev["step"], ev["eval_score"], scores))
        if decision.should_stop:
            return ev["step"], decision.best_step
    assert decision is not None and decision.best_step is not None
    return None, decision.best_step


def env() -> dict[str, str]:
    """The environment for the child processes: this checkout first on the path, one thread."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def child(name: str, log: Path, fmt: str, metric: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(trace_path(name)), str(log), "--format", fmt, "--metric", metric, *extra],
        env=env(),
        stderr=subprocess.PIPE,
    )


def watch(*args: str, timeout: float = 60, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m evalstop_callbacks.watch ARGS`` to its end (in ``environ``, default :func:`env`)."""
    return subprocess.run([*WATCH, *args], env=environ or env(), capture_output=True, text=True, timeout=timeout)


def last_json(stdout: str) -> dict[str, Any]:
    """The one-line result the watch prints last on stdout."""
    return json.loads(stdout.strip().splitlines()[-1])
