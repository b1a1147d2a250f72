"""The JSONL trace (format evalstop-trace/1): recorder rules, and the trace a real run writes."""

from __future__ import annotations

import json

import pytest
from _callback_helpers import HELDOUT_PROMPTS, gold, policy, sentences, tokenizer
from datasets import Dataset

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator, TraceRecorder
from evalstop_callbacks.trace import TraceError
from platform_sim.trace_format import read_trace


def test_recorder_writes_header_evals_end(tmp_path):
    path = tmp_path / "sub" / "t.jsonl"
    rec = TraceRecorder(path, job_id="j", job_type="rlhf", trainer="GRPOTrainer", planned_steps=30, world_size=1)
    rec.eval(10, 1.5, eval_scores=[1, 2], proxy_reward=0.3, train_loss=None)
    rec.eval(20, 1.0, kl=0.01, wall_s=3.5)
    rec.end("stopped", stopped_at=20, best_step=10, best_score=1.5)
    rec.end("completed", best_step=None, best_score=None)  # second end: ignored
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0] == {
        "kind": "header",
        "format": "evalstop-trace/1",
        "job_id": "j",
        "job_type": "rlhf",
        "trainer": "GRPOTrainer",
        "planned_steps": 30,
        "world_size": 1,
    }
    assert lines[1] == {"kind": "eval", "step": 10, "eval_score": 1.5, "eval_scores": [1.0, 2.0], "proxy_reward": 0.3}
    assert lines[2] == {"kind": "eval", "step": 20, "eval_score": 1.0, "kl": 0.01, "wall_s": 3.5}
    assert lines[3] == {"kind": "end", "reason": "stopped", "stopped_at": 20, "best_step": 10, "best_score": 1.5}
    assert read_trace(path).lines() == lines


def test_recorder_rejects_bad_lines(tmp_path):
    rec = TraceRecorder(tmp_path / "t.jsonl", job_id="j", job_type="rlhf")
    rec.eval(5, 1.0)
    with pytest.raises(TraceError, match="steps must increase: step 5 after 5"):
        rec.eval(5, 1.0)
    with pytest.raises(TraceError, match="eval_score must be a finite number"):
        rec.eval(6, float("nan"))
    with pytest.raises(TraceError, match="unknown trace eval field.*hostname"):
        rec.eval(6, 1.0, hostname="gpu-7")
    with pytest.raises(TraceError, match="unknown trace header field"):
        TraceRecorder(tmp_path / "u.jsonl", job_id="j", job_type="rlhf", token="secret")


def test_read_trace_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"kind": "header", "format": "evalstop-trace/1", "job_id": "j", "job_type": "rlhf"}\n'
        '{"kind": "eval", "step": 4, "eval_score": 1}\n{"kind": "eval", "step": 2, "eval_score": 1}\n'
    )
    with pytest.raises(TraceError, match=r"bad.jsonl:3: eval steps must be increasing"):
        read_trace(path).lines()
    path.write_text('{"kind": "eval", "step": 4, "eval_score": 1}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:1: the first line must be"):
        read_trace(path).lines()


def test_real_run_trace_has_scores_loss_extras_and_end(tmp_path):
    from trl import SFTConfig, SFTTrainer

    ev = RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, max_new_tokens=8)
    cb = EvalStopCallback(
        ev,
        eval_steps=2,
        k=2,
        job_type="sft",
        job_id="traced",
        trace_path=str(tmp_path / "t.jsonl"),
        trace_extras=lambda args, state: {"proxy_reward": float(state.global_step), "gpu_s": None},
    )
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=14,
        max_length=32,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        callbacks=[cb],
        train_dataset=Dataset.from_dict({"text": sentences("negative")}),
    ).train()
    lines = read_trace(tmp_path / "t.jsonl").lines()
    header, evals, end = lines[0], lines[1:-1], lines[-1]
    assert header["job_id"] == "traced" and header["job_type"] == "sft" and header["trainer"] == "SFTTrainer"
    assert header["planned_steps"] == 14 and header["world_size"] == 1
    assert header["config"]["detector"] == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
    assert [e["step"] for e in evals] == [h["step"] for h in cb.history]
    assert [e["eval_score"] for e in evals] == [h["eval_score"] for h in cb.history]
    assert evals[0]["step"] == 0 and "train_loss" not in evals[0]  # the baseline: before any training step
    for e in evals:
        assert len(e["eval_scores"]) == len(HELDOUT_PROMPTS)
        assert e["proxy_reward"] == e["step"]  # from trace_extras
        assert e["wall_s"] > 0
    for e in evals[1:]:
        assert "train_loss" in e  # loss from the trainer's own log of that step
    assert [e["wall_s"] for e in evals] == sorted(e["wall_s"] for e in evals)
    assert end == {
        "kind": "end",
        "reason": "stopped",
        "stopped_at": cb.stopped_at,
        "best_step": cb.best_step,
        "best_score": cb.best_score,
    }
    # the simulator's strict reader takes it as a real trace
    from platform_sim.sim.traces import load_trace as sim_read_trace

    real = sim_read_trace(tmp_path / "t.jsonl")
    assert list(real.steps) == [h["step"] for h in cb.history] and list(real.proxy) == list(real.steps)
