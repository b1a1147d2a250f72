"""evalstop-sim: one run, the paper command, and bad input (one line naming the flag, exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from platform_sim.sim.cli import main


@pytest.mark.parametrize("argv, flag", [
    (["run", "--base", "lifo"], "--base"),
    (["run", "--stop", "magic"], "--stop"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--sigma", "-0.1"], "--sigma"),
    (["run", "--hack-rate", "1.5"], "--hack-rate"),
    (["run", "--hack-rate", "-0.5"], "--hack-rate"),
    (["run", "--k", "0"], "--k"),
    (["run", "--min-delta", "-1"], "--min-delta"),
    (["run", "--detector", "nope"], "--detector"),
    (["run", "--detector-param", "window"], "--detector-param"),
    (["run", "--detector-param", "window=3"], "--detector-param"),
    (["paper", "--seeds", "0"], "--seeds"),
    (["paper", "--backend", "slurm"], "--backend"),
    (["paper", "--workers", "0"], "--workers"),
])
def test_bad_input_one_line_naming_the_flag_exit_2(argv, flag, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and flag in err, err


def test_console_script_exit_code():
    proc = subprocess.run([sys.executable, "-m", "platform_sim.sim.cli", "run", "--k", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--k" in proc.stderr and proc.stderr.count("\n") == 1


def test_run_json(capsys):
    assert main(["run", "--base", "fifo", "--stop", "evalstop", "--seed", "3", "--jobs", "60", "--k", "3",
                 "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["jobs"] == 60 and m["scheduler"] == "fifo+evalstop"
    assert m["config"]["detector"] == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    for key in ("precision", "recall", "fpr", "fpr_healthy_rlhf", "jct_mean_h", "wasted_gpu_h", "regret"):
        assert key in m


def test_run_table_and_generic_detector_params(capsys):
    assert main(["run", "--jobs", "30", "--detector", "k-decline", "--detector-param", "min_delta=0.01"]) == 0
    out = capsys.readouterr().out
    assert "srtf-est + evalstop" in out and "precision" in out


def test_paper_json_and_files(tmp_path, capsys):
    out_dir = tmp_path / "paper"
    assert main(["paper", "--seeds", "2", "--jobs", "40", "--out", str(out_dir), "--json", "--backend", "serial",
                 "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    fields = {"base", "stop", "precision", "recall", "fpr", "fpr_healthy_rlhf", "jct_mean_h", "jct_gain_pct",
              "wasted_gpu_h", "wasted_reduction_pct", "regret", "delay_evals"}
    assert [r["stop"] for r in res["main"]] == ["none", "evalstop", "stop-at-p", "loss-plateau", "oracle"]
    for r in res["main"]:
        assert fields <= set(r)
    assert {(r["base"], r["stop"]) for r in res["composability"]} == {
        (b, s) for b in ("fifo", "sjf-est", "srtf-est", "loss-aware") for s in ("none", "evalstop")}
    assert [r["sigma"] for r in res["noise"]] == [0.01, 0.02, 0.03, 0.05, 0.08, 0.12]
    assert [r["hack_rate"] for r in res["hack_rate"]] == [0.2, 0.4, 0.6, 0.8]
    assert [r["k"] for r in res["k"]] == [1, 2, 3, 4, 5]
    names = {p.name for p in out_dir.iterdir()}
    assert {"report.md", "results.json", "main.png", "composability.png", "noise_sweep.png",
            "hack_rate_sweep.png", "k_sweep.png"} <= names
    assert "## Main table" in (out_dir / "report.md").read_text()
    assert json.loads((out_dir / "results.json").read_text())["main"][1]["stop"] == "evalstop"


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["paper", "--help"])
    assert exc.value.code == 0 and "--seeds" in capsys.readouterr().out
