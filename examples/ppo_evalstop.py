"""PPO (TRL 1.12) that overoptimizes a learned proxy reward model, stopped by EvalStop. CPU, < 2 min.

Needs TRL 1.12.0, the last release with ``trl.experimental.ppo.PPOTrainer`` (the ``.venv-ppo`` environment). Its loop
ignores ``should_training_stop``, so the run is started with ``train_with_evalstop(trainer)`` instead of
``trainer.train()``: EvalStop ends it right after saving the stop step's checkpoint, with the best checkpoint's
weights restored into the policy.

    .venv-ppo/bin/python examples/ppo_evalstop.py
    .venv-ppo/bin/python examples/ppo_evalstop.py --min-delta 0.1 --trace ppo.jsonl
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=80, help="PPO updates if EvalStop never stops (default 80)")
    parser.add_argument("--eval-steps", type=int, default=4, help="evaluate every N updates (default 4)")
    parser.add_argument("--k", type=int, default=2, help="consecutive declines that stop the run (default 2)")
    parser.add_argument("--min-delta", type=float, default=0.0, help="decline tolerance (default 0, the paper's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output folder for checkpoints (default: a temporary folder)")
    parser.add_argument("--trace", default=None, help="write the JSONL trace here")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("EVALSTOP_THREADS", "1")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from evalstop_callbacks import EvalStopCallback, train_with_evalstop
    from evalstop_callbacks.demo.overopt import EnvConfig, build_env
    from evalstop_callbacks.demo.tiny import build_scalar_model

    t0 = time.perf_counter()
    env = build_env(EnvConfig(seed=args.seed))
    tok = env.tokenizer
    evaluator = env.evaluator()
    print(f"environment ready in {time.perf_counter() - t0:.1f} s; reference policy gold {env.reference_gold:.2f}")

    callback = EvalStopCallback(
        evaluator,
        eval_steps=args.eval_steps,
        k=args.k,
        min_delta=args.min_delta,
        trace_path=args.trace,
        trace_extras=evaluator.trace_extras,
    )
    batch = 32
    config = PPOConfig(
        output_dir=args.out or tempfile.mkdtemp(prefix="evalstop-ppo-"),
        per_device_train_batch_size=batch,
        num_mini_batches=1,
        num_ppo_epochs=4,
        total_episodes=batch * args.max_steps,
        response_length=env.config.max_new_tokens,
        learning_rate=5e-4,
        kl_coef=0.0,
        stop_token="eos",
        seed=args.seed,
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_sample_generations=0,
        save_strategy="no",
        save_total_limit=1,
        disable_tqdm=True,
        logging_steps=args.eval_steps,
        log_level="warning",
    )
    train = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in env.train_prompts * 40]})
    trainer = PPOTrainer(
        args=config,
        processing_class=tok,
        model=env.reference_policy(),
        ref_model=env.reference_policy(),
        reward_model=env.proxy_model(),
        value_model=build_scalar_model(tok, seed=args.seed),
        train_dataset=train,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)
    hf_logging.disable_progress_bar()
    t1 = time.perf_counter()
    stop = train_with_evalstop(trainer)  # trainer.train() would end with EvalStopTrainingStopped on a stop
    train_s = time.perf_counter() - t1

    print("\nstep  gold(held-out)  declines  action")
    for h in callback.history:
        print(f"{h['step']:>4}  {h['eval_score']:>14.3f}  {h['declines']:>8}  {h['action']}")
    restored = evaluator.evaluate(trainer.model.policy, tok).score
    if stop is not None:
        print(f"\nstopped at step {stop.step} of {args.max_steps} ({stop.reason})")
    else:
        print(f"\nnot stopped: ran all {args.max_steps} steps")
    where = (
        f"restored from {callback.restored_from}"
        if callback.restored_from
        else "the final weights are the best, nothing to restore"
    )
    print(f"best step {callback.best_step} (gold {callback.best_score:.3f}); {where}")
    print(f"restored policy's held-out gold: {restored:.3f}")
    eval_s = sum(callback.eval_seconds)
    print(
        f"training {train_s:.1f} s, of which evaluation {eval_s:.1f} s ({100 * eval_s / train_s:.1f}%); "
        f"callback's own cost {1000 * sum(callback.overhead_seconds) / max(1, len(callback.overhead_seconds)):.2f} "
        "ms per eval"
    )


if __name__ == "__main__":
    main()
