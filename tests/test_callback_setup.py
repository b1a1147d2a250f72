"""What a user meets first: the evalstop/* keys in the trainer's logs, errors before the first optimizer step, and
``EvalStopCallback()`` with the trainer's own eval metric and cadence (steps, epochs, dict eval datasets).

Real trainers on a tiny GPT-2 (CPU). The reporting backends are checked through what every one of them is, a callback
that receives the trainer's ``on_log``, plus ``log_history`` in ``trainer_state.json``; a real TensorBoard event file
is read back in test_callback_tensorboard.py and wandb offline in test_callback_wandb.py.
"""

from __future__ import annotations

import json

import pytest
from _callback_helpers import (
    HELDOUT_PROMPTS,
    TRAIN_PROMPTS,
    anti_gold,
    best_weights_steps,
    checkpoint_steps,
    gold,
    policy,
    sentences,
    tokenizer,
)
from datasets import Dataset
from transformers import TrainerCallback

from evalstop_callbacks import EvalStopCallback, EvaluatorError, MetricEvaluator, RewardFunctionEvaluator
from platform_sim.core import default_spec, detector_from_spec

COMMON = dict(use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, save_strategy="no", seed=0)


class Reporter(TrainerCallback):
    """Stands for any report_to backend: they are all trainer callbacks fed by on_log."""

    def __init__(self):
        self.logs: list[tuple[int, dict]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs or {})))


def encode(lines):
    tok = tokenizer()
    return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])


def plain_trainer(tmp_path, callbacks, eval_dataset="positive", train="negative", **kw):
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    options = dict(per_device_train_batch_size=8, learning_rate=5e-3, max_steps=12, logging_steps=1, **COMMON)
    options.update(kw)
    if isinstance(eval_dataset, str):
        eval_dataset = encode(sentences(eval_dataset, 32, seed=1))
    return Trainer(
        model=policy(),
        args=TrainingArguments(output_dir=str(tmp_path), **options),
        train_dataset=encode(sentences(train)),
        eval_dataset=eval_dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer(), mlm=False),
        callbacks=callbacks,
    )


def sft(tmp_path, callbacks, **kw):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=12,
        max_length=32,
        dataset_text_field="text",
        logging_steps=1,
        **{**COMMON, **kw},
    )
    return SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        callbacks=callbacks,
        train_dataset=Dataset.from_dict({"text": sentences("negative")}),
    )


# -- logging through the trainer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reporter_first", [True, False])
def test_every_evaluation_reaches_log_history_and_every_logging_callback(tmp_path, reporter_first):
    cb = EvalStopCallback(
        RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8), eval_steps=2, k=2, job_type="sft"
    )
    rep = Reporter()
    trainer = sft(tmp_path, [rep, cb] if reporter_first else [cb, rep])
    cb.attach(trainer)  # the trainer's callback handler: every report_to backend gets the evalstop/* values
    trainer.train()
    assert cb.stopped_at is not None
    logged = [e for e in trainer.state.log_history if "evalstop/eval_score" in e]
    assert [(e["step"], e["evalstop/eval_score"], e["evalstop/declines"]) for e in logged] == [
        (h["step"], h["eval_score"], h["declines"]) for h in cb.history
    ]
    assert all(
        e["evalstop/best_score"] == max(h["eval_score"] for h in cb.history if h["step"] <= e["step"]) for e in logged
    )
    assert [e.get("evalstop/stop_step") for e in logged] == [None] * (len(logged) - 1) + [cb.stopped_at]
    assert logged[-1]["evalstop/stopped"] == 1 and all(e["evalstop/stopped"] == 0 for e in logged[:-1])
    # the backends got the same lines, at the evaluation's global_step
    seen = [(step, logs) for step, logs in rep.logs if "evalstop/eval_score" in logs]
    assert [(step, logs["evalstop/eval_score"]) for step, logs in seen] == [
        (h["step"], h["eval_score"]) for h in cb.history
    ]
    # the trainer's own loss log of an evaluation step still happens
    assert any(step == 2 and "loss" in logs for step, logs in rep.logs)
    # and they are in the stop checkpoint's trainer_state.json
    saved = json.loads((tmp_path / f"checkpoint-{cb.stopped_at}" / "trainer_state.json").read_text())
    assert [e["step"] for e in saved["log_history"] if "evalstop/eval_score" in e] == [h["step"] for h in cb.history]
    # disk, without save_total_limit: one weights-only best folder (no optimizer state) and the stop checkpoint
    assert checkpoint_steps(tmp_path) == [cb.stopped_at] and best_weights_steps(tmp_path) == [cb.best_step]
    assert not list((tmp_path / f"evalstop-best-{cb.best_step}").glob("optimizer*"))


# -- errors before the first optimizer step ----------------------------------------------------------------------


def test_metric_name_typo_raises_before_the_first_step(tmp_path):
    trainer = plain_trainer(tmp_path, [EvalStopCallback(MetricEvaluator("acuracy"), eval_steps=2)])
    with pytest.raises(
        EvaluatorError,
        match=r"at step 0 .*metric 'acuracy' is not among the trainer's eval metrics "
        r"\(.*eval_loss",
    ):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize(
    "reward_fn,needle",
    [
        (lambda prompts, completions, **kw: 1.0, "must return a list of 12 numbers (one per example), got one scalar"),
        (lambda prompts, completions, **kw: [1.0], "returned 1 scores for 12 held-out examples"),
        (lambda prompts, completions, **kw: {}["answer"], "KeyError: 'answer'"),
    ],
)
def test_reward_function_errors_raise_at_step_0_naming_step_and_example(tmp_path, reward_fn, needle):
    cb = EvalStopCallback(RewardFunctionEvaluator(HELDOUT_PROMPTS, reward_fn, max_new_tokens=2), eval_steps=2)
    trainer = sft(tmp_path, [cb])
    with pytest.raises(EvaluatorError) as info:
        trainer.train()
    assert "EvalStop evaluation at step 0 failed" in str(info.value) and needle in str(info.value), str(info.value)
    assert trainer.state.global_step == 0 and cb.history == []


def test_missing_tokenizer_raises_at_step_0(tmp_path):
    cb = EvalStopCallback(RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, max_new_tokens=2), eval_steps=2)
    trainer = plain_trainer(tmp_path, [cb])  # a plain Trainer without processing_class
    with pytest.raises(EvaluatorError, match="at step 0 failed: RewardFunctionEvaluator has no tokenizer"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_trainer_metrics_without_eval_dataset_fail_when_the_trainer_is_attached(tmp_path):
    cb = EvalStopCallback(eval_steps=2)
    trainer = plain_trainer(tmp_path, [cb], eval_dataset=None)
    with pytest.raises(ValueError) as info:
        cb.attach(trainer)
    assert "has no eval_dataset" in str(info.value) and "\n" not in str(info.value)


def test_grpo_without_a_world_evaluator_fails_in_one_line(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        max_steps=2,
        **COMMON,
    )
    for cb, needle in (
        (EvalStopCallback(), "needs a world score on GRPOTrainer"),
        (EvalStopCallback(RewardFunctionEvaluator(HELDOUT_PROMPTS, gold)), "has no cadence"),
    ):
        trainer = GRPOTrainer(
            model=policy(),
            reward_funcs=anti_gold,
            args=args,
            processing_class=tokenizer(),
            train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS}),
        )
        with pytest.raises(ValueError) as info:
            cb.attach(trainer)  # at once, and without attach at train(): the arguments' class names GRPOTrainer
        assert needle in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(ValueError, match=needle):
            trainer.train()


# -- what users expect -------------------------------------------------------------------------------------------


def test_no_argument_callback_on_plain_trainer_stops_overfitting_and_restores_best(tmp_path):
    cb = EvalStopCallback()
    trainer = plain_trainer(tmp_path, [cb], eval_strategy="steps", eval_steps=2)
    trainer.train()
    assert cb.evaluator.describe() == {"evaluator": "MetricEvaluator", "metric": "loss", "greater_is_better": False}
    assert [h["step"] for h in cb.history][:3] == [0, 2, 4]  # the trainer's eval interval, from the baseline
    assert cb.detector_spec == detector_from_spec(default_spec()).spec()  # no arguments: the project's default
    assert cb.stopped_at is not None and cb.history[-1] == {**cb.history[-1], "step": cb.stopped_at, "action": "stop"}
    assert all(h["action"] == "continue" for h in cb.history[:-1])
    assert trainer.state.global_step == cb.stopped_at
    assert cb.restored_from is not None
    assert trainer.evaluate()["eval_loss"] == pytest.approx(-cb.best_score, abs=1e-6)  # the best weights are back
    assert trainer.state.best_metric == pytest.approx(-cb.best_score)  # a loss, as transformers stores it


def test_metric_for_best_model_is_the_default_metric(tmp_path):
    cb = EvalStopCallback()
    trainer = plain_trainer(
        tmp_path,
        [cb],
        eval_strategy="steps",
        eval_steps=4,
        metric_for_best_model="loss",
        greater_is_better=False,
        max_steps=4,
    )
    trainer.train()
    assert cb.evaluator.metric == "loss" and not cb.evaluator.greater_is_better
    assert [h["step"] for h in cb.history] == [0, 4]


@pytest.mark.parametrize("world_evaluator", [False, True])
def test_per_epoch_cadence(tmp_path, world_evaluator):
    # 16 training examples, batch 8: an epoch is 2 steps
    if world_evaluator:
        cb = EvalStopCallback(
            RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, max_new_tokens=4, tokenizer=tokenizer()),
            eval_steps="epoch",
            mode="observe",
        )
        kw = {}
    else:
        cb = EvalStopCallback(mode="observe")
        kw = {"eval_strategy": "epoch"}
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=3, **COMMON, **kw
    )
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=encode(sentences("negative", 16)),
        eval_dataset=encode(sentences("positive", 16, seed=1)),
        data_collator=DataCollatorForLanguageModeling(tokenizer(), mlm=False),
        callbacks=[cb],
    )
    trainer.train()
    assert [h["step"] for h in cb.history] == [0, 2, 4, 6]


def test_dict_eval_datasets(tmp_path):
    data = {"a": encode(sentences("negative", 16, seed=2)), "b": encode(sentences("positive", 16, seed=1))}
    cb = EvalStopCallback(MetricEvaluator("b_loss"), eval_steps=2, mode="observe")
    trainer = plain_trainer(tmp_path, [cb], eval_dataset=data, max_steps=4)
    cb.attach(trainer)
    trainer.train()
    b_losses = [e["eval_b_loss"] for e in trainer.state.log_history if "eval_b_loss" in e]
    assert [h["eval_score"] for h in cb.history] == [-x for x in b_losses] and len(cb.history) == 3
    typo_cb = EvalStopCallback(MetricEvaluator("c_loss"), eval_steps=2)
    typo = plain_trainer(tmp_path / "typo", [typo_cb], eval_dataset=data)
    typo_cb.attach(typo)  # a dict eval_dataset: the trainer says which datasets' metrics are still to come
    with pytest.raises(EvaluatorError, match=r"at step 0 .*'c_loss' is not among .*eval_a_loss.*eval_b_loss"):
        typo.train()


def test_k_next_to_a_detector_without_k_is_not_silently_ignored(caplog):
    with caplog.at_level("WARNING", logger="evalstop_callbacks.callback"):
        cb = EvalStopCallback(eval_steps=2, k=3, min_delta=0.1, detector="shape")
        EvalStopCallback(eval_steps=2, k=2, detector={"name": "k-decline", "params": {"k": 2}})  # agreeing: quiet
    assert cb.detector_spec["name"] == "shape" and cb.detector_spec["params"]["k"] == 1
    assert "k=3 is not used: the detector spec decides, and 'shape' has k=1" in caplog.text
    assert "min_delta=0.1 is not used: detector 'shape' has no min_delta parameter" in caplog.text
    assert len(caplog.records) == 2


def test_argument_errors():
    with pytest.raises(EvaluatorError, match="greater_is_better must be True, False or None, got 'no'"):
        MetricEvaluator("loss", greater_is_better="no")
    assert MetricEvaluator("loss").greater_is_better is False and MetricEvaluator("accuracy").greater_is_better
    with pytest.raises(ValueError, match="eval_steps must be an integer >= 1"):
        EvalStopCallback(eval_steps="every")


def test_platform_client_is_exported():
    import evalstop_callbacks
    from evalstop_callbacks.platform_client import PlatformClient

    assert evalstop_callbacks.PlatformClient is PlatformClient and "PlatformClient" in evalstop_callbacks.__all__


def test_arguments_after_the_evaluator_are_keyword_only_and_the_stop_exception_has_one_path():
    with pytest.raises(TypeError, match="positional"):
        EvalStopCallback(None, 10, 3)  # eval_steps=10, k=3 positionally would switch the detector silently
    import evalstop_callbacks
    import evalstop_callbacks.callback as callback_module
    from evalstop_callbacks.trainer_compat import EvalStopTrainingStopped

    assert evalstop_callbacks.EvalStopTrainingStopped is EvalStopTrainingStopped
    assert not hasattr(callback_module, "EvalStopTrainingStopped")
