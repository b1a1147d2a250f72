"""`evalstop-sim replay`: traces as platform jobs, labels as ground truth, per-trace rows, detector flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from platform_sim.cli import main as sim_main
from platform_sim.sim.traces import load_traces
from platform_sim.sim.workload import WorkloadConfig
from platform_sim.studies.replay import build_replay_workload, trace_curves
from platform_sim.studies.trace_detection import corpus_scale, trace_detection

N = 10  # evals per trace


def _write(path: Path, scores) -> None:
    lines = [
        {
            "kind": "header",
            "format": "evalstop-trace/1",
            "job_id": path.stem,
            "job_type": "rlhf",
            "planned_steps": 10 * N,
        }
    ]
    lines += [{"kind": "eval", "step": 10 * (i + 1), "eval_score": float(s)} for i, s in enumerate(scores)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


@pytest.fixture()
def corpus(tmp_path):
    """Three hacking curves (peak, then collapse) and three healthy ones (rise, then a noisy plateau), gold units."""
    rng = np.random.default_rng(0)
    p = np.arange(1, N + 1) / N
    for i, peak in enumerate((0.4, 0.5, 0.6)):
        curve = np.where(p <= peak, 4 * p / peak, 4 - 12 * (p - peak))
        _write(tmp_path / f"hack{i}.jsonl", curve)
    for i in range(3):
        curve = 4 * (1 - np.exp(-p / 0.2)) + rng.normal(0, 0.05, N)
        _write(tmp_path / f"ok{i}.jsonl", curve)
    return tmp_path


def test_rlhf_jobs_get_trace_curves_and_labels(corpus):
    traces = load_traces(corpus)
    curves = trace_curves(traces, corpus_scale(traces))
    wl = build_replay_workload(WorkloadConfig(n_jobs=60, n_evals=N), curves, seed=1)
    by_scores = {tuple(np.round(c.scores, 9)): c for c in curves}
    rlhf = [j for j in wl.jobs if j.job_type == "rlhf"]
    assert rlhf and any(j.job_type != "rlhf" for j in wl.jobs)  # mixed with synthetic LoRA/DPO jobs
    for j in rlhf:
        c = by_scores[tuple(np.round(wl.true_evals[j.index], 9))]  # the exact recorded curve on the grid
        assert j.hacking == c.hacking
        assert np.all(wl.noise[j.index] == 0)  # real eval noise is already in the curve
    assert {c.name for c in curves} == {by_scores[tuple(np.round(wl.true_evals[j.index], 9))].name for j in rlhf}
    assert wl.true_evals.min() >= 0 - 1e-12 and wl.true_evals[[j.index for j in rlhf]].max() <= 1 + 1e-12


def test_trace_detection_row(corpus):
    traces = load_traces(corpus)
    scale = corpus_scale(traces)
    hack = next(t for t in traces if t.name == "hack1")
    row = trace_detection(hack, {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}, scale)
    assert row["label"] == "hacking" and row["stopped"]
    assert row["peak_step"] == 50 and row["best_step"] == 50 and row["stop_step"] == 70
    assert row["delay_evals"] == 2 and row["regret_pct"] == 0.0
    never = trace_detection(hack, {"name": "k-decline", "params": {"k": 2, "min_delta": 5.0}}, scale)
    assert not never["stopped"] and never["stop_step"] is None and never["best_step"] == 100
    assert never["regret_pct"] == pytest.approx(100 * (4 - hack.scores[-1]) / 4)


def test_replay_json_tables_and_trace_rows(corpus, capsys):
    code = sim_main(
        ["replay", "--traces", str(corpus), "--seeds", "2", "--backend", "serial", "--json", "--min-delta", "0.02"]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["stop"] for r in res["main"]] == ["none", "evalstop", "stop-at-p", "loss-plateau", "oracle"]
    assert {(r["base"], r["stop"]) for r in res["composability"]} == {
        (b, s) for b in ("fifo", "sjf-est", "srtf-est", "loss-aware") for s in ("none", "evalstop")
    }
    rows = {r["trace"]: r for r in res["traces"]}
    assert set(rows) == {"hack0", "hack1", "hack2", "ok0", "ok1", "ok2"}
    for r in rows.values():
        assert {"trace", "label", "stopped", "stop_step", "best_step", "delay_evals", "regret_pct"} <= set(r)
        assert r["label"] == ("hacking" if r["trace"].startswith("hack") else "healthy")
    assert all(rows[f"hack{i}"]["stopped"] for i in range(3))
    assert not any(rows[f"ok{i}"]["stopped"] for i in range(3))
    assert res["config"]["detector"]["params"] == {"k": 2, "min_delta": 0.02}
    assert res["config"]["min_delta_native"] == pytest.approx(0.02 * corpus_scale(load_traces(corpus)).span)
    ev = next(r for r in res["main"] if r["stop"] == "evalstop")
    assert ev["recall"] == 1.0 and ev["jct_gain_pct"] > 0
    oracle = next(r for r in res["main"] if r["stop"] == "oracle")
    assert oracle["regret"] <= ev["regret"] + 1e-12


def test_replay_k_flag_changes_detection(corpus, capsys):
    assert (
        sim_main(["replay", "--traces", str(corpus), "--seeds", "1", "--backend", "serial", "--json", "--k", "1"]) == 0
    )
    k1 = json.loads(capsys.readouterr().out)
    assert (
        sim_main(["replay", "--traces", str(corpus), "--seeds", "1", "--backend", "serial", "--json", "--k", "5"]) == 0
    )
    k5 = json.loads(capsys.readouterr().out)
    d1 = {r["trace"]: r["stop_step"] for r in k1["traces"]}
    d5 = {r["trace"]: r["stop_step"] for r in k5["traces"]}
    assert all(d5[t] is None or (d1[t] is not None and d5[t] > d1[t]) for t in d1)
    assert sum(r["stopped"] for r in k1["traces"]) > sum(r["stopped"] for r in k5["traces"])


@pytest.mark.parametrize(
    "argv, flag", [(["--k", "0"], "--k"), (["--min-delta", "-1"], "--min-delta"), (["--seeds", "0"], "--seeds")]
)
def test_replay_bad_flags(corpus, capsys, argv, flag):
    assert sim_main(["replay", "--traces", str(corpus), "--backend", "serial", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_trace_min_delta_is_converted_to_the_platform_scale(corpus, capsys):
    assert (
        sim_main(
            [
                "replay",
                "--traces",
                str(corpus),
                "--seeds",
                "1",
                "--backend",
                "serial",
                "--json",
                "--trace-min-delta",
                "0.5",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    span = corpus_scale(load_traces(corpus)).span
    assert res["config"]["detector"]["params"]["min_delta"] == pytest.approx(0.5 / span)
    assert res["config"]["min_delta_native"] == pytest.approx(0.5)
    assert sim_main(["replay", "--traces", str(corpus), "--backend", "serial", "--trace-min-delta", "-1"]) == 2
    assert "--trace-min-delta" in capsys.readouterr().err


def test_warmup_keeps_an_early_dip_from_stopping_a_run(tmp_path):
    # A real shape (docs/results/real-trace-replay.md): gold dips before the policy improves, then rises, then is overoptimized.
    _write(tmp_path / "dip.jsonl", [1.0, 0.5, 0.0, 0.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0])
    traces = load_traces(tmp_path)
    scale = corpus_scale(traces)
    bare = trace_detection(traces[0], {"name": "k-decline", "params": {"k": 2}}, scale)
    assert bare["stop_step"] == 30 and bare["best_step"] == 10 and bare["delay_evals"] < 0
    warm = trace_detection(traces[0], {"name": "k-decline", "params": {"k": 2, "warmup": 3}}, scale)
    assert warm["stop_step"] == 90 and warm["best_step"] == 70 and warm["delay_evals"] == 2
    assert warm["regret_pct"] == 0.0


def test_warmup_detector_spec_and_state_round_trip():
    from platform_sim.core import detector_from_spec

    det = detector_from_spec({"name": "k-decline", "params": {"k": 2, "warmup": 2}})
    assert det.spec() == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0, "warmup": 2}}
    assert [det.update(i, s) for i, s in enumerate([3.0, 2.0, 1.0])] == [False, False, False]
    assert det.declines == 1  # the 2nd eval's drop fell in the warm-up; the 3rd's counts
    clone = detector_from_spec(det.spec())
    clone.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert clone.update(3, 0.5) is True
    assert detector_from_spec("k-decline").spec()["params"] == {"k": 2, "min_delta": 0.0}  # the paper's rule unchanged
    with pytest.raises(ValueError, match="warmup"):
        detector_from_spec({"name": "k-decline", "params": {"warmup": -1}})


def test_detectors_that_read_per_example_scores_get_the_recorded_ones(caplog):
    # The shipped corpus records 48 per-example gold scores per eval: `replay` and the per-trace rows must hand them
    # to a detector that reads them (no "falling back to the mean" for trace jobs), and the per-trace row must
    # equal the detector study's, which feeds the same recorded scores.
    import logging

    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.studies.detector_study import trace_rows
    from platform_sim.studies.replay import replay

    traces = load_traces(corpus_dir("real"))[:4]
    scale = corpus_scale(traces)
    spec = {"name": "shape", "params": {"threshold": 0.8}}
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        rows = [trace_detection(t, spec, scale) for t in traces]
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]
    study = trace_rows(traces, scale, [("shape", spec)])
    assert [(r["stopped"], r["stop_step"], r["best_step"]) for r in rows] == [
        (r["stopped"], r["stop_step"], r["best_step"]) for r in study
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        out = replay(traces, WorkloadConfig(n_jobs=30), spec, seeds=1)
    assert out["config"]["detector"]["name"] == "shape"
    # Only synthetic jobs are generated per-example scores; nobody falls back to the mean.
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]


@pytest.fixture()
def mixed(tmp_path):
    """GRPO-like and PPO-like traces of different lengths, eval intervals and planned steps, two environments with
    different units, some with per-example scores and some without, in one folder."""
    from _trace_factory import hacking_curve, healthy_curve, write

    d = tmp_path / "mixed"
    write(
        d / "grpo-hack.jsonl",
        hacking_curve(30),
        every=10,
        examples=16,
        noise=0.03,
        trainer="GRPOTrainer",
        model="gpt2-2x64",
        environment="bow",
        split="tune",
    )
    write(
        d / "grpo-ok.jsonl",
        healthy_curve(30),
        every=10,
        examples=16,
        noise=0.03,
        trainer="GRPOTrainer",
        environment="bow",
        split="tune",
    )
    write(
        d / "ppo-hack.jsonl",
        0.1 * hacking_curve(12, peak_at=0.4) + 0.5,
        every=4,
        planned=60,
        trainer="PPOTrainer",
        model="llama-2x64",
        environment="format",
        split="test",
    )
    write(
        d / "ppo-ok.jsonl",
        0.1 * healthy_curve(12) + 0.5,
        every=4,
        trainer="PPOTrainer",
        environment="format",
        split="test",
    )
    write(
        d / "dpo-ok.jsonl",
        0.1 * healthy_curve(45) + 0.5,
        every=2,
        examples=8,
        noise=0.002,
        trainer="DPOTrainer",
        environment="format",
        split="test",
    )
    return d


def test_a_folder_mixing_lengths_cadences_trainers_and_units_replays(mixed, capsys):
    assert (
        sim_main(["replay", "--traces", str(mixed), "--seeds", "1", "--backend", "serial", "--json", "--jobs", "40"])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    cfg = res["config"]
    assert cfg["eval_counts"] == [12, 30, 45] and cfg["grid_evals"] == 45
    assert set(cfg["scales"]) == {"bow", "format"}  # each environment mapped onto 0-1 on its own
    assert cfg["scales"]["format"]["hi"] < 1 < cfg["scales"]["bow"]["hi"]
    rows = {r["trace"]: r for r in res["traces"]}
    for r in rows.values():
        assert {"trace", "environment", "split", "label", "stopped", "stop_step", "delay_evals", "regret"} <= set(r)
    assert (rows["ppo-hack"]["environment"], rows["ppo-hack"]["split"]) == ("format", "test")
    assert rows["grpo-hack"]["label"] == rows["ppo-hack"]["label"] == "hacking"
    assert rows["ppo-hack"]["stopped"] and rows["ppo-hack"]["stop_step"] % 4 == 0
    assert rows["ppo-hack"]["regret"] == pytest.approx(0.0)
    ev = next(r for r in res["main"] if r["stop"] == "evalstop")
    assert ev["recall"] == 1.0


def test_each_trace_lands_on_the_shared_grid_at_its_own_progress(mixed):
    from platform_sim.sim.curves import eval_grid
    from platform_sim.studies.replay import grid_evals
    from platform_sim.studies.trace_detection import trace_scales

    traces = load_traces(mixed)
    scales = trace_scales(traces)
    assert scales["grpo-hack"] == scales["grpo-ok"] != scales["ppo-hack"] == scales["dpo-ok"]
    curves = {c.name: c for c in trace_curves(traces, scales)}
    ppo = next(t for t in traces if t.name == "ppo-hack")
    assert ppo.progress()[-1] == pytest.approx(48 / 60)  # planned 60 steps, recorded to step 48
    grid = eval_grid(grid_evals(traces))
    means, per = curves["grpo-hack"].on_grid(grid)
    t = next(t for t in traces if t.name == "grpo-hack")
    s = scales[t.name]
    # the grid point at a recorded eval's progress shows that eval, means and examples alike
    k = int(np.argmin(abs(grid - t.progress()[9])))
    if abs(grid[k] - t.progress()[9]) < 1e-12:
        assert means[k] == pytest.approx(s(t.scores[9]))
        assert per[k] == pytest.approx([s(v) for v in t.examples[9]])
    assert np.mean(per[5]) == pytest.approx(means[5])  # interpolated examples keep the mean
    wl = build_replay_workload(WorkloadConfig(n_jobs=40, n_evals=len(grid)), tuple(curves.values()), seed=0)
    assert wl.true_evals.shape[1] == 45


def test_a_broken_trace_in_a_mixed_folder_is_rejected_with_file_and_line(mixed, capsys):
    p = mixed / "ppo-ok.jsonl"
    lines = p.read_text().splitlines()
    lines[3] = lines[3].replace('"eval_score": ', '"eval_score": "x", "was": ')
    p.write_text("\n".join(lines) + "\n")
    assert sim_main(["replay", "--traces", str(mixed), "--seeds", "1", "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{p}:4:" in err and len(err.splitlines()) == 1


def test_trace_min_delta_needs_one_shared_scale(mixed, capsys):
    assert (
        sim_main(["replay", "--traces", str(mixed), "--seeds", "1", "--backend", "serial", "--trace-min-delta", "0.1"])
        == 2
    )
    assert "--trace-min-delta" in capsys.readouterr().err


def test_ambiguous_traces_are_listed_not_dealt(tmp_path, capsys):
    _write(tmp_path / "hack.jsonl", [0.0, 1, 2, 3, 4, 3, 2, 1, 0, -1])
    base = [0.0, 1, 2, 3, 4, 4, 4, 4, 4, 4]
    _write(tmp_path / "ok.jsonl", base)
    _write(tmp_path / "amb.jsonl", base[:-3] + [3.3, 3.3, 3.3])  # 17% of the gain given back, noise-free
    traces = load_traces(tmp_path)
    assert {t.name: t.label for t in traces} == {"hack": "hacking", "ok": "healthy", "amb": "ambiguous"}
    assert {c.name for c in trace_curves(traces, corpus_scale(traces))} == {"hack", "ok"}
    assert (
        sim_main(["replay", "--traces", str(tmp_path), "--seeds", "1", "--backend", "serial", "--json", "--jobs", "30"])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["config"]["ambiguous_traces"] == ["amb"] and res["trace_summary"]["ambiguous_traces"] == ["amb"]


def test_the_detector_study_takes_a_mixed_folder(mixed, capsys):
    assert (
        sim_main(
            [
                "detectors",
                "--parts",
                "real",
                "--traces",
                str(mixed),
                "--seeds",
                "1",
                "--jobs",
                "30",
                "--only",
                "paper k=2,shape",
                "--backend",
                "serial",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["config"]["real_missing"] is None and {r["detector"] for r in res["real"]} == {"paper k=2", "shape"}
    rows = [r for r in res["real_traces"] if r["detector"] == "shape"]
    assert {r["trace"] for r in rows} == {p.stem for p in mixed.glob("*.jsonl")}
    assert {r["environment"] for r in rows} == {"bow", "format"}
