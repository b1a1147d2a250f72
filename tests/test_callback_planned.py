"""A real transformers Trainer: the callback's reports carry the run's planned steps (the trainer's ``max_steps``),
the detector receives them and, on means alone, decides with the per-run test by planned progress."""

from __future__ import annotations

import json

import httpx
import numpy as np
from _callback_helpers import TRAINER_ARGS, policy, sentences, tokenizer
from datasets import Dataset
from service_support import auth, tenant_server

from evalstop_callbacks import EmbeddedClient, EvalStopCallback
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import EvidenceMode

HELDOUT = 16
MAX_STEPS = 12


def _token_accuracy(pred) -> dict[str, float]:
    """The mean share of held-out tokens the model predicts (argmax): a mean alone, no spread."""
    preds, labels = pred.predictions[:, :-1], pred.label_ids[:, 1:]  # a causal LM predicts the next token
    mask = labels != -100
    return {"accuracy": float((((preds == labels) & mask).sum(axis=1) / mask.sum(axis=1)).mean())}


def _argmax(logits, labels):
    return logits.argmax(dim=-1)


def _trainer(tmp_path, cb: EvalStopCallback):
    """A tiny GPT-2 trained on one kind of sentence for MAX_STEPS steps, evaluated at every step on another: the
    trainer logs a mean token accuracy, no spread."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tokenizer()

    def encode(lines):
        return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=HELDOUT,
        learning_rate=5e-3,
        max_steps=MAX_STEPS,
        eval_strategy="steps",
        eval_steps=1,
        metric_for_best_model="accuracy",
        greater_is_better=True,
        **TRAINER_ARGS,
    )
    return Trainer(
        model=policy(),
        args=args,
        train_dataset=encode(sentences("negative")),
        eval_dataset=encode(sentences("positive", HELDOUT, seed=1)),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        compute_metrics=_token_accuracy,
        preprocess_logits_for_metrics=_argmax,
        callbacks=[cb],
    )


def test_the_trainers_max_steps_reach_the_detector_as_planned_steps(tmp_path) -> None:
    client = EmbeddedClient()
    cb = EvalStopCallback(client=client, trace_path=tmp_path / "trace.jsonl", job_type="other")
    trainer = _trainer(tmp_path, cb)
    trainer.train()
    monitor = client.monitor(cb.job.job_id)
    assert len(monitor.steps) >= 6, monitor.steps
    # The detector holds the plan it was handed with every report: the trainer's max_steps.
    state = monitor.detector.state_dict()
    assert state["planned"]["planned"][0] == MAX_STEPS
    # Its window: the evals of the last fifth of the 12 planned steps (2.4 steps), at least the default's 6 evals.
    assert state["planned"]["steps"] == monitor.steps[-6:]
    # Means only (the trainer logs no spread): the history says so, and the trace's header records the same plan.
    assert cb.history and all(h["mode"] == EvidenceMode.MEANS_ONLY.value for h in cb.history if h.get("mode"))
    header = json.loads((tmp_path / "trace.jsonl").read_text().splitlines()[0])
    assert header["planned_steps"] == MAX_STEPS
    assert np.isfinite(monitor.best_score)


def test_through_the_service_the_job_registers_the_trainers_max_steps(tmp_path) -> None:
    # The service decides with the plan a job registered (a report's planned_steps is no wire field), so the callback
    # registers the trainer's max_steps: a PlatformClient given no planned_steps still gets the per-run test.
    (tmp_path / "svc").mkdir()
    with tenant_server(tmp_path / "svc") as (srv, token), PlatformClient(srv.url, token) as client:
        cb = EvalStopCallback(client=client, job_type="other")
        _trainer(tmp_path / "run", cb).train()
        job = httpx.get(f"{srv.url}/v1/jobs/{cb.job.job_id}", headers=auth(token), timeout=10).json()
        assert job["planned_steps"] == MAX_STEPS
        assert client.last_source == "service" and len(cb.history) >= 6
