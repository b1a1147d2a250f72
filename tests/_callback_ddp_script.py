"""Run by tests/test_callback_distributed.py under torchrun (2 or 3 processes, gloo on CPU): GRPO with EvalStop.

argv: model_dir out_dir. Each rank writes rank-<r>.json with what its callback and trainer saw: its own share of the
evaluation work, the decisions, the weights it ends with, and the errors of two broken runs (a NaN score on the main
process; a reward function that fails on one rank's shard only), both at the step-0 baseline.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from _callback_helpers import HELDOUT_PROMPTS, TRAIN_PROMPTS, anti_gold, end_distributed_script, gold  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from evalstop_callbacks import EvalResult, EvalStopCallback, Evaluator, RewardFunctionEvaluator  # noqa: E402

PROMPTS = HELDOUT_PROMPTS * 4  # 48 examples in 6 batches of 8: 3 per rank with 2 ranks, 2 with 3


def evaluator(reward_fn=gold) -> RewardFunctionEvaluator:
    return RewardFunctionEvaluator(PROMPTS, reward_fn, max_new_tokens=8, batch_size=8)


def main() -> None:
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seen: list[int] = []

    def counting_gold(prompts, completions, **kwargs):
        seen.append(len(prompts))  # how many examples this rank scored
        return gold(prompts, completions)

    cb = EvalStopCallback(evaluator(counting_gold), eval_steps=2, k=1, trace_path=os.path.join(out_dir, "trace.jsonl"))
    # EVALSTOP_TEST_FSDP=1 (GPU machines only: accelerate ignores fsdp on CPU): the same run with FSDP2 sharding
    placement = (
        dict(use_cpu=False, fsdp="full_shard", fsdp_config={"version": 2})
        if os.environ.get("EVALSTOP_TEST_FSDP")
        else dict(use_cpu=True, ddp_backend="gloo")
    )
    args = GRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=8,
        learning_rate=1e-2,
        max_steps=12,
        beta=0.0,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        **placement,
    )
    data = Dataset.from_dict({"prompt": TRAIN_PROMPTS * 8})
    trainer = GRPOTrainer(
        model=model, reward_funcs=anti_gold, args=args, processing_class=tok, train_dataset=data, callbacks=[cb]
    )
    cb.attach(trainer)  # trainer.save_model writes the weights-only best on every rank
    trainer.train()
    rank = trainer.args.process_index
    probe = float(sum(p.double().sum() for p in trainer.model.parameters()))  # same weights on every rank?
    rescore = evaluator().evaluate(trainer.model, tok)  # the restored best model, scored by every rank together
    alone = evaluator().evaluate(trainer.model, tok, local=True).score if rank == 0 else None  # rank 0 by itself

    class NaNOnMain(Evaluator):  # runs on the main process only (shards=False)
        def evaluate(self, model, tokenizer=None):
            return EvalResult(float("nan"))

    def fails_on_last_batch(prompts, completions, **kwargs):
        if prompts[-1] == PROMPTS[-1]:
            raise KeyError("no reference answer")
        return gold(prompts, completions)

    errors = {}
    for name, ev in (("nan_on_main", NaNOnMain()), ("shard_fails", evaluator(fails_on_last_batch))):
        broken = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=anti_gold,
            args=args,
            processing_class=tok,
            train_dataset=data,
            callbacks=[EvalStopCallback(ev, eval_steps=2)],
        )
        try:
            broken.train()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            errors[name] = f"{type(exc).__name__}: {exc}"
        errors[name + "_step"] = broken.state.global_step
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
        json.dump(
            {
                "rank": rank,
                "world_size": trainer.args.world_size,
                "stopped_at": cb.stopped_at,
                "global_step": trainer.state.global_step,
                "best_step": cb.best_step,
                "best_score": cb.best_score,
                "history": cb.history,
                "restored_from": cb.restored_from,
                "probe": probe,
                "evaluations": len(cb.eval_seconds),
                "scored_per_eval": seen[:1],
                "scored_total": sum(seen),
                "rescore": rescore.score,
                "alone": alone,
                "rescore_scores": list(rescore.scores),
                "log_keys": [
                    sorted(k for k in e if k.startswith("evalstop/"))
                    for e in trainer.state.log_history
                    if "evalstop/eval_score" in e
                ],
                **errors,
            },
            fh,
        )
    end_distributed_script()


if __name__ == "__main__":
    main()
