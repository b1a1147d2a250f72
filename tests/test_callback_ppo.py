"""TRL 1.12 PPOTrainer (run in .venv-ppo): its loop ignores should_training_stop, so EvalStop ends it from on_save,
after the stop step's checkpoint; ``train_with_evalstop`` turns that into a normal return."""

from __future__ import annotations

import pytest

pytest.importorskip("trl.experimental.ppo", reason="needs TRL 1.12 (.venv-ppo)")
pytestmark = pytest.mark.ppo

from _callback_helpers import (  # noqa: E402
    HELDOUT_PROMPTS,
    NEGATIVE,
    POSITIVE,
    TRAIN_PROMPTS,
    best_weights_steps,
    checkpoint_steps,
    first_k_decline_step,
    gold,
    policy,
    tokenizer,
)
from _callback_ppo_helpers import ppo_trainer  # noqa: E402

from evalstop_callbacks import (  # noqa: E402
    EvalStopCallback,
    EvalStopTrainingStopped,
    RewardFunctionEvaluator,
    train_with_evalstop,
)
from platform_sim.trace_format import read_trace  # noqa: E402

ANTI_GOLD = {**{w: 1.0 for w in NEGATIVE}, **{w: -1.0 for w in POSITIVE}}
GOLD = {w: -v for w, v in ANTI_GOLD.items()}


def world():
    return RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8)


def test_ppo_stop_ends_train_with_stop_checkpoint_and_best_restored(tmp_path):
    cb = EvalStopCallback(world(), eval_steps=2, k=2)
    trainer = ppo_trainer(
        tmp_path, policy(), tokenizer(), TRAIN_PROMPTS * 4, ANTI_GOLD, [cb], max_steps=20, save_total_limit=1
    )
    stop = train_with_evalstop(trainer)
    assert isinstance(stop, EvalStopTrainingStopped)
    assert cb.stopped_at == stop.step == first_k_decline_step(cb.history, 2) == trainer.state.global_step
    assert cb.stopped_at < 20
    # save_total_limit=1 kept the best checkpoint through rotation, beside the stop step's (the newest)
    # the stop step's full checkpoint, and the best step's weights alone (PPO saves the policy)
    assert checkpoint_steps(tmp_path) == [cb.stopped_at]
    assert best_weights_steps(tmp_path) == [cb.best_step]
    assert cb.restored_from.endswith(f"evalstop-best-{cb.best_step}")
    # the callback unwrapped PolicyAndValueWrapper: the live policy scores exactly the best eval
    assert world().evaluate(trainer.model.policy, tokenizer()).score == cb.best_score == stop.best_score
    # without the wrapper this exception escapes trainer.train(); it names the wrapper
    assert "evalstop_callbacks.ppo.train_with_evalstop(trainer) instead of trainer.train()" in str(stop)


def test_ppo_improving_run_is_not_stopped(tmp_path):
    cb = EvalStopCallback(world(), eval_steps=3, k=2)
    trainer = ppo_trainer(tmp_path, policy(), tokenizer(), TRAIN_PROMPTS * 4, GOLD, [cb], max_steps=9)
    assert train_with_evalstop(trainer) is None
    assert first_k_decline_step(cb.history, 2) is None and cb.stopped_at is None, cb.history
    assert trainer.state.global_step == 9 and [h["step"] for h in cb.history] == [0, 3, 6, 9]
    assert cb.history[-1]["eval_score"] > cb.history[0]["eval_score"]


def test_ppo_observe_mode_never_stops(tmp_path):
    cb = EvalStopCallback(world(), eval_steps=2, k=2, mode="observe", trace_path=str(tmp_path / "ppo.jsonl"))
    trainer = ppo_trainer(tmp_path, policy(), tokenizer(), TRAIN_PROMPTS * 4, ANTI_GOLD, [cb], max_steps=10)
    assert train_with_evalstop(trainer) is None
    assert cb.would_stop_at == first_k_decline_step(cb.history, 2) is not None
    assert cb.stopped_at is None and trainer.state.global_step == 10 and cb.restored_from is None
    # PPO logs a step before on_step_end: its proxy score and policy loss still reach the trace line of that step
    lines = read_trace(tmp_path / "ppo.jsonl").lines()
    assert lines[0]["trainer"] == "PPOTrainer" and lines[-1] == {
        "kind": "end",
        "reason": "completed",
        "best_step": cb.best_step,
        "best_score": cb.best_score,
    }
    evals = lines[1:-1]
    assert [e["step"] for e in evals] == [0, 2, 4, 6, 8, 10]  # step 0: the baseline, before any PPO step
    assert all("proxy_reward" in e and "train_loss" in e and "kl" in e for e in evals[1:]), evals
