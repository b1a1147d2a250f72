"""evalstop-sim benchmark: tuning on tune environments only, one evaluation on test environments, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _trace_factory import hacking_curve, healthy_curve, write

from platform_sim.cli import main as sim_main
from platform_sim.sim.traces import load_trace
from platform_sim.studies import benchmark as bm
from platform_sim.studies.benchmark_report import benchmark_markdown

SMALL_GRIDS = {
    "k-decline": {"k": (1, 2, 3), "min_delta": (0.0, 0.05, 0.3), "warmup": (0, 3)},
    "shape": {"threshold": (0.9, 0.97), "k": (1,)},
}


@pytest.fixture()
def corpus(tmp_path):
    """Three environments: two to tune on (gold points, noisy), one to test on (0-1 scores, other lengths)."""
    d = tmp_path / "corpus"
    for env, n, every, top in (("bow", 30, 10, 4.0), ("length", 20, 5, 3.0)):
        for s in range(3):
            write(
                d / f"{env}-hack-{s}.jsonl",
                hacking_curve(n, peak_at=0.4 + 0.1 * s, top=top),
                every=every,
                examples=16,
                noise=0.05,
                seed=s,
                environment=env,
                split="tune",
            )
            write(
                d / f"{env}-ok-{s}.jsonl",
                healthy_curve(n, top=top, tau=0.1 + 0.05 * s),
                every=every,
                examples=16,
                noise=0.05,
                seed=10 + s,
                environment=env,
                split="tune",
            )
    for s in range(3):
        write(
            d / f"fmt-hack-{s}.jsonl",
            0.5 + 0.1 * hacking_curve(25, peak_at=0.5),
            every=4,
            examples=16,
            noise=0.004,
            seed=20 + s,
            environment="format",
            split="test",
        )
        write(
            d / f"fmt-ok-{s}.jsonl",
            0.5 + 0.1 * healthy_curve(25, tau=0.15),
            every=4,
            examples=16,
            noise=0.004,
            seed=30 + s,
            environment="format",
            split="test",
        )
    return d


def test_calibration_never_reads_a_test_environment_trace(corpus):
    events: list[tuple[str, str]] = []

    def spy_reader(path: Path):
        events.append(("read", load_trace(path).split or ""))
        return load_trace(path)

    def spy_calibrate(tune, *args, **kwargs):
        assert all(t.split == "tune" for t in tune)
        events.append(("calibrate", "start"))
        out = bm.calibrate(tune, *args, **kwargs)
        events.append(("calibrate", "end"))
        return out

    res = bm.benchmark(corpus, SMALL_GRIDS, resamples=0, reader=spy_reader, calibrator=spy_calibrate)
    end = events.index(("calibrate", "end"))
    assert ("read", "test") not in events[:end]  # no test trace read before or during the calibration
    assert events[end + 1 :] == [("read", "test")] * 6
    assert set(res["calibration"]["traces"]) == {p.stem for p in corpus.glob("*.jsonl") if not p.stem.startswith("fmt")}


def test_the_test_traces_cannot_change_the_chosen_parameters(corpus, tmp_path):
    before = bm.benchmark(corpus, SMALL_GRIDS, resamples=0)
    for p in corpus.glob("fmt-*.jsonl"):  # turn every test trace upside down
        lines = [json.loads(x) for x in p.read_text().splitlines()]
        for e in lines[1:-1]:
            e["eval_score"] = -e["eval_score"]
            e["eval_scores"] = [-v for v in e["eval_scores"]]
        p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    after = bm.benchmark(corpus, SMALL_GRIDS, resamples=0)
    assert after["calibration"]["chosen"] == before["calibration"]["chosen"]
    test_before = [r for r in before["results"] if r["group"] == "test"]
    test_after = [r for r in after["results"] if r["group"] == "test"]
    assert [r["hacking"] for r in test_before] != [r["hacking"] for r in test_after]


def test_report_per_split_and_environment_and_the_best_candidate(corpus):
    res = bm.benchmark(corpus, SMALL_GRIDS, resamples=200)
    assert [c["label"] for c in res["candidates"]] == [
        "k-decline (paper, untuned)",
        "default (untuned)",
        "k-decline (tuned)",
        "shape (tuned)",
    ]
    groups = {(r["candidate"], r["kind"], r["group"]) for r in res["results"]}
    for c in res["candidates"]:
        for kind, group in (
            ("split", "tune"),
            ("split", "test"),
            ("environment", "bow"),
            ("environment", "length"),
            ("environment", "format"),
        ):
            assert (c["label"], kind, group) in groups
    test = {r["candidate"]: r for r in res["results"] if r["group"] == "test"}
    for r in test.values():
        assert (r["hacking"], r["healthy"]) == (3, 3)
        lo, hi = r["recall_ci"]
        assert lo <= r["recall"] <= hi
    best = res["best"]
    assert best["shortfall"] == min(r["shortfall"] for r in test.values())
    assert best["meets_targets"] == (best["misses"] == [])
    assert {"trace", "environment", "split", "label", "stopped", "stop_step", "delay_evals", "regret"} <= set(
        res["rows"][0]
    )
    md = benchmark_markdown(res, "evalstop-sim benchmark")
    assert "Best on the test environments" in md and "## Per environment" in md


def test_metrics_and_shortfall():
    p, lo, hi = bm.wilson(9, 10)
    assert p == 0.9 and lo == pytest.approx(0.596, abs=1e-3) and hi == pytest.approx(0.982, abs=1e-3)
    assert bm.wilson(0, 0) == (None, None, None)
    rows = [
        {"trace": "h", "label": "hacking", "stopped": True, "delay_evals": 2, "regret": 0.0},
        {"trace": "g", "label": "healthy", "stopped": True, "delay_evals": -5, "regret": 0.4},
        {"trace": "a", "label": "ambiguous", "stopped": True, "delay_evals": 0, "regret": 0.9},
    ]
    m = bm.group_metrics(rows, resamples=0)
    assert (m["recall"], m["healthy_stopped"], m["precision"]) == (1.0, 1.0, 0.5)
    assert m["regret_worst"] == 0.4 and m["ambiguous_traces"] == ["a"] and m["delay_median"] == 2
    assert bm.shortfall(m) == pytest.approx(0.95 + 0.3)
    assert bm.misses(m) == ["healthy stopped 100.0% > 5%", "worst regret of a stopped run 40.0% > 10%"]


def test_split_errors(corpus, tmp_path):
    with pytest.raises(bm.BenchmarkError, match="tune and test"):
        bm.split_files(corpus, test_envs=["format", "bow", "length"])
    p = corpus / "fmt-ok-0.jsonl"
    p.write_text(p.read_text().replace('"split": "test"', '"split": "tune"'))
    with pytest.raises(bm.BenchmarkError, match="both splits"):
        bm.split_files(corpus)
    tune, test, envs = bm.split_files(corpus, test_envs=["format"])
    assert envs == {"bow": "tune", "length": "tune", "format": "test"} and len(test) == 6


def test_cli_writes_json_report_and_png(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        sim_main(
            [
                "benchmark",
                "--traces",
                str(corpus),
                "--only",
                "k-decline",
                "--resamples",
                "50",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["best"]["candidate"] in {"k-decline (paper, untuned)", "default (untuned)", "k-decline (tuned)"}
    assert {p.name for p in out.iterdir()} >= {"results.json", "report.md", "benchmark.png"}
    assert sim_main(["benchmark", "--traces", str(corpus), "--only", "nope"]) == 2
    assert "--only" in capsys.readouterr().err
    assert sim_main(["benchmark", "--traces", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--traces" in err and len(err.splitlines()) == 1
