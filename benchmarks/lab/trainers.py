"""The TRL trainers of the recorded runs, one builder per trainer: GRPO and RLOO (TRL >= 1.13), PPO (TRL 1.12's
``trl.experimental.ppo``), DPO and SFT, all on CPU in fp32 with the arguments every recorded run shares
(:func:`cpu_run_args`).
"""

from __future__ import annotations

from typing import Any

from evalstop_callbacks.demo.overopt import OveroptEnv, gold_reward
from evalstop_callbacks.demo.tiny import build_scalar_model
from evalstop_callbacks.demo.training import cpu_run_args as _cpu_run_args
from evalstop_callbacks.demo.training import grpo_trainer as demo_grpo_trainer
from evalstop_callbacks.demo.training import quiet

from .runs import RunSpec


def ppo_available() -> bool:
    """True if this interpreter has TRL's ``PPOTrainer`` (TRL 1.12)."""
    try:
        from trl.experimental.ppo import PPOTrainer  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


def grpo_trainer(
    env: Any, spec: RunSpec, callbacks: list, output_dir: str, reward: Any = None, model: Any = None
) -> Any:
    """A GRPO (or, with ``spec.algo == "rloo"``, RLOO) trainer of ``spec`` on ``env``'s training prompts: the demo's
    trainer (:func:`evalstop_callbacks.demo.training.grpo_trainer`) with the run's settings, saving nothing.

    Args:
        env: What the run trains in: its ``train_prompts``, ``tokenizer`` and ``config.max_new_tokens``; with no
            ``reward`` or ``model``, an :class:`~evalstop_callbacks.demo.overopt.OveroptEnv` (its ``proxy`` and
            ``reference_policy``).
        spec: The run (trainer, KL, length, batch, learning rate, seed).
        callbacks: The trainer's callbacks.
        output_dir: The trainer's output folder.
        reward: The reward function (default: gold or ``env.proxy`` as ``spec.reward`` says).
        model: The policy to train (default: a fresh copy of ``env``'s reference policy).
    """
    if reward is None:
        reward = gold_reward if spec.reward == "gold" else env.proxy
    return demo_grpo_trainer(
        env,
        callbacks,
        output_dir,
        steps=spec.steps,
        eval_steps=spec.eval_steps,
        reward=reward,
        kl=spec.kl,
        seed=spec.seed,
        lr=spec.lr,
        batch=spec.batch,
        rloo=spec.algo == "rloo",
        model=model,
    )


def cpu_run_args(spec: RunSpec, output_dir: str) -> dict[str, Any]:
    """The training arguments every recorded run shares (:func:`evalstop_callbacks.demo.training.cpu_run_args` with
    the spec's batch, learning rate, cadence and seed)."""
    return _cpu_run_args(output_dir, batch=spec.batch, lr=spec.lr, eval_steps=spec.eval_steps, seed=spec.seed)


def ppo_trainer(env: OveroptEnv, spec: RunSpec, callbacks: list, output_dir: str) -> Any:
    """A PPO trainer (TRL 1.12) of ``spec`` against ``env``'s proxy as a reward-model module, with a fresh value model.

    Args:
        env: The bag-of-words environment.
        spec: The run.
        callbacks: The trainer's callbacks.
        output_dir: The trainer's output folder.
    """
    import torch
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    torch.manual_seed(spec.seed)
    dataset = Dataset.from_dict(
        {
            "input_ids": [env.tokenizer(p)["input_ids"] for p in env.train_prompts]
            * max(1, spec.steps * spec.batch // len(env.train_prompts) + 1)
        }
    )
    args = PPOConfig(
        **cpu_run_args(spec, output_dir),
        num_mini_batches=1,
        num_ppo_epochs=spec.ppo_epochs,
        response_length=env.config.max_new_tokens,
        kl_coef=spec.kl,
        total_episodes=spec.batch * spec.steps,
        num_sample_generations=0,
        save_strategy="no",
        temperature=1.0,
        stop_token="eos",
        missing_eos_penalty=None,
    )
    trainer = PPOTrainer(
        args=args,
        processing_class=env.tokenizer,
        model=env.reference_policy(),
        ref_model=env.reference_policy(),
        reward_model=env.proxy_model(),
        train_dataset=dataset,
        value_model=build_scalar_model(env.tokenizer, seed=spec.seed),
        callbacks=callbacks,
    )
    quiet(trainer)
    return trainer


def dpo_trainer(spec: RunSpec, output_dir: str, rows: list[dict], fresh: Any, tokenizer: Any, callbacks: list) -> Any:
    """A DPO trainer of ``spec`` (``spec.kl`` is beta) on preference ``rows``.

    Args:
        spec: The run.
        output_dir: The trainer's output folder.
        rows: Preference pairs ``{"prompt", "chosen", "rejected", ...}``.
        fresh: ``() -> a fresh copy of the reference policy`` (called for the policy and for the reference model).
        tokenizer: The policy's tokenizer.
        callbacks: The trainer's callbacks.
    """
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    data = Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")})
    args = DPOConfig(
        **cpu_run_args(spec, output_dir), beta=spec.kl, max_steps=spec.steps, max_length=64, save_strategy="no"
    )
    trainer = DPOTrainer(
        model=fresh(), ref_model=fresh(), args=args, train_dataset=data, processing_class=tokenizer, callbacks=callbacks
    )
    quiet(trainer)
    return trainer


def sft_trainer(
    spec: RunSpec,
    output_dir: str,
    prompts: list[str],
    completions: list[str],
    fresh: Any,
    tokenizer: Any,
    callbacks: list,
) -> Any:
    """An SFT trainer of ``spec`` on the demonstrations ``prompts`` -> ``completions``.

    Args:
        spec: The run.
        output_dir: The trainer's output folder.
        prompts: The demonstrations' prompts.
        completions: Their completions.
        fresh: ``() -> a fresh copy of the reference policy`` (the policy to train).
        tokenizer: The policy's tokenizer.
        callbacks: The trainer's callbacks.
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({"prompt": prompts, "completion": completions})
    args = SFTConfig(**cpu_run_args(spec, output_dir), max_steps=spec.steps, max_length=64, save_strategy="no")
    trainer = SFTTrainer(model=fresh(), args=args, train_dataset=data, processing_class=tokenizer, callbacks=callbacks)
    quiet(trainer)
    return trainer
