"""wandb integration: with report_to=["wandb"] (offline), the eval score, declines and the stop reach the run files.

The per-evaluation keys arrive through the trainer's own logs (transformers' WandbCallback writes them as
``train/evalstop/...``); the stop's summary fields and the alert come from EvalStop itself.
"""

from __future__ import annotations

import time

import pytest
from _callback_helpers import HELDOUT_PROMPTS, gold, policy, sentences, tokenizer
from datasets import Dataset

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator


def test_wandb_offline_run_has_evalstop_keys(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from trl import SFTConfig, SFTTrainer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "evalstop-test")
    cb = EvalStopCallback(
        RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, max_new_tokens=8), eval_steps=2, k=2, job_type="sft"
    )
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=14,
        max_length=32,
        use_cpu=True,
        bf16=False,
        report_to=["wandb"],
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        callbacks=[cb],
        train_dataset=Dataset.from_dict({"text": sentences("negative")}),
    )
    cb.attach(trainer)  # the evalstop/* values reach report_to backends through the trainer's callbacks
    try:
        trainer.train()
    finally:
        wandb.finish()
        wandb.teardown()  # stops the wandb service, which writes the offline run file
    assert cb.stopped_at is not None
    run_files = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, list(tmp_path.rglob("*"))
    keys = (
        b"train/evalstop/eval_score",
        b"train/evalstop/declines",
        b"train/evalstop/best_score",
        b"train/evalstop/stop_step",
        b"evalstop/stopped_at",
        b"evalstop/stop_reason",
        b"EvalStop stopped training",
    )
    deadline = time.monotonic() + 30
    while not all(k in run_files[0].read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.5)  # the service may still be flushing on a loaded machine
    data = run_files[0].read_bytes()
    for key in keys:
        assert key in data, key
    assert b"EvalStop stopped training" in data  # the alert record
