"""EvalStop where GRPO really runs: TRL's GRPOTrainer generating with vLLM (colocate mode, on CPU), and the same tests
with HF ``generate`` (the ``hf`` parameter, in the main environment).

Two routes to the world score, in the world of tests/_grpo_world.py (a proxy the policy games, gold on held-out
prompts):

- Route 1, the trainer's own evaluation: gold is a reward function of weight 0 beside the proxy, and
  ``EvalStopCallback()`` watches ``metric_for_best_model="eval_rewards/gold/mean"``.
- Route 2, per-example scores: ``RewardFunctionEvaluator(heldout, gold)`` generates through the trainer's vLLM engine.

A hacking run (the proxy trained) stops after the gold peak and ends with the best gold checkpoint's weights live; a
healthy run (gold trained) is not stopped. The ``vllm`` cases run in .venv-vllm (tests/vllm_env.sh), one process each.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from _grpo_world import HELDOUT_PROMPTS, gold, grpo_args, grpo_trainer, proxy, trained_gold

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator

ENGINES = [pytest.param(False, id="hf"), pytest.param(True, id="vllm", marks=pytest.mark.vllm)]
STEPS, EVAL_STEPS = 30, 2


@pytest.fixture
def use_vllm(request: pytest.FixtureRequest):
    """The engine parameter; for vLLM the CPU weight-layout fixture is in place (tests/_vllm_cpu_fixture.py)."""
    if not request.param:
        yield False
        return
    from _vllm_cpu_fixture import live_weight_layout, unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: about 3 GB per process, not 7.5
    with live_weight_layout():
        yield True


class GenerateCounter:
    """Counts the calls of the policy's HF ``generate``: with vLLM there must be none."""

    def __init__(self, model: Any) -> None:
        self.calls, self._generate = 0, model.generate
        model.generate = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._generate(*args, **kwargs)


def live_matches(model: Any, folder: str) -> bool:
    """Whether the live weights are those saved in ``folder`` (a best checkpoint)."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder) / "model.safetensors"))
    live = model.state_dict()
    return all(torch.equal(live[name], tensor) for name, tensor in saved.items() if name in live)


def route1_trainer(tmp_path: Path, use_vllm: bool, trained: Any, cb: Any, load_best: bool) -> Any:
    best = dict(load_best_model_at_end=True, save_strategy="steps", save_steps=EVAL_STEPS) if load_best else {}
    args = grpo_args(
        tmp_path,
        use_vllm,
        STEPS,
        reward_weights=[1.0, 0.0],
        eval_strategy="steps",
        eval_steps=EVAL_STEPS,
        num_generations_eval=8,
        per_device_eval_batch_size=32,
        metric_for_best_model="eval_rewards/gold/mean",
        **best,
    )
    return grpo_trainer(tmp_path, args, [trained, gold], [cb], eval_prompts=HELDOUT_PROMPTS)


def report(route: str, use_vllm: bool, cb: Any, engine: str) -> None:
    history = [(h["step"], round(h["eval_score"], 3)) for h in cb.history]
    peak = max(cb.history, key=lambda h: h["eval_score"])["step"]
    print(
        f"\n{route} engine={engine}: stopped_at={cb.stopped_at} gold_peak={peak} best_step={cb.best_step} "
        f"restored_from={cb.restored_from} history={history}"
    )


@pytest.mark.parametrize("use_vllm", ENGINES, indirect=True)
@pytest.mark.parametrize("load_best", [False, True], ids=["own-best", "load-best-at-end"])
def test_route1_zero_weight_gold_stops_hacking_run_with_best_gold_live(tmp_path, use_vllm, load_best, caplog):
    cb = EvalStopCallback()
    trainer = route1_trainer(tmp_path, use_vllm, proxy, cb, load_best)
    counter = GenerateCounter(trainer.model)
    with caplog.at_level(logging.WARNING, logger="evalstop_callbacks"):
        trainer.train()
    engine = "vllm-colocate" if use_vllm else "hf"
    report("route 1", use_vllm, cb, engine)
    assert cb.evaluator.describe()["metric"] == "eval_rewards/gold/mean"
    assert cb.stopped_at is not None and cb.stopped_at < STEPS
    peak = max(cb.history, key=lambda h: h["eval_score"])["step"]
    assert cb.best_step == peak < cb.stopped_at  # stopped after the gold peak, which is the kept best
    assert live_matches(trainer.model, cb.best_checkpoint)
    assert (counter.calls == 0) == use_vllm  # with vLLM every completion came from the engine
    # One rule, nothing to act on: EvalStop's restore comes last, and here both keepers rank by the same metric.
    assert not [r for r in caplog.records if "load_best_model_at_end" in r.getMessage()]


@pytest.mark.parametrize("use_vllm", ENGINES, indirect=True)
def test_route1_healthy_run_is_not_stopped(tmp_path, use_vllm):
    cb = EvalStopCallback()
    trainer = route1_trainer(tmp_path, use_vllm, trained_gold, cb, load_best=False)
    trainer.train()
    report("route 1 healthy", use_vllm, cb, "vllm-colocate" if use_vllm else "hf")
    assert cb.stopped_at is None and trainer.state.global_step == STEPS


def route2_run(tmp_path: Path, use_vllm: bool, trained: Any) -> tuple[Any, Any, Any]:
    evaluator = RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8, seed=1)
    cb = EvalStopCallback(evaluator, eval_steps=EVAL_STEPS)
    trainer = grpo_trainer(tmp_path, grpo_args(tmp_path, use_vllm, STEPS), [trained], [cb])
    cb.attach(trainer)
    counter = GenerateCounter(trainer.model)
    trainer.train()
    return trainer, cb, counter


@pytest.mark.parametrize("use_vllm", ENGINES, indirect=True)
def test_route2_evaluator_generates_through_the_trainers_engine_and_stops_hacking_run(tmp_path, use_vllm):
    trainer, cb, counter = route2_run(tmp_path, use_vllm, proxy)
    engine = "vllm-colocate" if use_vllm else "hf"
    report("route 2", use_vllm, cb, engine)
    assert cb.stopped_at is not None and cb.stopped_at < STEPS
    peak = max(cb.history, key=lambda h: h["eval_score"])["step"]
    assert cb.best_step == peak < cb.stopped_at
    assert live_matches(trainer.model, cb.best_checkpoint)
    assert (counter.calls == 0) == use_vllm
    # The live (restored) weights, evaluated again through the same engine, score the best gold: the engine got them.
    result = cb.evaluator.evaluate(trainer.model, trainer.processing_class)
    print(f"route 2 re-evaluation: engine={result.engine} sampling={dict(result.sampling)} score={result.score}")
    assert result.engine == engine
    assert dict(result.sampling) == {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_new_tokens": 8,
        "seed": 1,
    }
    assert result.score == pytest.approx(cb.best_score)


@pytest.mark.parametrize("use_vllm", ENGINES, indirect=True)
def test_route2_healthy_run_is_not_stopped(tmp_path, use_vllm):
    trainer, cb, _ = route2_run(tmp_path, use_vllm, trained_gold)
    report("route 2 healthy", use_vllm, cb, cb.evaluator.engine_name)
    assert cb.stopped_at is None and trainer.state.global_step == STEPS


# -- bad input: one line naming the problem, before step 1 --------------------------------------------------------


def refusal_trainer(tmp_path: Path, metric: str | None, weights: list[float] | None, cb: Any) -> Any:
    extra: dict[str, Any] = dict(eval_strategy="steps", eval_steps=2, num_generations_eval=4)
    args = grpo_args(tmp_path, False, 2, reward_weights=weights, metric_for_best_model=metric, **extra)
    return grpo_trainer(tmp_path, args, [proxy, gold], [cb], eval_prompts=HELDOUT_PROMPTS)


@pytest.mark.parametrize(
    ("metric", "weights", "needle"),
    [
        ("eval_rewards/proxy/mean", [1.0, 0.0], "names reward function 'proxy', which GRPOTrainer optimizes (weight 1"),
        ("eval_rewards/gold/mean", None, "names reward function 'gold', which GRPOTrainer optimizes"),
        ("eval_reward", [1.0, 0.0], "is the total reward GRPOTrainer optimizes"),
        ("eval_rewards/golden/mean", [1.0, 0.0], "'golden', which GRPOTrainer does not have (its reward functions: "),
        ("eval_loss", [1.0, 0.0], "is no reward function's eval mean"),
        (None, [1.0, 0.0], "metric_for_best_model is not set"),
    ],
    ids=["optimized", "default-weights", "total", "unknown-name", "not-a-reward", "unset"],
)
def test_route1_refuses_any_metric_but_a_zero_weight_reward(tmp_path, metric, weights, needle):
    # attached: at once; not attached: at train(), before step 1 (the step-0 evaluation names the reward functions)
    for attach in (True, False):
        cb = EvalStopCallback()
        trainer = refusal_trainer(tmp_path / str(attach), metric, weights, cb)
        with pytest.raises(ValueError) as info:
            cb.attach(trainer) if attach else trainer.train()
        assert needle in str(info.value) and "\n" not in str(info.value)
        assert trainer.state.global_step == 0


def test_route1_on_rloo_watches_the_zero_weight_reward_and_refuses_the_trained_one(tmp_path):
    extra: dict[str, Any] = dict(eval_strategy="steps", eval_steps=2, num_generations_eval=4)
    for metric, accepted in (("eval_rewards/gold/mean", True), ("eval_rewards/proxy/mean", False)):
        cb = EvalStopCallback()
        args = grpo_args(
            tmp_path / metric, False, 2, rloo=True, reward_weights=[1.0, 0.0], metric_for_best_model=metric, **extra
        )
        trainer = grpo_trainer(tmp_path / metric, args, [proxy, gold], [cb], eval_prompts=HELDOUT_PROMPTS)
        if not accepted:
            with pytest.raises(ValueError, match="names reward function 'proxy', which RLOOTrainer optimizes"):
                cb.attach(trainer)
            continue
        cb.attach(trainer)
        trainer.train()
        assert [h["step"] for h in cb.history] == [0, 2]
        scores = [h["eval_rewards/gold/mean"] for h in trainer.state.log_history if "eval_rewards/gold/mean" in h]
        assert [h["eval_score"] for h in cb.history] == scores  # the zero-weight reward's eval mean, as logged


def test_evaluator_refuses_an_engine_it_cannot_generate_through(tmp_path):
    from evalstop_callbacks.evaluators.engines import check_engine

    class ServerEngineWithoutClient:  # what TRL's VLLMGeneration is on a rank other than the main one, server mode
        mode = "server"

    with pytest.raises(ValueError) as info:
        check_engine(ServerEngineWithoutClient(), rank=1)
    assert "server mode and rank 1 holds no client" in str(info.value) and "\n" not in str(info.value)
    evaluator = RewardFunctionEvaluator(HELDOUT_PROMPTS, gold, engine="vllm")
    cb = EvalStopCallback(evaluator, eval_steps=2)
    trainer = grpo_trainer(tmp_path, grpo_args(tmp_path, False, 2), [proxy], [cb])
    with pytest.raises(ValueError, match=r"engine='vllm'\): GRPOTrainer has no vLLM engine \(use_vllm=False\)"):
        cb.attach(trainer)
