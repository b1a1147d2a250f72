"""A real transformers Trainer whose own evaluation logs a mean and its standard deviation: ``EvalStopCallback()`` with
no arguments reads ``metric_for_best_model`` and its ``.../std`` sibling, counts the eval set, sends both with every
report (its trace shows them) and decides in mean-and-spread mode (its history says so)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _callback_helpers import TRAINER_ARGS, policy, sentences, tokenizer
from datasets import Dataset

from evalstop_callbacks import EvalStopCallback, MetricEvaluator
from platform_sim.core import EvidenceMode

HELDOUT = 32


def _token_accuracy(pred) -> dict[str, float]:
    """Per held-out sentence, the share of its tokens the model predicts (argmax); their mean and sample std."""
    preds, labels = pred.predictions[:, :-1], pred.label_ids[:, 1:]  # a causal LM predicts the next token
    mask = labels != -100
    per_sentence = ((preds == labels) & mask).sum(axis=1) / mask.sum(axis=1)
    return {"positive/mean": float(per_sentence.mean()), "positive/std": float(np.std(per_sentence, ddof=1))}


def _argmax(logits, labels):
    return logits.argmax(dim=-1)


@pytest.mark.parametrize("kind", ["negative"])
def test_a_trainer_logging_mean_and_std_makes_the_callback_decide_on_the_spread(tmp_path, kind, caplog) -> None:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tokenizer()

    def encode(lines):
        return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    cb = EvalStopCallback(trace_path=tmp_path / "trace.jsonl", job_type="other")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=HELDOUT,
        learning_rate=5e-3,
        max_steps=12,
        eval_strategy="steps",
        eval_steps=2,
        metric_for_best_model="positive/mean",
        greater_is_better=True,
        **TRAINER_ARGS,
    )
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=encode(sentences(kind)),
        eval_dataset=encode(sentences("positive", HELDOUT, seed=1)),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        compute_metrics=_token_accuracy,
        preprocess_logits_for_metrics=_argmax,
        callbacks=[cb],
    )
    with caplog.at_level("INFO", logger="evalstop_callbacks.evaluators.metric"):
        trainer.train()
    assert isinstance(cb.evaluator, MetricEvaluator) and cb.evaluator.metric == "positive/mean"
    told = [r.getMessage() for r in caplog.records if r.name == "evalstop_callbacks.evaluators.metric"]
    assert len(told) == 1 and "mean-and-spread" in told[0] and f"n from the eval set: {HELDOUT}" in told[0]
    # Every report carried the trainer's logged std and the eval set's size: the trace records what was sent.
    logged = {h["step"]: h["eval_positive/std"] for h in trainer.state.log_history if "eval_positive/std" in h}
    lines = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    evals = [line for line in lines if line["kind"] == "eval"]
    assert evals and all(e["eval_n"] == HELDOUT for e in evals)
    assert all(e["eval_std"] == pytest.approx(logged[e["step"]]) for e in evals)
    # The detector decided on the mean with its spread (its reason says so), and the history names that mode.
    assert EvidenceMode.of_reason(cb.last_decision.reason) is EvidenceMode.MEAN_AND_SPREAD, cb.last_decision
    assert cb.history and all(h["mode"] == EvidenceMode.MEAN_AND_SPREAD.value for h in cb.history), cb.history
