"""Run by tests/test_callback_distributed.py under torchrun (gloo, CPU): a GPT-2 partitioned by DeepSpeed ZeRO-3,
evaluated and restored by the evalstop evaluator and checkpoint code.

argv: model_dir best_dir out_dir. The model is built under transformers' ``HfDeepSpeedConfig`` (as the Trainer does
with a ZeRO-3 config), so ``from_pretrained`` partitions it at load time, then wrapped by ``deepspeed.initialize``
(ZeRO-3 without an optimizer: evaluation only). 48 held-out examples in 5 batches of 10: with 2 ranks one rank has a
batch fewer and makes a filler ``generate`` call. Each rank writes zero3-<r>.json: whether the evaluator saw a
sharded model, its scores before and after restoring ``best_dir``, and how many elements its partitions hold.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from _callback_fsdp_script import evaluator  # noqa: E402
from _callback_helpers import end_distributed_script  # noqa: E402


def main() -> None:
    import deepspeed
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import HfDeepSpeedConfig

    from evalstop_callbacks.checkpoints import restore_checkpoint
    from evalstop_callbacks.evaluators.model_context import _is_sharded

    model_dir, best_dir, out_dir = sys.argv[1:4]
    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }
    keep = HfDeepSpeedConfig(config)  # noqa: F841 - must stay alive: from_pretrained partitions under it
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    module = engine.module
    before = evaluator().evaluate(module, tok)
    restore_checkpoint(module, best_dir)
    after = evaluator().evaluate(module, tok)
    rank = dist.get_rank()
    with open(os.path.join(out_dir, f"zero3-{rank}.json"), "w") as fh:
        json.dump(
            {
                "sharded": _is_sharded(module),
                "before": list(before.scores),
                "after": list(after.scores),
                "local_params": sum(p.ds_tensor.numel() for p in module.parameters()),
            },
            fh,
        )
    end_distributed_script()


if __name__ == "__main__":
    main()
