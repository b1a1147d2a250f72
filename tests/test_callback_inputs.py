"""Bad input gets a clear error naming the problem: at construction where possible, never a silent stop."""

from __future__ import annotations

import math

import pytest
from _callback_helpers import HELDOUT_PROMPTS, gold, policy, sentences, tokenizer
from datasets import Dataset

from evalstop_callbacks import (
    EvalResult,
    EvalStopCallback,
    Evaluator,
    EvaluatorError,
    MetricEvaluator,
    RewardFunctionEvaluator,
    RewardModelEvaluator,
)
from evalstop_callbacks.demo.tiny import build_scalar_model


def world():
    return RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, max_new_tokens=4)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"eval_steps": 0}, "eval_steps must be an integer >= 1"),
        ({"eval_steps": 2.5}, "eval_steps must be an integer >= 1"),
        ({"eval_steps": 2, "k": 0}, "k must be an integer >= 1"),
        ({"eval_steps": 2, "min_delta": float("nan")}, "min_delta"),
        ({"eval_steps": 2, "min_delta": -0.1}, "min_delta"),
        ({"eval_steps": 2, "job_type": "ppo"}, "job_type must be one of rlhf, dpo, lora, sft, other"),
        ({"eval_steps": 2, "mode": "shadow"}, "mode must be 'enforce' or 'observe'"),
        ({"eval_steps": 2, "job_id": ""}, "job_id"),
        ({"eval_steps": 2, "detector": "no-such-rule"}, "unknown detector 'no-such-rule'"),
    ],
)
def test_bad_callback_arguments_fail_at_construction(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        EvalStopCallback(world(), **kwargs)


def test_bad_evaluator_and_client_types():
    with pytest.raises(TypeError, match="evaluator must be an evalstop_callbacks Evaluator"):
        EvalStopCallback(gold, eval_steps=2)
    with pytest.raises(TypeError, match="client must implement register/report/finish"):
        EvalStopCallback(world(), eval_steps=2, client=object())


def test_detector_spec_replaces_k_decline():
    cb = EvalStopCallback(world(), eval_steps=2, detector={"name": "k-decline", "params": {"k": 3}})
    assert cb.detector_spec == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    assert EvalStopCallback(world(), eval_steps=2, k=4, min_delta=0.1).detector_spec == {
        "name": "k-decline",
        "params": {"k": 4, "min_delta": 0.1},
    }


def test_empty_and_malformed_prompts():
    with pytest.raises(EvaluatorError, match="prompts is empty"):
        RewardFunctionEvaluator([], gold)
    with pytest.raises(EvaluatorError, match="prompts must be a list"):
        RewardFunctionEvaluator("the bird is", gold)
    with pytest.raises(EvaluatorError, match=r"prompts\[1\] must be a string"):
        RewardFunctionEvaluator(["ok", 3], gold)
    with pytest.raises(EvaluatorError, match="max_new_tokens must be an integer >= 1"):
        RewardFunctionEvaluator(["ok"], gold, max_new_tokens=0)


def test_reward_fn_with_the_wrong_signature():
    def positional(texts):
        return [0.0] * len(texts)

    def needs_label(prompts, completions, label):
        return [0.0] * len(prompts)

    with pytest.raises(EvaluatorError, match="wrong signature.*'prompts' is missing"):
        RewardFunctionEvaluator(["a"], positional)
    with pytest.raises(EvaluatorError, match="wrong signature.*requires label"):
        RewardFunctionEvaluator(["a"], needs_label)
    with pytest.raises(EvaluatorError, match="reward_fn must be callable"):
        RewardFunctionEvaluator(["a"], 3.0)
    # TRL's own style passes: named parameters plus **kwargs, or only **kwargs
    RewardFunctionEvaluator(["a"], lambda prompts, completions, **kw: [0.0] * len(prompts))
    RewardFunctionEvaluator(["a"], lambda **kw: [0.0] * len(kw["prompts"]))
    with pytest.raises(EvaluatorError, match=r"reward_kwargs\['answer'\] has 1 entries for 2 prompts"):
        RewardFunctionEvaluator(["a", "b"], gold, reward_kwargs={"answer": ["x"]})


def test_reward_fn_returning_nan_gives_a_nan_eval_and_a_wrong_length_is_an_error(caplog):
    model, tok = policy(), tokenizer()
    nan = RewardFunctionEvaluator(
        HELDOUT_PROMPTS,
        lambda prompts, completions, **kw: [math.nan if i == 1 else 0.5 for i in range(len(prompts))],
        tokenizer=tok,
        max_new_tokens=2,
    )
    # a NaN score is not a bug of the call: it is kept, warned about by example, and makes the eval NaN, which the
    # callback's non-finite policy records and does not decide on (tests/test_callback_nonfinite.py)
    result = nan.evaluate(model)
    assert math.isnan(result.score) and result.scores is not None and math.isnan(result.scores[1])
    assert result.scores[0] == 0.5
    assert f"non-finite score (nan) for example 1 (prompt {HELDOUT_PROMPTS[1]!r})" in caplog.text
    short = RewardFunctionEvaluator(
        HELDOUT_PROMPTS, lambda prompts, completions, **kw: [1.0], tokenizer=tok, max_new_tokens=2
    )
    with pytest.raises(EvaluatorError, match=f"returned 1 scores for {len(HELDOUT_PROMPTS)} held-out examples"):
        short.evaluate(model)
    with pytest.raises(EvaluatorError, match="has no tokenizer"):
        world().evaluate(model)


def test_reward_model_evaluator_checks_and_scores():
    tok = tokenizer()
    with pytest.raises(EvaluatorError, match="one output"):
        from transformers import GPT2Config, GPT2ForSequenceClassification

        RewardModelEvaluator(
            ["a"], GPT2ForSequenceClassification(GPT2Config(n_layer=1, n_embd=8, n_head=1, num_labels=2))
        )
    ev = RewardModelEvaluator(HELDOUT_PROMPTS, build_scalar_model(tok), tokenizer=tok, max_new_tokens=4)
    model = policy()
    model.train()
    first, again = ev.evaluate(model), ev.evaluate(model)
    assert math.isfinite(first.score) and len(first.scores) == len(HELDOUT_PROMPTS)
    assert first == again  # fixed seed: equal weights, equal score
    assert model.training  # mode restored


def test_evaluation_does_not_change_the_training_rng():
    import random

    import numpy as np
    import torch

    def noisy_gold(prompts, completions, **kw):  # a reward function that draws from the global generators
        random.random(), np.random.rand()
        return gold(prompts, completions)

    model, tok = policy(), tokenizer()
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    RewardFunctionEvaluator(HELDOUT_PROMPTS, noisy_gold, max_new_tokens=4).evaluate(model, tok)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_metric_evaluator_errors():
    ev = MetricEvaluator("accuracy")
    with pytest.raises(EvaluatorError, match="metric 'accuracy' is not among the trainer's eval metrics"):
        ev.from_metrics({"eval_loss": 1.0})
    assert math.isnan(ev.from_metrics({"eval_accuracy": float("nan")}).score)  # for the non-finite policy to take
    assert MetricEvaluator("loss", greater_is_better=False).from_metrics({"eval_loss": 2.0}).score == -2.0


class _NaNAtSecondEval(Evaluator):
    def __init__(self):
        self.calls = 0

    def evaluate(self, model, tokenizer=None):
        self.calls += 1
        return EvalResult(1.0 if self.calls == 1 else float("nan"))


def _sft(tmp_path, cb, **kw):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=6,
        max_length=32,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        **kw,
    )
    return SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        train_dataset=Dataset.from_dict({"text": sentences("negative", 16)}),
        callbacks=[cb],
    )


def test_nan_evaluations_in_training_end_it_gracefully_instead_of_raising(tmp_path):
    # Every evaluation after the baseline is NaN: recorded, not decided on; the third in a row ends the run
    # (the one non-finite policy; test_callback_nonfinite.py checks the best weights it leaves live).
    cb = EvalStopCallback(_NaNAtSecondEval(), eval_steps=2, max_non_finite=2)
    trainer = _sft(tmp_path, cb)
    trainer.train()
    assert cb.stopped_at == 4 and trainer.state.global_step == 4 and cb.best_step == 0
    assert [(h["step"], h.get("non_finite")) for h in cb.history] == [
        (0, None),
        (2, "eval score nan"),
        (4, "eval score nan"),
    ]
    assert "2 non-finite evaluations of _NaNAtSecondEval in a row (steps 2, 4" in cb.stop_reason


def test_restore_callback_states_flag_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="leave restore_callback_states_from_checkpoint=False"):
        _sft(tmp_path, EvalStopCallback(world(), eval_steps=2), restore_callback_states_from_checkpoint=True)


def test_a_callback_serves_one_run():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    cb = EvalStopCallback(_NaNAtSecondEval(), eval_steps=1, eval_on_start=False)  # no trainer: events by hand
    args, state, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(), TrainerControl()
    state.max_steps = 5
    cb.on_train_begin(args, state, control)
    state.global_step = 1
    cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    state.global_step = 0
    with pytest.raises(ValueError, match="already served a training run; create a new one"):
        cb.on_train_begin(args, state, control)
