"""platform_sim.trace_format: the one definition of the trace format, used by the recorder and every reader."""

from __future__ import annotations

import json

import pytest

from evalstop_callbacks import TraceRecorder
from evalstop_callbacks import trace as lib_trace
from platform_sim import trace_format as tf
from platform_sim.sim import traces as sim_traces


def _header(**extra):
    return {"kind": "header", "format": "evalstop-trace/1", "job_id": "j", "job_type": "rlhf", **extra}


def test_one_definition_shared_by_recorder_and_simulator():
    assert lib_trace.TRACE_FORMAT is tf.TRACE_FORMAT and sim_traces.TRACE_FORMAT is tf.TRACE_FORMAT
    assert lib_trace.TraceError is tf.TraceError is sim_traces.TraceError
    assert issubclass(TraceRecorder, tf.TraceWriter)
    assert {"environment", "split"} <= tf.HEADER_OPTIONAL == lib_trace.HEADER_OPTIONAL_FIELDS


def test_environment_and_split_are_known_optional_header_fields(tmp_path):
    rec = TraceRecorder(tmp_path / "t.jsonl", job_id="j", job_type="rlhf", environment="length", split="test")
    rec.eval(1, 0.5)
    rec.eval(2, 0.4)
    rec.end("completed", best_step=1, best_score=0.5)
    t = sim_traces.load_trace(tmp_path / "t.jsonl")
    assert (t.environment, t.split) == ("length", "test")
    assert tf.read_header(tmp_path / "t.jsonl")["split"] == "test"


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"split": "train"}, "split must be one of tune, test"),
        ({"environment": ""}, "environment must be a non-empty string"),
        ({"environment": 3}, "environment must be a non-empty string"),
        ({"planned_steps": -1}, "planned_steps must be an integer >= 0"),
        ({"world_size": 0}, "world_size must be an integer >= 1"),
        ({"config": []}, "config must be an object"),
        ({"host": "gpu-1"}, "unknown trace header field(s): host"),
    ],
)
def test_bad_header_fields_named_with_file_and_line(tmp_path, extra, words):
    p = tmp_path / "h.jsonl"
    p.write_text(json.dumps(_header(**extra)) + "\n" + json.dumps({"kind": "eval", "step": 1, "eval_score": 1}) + "\n")
    for read in (tf.read_trace, tf.read_header):
        with pytest.raises(tf.TraceError) as exc:
            read(p)
        assert str(exc.value).startswith(f"{p}:1: ") and words in str(exc.value)
    with pytest.raises(tf.TraceError, match=words.split("(")[0]):
        TraceRecorder(tmp_path / "w.jsonl", job_id="j", job_type="rlhf", **extra)


def test_writer_and_reader_round_trip_and_whole_file_writer(tmp_path):
    header = {"job_id": "a", "job_type": "rlhf", "trainer": "PPOTrainer", "environment": "bow", "split": "tune"}
    evals = [{"step": 0, "eval_score": 1.0, "eval_scores": [0.5, 1.5]}, {"step": 4, "eval_score": 2.0, "kl": 0.1}]
    p = tf.write_trace(tmp_path / "sub" / "a.jsonl", header, evals, {"reason": "completed", "best_step": 4})
    t = tf.read_trace(p)
    assert t.header == {"kind": "header", "format": tf.TRACE_FORMAT, **header}
    assert [e["step"] for e in t.evals] == [0, 4] and t.end["best_step"] == 4 and t.eval_line_numbers == (2, 3)
    with pytest.raises(tf.TraceError, match=r"b.jsonl:4: .*steps must increase: step 0 after 4"):
        tf.write_trace(tmp_path / "b.jsonl", header, [*evals, {"step": 0, "eval_score": 1.0}])
    assert not (tmp_path / "b.jsonl").exists()  # nothing written


def test_update_header_replaces_the_recorders_header_rewrite(tmp_path):
    rec = TraceRecorder(tmp_path / "t.jsonl", job_id="j", job_type="rlhf", config={"eval_steps": 5})
    rec.eval(5, 1.0)
    rec.end("completed", best_step=5, best_score=1.0)
    before = tf.read_trace(tmp_path / "t.jsonl")
    new = tf.update_header(
        tmp_path / "t.jsonl",
        {"environment": "format", "split": "test", "model": "llama-2x64"},
        config={"run": {"algo": "grpo"}},
    )
    after = tf.read_trace(tmp_path / "t.jsonl")
    assert after.header == new and new["config"] == {"eval_steps": 5, "run": {"algo": "grpo"}}
    assert (new["environment"], new["split"], new["model"]) == ("format", "test", "llama-2x64")
    assert after.evals == before.evals and after.end == before.end
    with pytest.raises(tf.TraceError, match="split must be one of"):
        tf.update_header(tmp_path / "t.jsonl", {"split": "holdout"})
    assert tf.read_trace(tmp_path / "t.jsonl").header == new  # unchanged on error


def test_eval_prefix_keeps_a_crashed_runs_lines_and_rejects_real_damage(tmp_path):
    p = tmp_path / "crash.jsonl"
    lines = [json.dumps(_header())] + [json.dumps({"kind": "eval", "step": s, "eval_score": 1.0}) for s in (2, 4, 6)]
    p.write_text("\n".join(lines) + '\n{"kind": "eval", "st')  # the crash cut the last line
    assert [e["step"] for e in tf.eval_prefix(p, 4)] == [2, 4]
    assert tf.eval_prefix(tmp_path / "missing.jsonl", 4) == [] and tf.eval_prefix(None, 4) == []
    assert not tf.trace_complete(p)
    with pytest.raises(tf.TraceError, match=r"crash.jsonl:5: not valid JSON"):
        tf.read_trace(p)  # the strict reader does not guess
    p.write_text("\n".join([lines[0], "{bad", *lines[1:]]) + "\n")
    with pytest.raises(tf.TraceError, match=r"crash.jsonl:2: not valid JSON"):
        tf.eval_prefix(p, 4)  # only a cut last line is a crash; anything else is damage


def test_a_non_finite_evaluation_has_its_own_line_among_the_evals(tmp_path):
    p = tmp_path / "nan.jsonl"
    writer = tf.TraceWriter(p, "j", "rlhf")
    writer.eval(2, 1.0)
    writer.non_finite(4, "eval score nan")
    writer.eval(6, 0.5)
    with pytest.raises(tf.TraceError, match="non_finite step 6 after 6"):
        writer.non_finite(6, "eval score inf")  # evaluation steps increase across both kinds
    writer.end("completed", best_step=2, best_score=1.0)
    trace = tf.read_trace(p)
    assert [e["step"] for e in trace.evals] == [2, 6]  # what a replay decides on
    assert trace.non_finite == ({"kind": "non_finite", "step": 4, "what": "eval score nan"},)
    assert [line["kind"] for line in trace.lines()] == ["header", "eval", "non_finite", "eval", "end"]
    assert [line["step"] for line in tf.eval_prefix(p, 4)] == [2, 4]  # a resumed run keeps it too
    resumed = tf.TraceWriter(tmp_path / "resumed.jsonl", "j", "rlhf")
    resumed.append_raw(tf.eval_prefix(p, 6))
    assert tf.read_trace(tmp_path / "resumed.jsonl").non_finite == trace.non_finite
    head = json.dumps(_header())
    for bad, match in (
        ({"kind": "non_finite", "step": 4}, "non_finite field what must be a non-empty string"),
        ({"kind": "non_finite", "step": 4, "what": "nan", "eval_score": 1.0}, "unknown trace non_finite field"),
        ({"kind": "non_finite", "step": 2, "what": "nan"}, "evaluation steps must increase: non_finite step 2"),
    ):
        (tmp_path / "bad.jsonl").write_text(
            "\n".join([head, json.dumps({"kind": "eval", "step": 2, "eval_score": 1.0}), json.dumps(bad)]) + "\n"
        )
        with pytest.raises(tf.TraceError, match=rf"bad.jsonl:3: {match}"):
            tf.read_trace(tmp_path / "bad.jsonl")


def test_read_header_reads_only_the_first_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n" + json.dumps(_header(split="test")) + "\n{not json at all\n")
    assert tf.read_header(p)["split"] == "test"
    with pytest.raises(tf.TraceError, match=r"t.jsonl:3: not valid JSON"):
        tf.read_trace(p)
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(tf.TraceError, match=r"e.jsonl:1: empty trace"):
        tf.read_header(tmp_path / "e.jsonl")


def test_one_error_type_and_one_reader(tmp_path) -> None:  # noqa: ANN001
    """TraceError is the one error class (the library and the simulator raise it); read_trace is the one reader."""
    from evalstop_callbacks.trace import TraceError as lib_error
    from platform_sim.sim.traces import TraceError as sim_error

    assert tf.TraceError is lib_error is sim_error
    p = tf.write_trace(tmp_path / "t.jsonl", tf.make_header("j", "rlhf"), [tf.make_eval(1, 0.5), tf.make_eval(2, 0.4)])
    lines = tf.read_trace(p)
    assert isinstance(lines, tf.TraceLines) and [e["eval_score"] for e in lines.evals] == [0.5, 0.4]
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(tf.TraceError, match="bad.jsonl:1"):
        tf.read_trace(tmp_path / "bad.jsonl")
