"""Run by tests/test_callback_distributed.py under torchrun (gloo, CPU): the Trainer with a DeepSpeed ZeRO-3 config
and EvalStopCallback, on text that teaches negative words, so that the held-out world score declines.

argv: out_dir. accelerate runs DeepSpeed on CPU (its CPU accelerator falls back to gloo). With ZeRO-3 and no
``stage3_gather_16bit_weights_on_model_save`` the Trainer saves a best step as a DeepSpeed checkpoint (a partition
file per rank); the callback must restore it into the partitions on a stop. Each rank writes zero3-trainer-<r>.json:
the distributed type, the callback's history, stop, best step and score, and a re-score of the final model by all
ranks together.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from _callback_helpers import HELDOUT_PROMPTS, end_distributed_script, gold, policy, sentences, tokenizer  # noqa: E402


def evaluator():  # noqa: ANN201
    from evalstop_callbacks import RewardFunctionEvaluator

    return RewardFunctionEvaluator(HELDOUT_PROMPTS * 2, gold, max_new_tokens=6, batch_size=6)


def main() -> None:
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from evalstop_callbacks import EvalStopCallback

    out = sys.argv[1]
    zero3 = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,  # the Trainer's torch AdamW: DeepSpeed's own Adam needs built ops
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=4,
        max_steps=16,
        learning_rate=1e-2,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        deepspeed=zero3,
    )
    tok = tokenizer()
    data = Dataset.from_dict({"input_ids": tok(sentences("negative", 64))["input_ids"]})
    cb = EvalStopCallback(evaluator(), eval_steps=2, k=2)
    trainer = Trainer(
        model=policy(),
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
        callbacks=[cb],
    )
    cb.attach(trainer)  # trainer.save_model gathers the ZeRO-3 partitions for the weights-only best
    trainer.train()
    rescore = evaluator().evaluate(trainer.model, tok).score  # every rank, on the restored partitions
    rank = trainer.args.process_index
    with open(os.path.join(out, f"zero3-trainer-{rank}.json"), "w") as fh:
        json.dump(
            {
                "distributed_type": str(trainer.accelerator.distributed_type),
                "history": cb.history,
                "stopped_at": cb.stopped_at,
                "best_step": cb.best_step,
                "best_score": cb.best_score,
                "restored_from": cb.restored_from,
                "rescore": rescore,
            },
            fh,
        )
    end_distributed_script()


if __name__ == "__main__":
    main()
