"""Per-example eval scores in the simulator and the ``evalstop-sim detectors`` comparison."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from platform_sim.cli import main
from platform_sim.sim.eval_scores import PerExampleObservation, RecordedExamplesObservation
from platform_sim.sim.experiments import PolicySpec, run_one
from platform_sim.sim.observe import ObservationModel
from platform_sim.sim.workload import WorkloadConfig, generate_workload
from platform_sim.studies.detector_study import CANDIDATES, StudyConfig, detection_metrics, job_series, study

SMALL = WorkloadConfig(n_jobs=40, sigma=0.05)


def test_per_example_mean_is_the_plain_observation_and_deterministic():
    wl = generate_workload(SMALL, 3)
    plain, ours, again = ObservationModel(wl), PerExampleObservation(wl), PerExampleObservation(wl)
    for job in wl.jobs[:10]:
        for k in (1, 7, 20):
            mean, none = plain.observe_eval(job, k, k / 20)
            score, scores = ours.observe_eval(job, k, k / 20)
            assert none is None and score == mean
            assert np.mean(scores) == pytest.approx(mean, abs=1e-12)
            assert again.observe_eval(job, k, k / 20)[1] == scores


def test_per_example_noise_is_paired_like_real_evals():
    # Over many jobs: the paired SE of a difference estimates sigma * sqrt(2) (the mean's real noise), and
    # consecutive checkpoints' per-example scores correlate at about rho.
    cfg = WorkloadConfig(n_jobs=200, sigma=0.05)
    wl = generate_workload(cfg, 1)
    obs = PerExampleObservation(wl, examples=48, rho=0.85)
    paired, corr = [], []
    for job in wl.jobs:
        a = np.array(obs.observe_eval(job, 5, 0.25)[1])
        b = np.array(obs.observe_eval(job, 6, 0.30)[1])
        paired.append((b - a).std(ddof=1) / np.sqrt(48))
        corr.append(np.corrcoef(a, b)[0, 1])
    assert np.median(paired) == pytest.approx(0.05 * np.sqrt(2), rel=0.1)
    assert np.median(corr) == pytest.approx(0.85, abs=0.05)


def test_per_example_scores_change_nothing_for_detectors_on_the_mean():
    spec = PolicySpec(stop="evalstop", detector={"name": "k-decline", "params": {"k": 2}})
    _, plain = run_one(SMALL, spec, 2)
    _, ours = run_one(SMALL, spec, 2, observation={"name": "per-example", "params": {}})
    for key in ("precision", "recall", "fpr", "jct_mean_h", "wasted_gpu_h"):
        assert plain[key] == ours[key]


def test_paired_detector_gets_the_scores_in_the_simulator(caplog):
    spec = PolicySpec(stop="evalstop", detector={"name": "paired-test", "params": {}})
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        run_one(SMALL, spec, 0, observation={"name": "per-example", "params": {}})
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]


def test_detection_only_fast_path_agrees_with_the_simulator():
    spec = {"name": "trend", "params": {"window": 6, "alpha": 0.05}}
    fast = detection_metrics(spec, [job_series(SMALL, 4)])
    _, sim = run_one(
        SMALL, PolicySpec(stop="evalstop", detector=spec), 4, observation={"name": "per-example", "params": {}}
    )
    assert fast["precision"] == sim["precision"] and fast["recall"] == sim["recall"]
    assert fast["fpr_healthy_rlhf"] == sim["fpr_healthy_rlhf"]


def _write_trace(path, name, means, rng):
    lines = [
        {
            "kind": "header",
            "format": "evalstop-trace/1",
            "job_id": name,
            "job_type": "rlhf",
            "planned_steps": 10 * len(means),
        }
    ]
    for i, m in enumerate(means):
        dev = rng.normal(0, 1.0, 16)
        lines.append(
            {
                "kind": "eval",
                "step": 10 * (i + 1),
                "eval_score": float(m),
                "eval_scores": [float(v) for v in m + dev - dev.mean()],
            }
        )
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_study_rows_and_real_traces(tmp_path):
    rng = np.random.default_rng(0)
    up = np.linspace(0, 3, 12)
    _write_trace(tmp_path / "hack.jsonl", "hack", np.concatenate([up[:7], up[6] - np.linspace(0.5, 4, 5)]), rng)
    _write_trace(tmp_path / "ok.jsonl", "ok", up, rng)
    cfg = StudyConfig(
        seeds=2,
        detectors=(CANDIDATES[0], CANDIDATES[-1]),
        workload=WorkloadConfig(n_jobs=30),
        sigmas=(0.12,),
        hack_rates=(0.6,),
        plateau_sigmas=(0.02,),
        traces_dir=str(tmp_path),
    )
    res = study(cfg)
    for name in ("noise", "hack_rate", "plateau", "real"):
        assert [r["detector"] for r in res[name]] == [CANDIDATES[0][0], CANDIDATES[-1][0]]
        for r in res[name]:
            for key in (
                "precision",
                "recall",
                "fpr",
                "delay_evals",
                "delay_median_evals",
                "regret",
                "jct_gain_pct",
                "wasted_reduction_pct",
                "wasted_gpu_h",
                "jct_mean_h",
            ):
                assert key in r
    assert res["noise"][0]["sigma"] == 0.12 and res["hack_rate"][0]["hack_rate"] == 0.6
    summary = {s["detector"]: s for s in res["real_summary"]}
    assert summary[CANDIDATES[-1][0]]["hacking_stopped"] == 1
    assert summary[CANDIDATES[-1][0]]["healthy_stopped"] == 0
    json.dumps(res)


def test_recorded_examples_reach_the_detector(tmp_path):
    from platform_sim.sim.traces import load_traces
    from platform_sim.studies.replay import build_replay_workload, trace_curves
    from platform_sim.studies.trace_detection import corpus_scale

    rng = np.random.default_rng(1)
    _write_trace(tmp_path / "a.jsonl", "a", np.linspace(0, 3, 12), rng)
    traces = load_traces(tmp_path)
    scale = corpus_scale(traces)
    curves = trace_curves(traces, scale)
    recorded = [
        [scale(v) for v in json.loads(line)["eval_scores"]]
        for line in (tmp_path / "a.jsonl").read_text().splitlines()[1:]
    ]
    wl = build_replay_workload(WorkloadConfig(n_jobs=20, n_evals=12), curves, 0)
    obs = RecordedExamplesObservation(wl, traces=[(list(curves[0].scores), recorded)])
    job = next(j for j in wl.jobs if j.job_type == "rlhf")
    score, scores = obs.observe_eval(job, 3, 0.25)
    assert list(scores) == pytest.approx(recorded[2])
    assert score == pytest.approx(np.mean(recorded[2]))


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--seeds", "0"], "--seeds"),
        (["--only", "nope"], "--only"),
        (["--detector", "nope"], "--detector"),
        (["--detector-param", "k=3"], "--detector-param"),
        (["--detector", "trend", "--detector-param", "window=1"], "window"),
        (["--sigmas", "a,b"], "--sigmas"),
        (["--jobs", "0"], "--jobs"),
        (["--parts", "noise,bogus"], "--parts"),
        (["--traces", "/nonexistent-folder-xyz"], "--traces"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    assert main(["detectors", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1


def test_cli_json_has_the_four_lists(capsys):
    rc = main(
        [
            "detectors",
            "--seeds",
            "1",
            "--jobs",
            "20",
            "--sigmas",
            "0.12",
            "--no-real",
            "--json",
            "--only",
            "paper k=2,cusum",
            "--backend",
            "serial",
            "--detector",
            "trend",
            "--detector-param",
            "window=6",
        ]
    )
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) >= {"noise", "hack_rate", "plateau", "real", "config"}
    assert [r["detector"] for r in res["noise"]] == ["paper k=2", "cusum", "trend window=6"]
    assert res["real"] == []


def test_run_generates_per_example_scores_only_for_detectors_that_read_them(capsys, caplog):
    from platform_sim.sim.eval_scores import observation_for

    assert observation_for(None) is None and observation_for("k-decline") is None
    for name in ("paired-test", "trend", "cusum", "k-decline-se"):
        assert observation_for(name) == {"name": "per-example", "params": {}}
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        assert main(["run", "--jobs", "30", "--detector", "trend", "--detector-param", "window=6", "--json"]) == 0
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]
    assert json.loads(capsys.readouterr().out)["config"]["detector"]["name"] == "trend"
    assert observation_for("shape") == {"name": "per-example", "params": {}}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="platform_sim.core.detectors"):
        assert main(["run", "--jobs", "30", "--stop", "evalstop-fleet", "--json"]) == 0  # shape and shape-sens
    assert not [r for r in caplog.records if "falling back" in r.getMessage()]
    assert json.loads(capsys.readouterr().out)["config"]["stop"] == "evalstop-fleet"


@pytest.mark.parametrize("rule_name", ["plateau-safe", "high-noise"])
def test_calibration_on_recorded_series_picks_the_pinned_point(rule_name):
    from platform_sim.studies.detector_study import CALIBRATION_RULES, calibrate

    grids = {"cusum": ("cusum", {"slack": (0.0,), "threshold": (1.0, 4.0, 8.0)})}
    res = calibrate(seeds=(1000,), rule=CALIBRATION_RULES[rule_name], grids=grids)
    rows = res["grid"]
    assert res["seeds"] == [1000]
    assert [r["spec"]["params"]["threshold"] for r in rows] == [1.0, 4.0, 8.0]
    # threshold 1 stops healthy runs (precision < 95% at sigma 0.12 and on plateaus); of the other two, 4 is as
    # fast as the paper's rule at sigma 0.02 (plateau-safe's first criterion) and has the higher recall and
    # min(precision, recall) at sigma 0.12 (high-noise's, where neither is fast enough).
    assert [r["feasible"] for r in rows] == [False, True, True]
    assert rows[1]["default_s0.02"]["delay_median_evals"] == 3.0 and rows[2]["default_s0.02"]["delay_median_evals"] > 3
    assert res["chosen"] == {"cusum": {"name": "cusum", "params": {"slack": 0.0, "threshold": 4.0}}}


# Synthetic metrics per grid point (cusum's threshold) and scenario: (precision, recall, median delay in evals).
_METRICS = {
    1.0: {"default_s0.02": (0.99, 1.0, 1.0), "default_s0.12": (0.50, 1.0, 2.0), "plateau_s0.02": (0.90, 1.0, 1.0)},
    2.0: {"default_s0.02": (1.0, 1.0, 4.0), "default_s0.12": (0.97, 0.90, 5.0), "plateau_s0.02": (1.0, 1.0, 4.0)},
    3.0: {"default_s0.02": (1.0, 1.0, 3.0), "default_s0.12": (0.97, 0.703, 6.0), "plateau_s0.02": (1.0, 1.0, 3.0)},
    4.0: {"default_s0.02": (1.0, 1.0, 3.0), "default_s0.12": (0.97, 0.699, 5.0), "plateau_s0.02": (1.0, 1.0, 3.0)},
    5.0: {"default_s0.02": (1.0, 1.0, 3.0), "default_s0.12": (0.97, 0.701, 5.0), "plateau_s0.02": (1.0, 1.0, 3.0)},
    6.0: {"default_s0.02": (1.0, 1.0, 2.0), "default_s0.12": (0.96, 0.99, 3.0), "plateau_s0.02": (None, 0.0, None)},
    7.0: {"default_s0.02": (1.0, 1.0, 2.0), "default_s0.12": (0.99, 0.97, 4.0), "plateau_s0.02": (0.90, 1.0, 2.0)},
}


@pytest.mark.parametrize(
    "rule_name, expected",
    [
        # Feasible on all three scenarios: 2-5. Fast at sigma 0.02 (delay <= 3): 3, 4, 5 (2 has the higher recall but
        # is slow). Their recalls round to 0.70; 4 and 5 are faster at sigma 0.12 than 3 (which has the highest raw
        # recall); of those two, 5 has the higher raw recall.
        ("plateau-safe", 5.0),
        # (6 has no precision on plateaus, 7 too low a one.)
        # Feasible at sigma 0.12: 2-7. Fast at sigma 0.02: 3-7; highest rounded recall at sigma 0.12: 6.
        ("default-only", 6.0),
        # Feasible at sigma 0.12: 2-7; fast there (delay <= 4): 6, 7; min(precision, recall): 0.96 and 0.97.
        ("high-noise", 7.0),
    ],
)
def test_calibration_selection_follows_its_rule(monkeypatch, rule_name, expected):
    from platform_sim.studies import detector_study
    from platform_sim.studies.detector_study import CALIBRATION_RULES, CALIBRATION_SCENARIOS, calibrate

    names = {id(cfg): name for name, cfg in CALIBRATION_SCENARIOS.items()}
    monkeypatch.setattr(detector_study, "job_series", lambda cfg, seed: names[id(cfg)])

    def metrics(spec, series):
        precision, recall, delay = _METRICS[spec["params"]["threshold"]][series[0]]
        return {"precision": precision, "recall": recall, "delay_median_evals": delay}

    monkeypatch.setattr(detector_study, "detection_metrics", metrics)
    grids = {"cusum": ("cusum", {"threshold": tuple(_METRICS)}), "none-feasible": ("cusum", {"threshold": (1.0,)})}
    res = calibrate(seeds=(0,), rule=CALIBRATION_RULES[rule_name], grids=grids)
    assert res["chosen"] == {"cusum": {"name": "cusum", "params": {"threshold": expected}}, "none-feasible": None}
