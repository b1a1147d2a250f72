"""One precision for scores: under bf16 and fp16 mixed-precision training (CPU), the restored best checkpoint,
reloaded fresh with ``from_pretrained``, re-scores to exactly the recorded best score.

Mixed precision wraps the live model's ``forward`` in autocast (bf16) or runs it under an autocast context; the
evaluators score in the dtype of the weights with autocast off, so live and reloaded weights score alike.
"""

from __future__ import annotations

import pytest
import torch
from _callback_helpers import HELDOUT_PROMPTS, gold, policy, sentences, tokenizer
from datasets import Dataset
from transformers import AutoModelForCausalLM

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator
from evalstop_callbacks.evaluators import scoring_precision


def world() -> RewardFunctionEvaluator:
    # 192 samples of 16 tokens: enough draws that bf16 logits would flip some of them (checked: the bf16 test fails
    # when scoring_precision is a no-op)
    return RewardFunctionEvaluator(HELDOUT_PROMPTS * 16, gold, max_new_tokens=16, batch_size=64)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_restored_best_rescores_to_the_recorded_best(tmp_path, precision):
    from trl import SFTConfig, SFTTrainer

    cb = EvalStopCallback(world(), eval_steps=2, k=2, job_type="sft")
    args = SFTConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=12,
        max_length=32,
        dataset_text_field="text",
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        seed=0,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
    )
    trainer = SFTTrainer(
        model=policy(),
        args=args,
        processing_class=tokenizer(),
        callbacks=[cb],
        train_dataset=Dataset.from_dict({"text": sentences("negative")}),
    )
    assert trainer.accelerator.mixed_precision == precision
    trainer.train()
    assert cb.best_checkpoint is not None and len(cb.history) >= 3
    fresh = AutoModelForCausalLM.from_pretrained(cb.best_checkpoint)  # fp32, no autocast: a user reloading it
    assert world().evaluate(fresh, tokenizer()).score == cb.best_score
    assert world().evaluate(trainer.model, tokenizer()).score == cb.best_score  # restored in place (or last = best)


def test_scoring_ignores_an_autocast_forward_and_context():
    model, tok = policy(), tokenizer()
    plain = world().evaluate(model, tok)
    from accelerate.utils import convert_outputs_to_fp32

    # what accelerate's bf16 mixed precision does to a prepared model
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(torch.autocast("cpu", dtype=torch.bfloat16)(model.forward))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wrapped = world().evaluate(model, tok)
        with scoring_precision(model):
            assert model.forward == model._original_forward
        assert model.forward != model._original_forward  # the trainer's wrapper is back afterwards
    assert wrapped == plain
