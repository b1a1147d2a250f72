"""Keeping the best checkpoint on disk and restoring it into the live model.

The Trainer protects ``state.best_model_checkpoint`` from ``save_total_limit`` rotation, but nothing in GRPO or PPO
sets it without an eval strategy and ``metric_for_best_model``. :func:`mark_best` sets the three fields the Trainer
reads (``best_global_step``, ``best_metric``, ``best_model_checkpoint``) to the folder name the Trainer itself builds,
so rotation keeps that folder. :func:`restore_checkpoint` loads it back into the model object the trainer holds.

Disk: a best evaluation that the trainer's own save schedule does not save anyway is written by
:func:`save_best_weights` with ``trainer.save_model`` into ``<output_dir>/evalstop-best-<step>``: the weights (or
PEFT adapter), config and tokenizer that restore needs, no optimizer or scheduler state. At most one such folder
exists: the previous one is deleted when a new best is written. The name is not ``checkpoint-<step>`` on purpose:
``resume_from_checkpoint=True`` picks the newest ``checkpoint-*`` folder, which must be a full checkpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PREFIX = "checkpoint"
BEST_PREFIX = "evalstop-best"


class CheckpointError(RuntimeError):
    """The best checkpoint cannot be restored (missing folder, no weights, shape mismatch)."""


def checkpoint_dir(output_dir: str | os.PathLike[str], step: int) -> str:
    """The folder the Trainer writes for ``step``: ``os.path.join(output_dir, f"checkpoint-{step}")``."""
    return os.path.join(str(output_dir), f"{PREFIX}-{step}")


def best_weights_dir(output_dir: str | os.PathLike[str], step: int) -> str:
    """The weights-only folder EvalStop writes for a best ``step``: ``<output_dir>/evalstop-best-<step>``."""
    return os.path.join(str(output_dir), f"{BEST_PREFIX}-{step}")


def mark_best(state: Any, path: str, step: int, metric: float) -> str:
    """Point the trainer state at the best checkpoint so that ``save_total_limit`` rotation never deletes it.

    Args:
        state: The ``TrainerState``.
        path: The best checkpoint's folder (:func:`checkpoint_dir` or :func:`best_weights_dir`).
        step: Step of the best evaluation; its checkpoint is (or is about to be) saved.
        metric: Its value in transformers' convention (the metric itself, a loss stays positive), stored as
            ``best_metric``.

    Returns:
        ``path``.
    """
    state.best_global_step = step
    state.best_metric = float(metric)
    state.best_model_checkpoint = path
    return path


def save_best_weights(trainer: Any, path: str, previous: str | None) -> None:
    """Write what restore needs (``trainer.save_model``) to ``path``; delete ``previous`` (an older such folder).

    Every rank must call it: ``save_model`` gathers a sharded model's weights (FSDP, ZeRO-3) before the main process
    writes them. Only folders named :data:`BEST_PREFIX` are ever deleted.
    """
    import shutil

    trainer.save_model(path)
    if (
        previous
        and previous != path
        and Path(previous).name.startswith(BEST_PREFIX + "-")
        and getattr(trainer.args, "should_save", True)
        and os.path.isdir(previous)
    ):
        shutil.rmtree(previous, ignore_errors=True)
        logger.info("removed the previous best weights %s", previous)


def _is_fsdp2(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _load_into_shards(model: Any, full: dict[str, Any]) -> None:
    """Copy a full state dict into an FSDP2 model: each rank keeps its shard of every DTensor (collective)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    target = model.state_dict()
    missing = sorted(set(target) - set(full))
    if missing:
        raise CheckpointError(f"checkpoint lacks {missing[:3]}")
    with torch.no_grad():
        for name, tensor in target.items():
            source = full[name].to(dtype=tensor.dtype)
            if isinstance(tensor, DTensor):
                shard = distribute_tensor(source.to(tensor.device), tensor.device_mesh, tensor.placements)
                tensor.to_local().copy_(shard.to_local())
            else:
                tensor.copy_(source.to(tensor.device))


def _is_zero3(model: Any) -> bool:  # also read by evaluators._is_sharded
    """Whether ``model``'s parameters are partitioned by DeepSpeed ZeRO-3 (each carries a ``ds_id``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _read_weights(path: Path) -> dict[str, Any]:
    """The saved weights of ``path`` as a plain state dict (one file or an index of shards), without building a
    model: under ZeRO-3, ``from_pretrained`` would partition the model it builds."""
    import json

    import torch
    from safetensors.torch import load_file

    def one(f: Path) -> dict[str, Any]:
        if f.suffix == ".safetensors":
            return load_file(str(f))
        return torch.load(str(f), map_location="cpu", weights_only=True)

    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index).exists():
            shards = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
            out: dict[str, Any] = {}
            for shard in shards:
                out.update(one(path / shard))
            return out
    return one(path / ("model.safetensors" if (path / "model.safetensors").exists() else "pytorch_model.bin"))


def _load_into_zero3(model: Any, full: dict[str, Any]) -> None:
    """Copy a full state dict into a ZeRO-3 model (collective: every rank must call it).

    Every rank gathers the full parameters; rank 0 copies the weights in, and DeepSpeed re-partitions rank 0's values
    to every rank when the gathering ends. Keys a checkpoint leaves out must be tied to saved ones (GPT-2's
    ``lm_head.weight`` is ``wte.weight``)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    named = dict(model.named_parameters(remove_duplicate=False))
    saved = {id(p) for name, p in named.items() if name in full}
    untied = sorted(name for name, p in named.items() if name not in full and id(p) not in saved)
    if untied:
        raise CheckpointError(f"checkpoint lacks {untied[:3]}")
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0), torch.no_grad():
        if rank == 0:
            for name, p in named.items():
                if name in full:
                    p.copy_(full[name].to(dtype=p.dtype, device=p.device))
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, b in buffers.items():  # buffers are not partitioned: every rank loads its own copy
            if name in full:
                b.copy_(full[name].to(dtype=b.dtype, device=b.device))


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is optional
        return False
    return isinstance(model, PeftModel)


def restore_checkpoint(model: Any, path: str | os.PathLike[str]) -> None:
    """Load the weights saved in ``path`` into ``model`` in place.

    PEFT models get their adapter weights back (``adapter_model.safetensors``/``.bin``); other models are loaded with
    ``from_pretrained`` and copied over with ``load_state_dict``, because GPT-2-style tied weights are absent from a raw
    safetensors dict. The model keeps its device, dtype and train/eval mode.

    Raises:
        CheckpointError: the folder is missing or holds no weights this model can take.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"best checkpoint {path} does not exist (was it deleted by hand or by another tool?)")
    if _is_peft(model):
        _restore_peft(model, path)
        return
    files = [
        f
        for f in (
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
        )
        if (path / f).exists()
    ]
    zero_checkpoint = not files and (path / "latest").is_file() and _is_zero3(model)
    if not files and not zero_checkpoint:
        raise CheckpointError(f"best checkpoint {path} holds no model weights")
    param = next(model.parameters())
    if _is_zero3(model):
        try:
            # A ZeRO-3 Trainer saves a DeepSpeed checkpoint (one partition file per rank, no model file) unless its
            # config sets stage3_gather_16bit_weights_on_model_save; DeepSpeed's own reader rebuilds the fp32 weights.
            if zero_checkpoint:
                from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

                weights = get_fp32_state_dict_from_zero_checkpoint(str(path))
            else:
                weights = _read_weights(path)
            _load_into_zero3(model, weights)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with the folder named
            raise CheckpointError(f"cannot restore {path} into {type(model).__name__} (ZeRO-3): {exc}") from exc
        logger.info("restored weights from %s into the ZeRO-3 partitions", path)
        return
    try:
        cls = type(model)
        if _is_fsdp2(model):  # fully_shard swaps the class for an FSDP<Model> subclass: load the model class itself
            from torch.distributed.fsdp import FSDPModule

            cls = next(c for c in cls.__mro__[1:] if not issubclass(c, FSDPModule))
        loaded = cls.from_pretrained(str(path), dtype=param.dtype)
        if _is_fsdp2(model):
            _load_into_shards(model, loaded.state_dict())
        else:
            model.load_state_dict(loaded.state_dict(), strict=True)
    except Exception as exc:  # noqa: BLE001 - re-raised with the folder named
        raise CheckpointError(f"cannot restore {path} into {type(model).__name__}: {exc}") from exc
    logger.info("restored weights from %s", path)


def _restore_peft(model: Any, path: Path) -> None:
    from peft import set_peft_model_state_dict

    if (path / "adapter_model.safetensors").exists():
        from safetensors.torch import load_file

        weights = load_file(str(path / "adapter_model.safetensors"))
    elif (path / "adapter_model.bin").exists():
        import torch

        weights = torch.load(str(path / "adapter_model.bin"), map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"best checkpoint {path} holds no PEFT adapter (adapter_model.safetensors)")
    result = set_peft_model_state_dict(model, weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise CheckpointError(f"adapter in {path} does not fit the live model: unexpected keys {unexpected[:3]}")
    logger.info("restored PEFT adapter from %s", path)


def keep_best(
    trainer: Any,
    args: Any,
    state: Any,
    control: Any,
    step: int,
    previous: str | None,
    metric: float,
    stopping: bool,
    is_main: bool,
) -> tuple[str | None, float | None]:
    """Keep the new best step's weights on disk and point ``state.best_model_checkpoint`` at them.

    If the step is saved anyway (the trainer's own schedule, or the stop), the Trainer's full checkpoint folder is the
    best one (``control.should_save`` is set). Otherwise the weights alone go to ``evalstop-best-<step>`` (no
    optimizer state), replacing the previous such folder.

    Args:
        trainer: The trainer (its ``save_model`` writes weights-only folders), or None.
        args: Its ``TrainingArguments`` (``output_dir``).
        state: Its ``TrainerState``, pointed at the new best.
        control: Its ``TrainerControl``.
        step: The new best step (the one being evaluated).
        previous: The previous best folder, or None.
        metric: The best score in transformers' convention (:meth:`Evaluator.to_metric`).
        stopping: Whether training stops at this step (its full checkpoint is saved).
        is_main: Whether this is the main process (it deletes the previous weights-only folder).

    Returns:
        The new best folder (None when step 0 cannot be saved without a trainer) and the seconds a weights-only save
        took (None when the trainer's own checkpoint is the best one).
    """
    import shutil
    import time

    if control.should_save or stopping or trainer is None or not callable(getattr(trainer, "save_model", None)):
        if step == 0:
            logger.warning("EvalStop: no trainer to save the step-0 weights with; restore cannot go back to them")
            return previous, None
        path = checkpoint_dir(args.output_dir, step)
        control.should_save = True
        if (
            previous
            and os.path.basename(previous).startswith(BEST_PREFIX + "-")
            and is_main
            and os.path.isdir(previous)
        ):
            shutil.rmtree(previous, ignore_errors=True)
        return mark_best(state, path, step, metric), None
    path = best_weights_dir(args.output_dir, step)
    t0 = time.perf_counter()
    save_best_weights(trainer, path, previous)
    seconds = time.perf_counter() - t0
    return mark_best(state, path, step, metric), seconds


def restore_best(model: Any, path: str | None, step: int | None, score: float | None) -> str | None:
    """Every rank: load the best checkpoint ``path`` (of ``step``, scored ``score``) into the live (unwrapped) ``model``.

    Returns:
        ``path`` once restored; None when there is no model or no checkpoint to restore.

    Raises:
        CheckpointError: The checkpoint cannot be loaded.
    """
    from .distributed import barrier

    if model is None or not path:
        return None
    barrier()  # rank 0 wrote the checkpoint; every rank reads it
    try:
        restore_checkpoint(model, path)
    except CheckpointError:
        logger.error("EvalStop could not restore the best checkpoint (step %s)", step)
        raise
    logger.info("EvalStop restored the best checkpoint: step %s, score %s", step, score)
    return path


def update_best(
    callback: Any, trainer: Any, args: Any, state: Any, control: Any, step: int, decision: Any, stopping: bool,
    is_main: bool,
) -> None:  # fmt: skip
    """Follow the decision's best step in an :class:`~evalstop_callbacks.EvalStopCallback` (``best_step``,
    ``best_score``) and, in enforce mode, keep its weights (:func:`keep_best`) and the trainer state's pointer.

    Args:
        callback: The callback (its best fields, mode, evaluator and ``save_seconds``).
        trainer: The trainer (saves weights-only folders), or None.
        args, state, control: The trainer's arguments, state and control of this event.
        step: The step being evaluated.
        decision: The scheduler's :class:`~platform_sim.core.Decision` for it.
        stopping: Whether training stops at this step.
        is_main: Whether this is the main process (it deletes an older weights-only folder).
    """
    enforce = callback.mode == "enforce"
    if decision.best_step is not None and decision.best_step != callback.best_step:
        if decision.best_step != step:
            # Only the step being evaluated can still be saved; a scheduler naming another step as best (a history
            # this run does not share) would point restore at a checkpoint that was never written.
            logger.warning(
                "EvalStop: the scheduler names step %s as best, but this run evaluated step %s "
                "and has no checkpoint of step %s",
                decision.best_step,
                step,
                decision.best_step,
            )
        callback.best_step, callback.best_score = decision.best_step, decision.best_score
        if enforce:
            metric = float(callback.evaluator.to_metric(callback.best_score))
            previous = callback.best_checkpoint
            callback.best_checkpoint, seconds = keep_best(
                trainer, args, state, control, step, previous, metric, stopping, is_main
            )
            if seconds is not None:
                callback.save_seconds.append(seconds)
    elif decision.best_step is not None and callback.best_step is not None and enforce and callback.best_checkpoint:
        # keep it set (resume, other tools, the trainer's own best-metric bookkeeping)
        metric = float(callback.evaluator.to_metric(callback.best_score))
        mark_best(state, callback.best_checkpoint, callback.best_step, metric)
