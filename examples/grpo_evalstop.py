"""GRPO that overoptimizes a learned proxy reward, stopped by EvalStop on its held-out world score. CPU, < 2 min.

The policy is a tiny GPT-2 pretrained locally; the proxy is a bag-of-words ridge regression fitted on gold-labelled
samples (it cannot see repetition); the world score ("gold") rewards *diverse* positive words. GRPO drives the proxy
up while gold peaks and then falls (the policy ends up writing "good . good . good"). EvalStopCallback evaluates gold
on held-out prompts every ``--eval-steps`` steps, stops after ``--k`` consecutive declines and restores the best
checkpoint.

    python examples/grpo_evalstop.py                 # paper rule: k=2, min_delta=0
    python examples/grpo_evalstop.py --min-delta 0.1 --trace grpo.jsonl
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=300, help="GRPO steps if EvalStop never stops (default 300)")
    parser.add_argument("--eval-steps", type=int, default=10, help="evaluate every N steps (default 10)")
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
    from trl import GRPOConfig, GRPOTrainer

    from evalstop_callbacks import EvalStopCallback
    from evalstop_callbacks.demo.overopt import EnvConfig, build_env

    t0 = time.perf_counter()
    env = build_env(EnvConfig(seed=args.seed))
    evaluator = env.evaluator()  # gold on 48 sampled completions of held-out prompts, fixed seed
    print(f"environment ready in {time.perf_counter() - t0:.1f} s; reference policy gold {env.reference_gold:.2f}")

    callback = EvalStopCallback(
        evaluator,
        eval_steps=args.eval_steps,
        k=args.k,
        min_delta=args.min_delta,
        trace_path=args.trace,
        trace_extras=evaluator.trace_extras,
    )
    out = args.out or tempfile.mkdtemp(prefix="evalstop-grpo-")
    config = GRPOConfig(
        output_dir=out,
        max_steps=args.max_steps,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=env.config.max_new_tokens,
        learning_rate=5e-4,
        beta=0.0,
        seed=args.seed,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=args.eval_steps,
        save_strategy="no",
        save_total_limit=1,
        disable_tqdm=True,
        log_level="warning",
    )
    trainer = GRPOTrainer(
        model=env.reference_policy(),
        reward_funcs=env.proxy,
        args=config,
        processing_class=env.tokenizer,
        train_dataset=Dataset.from_dict({"prompt": env.train_prompts * 40}),
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # the table below says what happened
    hf_logging.disable_progress_bar()
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1

    print("\nstep  gold(held-out)  declines  action")
    for h in callback.history:
        print(f"{h['step']:>4}  {h['eval_score']:>14.3f}  {h['declines']:>8}  {h['action']}")
    restored = evaluator.evaluate(trainer.model, env.tokenizer).score
    if callback.stopped_at is not None:
        print(f"\nstopped at step {callback.stopped_at} of {args.max_steps} ({callback.stop_reason})")
    else:
        print(f"\nnot stopped: ran all {args.max_steps} steps")
    where = (
        f"restored from {callback.restored_from}"
        if callback.restored_from
        else "the final weights are the best, nothing to restore"
    )
    print(f"best step {callback.best_step} (gold {callback.best_score:.3f}); {where}")
    print(f"restored model's held-out gold: {restored:.3f}")
    eval_s = sum(callback.eval_seconds)
    print(
        f"training {train_s:.1f} s, of which evaluation {eval_s:.1f} s ({100 * eval_s / train_s:.1f}%); "
        f"callback's own cost {1000 * sum(callback.overhead_seconds) / max(1, len(callback.overhead_seconds)):.2f} "
        "ms per eval"
    )


if __name__ == "__main__":
    main()
