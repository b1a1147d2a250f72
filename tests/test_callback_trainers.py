"""EvalStopCallback inside real trainers (tiny GPT-2 on CPU, real TRL): GRPO, RLOO, DPO, SFT, plain Trainer.

The world score is real: completions sampled from the live policy for held-out prompts, scored by a gold function
(+1 per positive word, -1 per negative word). Training toward negative words (an anti-gold proxy, or negative
demonstrations) makes it decline; training toward positive words makes it rise.
"""

from __future__ import annotations

import pytest
from _callback_helpers import (
    TRAINER_ARGS,
    anti_gold,
    best_weights_steps,
    checkpoint_steps,
    first_k_decline_step,
    gold,
    policy,
    sentences,
    tiny_grpo,
    tokenizer,
    world_evaluator,
)
from datasets import Dataset

from evalstop_callbacks import EvalStopCallback, MetricEvaluator
from evalstop_callbacks.checkpoints import restore_checkpoint


def assert_stopped_at_decline(cb: EvalStopCallback, trainer, k: int = 2) -> None:
    expected = first_k_decline_step(cb.history, k)
    assert expected is not None, f"the world score did not decline: {cb.history}"
    assert cb.stopped_at == expected, (cb.stopped_at, cb.history)
    assert trainer.state.global_step == cb.stopped_at  # training really ended at the decision
    assert cb.history[-1]["step"] == cb.stopped_at
    assert cb.best_score == max(h["eval_score"] for h in cb.history)


def assert_restored_best(cb: EvalStopCallback, model, output_dir) -> None:
    """The live model scores exactly the best eval; the best checkpoint is on disk and scores the same."""
    ev = world_evaluator()
    assert cb.restored_from is not None and cb.restored_from == cb.best_checkpoint
    assert ev.evaluate(model, tokenizer()).score == cb.best_score
    # the best step is kept weights-only (no optimizer state), and only the current best is kept that way
    assert best_weights_steps(output_dir) == [cb.best_step]
    assert not (output_dir / f"evalstop-best-{cb.best_step}" / "optimizer.pt").exists()
    fresh = policy()
    restore_checkpoint(fresh, cb.restored_from)
    assert ev.evaluate(fresh, tokenizer()).score == cb.best_score


def test_grpo_stops_on_declining_world_score_and_restores_best(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2)
    trainer = tiny_grpo(tmp_path, cb, anti_gold, save_total_limit=1)
    trainer.train()
    assert_stopped_at_decline(cb, trainer)
    assert cb.stopped_at < 16
    assert_restored_best(cb, trainer.model, tmp_path)
    # save_total_limit=1: at the end the Trainer deletes every full checkpoint that is not the best (the stop step's)
    assert checkpoint_steps(tmp_path) == []
    assert trainer.state.best_global_step == cb.best_step
    assert trainer.state.best_model_checkpoint == cb.best_checkpoint
    assert trainer.state.best_metric == cb.best_score  # a world score: higher is better, stored as it is


def test_grpo_improving_run_is_not_stopped(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=4, k=2)
    trainer = tiny_grpo(tmp_path, cb, gold, max_steps=12)
    trainer.train()
    assert first_k_decline_step(cb.history, 2) is None, cb.history
    assert cb.stopped_at is None and cb.would_stop_at is None
    assert trainer.state.global_step == 12
    assert cb.history[-1]["eval_score"] > cb.history[0]["eval_score"]
    assert [h["step"] for h in cb.history] == [0, 4, 8, 12]  # step 0: the baseline
    # the last eval is the best: the model in memory is already the best one, nothing to restore
    assert cb.best_step == 12 and cb.restored_from is None
    # each new best replaced the previous weights-only folder: one on disk, no optimizer state, no full checkpoint
    scores = [h["eval_score"] for h in cb.history]
    assert sum(x > max(scores[:i], default=float("-inf")) for i, x in enumerate(scores)) >= 2
    assert best_weights_steps(tmp_path) == [12] and checkpoint_steps(tmp_path) == []
    assert not list((tmp_path / "evalstop-best-12").glob("optimizer*"))


def test_observe_mode_never_stops(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2, mode="observe")
    trainer = tiny_grpo(tmp_path, cb, anti_gold, max_steps=12)
    trainer.train()
    assert cb.would_stop_at == first_k_decline_step(cb.history, 2) is not None
    assert cb.stopped_at is None and trainer.state.global_step == 12
    assert cb.restored_from is None and checkpoint_steps(tmp_path) == []  # shadow runs change nothing
    assert best_weights_steps(tmp_path) == []
    assert world_evaluator().evaluate(trainer.model, tokenizer()).score == cb.history[-1]["eval_score"]


def test_rloo_stops_on_declining_world_score(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2)
    trainer = tiny_grpo(tmp_path, cb, anti_gold, save_total_limit=1, algo="rloo")
    trainer.train()
    assert_stopped_at_decline(cb, trainer)
    assert_restored_best(cb, trainer.model, tmp_path)


def dpo(tmp_path, cb, toward: str):
    from trl import DPOConfig, DPOTrainer

    good, bad = sentences("positive", 48), sentences("negative", 48)
    chosen, rejected = (good, bad) if toward == "positive" else (bad, good)
    data = Dataset.from_dict(
        {
            "prompt": [s.split(" is ")[0] + " is" for s in chosen],
            "chosen": [c[len(c.split(" is ")[0]) + 3 :] for c in chosen],
            "rejected": [r[len(r.split(" is ")[0]) + 3 :] for r in rejected],
        }
    )
    args = DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=2e-3,
        max_steps=12,
        max_length=32,
        beta=0.1,
        save_total_limit=1,
        **TRAINER_ARGS,
    )
    return DPOTrainer(
        model=policy(), ref_model=policy(), args=args, processing_class=tokenizer(), train_dataset=data, callbacks=[cb]
    )


def test_dpo_stops_on_declining_world_score(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2, job_type="dpo")
    trainer = dpo(tmp_path, cb, toward="negative")
    trainer.train()
    assert_stopped_at_decline(cb, trainer)
    assert_restored_best(cb, trainer.model, tmp_path)


def test_dpo_improving_run_is_not_stopped(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=3, k=2, job_type="dpo")
    trainer = dpo(tmp_path, cb, toward="positive")
    trainer.train()
    assert first_k_decline_step(cb.history, 2) is None and cb.stopped_at is None, cb.history
    assert trainer.state.global_step == 12


def sft(tmp_path, cb, kind: str, peft_config=None, lr=5e-3, max_steps=12):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=lr,
        max_steps=max_steps,
        max_length=32,
        dataset_text_field="text",
        save_total_limit=1,
        **TRAINER_ARGS,
    )
    return SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        peft_config=peft_config,
        train_dataset=Dataset.from_dict({"text": sentences(kind)}),
        callbacks=[cb],
    )


def test_sft_stops_on_declining_world_score(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2, job_type="sft")
    trainer = sft(tmp_path, cb, "negative")
    trainer.train()
    assert_stopped_at_decline(cb, trainer)
    assert_restored_best(cb, trainer.model, tmp_path)


def test_sft_improving_run_is_not_stopped(tmp_path):
    cb = EvalStopCallback(world_evaluator(), eval_steps=3, k=2, job_type="sft")
    trainer = sft(tmp_path, cb, "positive")
    trainer.train()
    assert first_k_decline_step(cb.history, 2) is None and cb.stopped_at is None, cb.history
    assert cb.history[-1]["eval_score"] > cb.history[0]["eval_score"]


def test_sft_lora_restores_the_best_adapter(tmp_path):
    from peft import LoraConfig

    cb = EvalStopCallback(world_evaluator(), eval_steps=2, k=2, job_type="lora")
    trainer = sft(
        tmp_path,
        cb,
        "negative",
        LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], lora_dropout=0.0, task_type="CAUSAL_LM"),
        lr=1e-1,
    )
    trainer.train()
    assert_stopped_at_decline(cb, trainer)
    assert (tmp_path / f"evalstop-best-{cb.best_step}" / "adapter_model.safetensors").exists()
    assert world_evaluator().evaluate(trainer.model, tokenizer()).score == cb.best_score


@pytest.mark.parametrize("kind,stops", [("negative", True), ("positive", False)])
def test_plain_trainer_with_metric_evaluator(tmp_path, kind, stops):
    """Plain Trainer, score = minus the eval loss on positive held-out text (MetricEvaluator, trainer.evaluate)."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tokenizer()

    def encode(lines):
        return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    heldout = sentences("positive", 32, seed=1)  # fresh sentences of the positive kind
    cb = EvalStopCallback(MetricEvaluator("loss", greater_is_better=False), eval_steps=2, k=2, job_type="other")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=12,
        save_total_limit=1,
        **TRAINER_ARGS,
    )
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=encode(sentences(kind)),
        eval_dataset=encode(heldout),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        callbacks=[cb],
    )
    trainer.train()
    if stops:
        assert_stopped_at_decline(cb, trainer)
        assert trainer.evaluate()["eval_loss"] == pytest.approx(-cb.best_score, abs=1e-6)
        # transformers' convention for a loss: best_metric is the loss itself (positive), not EvalStop's score
        assert trainer.state.best_metric == -cb.best_score > 0
    else:
        assert first_k_decline_step(cb.history, 2) is None and cb.stopped_at is None, cb.history
        assert len(cb.history) == 7  # step 0 and every 2 steps


def test_sft_with_the_shape_detector_reads_per_example_scores(tmp_path):
    # A detector chosen by name and parameters in the callback gets the evaluator's per-example scores through the
    # embedded client: its paired noise estimate exists, and its decisions are those of the core on the same reports.
    spec = {"name": "shape", "params": {"threshold": 0.8, "min_evals": 3}}
    cb = EvalStopCallback(world_evaluator(), eval_steps=2, job_type="sft", detector=spec)
    trainer = sft(tmp_path, cb, "negative")
    trainer.train()
    monitor = cb.client.monitor(cb.job_id)
    assert monitor.detector.name == "shape" and monitor.detector.paired_pairs == len(cb.history) - 1
    assert monitor.detector.steps == [h["step"] for h in cb.history]
    assert monitor.detector.means == [h["eval_score"] for h in cb.history]
    # The world score falls from the first eval on: past its peak as soon as the model has its 3 points.
    assert cb.stopped_at == cb.history[2]["step"] and monitor.detector.last_posterior > 0.8
    assert_restored_best(cb, trainer.model, tmp_path)
