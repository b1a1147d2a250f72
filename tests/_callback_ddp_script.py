"""Run by tests/test_callback_distributed.py under torchrun (2 processes, gloo on CPU): GRPO with EvalStop.

argv: model_dir out_dir. Each rank writes rank-<r>.json with what its callback and trainer saw, then runs a second,
broken run (NaN eval on rank 0) and records the error each rank got.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from _callback_helpers import HELDOUT_PROMPTS, TRAIN_PROMPTS, anti_gold, gold  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from evalstop_callbacks import EvalResult, EvalStopCallback, Evaluator, RewardFunctionEvaluator  # noqa: E402


def main() -> None:
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cb = EvalStopCallback(RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8), eval_steps=2, k=2,
                          trace_path=os.path.join(out_dir, "trace.jsonl"))
    args = GRPOConfig(output_dir=os.path.join(out_dir, "run"), per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=8, learning_rate=1e-2, max_steps=16, beta=0.0, use_cpu=True, bf16=False,
                      report_to="none", disable_tqdm=True, logging_steps=1, save_strategy="no", seed=0,
                      ddp_backend="gloo")
    trainer = GRPOTrainer(model=model, reward_funcs=anti_gold, args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8}), callbacks=[cb])
    trainer.train()
    rank = trainer.args.process_index
    probe = float(sum(p.double().sum() for p in trainer.model.parameters()))  # same weights on every rank?

    # A second run whose evaluator fails on rank 0 at the first eval: every rank must raise, none may hang.
    class Broken(Evaluator):
        def evaluate(self, model, tokenizer=None):
            return EvalResult(float("nan"))

    broken = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=anti_gold,
                         args=args, processing_class=tok, train_dataset=Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8}),
                         callbacks=[EvalStopCallback(Broken(), eval_steps=2)])
    try:
        broken.train()
        error = None
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        error = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world_size": trainer.args.world_size, "stopped_at": cb.stopped_at,
                   "global_step": trainer.state.global_step, "best_step": cb.best_step, "best_score": cb.best_score,
                   "history": cb.history, "restored_from": cb.restored_from, "probe": probe,
                   "evaluated": len(cb.eval_seconds), "broken_error": error,
                   "broken_step": broken.state.global_step}, fh)


if __name__ == "__main__":
    main()
