"""Several processes (torchrun, gloo on CPU): every rank evaluates its shard, the decision is the same everywhere.

The held-out set is split in fixed batches, each generated on one rank with its own seed; the per-example scores are
gathered in the held-out order, so the gathered score equals the single-process score of the same weights. The main
process reports; the decision reaches every rank through a broadcast at the same step, so all ranks stop together
(without it they would stop at different steps and crash in mismatched collectives). Errors reach every rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _callback_helpers import gold, policy, tokenizer

from evalstop_callbacks import RewardFunctionEvaluator
from evalstop_callbacks.checkpoints import restore_checkpoint
from platform_sim.trace_format import read_trace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(
    script: str, *args: object, nproc: int = 2, env: dict[str, str] | None = None, timeout: int = 600
) -> None:
    """Run ``script`` of this folder under torchrun on loopback (gloo, one thread per process); assert it succeeded."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(Path(__file__).with_name(script)),
        *(str(a) for a in args),
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _run(tmp_path: Path, nproc: int) -> list[dict]:
    model_dir = tmp_path / "model"
    policy().save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    _torchrun("_callback_ddp_script.py", str(model_dir), str(tmp_path), nproc=nproc)
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(nproc)]


def _check(tmp_path: Path, ranks: list[dict]) -> None:
    from _callback_ddp_script import PROMPTS

    nproc = len(ranks)
    r0 = ranks[0]
    assert all(r["world_size"] == nproc for r in ranks)
    assert r0["stopped_at"] is not None and r0["stopped_at"] < 12, r0["history"]
    for r in ranks[1:]:
        for key in (
            "stopped_at",
            "global_step",
            "best_step",
            "best_score",
            "history",
            "restored_from",
            "probe",
            "rescore",
            "rescore_scores",
            "log_keys",
        ):
            assert r[key] == r0[key], key
    assert r0["global_step"] == r0["stopped_at"]  # every rank stopped at the decision step
    # every rank evaluated at every evaluation, each its share of the 48 examples (6 batches of 8)
    assert all(r["evaluations"] == len(r0["history"]) for r in ranks)
    assert sorted(r["scored_per_eval"][0] for r in ranks) == sorted(
        8 * len(range(rank, 6, nproc)) for rank in range(nproc)
    )
    assert sum(r["scored_total"] for r in ranks) == 48 * len(r0["history"])
    # the gathered score of the restored best model equals one process scoring the same weights
    single = policy()
    restore_checkpoint(single, r0["restored_from"])
    alone = RewardFunctionEvaluator(PROMPTS, gold, max_new_tokens=8, batch_size=8).evaluate(single, tokenizer())
    assert list(alone.scores) == r0["rescore_scores"]
    assert alone.score == pytest.approx(r0["rescore"], abs=1e-12) and alone.score == pytest.approx(r0["best_score"])
    assert r0["alone"] == alone.score  # local=True on rank 0 alone, inside the process group
    # the trainer's logs of every rank hold the evalstop keys at every evaluation
    assert len(r0["log_keys"]) == len(r0["history"]) and "evalstop/best_score" in r0["log_keys"][0]
    # A NaN on the main process reaches every rank as a record, not an error: three in a row (steps 0, 2, 4) end
    # the run on every rank at the same step (the one non-finite policy). A reward function failing on one rank's
    # shard is an error on every rank.
    for r in ranks:
        assert r["nan_on_main"] is None and r["nan_on_main_step"] == 4, r["nan_on_main"]
    failing = (6 - 1) % nproc  # the rank holding the last batch
    for r in ranks:
        assert r["shard_fails_step"] == 0  # before the first optimizer step
        assert "at step 0" in r["shard_fails"], r["shard_fails"]
        expected = "no reference answer" if r["rank"] == failing else f"evaluation failed on rank {failing}"
        assert expected in r["shard_fails"], r["shard_fails"]
    trace = read_trace(tmp_path / "trace.jsonl").lines()  # written once, by rank 0
    assert trace[0]["world_size"] == nproc and trace[-1]["stopped_at"] == r0["stopped_at"]


def test_two_ranks_evaluate_their_shards_and_stop_at_the_same_step(tmp_path):
    _check(tmp_path, _run(tmp_path, 2))


@pytest.mark.slow
def test_three_ranks_evaluate_their_shards_and_stop_at_the_same_step(tmp_path):
    _check(tmp_path, _run(tmp_path, 3))


def _sharded_evaluation_and_restore(tmp_path: Path, script: str, prefix: str, **run: Any) -> None:
    """Run a sharding script on 2 ranks with a start model and other best weights; check what each rank wrote: it
    saw a sharded model holding part of the parameters, and scored exactly what one process scores for the start
    weights before the restore and for the best weights after it."""
    from _callback_fsdp_script import evaluator

    model_dir, best_dir = tmp_path / "model", tmp_path / "best"
    start, best = policy(), policy()
    with __import__("torch").no_grad():
        for p in best.parameters():
            p.mul_(0.9)  # other weights, so that the restore shows in the scores
    start.save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    best.save_pretrained(best_dir)
    _torchrun(script, model_dir, best_dir, tmp_path, **run)
    r0, r1 = (json.loads((tmp_path / f"{prefix}-{r}.json").read_text()) for r in (0, 1))
    assert r0["sharded"] and r1["sharded"]
    n_params = sum(p.numel() for p in start.parameters())
    assert r0["local_params"] < n_params and r0["local_params"] + r1["local_params"] >= n_params  # really sharded
    assert r0["before"] == r1["before"] == list(evaluator().evaluate(start, tokenizer()).scores)
    assert r0["after"] == r1["after"] == list(evaluator().evaluate(best, tokenizer()).scores)
    assert r0["after"] != r0["before"]


def test_fsdp2_sharded_model_evaluates_in_lockstep_and_restores(tmp_path):
    """torch's FSDP2 on CPU: the sharded evaluation equals one process's, and restore loads into the shards.

    (Through the Trainer, FSDP cannot run on CPU: accelerate enables FSDP only for multi-GPU-type backends, and with
    ``use_cpu=True`` it silently trains plain DDP. ``test_trainer_fsdp_on_gpus`` covers that path where GPUs exist.)
    """
    _sharded_evaluation_and_restore(tmp_path, "_callback_fsdp_script.py", "fsdp", timeout=300)


def _has_deepspeed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


@pytest.mark.skipif(
    not _has_deepspeed(), reason="DeepSpeed is not installed (not in the test extra: it builds from source)"
)
def test_zero3_partitioned_model_evaluates_in_lockstep_and_restores(tmp_path):
    """DeepSpeed ZeRO-3 on CPU (gloo): the partitioned evaluation equals one process's, restore loads the partitions."""
    _sharded_evaluation_and_restore(tmp_path, "_callback_zero3_script.py", "zero3", env={"DS_ACCELERATOR": "cpu"})


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available() or __import__("torch").cuda.device_count() < 2,
    reason="FSDP through the Trainer needs 2 GPUs: accelerate ignores fsdp= on CPU",
)
def test_trainer_fsdp_on_gpus(tmp_path):
    model_dir = tmp_path / "model"
    policy().save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    _torchrun("_callback_ddp_script.py", str(model_dir), str(tmp_path), env={"EVALSTOP_TEST_FSDP": "1"})
    _check(tmp_path, [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)])


@pytest.mark.skipif(
    not _has_deepspeed(), reason="DeepSpeed is not installed (not in the test extra: it builds from source)"
)
def test_trainer_zero3_stops_and_restores_the_best_partitions(tmp_path):
    """The Trainer with a ZeRO-3 config on CPU (accelerate runs DeepSpeed there): stop on both ranks, restore the best
    step from its DeepSpeed checkpoint, and the final model scores the best score."""
    _torchrun("_callback_zero3_trainer_script.py", str(tmp_path), env={"DS_ACCELERATOR": "cpu"})
    r0, r1 = (json.loads((tmp_path / f"zero3-trainer-{r}.json").read_text()) for r in (0, 1))
    assert r0["distributed_type"] == "DistributedType.DEEPSPEED"
    assert r0["stopped_at"] is not None and r0["stopped_at"] == r1["stopped_at"]
    assert r0["history"] == r1["history"] and r0["best_step"] == r1["best_step"] < r0["stopped_at"]
    assert r0["restored_from"] and os.path.isfile(os.path.join(r0["restored_from"], "latest"))  # a DeepSpeed save
    assert r0["rescore"] == r1["rescore"] == r0["best_score"]  # the restored partitions are the best step's


def test_saved_weights_read_back_from_one_file_or_an_index_of_shards(tmp_path):
    """What a ZeRO-3 restore reads (no model is built, since under ZeRO-3 that would partition it)."""
    import torch

    from evalstop_callbacks.checkpoints import _read_weights

    model = policy()
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to wte: not saved
    for folder in ("one", "sharded"):
        got = _read_weights(tmp_path / folder)
        assert set(got) == set(want), folder
        assert all(torch.equal(got[k], want[k]) for k in want), folder
