"""Resume: the detector state, the best checkpoint and the trace survive ``resume_from_checkpoint``.

A run crashes after its checkpoint at step 4 (one decline seen, best at step 2). A fresh trainer with a fresh callback
and a fresh embedded client resumes from checkpoint-4: it must stop exactly where an uninterrupted run stops (a
callback that forgot the decline would stop one eval later) and restore the same best checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _callback_helpers import HELDOUT_PROMPTS, gold, policy, sentences, tokenizer
from datasets import Dataset
from transformers import TrainerCallback

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator
from platform_sim.trace_format import read_trace


class _Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            raise KeyboardInterrupt("simulated crash at step 5")


def _run(out, cb, extra=(), resume=None):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(out),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=14,
        max_length=32,
        dataset_text_field="text",
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        seed=0,
    )
    trainer = SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        train_dataset=Dataset.from_dict({"text": sentences("negative")}),
        callbacks=[cb, *extra],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _cb(trace):
    return EvalStopCallback(
        RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8),
        eval_steps=2,
        k=3,
        job_id="sft-resume",
        job_type="sft",
        trace_path=str(trace),
    )


def test_resume_restores_detector_state_and_best_checkpoint(tmp_path):
    ref = _cb(tmp_path / "ref.jsonl")
    _run(tmp_path / "ref", ref)
    assert ref.stopped_at is not None and ref.history[1]["declines"] == 1, ref.history

    crashed = _cb(tmp_path / "run.jsonl")
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "run", crashed, extra=[_Crash()])
    resumed = _cb(tmp_path / "run.jsonl")  # fresh callback, fresh EmbeddedClient
    trainer = _run(tmp_path / "run", resumed, resume=str(tmp_path / "run" / "checkpoint-4"))

    assert resumed.history[:2] == ref.history[:2]  # loaded from checkpoint-4, not re-evaluated
    assert resumed.history == ref.history
    assert resumed.stopped_at == ref.stopped_at == trainer.state.global_step
    assert (resumed.best_step, resumed.best_score) == (ref.best_step, ref.best_score)
    # the same best folder: the trainer's checkpoint of that step, or EvalStop's weights-only one (step 0)
    assert Path(resumed.restored_from).name == Path(ref.restored_from).name
    assert Path(resumed.restored_from).name.endswith(f"-{ref.best_step}")
    # the evaluation time spent before the crash carries over (max_eval_share budgets the whole run)
    state = json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())
    saved = state["stateful_callbacks"]["EvalStopCallback"]["attributes"]["evalstop"]
    assert saved["eval_s"] > 0
    total = resumed.state()["attributes"]["evalstop"]["eval_s"]
    assert total == pytest.approx(saved["eval_s"] + sum(resumed.eval_seconds))
    monitor = resumed.client.monitor("sft-resume")
    assert monitor.steps == [h["step"] for h in ref.history] and monitor.stopped_at == ref.stopped_at
    # the trace continues the one of the crashed run: same eval lines as the uninterrupted run
    evals = [
        (line["step"], line["eval_score"])
        for line in read_trace(tmp_path / "run.jsonl").lines()
        if line["kind"] == "eval"
    ]
    assert evals == [
        (line["step"], line["eval_score"])
        for line in read_trace(tmp_path / "ref.jsonl").lines()
        if line["kind"] == "eval"
    ]
