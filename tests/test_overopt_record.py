"""`python -m lab traces record` (the lab's recorder): real GRPO (and PPO, in the TRL 1.12 environment) runs written as traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import main
from lab.runs import RunSpec, default_grid
from lab.trainers import ppo_available

LAB_ROOT = Path(__file__).resolve().parents[1] / "benchmarks"


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # The lab is not installed: the child finds it beside the benchmarks, as `PYTHONPATH=benchmarks python -m lab`.
    path = os.pathsep.join(p for p in (str(LAB_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-m", "lab", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_default_grid_has_hacking_and_healthy_configurations_and_ppo():
    grid = default_grid()
    names = [s.name for s in grid]
    assert len(set(names)) == len(names) >= 24
    assert sum(s.algo == "ppo" for s in grid) >= 4
    assert sum(s.reward == "gold" for s in grid) >= 4
    assert sum(s.reward == "proxy" and s.kl >= 0.2 and s.algo == "grpo" for s in grid) >= 4
    # the bow-proxy grid keeps the eval interval of its shipped traces: 30 evals per run
    assert len({s.steps // s.eval_steps for s in grid}) == 1


@pytest.mark.parametrize(
    "bad", [dict(algo="dpg"), dict(reward="oracle"), dict(steps=0), dict(algo="ppo", reward="gold"), dict(algo="dpo")]
)
def test_runspec_rejects_bad_values(bad):
    args = dict(algo="grpo", reward="proxy", kl=0.0, seed=0, steps=10, eval_steps=5) | bad
    with pytest.raises(ValueError):
        RunSpec(**args)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["traces", "record", "--seeds", "-1"], "--seeds"),
        (["traces", "record", "--only", "no-such-run", "--skip-ppo"], "--only"),
        (["traces", "record", "--env", "no-such-env"], "--env"),
        (["traces", "record", "--env", "length", "--only", "no-such-run"], "--only"),
        (["traces", "record", "--ppo-python", "/no/such/python"], "--ppo-python"),
    ],
)
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
    proc = _cli(
        "traces",
        "record",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--grpo-steps",
        "20",
        "--skip-ppo",
        "--only",
        "bow-proxy-grpo-proxy-kl0-s0",
        "--cache-dir",
        str(cache),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert [r["name"] for r in summary["runs"]] == ["bow-proxy-grpo-proxy-kl0-s0"]
    lines = [json.loads(x) for x in (out / "bow-proxy-grpo-proxy-kl0-s0.jsonl").read_text().splitlines()]
    header, evals = lines[0], [x for x in lines if x["kind"] == "eval"]
    assert [e["step"] for e in evals] in ([10, 20], [0, 10, 20])  # the callback may score step 0 too
    assert header["config"]["run"]["algo"] == "grpo" and header["job_type"] == "rlhf"
    assert header["environment"] == "bow-proxy" and header["split"] == "tune"
    assert all({"eval_score", "eval_scores", "proxy_reward", "wall_s"} <= set(e) for e in evals)
    assert all("train_loss" in e for e in evals if e["step"] > 0)  # no loss before the first step
    assert len(evals[0]["eval_scores"]) == 48
    assert lines[-1]["kind"] == "end" and lines[-1]["reason"] == "completed"  # observe mode never stops
    # a second call keeps the complete trace instead of recording it again
    again = _cli(
        "traces",
        "record",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--grpo-steps",
        "20",
        "--skip-ppo",
        "--only",
        "bow-proxy-grpo-proxy-kl0-s0",
        "--cache-dir",
        str(cache),
        "--json",
    )
    assert json.loads(again.stdout)["runs"][0].get("skipped") is True


@pytest.mark.ppo
@pytest.mark.skipif(not ppo_available(), reason="needs trl==1.12.0 (PPOTrainer)")
def test_record_writes_a_ppo_trace(tmp_path):
    import torch

    from lab.record import record_run

    torch.set_num_threads(1)
    path = tmp_path / "ppo.jsonl"
    from evalstop_callbacks.demo.overopt import EnvConfig

    small = EnvConfig(seed=0, pretrain_steps=60, proxy_samples=120, proxy_check_samples=60)
    record_run(
        RunSpec("ppo", "proxy", 0.0, 0, steps=8, eval_steps=4),
        path,
        cache_dir=str(tmp_path / "cache"),
        env_config=small,
    )
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    evals = [e for e in lines if e["kind"] == "eval"]
    assert [e["step"] for e in evals] in ([4, 8], [0, 4, 8])
    assert lines[0]["trainer"].lower().startswith("ppo") and lines[0]["environment"] == "bow-proxy"
    assert all(e.get("proxy_reward") is not None for e in evals)
    # PPO's own log names, taken by trace_extras (none before the first step)
    assert all("train_loss" in e and "kl" in e for e in evals if e["step"] > 0)
