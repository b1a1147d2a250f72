"""The callback under the one non-finite policy (:mod:`evalstop_callbacks.nonfinite`), on a real transformers
Trainer with the tests' tiny GPT-2 (CPU): an evaluator that returns NaN once is recorded and the run goes on; three
NaN evaluations in a row end the run gracefully, with the best weights live in the model. Nothing raises out of
``trainer.train()`` for a NaN."""

from __future__ import annotations

import json
import math

import torch
from _callback_helpers import policy, sentences, tokenizer, world_evaluator
from datasets import Dataset
from safetensors.torch import load_file

from evalstop_callbacks import EvalResult, EvalStopCallback, Evaluator
from evalstop_callbacks.outcome import run_summary, summary_text
from evalstop_callbacks.state import CallbackState, resume_state

COMMON = dict(use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, save_strategy="no", seed=0)


class NaNAt(Evaluator):
    """The tests' world evaluator, except at the given calls (0: the step-0 baseline), where it returns NaN."""

    def __init__(self, *calls: int) -> None:
        self.world = world_evaluator()
        self.calls, self.nan_at = 0, set(calls)

    def evaluate(self, model, tokenizer=None):
        result = self.world.evaluate(model, tokenizer)
        self.calls += 1
        return EvalResult(math.nan) if self.calls - 1 in self.nan_at else result


def _train(tmp_path, evaluator: Evaluator, trace_path=None) -> tuple[EvalStopCallback, object]:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tokenizer()
    data = Dataset.from_dict({"text": sentences("negative")})
    data = data.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    cb = EvalStopCallback(evaluator, eval_steps=2, k=50, job_type="sft", trace_path=trace_path)  # k=50: no stops
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=5e-3, max_steps=12, **COMMON
    )
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
        callbacks=[cb],
    )
    cb.attach(trainer)
    trainer.train()  # never raises for a NaN
    return cb, trainer


def test_one_nan_evaluation_is_recorded_and_the_run_goes_on(tmp_path) -> None:
    cb, trainer = _train(tmp_path, NaNAt(2), trace_path=str(tmp_path / "trace.jsonl"))  # calls 0, 1, 2: steps 0, 2, 4
    assert trainer.state.global_step == 12 and cb.stopped_at is None
    from platform_sim.trace_format import read_trace

    trace = read_trace(tmp_path / "trace.jsonl")  # recorded in the trace too, between the evals it never joins
    assert [line["step"] for line in trace.non_finite] == [4] and trace.non_finite[0]["what"] == "eval score nan"
    assert [e["step"] for e in trace.evals] == [0, 2, 6, 8, 10, 12]
    steps = [h["step"] for h in cb.history]
    assert steps == [0, 2, 4, 6, 8, 10, 12]
    nan = next(h for h in cb.history if h["step"] == 4)
    assert nan["non_finite"] == "eval score nan" and nan["eval_score"] is None
    assert cb.best_step != 4 and math.isfinite(cb.best_score)
    summary = run_summary(cb, tmp_path)
    assert summary["non_finite"] == [4]
    assert "non-finite evaluations (not decided on): steps 4" in summary_text(summary)


def test_a_reward_function_that_returns_nan_once_is_recorded_and_the_run_goes_on(tmp_path) -> None:
    from _callback_helpers import HELDOUT_PROMPTS, gold

    from evalstop_callbacks import RewardFunctionEvaluator

    calls = [0]

    def flaky_gold(prompts, completions, **kwargs):  # the world score, NaN for one example at the third evaluation
        calls[0] += 1
        scores = gold(prompts, completions, **kwargs)
        return [math.nan if calls[0] == 3 and i == 0 else s for i, s in enumerate(scores)]

    cb, trainer = _train(tmp_path, RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, flaky_gold, max_new_tokens=8))
    assert trainer.state.global_step == 12 and cb.stopped_at is None  # never raised out of train()
    nan = [h for h in cb.history if h.get("non_finite")]
    assert [h["step"] for h in nan] == [4] and nan[0]["eval_score"] is None
    assert [h["step"] for h in cb.history] == [0, 2, 4, 6, 8, 10, 12]


def test_three_nan_evaluations_in_a_row_end_the_run_with_the_best_weights_live(tmp_path) -> None:
    cb, trainer = _train(tmp_path, NaNAt(3, 4, 5))  # steps 6, 8, 10
    assert cb.stopped_at == 10 and trainer.state.global_step == 10  # ended at the third, not trained to 12
    assert [h["step"] for h in cb.history if h.get("non_finite")] == [6, 8, 10]
    assert "3 non-finite evaluations" in cb.stop_reason and "steps 6, 8, 10" in cb.stop_reason
    assert cb.best_step in (0, 2, 4)
    best = max((h for h in cb.history if not h.get("non_finite")), key=lambda h: h["eval_score"])
    assert (cb.best_step, cb.best_score) == (best["step"], best["eval_score"])
    # The best weights are live: the model equals the kept best folder, and scores the best score again.
    assert cb.restored_from is not None and cb.best_checkpoint is not None
    kept = load_file(f"{cb.best_checkpoint}/model.safetensors")
    live = trainer.model.state_dict()
    assert all(torch.equal(live[name].cpu(), tensor) for name, tensor in kept.items())
    assert world_evaluator().evaluate(trainer.model, tokenizer()).score == cb.best_score
    text = summary_text(run_summary(cb, tmp_path))
    assert text.startswith("EvalStop summary: stopped at step 10 (non-finite evaluation: 3 non-finite evaluations")
    # What a checkpoint keeps (trainer_state.json) carries the count of NaNs in a row into a resumed run.
    saved = CallbackState.from_dict(json.loads(json.dumps(cb.state()))["attributes"]["evalstop"])
    resumed = EvalStopCallback(NaNAt(), eval_steps=2, k=50, job_type="sft")
    resume_state(resumed, saved)  # a history that ends in a NaN evaluation resumes too
    assert resumed.job.policy.consecutive == 3 and resumed.job.policy.steps == [6, 8, 10]
    assert resumed.history == cb.history
