"""Run by tests/test_callback_distributed.py under torchrun (gloo, CPU): a GPT-2 sharded with torch's FSDP2
(``fully_shard``), evaluated and restored by the evalstop evaluator and checkpoint code.

argv: model_dir best_dir out_dir. 48 held-out examples in 5 batches of 10: with 2 ranks one rank has a batch fewer,
so it must make a filler ``generate`` call (a sharded forward needs every rank), and completions end at different
lengths on different ranks (``synced_gpus``). Each rank writes fsdp-<r>.json: its scores before and after restoring
``best_dir`` into the sharded model.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)

from _callback_helpers import HELDOUT_PROMPTS, end_distributed_script, gold  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from evalstop_callbacks import RewardFunctionEvaluator  # noqa: E402
from evalstop_callbacks.checkpoints import restore_checkpoint  # noqa: E402
from evalstop_callbacks.evaluators.model_context import _is_sharded  # noqa: E402

PROMPTS = HELDOUT_PROMPTS * 4


def evaluator() -> RewardFunctionEvaluator:
    return RewardFunctionEvaluator(PROMPTS, gold, max_new_tokens=8, batch_size=10)


def main() -> None:
    model_dir, best_dir, out_dir = sys.argv[1:4]
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    before = evaluator().evaluate(model, tok)
    restore_checkpoint(model, best_dir)
    after = evaluator().evaluate(model, tok)
    rank = dist.get_rank()
    model.reshard()  # the root keeps its parameters gathered after a forward; count the shards
    with open(os.path.join(out_dir, f"fsdp-{rank}.json"), "w") as fh:
        json.dump(
            {
                "sharded": _is_sharded(model),
                "before": list(before.scores),
                "after": list(after.scores),
                "local_params": sum(p.to_local().numel() for p in model.parameters()),
            },
            fh,
        )
    end_distributed_script()


if __name__ == "__main__":
    main()
