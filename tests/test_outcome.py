"""How a run's end is told (:mod:`evalstop_callbacks.outcome`): the end-of-training summary the YAML integrations
print gives a loss as a loss (the core sees it negated), and observe mode's reason never says "stopped at".

A real transformers Trainer on the tests' tiny GPT-2 (CPU) with the trainer's own eval loss as the metric.
"""

from __future__ import annotations

from _callback_helpers import policy, sentences, tokenizer
from datasets import Dataset

from evalstop_callbacks import EvalStopCallback, MetricEvaluator
from evalstop_callbacks.outcome import run_summary, summary_text, worded

COMMON = dict(use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, save_strategy="no", seed=0)


def _encode(lines):
    tok = tokenizer()
    return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])


def test_a_loss_is_summarised_in_its_own_units(tmp_path) -> None:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    cb = EvalStopCallback(MetricEvaluator("loss"), eval_steps=2, k=50, job_type="sft", mode="observe")
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=5e-3, max_steps=4, **COMMON
    )
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=_encode(sentences("negative")),
        eval_dataset=_encode(sentences("positive", 16, seed=1)),
        data_collator=DataCollatorForLanguageModeling(tokenizer(), mlm=False),
        callbacks=[cb],
    )
    cb.attach(trainer)
    trainer.train()
    losses = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    summary = run_summary(cb, tmp_path)
    assert cb.best_score == -losses[cb.best_step]  # the core's convention: higher is better
    assert summary["best_score"] == losses[cb.best_step] == min(losses.values()) > 0  # the loss itself
    assert (summary["metric"], summary["output_dir"]) == ("loss", str(tmp_path))
    text = summary_text(summary, cb.restore_best)
    assert text.startswith(
        "EvalStop summary (observe mode): not stopped: trained to the end, last evaluation at step 4"
    )
    assert f"best evaluation: step {cb.best_step}, loss = {losses[cb.best_step]:.6g}" in text
    assert f"observe mode keeps and restores nothing: the model saved in {tmp_path} is the last step's" in text


def test_observe_mode_words_the_cores_stop_as_where_it_would_stop() -> None:
    reason = "stopped at step 40: 2 consecutive declines (k=2, min_delta=0)"
    assert worded(reason, "enforce") == reason
    assert worded(reason, "observe") == (
        "would stop at step 40 (observe mode: not stopped): 2 consecutive declines (k=2, min_delta=0)"
    )
    assert worded("per-example: " + reason, "observe").startswith("per-example: would stop at step 40 (observe")
