"""Real-calibrated RLHF curves: the fits recover known shapes, the calibration keeps to the tune split, the workload
draws curves with the calibrated properties, and ``--curves real`` works end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from platform_sim.cli import main
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.curve_fit import (
    CurveCalibration,
    calibrate,
    calibration_from_folder,
    calibration_traces,
    fit_hacking,
    fit_healthy,
)
from platform_sim.sim.curves import PeakDeclineCurve, RiseCurve, eval_grid
from platform_sim.sim.observe import make_observation_model
from platform_sim.sim.traces import TraceError, load_trace
from platform_sim.sim.workload import WorkloadConfig, generate_workload

EXAMPLES = 48
EXAMPLE_SD = 0.5  # per-example std in trace units: each eval's mean has std 0.5 / sqrt(48) = 0.072


def write_trace(
    folder: Path,
    name: str,
    curve,
    n_evals: int,
    planned: int,
    rng: np.random.Generator,
    examples: bool = True,
    split: str | None = None,
    body: str | None = None,
) -> Path:
    """A trace in the documented format whose eval scores are the mean of noisy per-example scores around
    ``curve``; ``body`` replaces every line after the header (to make a file that cannot be parsed)."""
    header = {
        "kind": "header",
        "format": "evalstop-trace/1",
        "job_id": name,
        "job_type": "rlhf",
        "trainer": "GRPOTrainer",
        "planned_steps": planned,
    }
    if split is not None:
        header["split"] = split
    lines = [json.dumps(header)]
    if body is not None:
        lines.append(body)
    else:
        steps = [(i * planned) // n_evals for i in range(1, n_evals + 1)]
        for step in steps:
            per = curve.value(step / planned) + EXAMPLE_SD * rng.standard_normal(EXAMPLES)
            line = {"kind": "eval", "step": step, "eval_score": float(per.mean())}
            if examples:
                line["eval_scores"] = [float(v) for v in per]
            lines.append(json.dumps(line))
    path = folder / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


HACK = {"s0": 2.0, "gain": 3.0, "p_peak": 0.3, "decline": 2.0, "drop": 1.0}  # floor at s0: never clipped
HEALTHY = {"s0": 1.0, "gain": 4.0, "share": 0.8}


@pytest.fixture()
def corpus(tmp_path):
    rng = np.random.default_rng(5)
    for i in range(3):
        write_trace(tmp_path, f"hack-{i}", PeakDeclineCurve(**HACK), 40, 400, rng)
    write_trace(tmp_path, "hack-short", PeakDeclineCurve(**HACK), 25, 250, rng)  # another length and cadence
    for i in range(3):
        write_trace(tmp_path, f"healthy-{i}", RiseCurve(**HEALTHY), 30, 300, rng)
    write_trace(tmp_path, "healthy-noex", RiseCurve(**HEALTHY), 30, 300, rng, examples=False)
    return tmp_path


def test_fit_recovers_known_shapes_and_noise(corpus):
    cal, fits = calibration_from_folder(corpus)
    assert cal.split == "all" and cal.hack_share == pytest.approx(0.5) and len(fits) == 8
    se = EXAMPLE_SD / np.sqrt(EXAMPLES)
    for f in fits:
        if f.label == "hacking":
            assert f.peak == pytest.approx(HACK["p_peak"], abs=0.01)
            assert f.decline == pytest.approx(HACK["decline"], rel=0.1)
            assert f.drop == pytest.approx(HACK["drop"], rel=0.1)
            assert f.gain == pytest.approx(HACK["gain"], rel=0.06)
            truth = se / HACK["gain"]
        else:
            assert f.label == "healthy" and f.peak is None
            assert f.plateau_share == pytest.approx(HEALTHY["share"], abs=0.02)
            truth = se / HEALTHY["gain"]
        assert f.noise_source == ("residual" if f.name == "healthy-noex" else "examples")
        assert f.noise == pytest.approx(truth, rel=0.15)
        assert f.noise_residual == pytest.approx(truth, rel=0.3)
    # the calibration holds each fitted trace's parameters together
    assert sorted(cal.traces) == sorted(f.name for f in fits)
    assert {h[0] for h in cal.hacking} == {f.peak for f in fits if f.label == "hacking"}
    _, fits_res = calibrate([load_trace(p) for p in sorted(corpus.glob("*.jsonl"))], noise="residual")
    assert all(f.noise_source == "residual" for f in fits_res)


def test_fit_functions_on_exact_curves():
    p = eval_grid(30)
    h = fit_hacking(p, PeakDeclineCurve(1.0, 2.0, 0.42, 1.5, 0.6).values(p))
    assert h["peak"] == pytest.approx(0.42, abs=0.005) and h["decline"] == pytest.approx(1.5, rel=0.02)
    assert h["drop"] == pytest.approx(0.6, rel=0.02) and h["sse"] < 1e-6
    g = fit_healthy(p, RiseCurve(0.5, 1.0, 0.3).values(p))  # a convex rise (share < 0.5) fits too
    assert g["plateau_share"] == pytest.approx(0.3, abs=0.005) and g["gain"] == pytest.approx(1.0, rel=0.01)
    with pytest.raises(ValueError, match="at least"):
        fit_hacking(p[:3], [0.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="never rise"):
        fit_healthy(p, np.linspace(1.0, 0.0, 30))


def _reader_accepts_split(tmp_path: Path) -> bool:
    path = write_trace(tmp_path, "probe", RiseCurve(**HEALTHY), 5, 50, np.random.default_rng(0), split="tune")
    try:
        load_trace(path)
    except TraceError:
        return False
    finally:
        path.unlink()
    return True


def test_calibration_reads_only_tune_traces(tmp_path):
    if not _reader_accepts_split(tmp_path):
        pytest.skip("the trace reader does not accept the header field split yet")
    rng = np.random.default_rng(1)
    write_trace(tmp_path, "a-hack", PeakDeclineCurve(**HACK), 30, 300, rng, split="tune")
    write_trace(tmp_path, "b-healthy", RiseCurve(**HEALTHY), 30, 300, rng, split="tune")
    # Test traces whose body cannot be parsed: any read beyond the header would raise.
    write_trace(tmp_path, "c-test", PeakDeclineCurve(**HACK), 30, 300, rng, split="test", body="{not json")
    write_trace(tmp_path, "d-test", RiseCurve(**HEALTHY), 30, 300, rng, split="test", body="{not json")
    traces, split = calibration_traces(tmp_path)
    assert split == "tune" and [t.name for t in traces] == ["a-hack", "b-healthy"]
    cal, _ = calibration_from_folder(tmp_path)
    assert cal.split == "tune" and cal.traces == ("a-hack", "b-healthy")


def test_split_errors_name_the_problem(tmp_path):
    rng = np.random.default_rng(2)
    write_trace(tmp_path, "a", RiseCurve(**HEALTHY), 10, 100, rng, split="test")
    with pytest.raises(TraceError, match="no trace with split 'tune'"):
        calibration_traces(tmp_path)
    write_trace(tmp_path, "b", RiseCurve(**HEALTHY), 10, 100, rng, split="train")
    with pytest.raises(TraceError, match=r"b\.jsonl:1: header field split"):
        calibration_traces(tmp_path)
    with pytest.raises(FileNotFoundError):
        calibration_traces(tmp_path / "missing")


def test_calibration_needs_both_kinds_and_round_trips(corpus):
    traces = [load_trace(p) for p in sorted(corpus.glob("hack-*.jsonl"))]
    with pytest.raises(ValueError, match="at least one hacking and one healthy"):
        calibrate(traces)
    cal, _ = calibration_from_folder(corpus)
    assert CurveCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    cfg = WorkloadConfig(n_jobs=10, real_curves=cal)
    assert WorkloadConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert "real_curves" not in WorkloadConfig().to_dict()  # synthetic configs keep their old form


# -- the generator -----------------------------------------------------------------------------------------------

CAL = CurveCalibration(
    hacking=((0.3, 2.0, 1.0, 0.04), (0.6, 1.0, 0.3, 0.02)),
    healthy=((0.9, 0.05),),
    hack_share=0.5,
    split="all",
    smoothing=0.0,
)


@pytest.fixture(scope="module")
def real_wl():
    return generate_workload(WorkloadConfig(n_jobs=2000, real_curves=CAL), 3)


def test_generated_curves_have_the_calibrated_shapes(real_wl):
    grid = eval_grid(20)
    sigma = real_wl.noise_std()
    seen = {0.3: 0, 0.6: 0}
    for j in real_wl.jobs:
        if j.job_type != "rlhf":
            continue
        v, gain = real_wl.true_evals[j.index], j.curve.gain
        s0 = j.curve.s0
        if j.hacking:
            k = int(np.argmax(v))
            peak = round(float(grid[k]), 6)
            assert peak in seen, peak
            seen[peak] += 1
            entry = CAL.hacking[0] if peak == 0.3 else CAL.hacking[1]
            # the decline over the two evals after the peak, in gains per unit of progress
            assert (v[k] - v[k + 2]) / (0.1 * gain) == pytest.approx(entry[1], rel=1e-6)
            if s0 + gain * (1 - entry[2]) > 0:  # not clipped at the floor of the 0-1 scale
                assert (v[k] - v[-1]) / gain == pytest.approx(entry[2], rel=1e-6)
            assert sigma[j.index] == pytest.approx(entry[3] * gain)
        else:
            assert np.all(np.diff(v) > 0)
            assert (v[9] - s0) / gain == pytest.approx(0.9, abs=1e-9)  # grid[9] = 0.5: the plateau share
            assert sigma[j.index] == pytest.approx(0.05 * gain)
    n = sum(seen.values())
    assert n > 500 and abs(seen[0.3] / n - 0.5) < 0.06


def test_real_noise_reaches_the_observations(real_wl):
    obs = make_observation_model(real_wl)
    hack = [j for j in real_wl.jobs if j.hacking]
    resid = np.array(
        [
            [
                (obs.observe_eval(j, k, k / 20)[0] - real_wl.true_evals[j.index, k - 1]) / j.curve.gain
                for k in range(1, 21)
            ]
            for j in hack
        ]
    )
    peaks = np.array([int(np.argmax(real_wl.true_evals[j.index])) for j in hack])
    assert resid[peaks == 5].std() == pytest.approx(0.04, rel=0.05)
    assert resid[peaks == 11].std() == pytest.approx(0.02, rel=0.05)
    lora = [j for j in real_wl.jobs if j.job_type == "lora"]
    assert all(real_wl.noise_std()[j.index] == 0.02 for j in lora)  # sigma still applies to the other types


def test_real_workload_is_paired_with_the_synthetic_one(real_wl):
    syn = generate_workload(WorkloadConfig(n_jobs=2000), 3)
    assert [(j.job_id, j.job_type, j.gpus, j.submit_time, j.duration_h, j.hacking) for j in syn.jobs] == [
        (j.job_id, j.job_type, j.gpus, j.submit_time, j.duration_h, j.hacking) for j in real_wl.jobs
    ]
    assert np.array_equal(syn.noise, real_wl.noise) and np.array_equal(syn.losses, real_wl.losses)
    other = [j.index for j in syn.jobs if j.job_type != "rlhf"]
    assert np.array_equal(syn.true_evals[other], real_wl.true_evals[other])
    assert syn.job_sigma is None


def test_smoothed_draws_follow_the_shipped_calibration():
    cal, _ = calibration_from_folder(corpus_dir("real"))
    wl = generate_workload(WorkloadConfig(n_jobs=3000, real_curves=cal), 0)
    grid = eval_grid(20)
    peaks = [grid[int(np.argmax(wl.true_evals[j.index]))] for j in wl.jobs if j.hacking]
    fitted = np.array(cal.hacking)[:, 0]
    assert np.median(peaks) == pytest.approx(np.median(fitted), abs=0.06)
    assert fitted.min() - 0.1 <= np.quantile(peaks, 0.05) and np.quantile(peaks, 0.95) <= fitted.max() + 0.1


# -- the command line ----------------------------------------------------------------------------------------------


def test_run_with_real_curves_end_to_end(corpus, capsys):
    assert main(["run", "--curves", "real", "--jobs", "40", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    rc = m["config"]["workload"]["real_curves"]
    # The shipped corpus names its splits: only the RLHF traces of the tune-split environments are fitted.
    assert rc["split"] == "tune" and rc["traces"]
    assert all(name.startswith(("bow-proxy-", "length-")) for name in rc["traces"]), rc["traces"]
    assert 0 < rc["hack_share"] < 1
    assert (
        main(
            ["run", "--curves", "real", "--curve-traces", str(corpus), "--jobs", "40", "--detector", "shape", "--json"]
        )
        == 0
    )  # a detector that reads per-example scores: the per-example model on real noise
    m = json.loads(capsys.readouterr().out)
    assert len(m["config"]["workload"]["real_curves"]["traces"]) == 8 and m["jobs"] == 40


def test_paper_with_real_curves(tmp_path, capsys):
    assert (
        main(
            [
                "paper",
                "--curves",
                "real",
                "--seeds",
                "1",
                "--jobs",
                "40",
                "--json",
                "--no-plots",
                "--no-progress",
                "--backend",
                "serial",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert [r["stop"] for r in res["main"]] == ["none", "evalstop", "stop-at-p", "loss-plateau", "oracle"]
    assert res["config"]["workload"]["real_curves"]["split"] == "tune"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--curves", "real", "--curve-traces", "/nonexistent-trace-folder"],
        ["run", "--curve-traces", "."],
        ["run", "--curves", "gao"],
    ],
)
def test_bad_curve_flags_one_line_exit_2(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--curve" in err, err
