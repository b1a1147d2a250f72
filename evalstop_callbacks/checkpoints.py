"""Pointing the trainer state at the best checkpoint, writing a weights-only one, and restoring it into the model.

Which checkpoints are kept, and under which name, is :mod:`evalstop_callbacks.keeper`'s (``evalstop-best-<step>``,
out of reach of ``save_total_limit``); the callback decides when. The Trainer protects ``state.best_model_checkpoint``
from rotation too, but nothing in GRPO or PPO sets it without an eval strategy and ``metric_for_best_model``:
:func:`mark_best` sets the three fields the Trainer reads (``best_global_step``, ``best_metric``,
``best_model_checkpoint``) to the kept folder. :func:`save_weights` writes what restore needs (weights or PEFT
adapter, config, tokenizer; no optimizer or scheduler state); :func:`restore_checkpoint` loads a folder back into the
model object the trainer holds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .keeper import protected_dir

logger = logging.getLogger(__name__)

PREFIX = "checkpoint"


class CheckpointError(RuntimeError):
    """The best checkpoint cannot be restored (missing folder, no weights, shape mismatch)."""


def checkpoint_dir(output_dir: str | os.PathLike[str], step: int) -> str:
    """The folder the Trainer writes for ``step``: ``os.path.join(output_dir, f"checkpoint-{step}")``."""
    return os.path.join(str(output_dir), f"{PREFIX}-{step}")


def best_weights_dir(output_dir: str | os.PathLike[str], step: int) -> str:
    """The folder EvalStop keeps the best ``step`` in: ``<output_dir>/evalstop-best-<step>`` (the keeper's name)."""
    return str(protected_dir(output_dir, step))


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


def save_weights(trainer: Any, model: Any, processing_class: Any, path: str, is_main: bool) -> bool:
    """Write what restore needs into ``path``, without optimizer state; whether it could.

    With the attached trainer, ``trainer.save_model`` (every rank must call it: it gathers a sharded model's
    weights, FSDP or ZeRO-3, before the main process writes them). Without one, the main process saves the unwrapped
    model (and ``processing_class``) with ``save_pretrained``; a sharded model cannot be saved that way, and False
    tells the caller to keep the trainer's own full checkpoint instead.
    """
    if trainer is not None and callable(getattr(trainer, "save_model", None)):
        trainer.save_model(path)
        return True
    if model is None or _is_fsdp2(model) or _is_zero3(model) or not callable(getattr(model, "save_pretrained", None)):
        return False
    if is_main:
        model.save_pretrained(path)
        if processing_class is not None and callable(getattr(processing_class, "save_pretrained", None)):
            processing_class.save_pretrained(path)
    return True


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
