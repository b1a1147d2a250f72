"""The demo's GRPO trainer (TRL), on CPU in fp32, and the training arguments the lab's recorded runs share with it."""

from __future__ import annotations

from typing import Any


def cpu_run_args(output_dir: str, *, batch: int, lr: float, eval_steps: int, seed: int) -> dict[str, Any]:
    """Training arguments for a small run on CPU: fp32, no reporting or progress bar, and the trainer's logs at the
    eval cadence (so each trace line gets the trainer's loss).

    Args:
        output_dir: The trainer's output folder.
        batch: Completions per device and step.
        lr: Learning rate.
        eval_steps: The eval cadence, used as the logging cadence.
        seed: The trainer's seed.
    """
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        logging_steps=eval_steps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=seed,
        disable_tqdm=True,
    )


def quiet(trainer: Any) -> None:
    """Remove the trainer's printer of log dicts."""
    # With disable_tqdm the Trainer prints every log dict to stdout; the trace has what matters.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def grpo_trainer(
    env: Any,
    callbacks: list,
    output_dir: str,
    *,
    steps: int,
    eval_steps: int,
    reward: Any,
    kl: float = 0.0,
    seed: int = 0,
    lr: float = 5e-4,
    batch: int = 32,
    rloo: bool = False,
    save: bool = False,
    save_total_limit: int | None = None,
    model: Any = None,
) -> Any:
    """A GRPO trainer (or TRL's RLOO trainer, its sibling, with ``rloo``) on ``env``'s training prompts.

    Args:
        env: What the run trains in: its ``train_prompts``, ``tokenizer`` and ``config.max_new_tokens``, and with no
            ``model`` its ``reference_policy()`` (an :class:`~.overopt.OveroptEnv` has them all).
        callbacks: The trainer's callbacks.
        output_dir: The trainer's output folder.
        steps: Optimizer steps (the run's full length).
        eval_steps: The eval cadence (the trainer logs at it).
        reward: The reward function (``env.proxy`` to hack it, :func:`~.overopt.gold_reward` for the world score).
        kl: The KL coefficient towards the reference policy (``beta``).
        seed: The trainer's seed.
        lr: Learning rate.
        batch: Completions per step (8 generations per prompt).
        rloo: Train with ``RLOOTrainer`` instead of ``GRPOTrainer``.
        save: Save checkpoints (at the callbacks' request only: the step schedule never fires).
        save_total_limit: Checkpoints kept when ``save``.
        model: The policy to train (default: a fresh copy of ``env``'s reference policy).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    # Enough rows that the run never exhausts the data (an epoch end would reshuffle mid-run: harmless, but avoidable).
    reps = max(1, (steps * batch) // (8 * len(env.train_prompts)) + 1)
    dataset = Dataset.from_dict({"prompt": env.train_prompts * reps})
    config_cls, trainer_cls = (RLOOConfig, RLOOTrainer) if rloo else (GRPOConfig, GRPOTrainer)
    args: Any = config_cls(
        **cpu_run_args(output_dir, batch=batch, lr=lr, eval_steps=eval_steps, seed=seed),
        num_generations=8,
        max_completion_length=env.config.max_new_tokens,
        beta=kl,
        max_steps=steps,
        save_strategy="steps" if save else "no",
        save_steps=10**9,
        save_total_limit=save_total_limit,
        save_only_model=save,
        temperature=1.0,
    )
    trainer = trainer_cls(
        model=model if model is not None else env.reference_policy(),
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=env.tokenizer,
        callbacks=callbacks,
    )
    quiet(trainer)
    return trainer
