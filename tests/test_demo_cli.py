"""`evalstop demo`: flags, and the demo itself on a real tiny GRPO run (short here; the full one is slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_callbacks.cli import main
from platform_sim.sim.traces import load_trace


@pytest.fixture(scope="session")
def env_cache(tmp_path_factory) -> Path:
    # One environment cache for the session's tests (test_overopt_record uses the same folder): built once.
    return tmp_path_factory.getbasetemp() / "evalstop-env-cache"


def _demo(tmp_path: Path, cache: Path, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, EVALSTOP_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "evalstop_callbacks.cli", "demo", "--out", str(tmp_path / "out"), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def test_demo_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--out" in out and "--json" in out and "--min-delta" in out


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--k", "0"], "--k"),
        (["--min-delta", "-0.5"], "--min-delta"),
        (["--steps", "x"], "--steps"),
        (["--traces", "/no/such/dir"], "--traces"),
        (["--detector", "no-such-rule"], "--detector"),
        (["--detector", "shape", "--detector-param", "threshold=2"], "--detector"),
        (["--detector-param", "k=2"], "--detector-param"),
        (["--detector", "shape", "--detector-param", "nokey"], "--detector-param"),
    ],
)
def test_demo_bad_flags_exit_2(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["demo", *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_short_demo_writes_plot_trace_and_summary_with_the_chosen_detector(tmp_path, env_cache):
    # One short run pins both the demo's outputs and that a --detector flag reaches the run. That a run without the
    # flag gets the project's default is pinned where the demo's flags are settled, without training:
    # tests/test_default_everywhere.py::test_the_demo_runs_the_default.
    proc = _demo(
        tmp_path,
        env_cache,
        "--steps",
        "20",
        "--eval-steps",
        "10",
        "--no-sim",
        "--json",
        "--detector",
        "shape",
        "--detector-param",
        "threshold=0.9",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert {"stop_step", "best_step", "best_gold", "restored_gold", "proxy_at_stop"} <= set(s)
    assert s["restored_gold"] == s["best_gold"] and s["restored_equals_best"]
    assert [e["step"] for e in s["evals"]] == [10, 20]  # the printed rows; the trace also holds the step-0 baseline
    out = tmp_path / "out"
    assert (out / "proxy_vs_gold.png").stat().st_size > 1000
    trace = load_trace(out / "trace.jsonl")
    assert trace.steps == (0, 10, 20) and trace.scores[trace.steps.index(s["best_step"])] == s["best_gold"]
    assert json.loads((out / "summary.json").read_text())["best_step"] == s["best_step"]
    # The chosen detector, in the summary and in the trace's header.
    assert s["detector"]["name"] == "shape" and s["detector"]["params"]["threshold"] == 0.9
    assert trace.header["config"]["detector"] == s["detector"]
    assert "falling back" not in proc.stderr  # the demo's evaluator reports per-example scores


@pytest.mark.slow
def test_full_demo_stops_the_hacking_job_and_restores_the_best(tmp_path, env_cache):
    proc = _demo(tmp_path, env_cache, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["stop_step"] is not None and s["best_step"] < s["stop_step"] < s["planned_steps"]
    assert s["restored_gold"] == s["best_gold"]
    at_best = next(e for e in s["evals"] if e["step"] == s["best_step"])
    assert s["proxy_at_stop"] > at_best["proxy"]  # the proxy kept rising while gold fell
    assert s["platform"]["trace_summary"]["hacking"] >= 8
