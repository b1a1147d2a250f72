"""`evalstop traces record`: real GRPO (and PPO, in the TRL 1.12 environment) runs written as traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalstop_callbacks.research.cli import main
from evalstop_callbacks.research.record import RunSpec, default_grid, ppo_available
from platform_sim.sim.traces import read_trace


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "evalstop_callbacks.research.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_default_grid_has_hacking_and_healthy_configurations_and_ppo():
    grid = default_grid()
    names = [s.name for s in grid]
    assert len(set(names)) == len(names) >= 24
    assert sum(s.algo == "ppo" for s in grid) >= 4
    assert sum(s.reward == "gold" for s in grid) >= 4
    assert sum(s.reward == "proxy" and s.kl >= 0.2 and s.algo == "grpo" for s in grid) >= 4
    # every run has the same number of evals, so replay can put them on one platform grid
    assert len({s.steps // s.eval_steps for s in grid}) == 1


@pytest.mark.parametrize("bad", [dict(algo="dpo"), dict(reward="oracle"), dict(steps=0), dict(algo="ppo", reward="gold")])
def test_runspec_rejects_bad_values(bad):
    args = dict(algo="grpo", reward="proxy", kl=0.0, seed=0, steps=10, eval_steps=5) | bad
    with pytest.raises(ValueError):
        RunSpec(**args)


@pytest.mark.parametrize("argv, flag", [
    (["traces", "record", "--seeds", "-1"], "--seeds"),
    (["traces", "record", "--only", "no-such-run", "--skip-ppo"], "--only"),
    (["traces", "record", "--ppo-python", "/no/such/python"], "--ppo-python"),
])
def test_record_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_record_writes_a_grpo_trace_with_gold_proxy_loss_and_time(tmp_path, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "evalstop-env-cache"  # shared with test_demo_cli: built once
    out = tmp_path / "traces"
    proc = _cli("traces", "record", "--out", str(out), "--seeds", "1", "--grpo-steps", "20", "--skip-ppo",
                "--only", "grpo-proxy-kl0-s0", "--cache-dir", str(cache), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert [r["name"] for r in summary["runs"]] == ["grpo-proxy-kl0-s0"]
    trace = read_trace(out / "grpo-proxy-kl0-s0.jsonl")
    assert trace.steps == (10, 20)
    assert trace.header["config"]["run"]["algo"] == "grpo" and trace.header["job_type"] == "rlhf"
    lines = [json.loads(x) for x in (out / "grpo-proxy-kl0-s0.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x["kind"] == "eval"]
    assert all({"eval_score", "eval_scores", "proxy_reward", "train_loss", "wall_s"} <= set(e) for e in evals)
    assert len(evals[0]["eval_scores"]) == 48
    assert lines[-1]["kind"] == "end" and lines[-1]["reason"] == "completed"  # observe mode never stops
    # a second call keeps the complete trace instead of recording it again
    again = _cli("traces", "record", "--out", str(out), "--seeds", "1", "--grpo-steps", "20", "--skip-ppo",
                 "--only", "grpo-proxy-kl0-s0", "--cache-dir", str(cache), "--json")
    assert json.loads(again.stdout)["runs"][0].get("skipped") is True


@pytest.mark.ppo
@pytest.mark.skipif(not ppo_available(), reason="needs trl==1.12.0 (PPOTrainer)")
def test_record_writes_a_ppo_trace(tmp_path):
    from evalstop_callbacks.research.record import record_run

    import torch

    torch.set_num_threads(1)
    path = tmp_path / "ppo.jsonl"
    from evalstop_callbacks.research.overopt import EnvConfig

    small = EnvConfig(seed=0, pretrain_steps=60, proxy_samples=120, proxy_check_samples=60)
    record_run(RunSpec("ppo", "proxy", 0.0, 0, steps=8, eval_steps=4), path, cache_dir=str(tmp_path / "cache"),
               env_config=small)
    trace = read_trace(path)
    assert trace.steps == (4, 8)
    assert trace.header["trainer"].lower().startswith("ppo")
    assert all(p is not None for p in trace.proxy)
    evals = [e for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == "eval"]
    assert all("train_loss" in e and "kl" in e for e in evals)  # PPO's own log names, taken by trace_extras
