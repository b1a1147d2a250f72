"""An eval line's spread (``eval_std``, ``eval_n``) in the trace format: written by the recorder, read back by the
simulator's loader, and bad ones refused by every reader with the file and line number."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evalstop_callbacks import TraceRecorder
from platform_sim import trace_format as tf
from platform_sim.sim import traces as sim_traces


def _write(path: Path, evals: list[dict]) -> Path:
    lines = [{"kind": "header", "format": tf.TRACE_FORMAT, "job_id": "j", "job_type": "rlhf"}]
    lines += [{"kind": "eval", **e} for e in evals]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_recorder_writes_the_spread_and_the_loader_reads_it(tmp_path: Path) -> None:
    with TraceRecorder(tmp_path / "t.jsonl", job_id="j", job_type="rlhf") as rec:
        rec.eval(10, 0.5, eval_std=0.25, eval_n=64)
        rec.eval(20, 0.6)
        rec.eval(30, 2 / 3, eval_scores=[0.0, 1.0, 1.0], eval_std=math.sqrt(1 / 3), eval_n=3)
        rec.end("completed", best_step=30, best_score=2 / 3)
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert lines[1]["eval_std"] == 0.25 and lines[1]["eval_n"] == 64 and isinstance(lines[1]["eval_n"], int)
    assert "eval_std" not in lines[2]
    trace = sim_traces.load_trace(tmp_path / "t.jsonl")
    assert trace.spreads == ((0.25, 64), None, (math.sqrt(1 / 3), 3))
    # A trace without any spread has none (as the corpus traces, which carry per-example scores or means alone).
    plain = sim_traces.load_trace(
        _write(tmp_path / "p.jsonl", [{"step": 1, "eval_score": 0.1}, {"step": 2, "eval_score": 0.2}])
    )
    assert plain.spreads == ()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"eval_std": 0.2}, "eval_std was given without eval_n"),
        ({"eval_n": 10}, "eval_n was given without eval_std"),
        ({"eval_std": 0.2, "eval_n": 1}, "eval_n must be an integer >= 2"),
        ({"eval_std": 0.2, "eval_n": 2.5}, "eval_n must be an integer >= 2"),
        ({"eval_std": -0.2, "eval_n": 10}, "eval_std must be >= 0"),
        ({"eval_std": "0.2", "eval_n": 10}, "eval_std must be a number"),
        ({"eval_std": float("nan"), "eval_n": 10}, "eval_std must be finite"),
        ({"eval_std": 0.2, "eval_n": 3, "eval_scores": [0.0, 1.0, 1.0]}, "disagrees with the sample standard"),
        ({"eval_std": 0.5, "eval_n": 2, "eval_scores": [0.0, 1.0, 1.0]}, "eval_n is 2 but eval_scores holds 3"),
    ],
)
def test_readers_refuse_a_bad_spread_with_file_and_line(tmp_path: Path, fields: dict, words: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [{"step": 1, "eval_score": 0.5}, {"step": 2, "eval_score": 0.5, **fields}])
    for read in (tf.read_trace, sim_traces.load_trace):
        with pytest.raises(tf.TraceError) as info:
            read(path)
        assert str(info.value).startswith(f"{path}:3: ") and words in str(info.value), str(info.value)
    with TraceRecorder(tmp_path / "w.jsonl", job_id="j", job_type="rlhf") as rec, pytest.raises(tf.TraceError):
        rec.eval(1, 0.5, **fields)  # the writer refuses it too, before writing
    assert len((tmp_path / "w.jsonl").read_text().splitlines()) == 1  # the header alone


def test_a_sub_eval_does_not_keep_the_whole_eval_s_spread(tmp_path: Path) -> None:
    evals = [
        {"step": s, "eval_score": 0.5, "eval_scores": [0.0, 1.0, 1.0, 0.0], "eval_std": math.sqrt(1 / 3), "eval_n": 4}
        for s in (1, 2)
    ]
    path = _write(tmp_path / "t.jsonl", evals)
    header = json.loads(path.read_text().splitlines()[0])
    header["config"] = {"run": {"eval_samples": 4}}
    path.write_text("\n".join([json.dumps(header), *path.read_text().splitlines()[1:]]) + "\n")
    trace = sim_traces.load_trace(path)
    assert trace.spreads and all(sub.spreads == () for sub in sim_traces.sub_evals(trace, per=2))


def test_the_replay_feeds_each_trace_s_recorded_spread_to_the_detector(tmp_path: Path) -> None:
    """Two recordings of one falling curve, one with a spread far larger than its dips and one with a small spread:
    the replay's per-trace rows decide on the recorded spread (the first is not stopped, which the same curve on its
    means alone is; the second is), as trace_detection does when handed the spreads."""
    import numpy as np

    from platform_sim.core import default_spec
    from platform_sim.sim.workload import WorkloadConfig
    from platform_sim.studies.replay import replay
    from platform_sim.studies.trace_detection import corpus_scale, trace_detection

    rng = np.random.default_rng(3)
    p = np.arange(1, 25) / 24
    curve = np.where(p <= 0.5, 2 * p, 1 - (p - 0.5)) + rng.normal(0, 0.03, p.size)
    for name, std in (("wide", 5.0), ("narrow", 0.01)):
        rows = [
            {"step": 10 * (i + 1), "eval_score": float(v), "eval_std": std, "eval_n": 50} for i, v in enumerate(curve)
        ]
        _write(tmp_path / f"{name}.jsonl", rows)
    traces = sim_traces.load_traces(tmp_path)
    spec = default_spec()
    out = replay(traces, WorkloadConfig(n_jobs=12), spec, seeds=1)
    got = {row["trace"]: row for row in out["traces"]}
    scale = corpus_scale(traces)
    for t in traces:
        assert t.spreads and got[t.name]["stopped"] == trace_detection(t, spec, scale, spreads=t.spreads)["stopped"]
    means_only = {t.name: trace_detection(t, spec, scale)["stopped"] for t in traces}
    assert means_only == {"wide": True, "narrow": True}
    assert (got["wide"]["stopped"], got["narrow"]["stopped"]) == (False, True)
