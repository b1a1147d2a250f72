"""Running the live model for an evaluation without changing training: wrappers, RNG streams, precision."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def unwrap_model(model: Any) -> Any:
    """The policy inside the wrappers trainers hand to callbacks.

    Unwraps DDP/DataParallel (``.module``) and TRL's PPO ``PolicyAndValueWrapper`` (``.policy``), in any nesting.
    PEFT models are kept as they are: they generate with their adapters active.
    """
    for _ in range(8):  # wrappers nest at most a few levels; a bound avoids a loop on odd objects
        if type(model).__name__ == "PolicyAndValueWrapper" or (
            hasattr(model, "policy") and hasattr(model, "value_model")
        ):
            model = model.policy
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model
    return model


@contextlib.contextmanager
def preserved_rng(seed: int | None = None) -> Iterator[None]:
    """Run a block without touching the training RNG streams.

    Saves and restores the torch CPU and CUDA RNG states (evaluation sampling would otherwise shift the random
    stream of training) and Python's and NumPy's global ones (a reward function may draw from them). With ``seed``
    the block starts from ``torch.manual_seed(seed)``, so the same weights always get the same completions.
    """
    import random

    import torch

    py_state = random.getstate()
    try:
        import numpy as np
    except ImportError:  # numpy is optional here
        np_state = None
    else:
        np_state = np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        if seed is not None:
            torch.manual_seed(seed)  # also seeds every CUDA device
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(py_state)
        if np_state is not None:  # numpy was imported
            np.random.set_state(np_state)


@contextlib.contextmanager
def isolated_eval(model: Any, seed: int | None) -> Iterator[None]:
    """:func:`preserved_rng` plus eval mode and no gradients; the model gets its previous train/eval mode back."""
    import torch

    was_training = model.training
    try:
        with preserved_rng(seed):
            model.eval()
            with torch.no_grad():
                yield
    finally:
        if was_training:
            model.train()


@contextlib.contextmanager
def scoring_precision(model: Any) -> Iterator[None]:
    """Score in the dtype of the model's weights, with autocast off.

    accelerate's mixed precision (the Trainer's ``bf16=True``/``fp16=True``) replaces the prepared model's ``forward``
    by an autocast wrapper and keeps the original as ``_original_forward``; inside this block the original is back,
    and any autocast context the caller opened is disabled. Without this the live model would score in bf16 while the
    same weights reloaded from the best checkpoint score in fp32.
    """
    import torch

    wrapped = []
    for module in _modules_with_forward_wrapper(model):
        wrapped.append((module, module.__dict__["forward"]))
        module.forward = module.__dict__["_original_forward"]
    try:
        with contextlib.ExitStack() as stack:
            for device_type in ("cpu", "cuda"):
                if device_type == "cpu" or torch.cuda.is_available():
                    stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
            yield
    finally:
        for module, forward in wrapped:
            module.forward = forward


def _modules_with_forward_wrapper(model: Any) -> list[Any]:
    # The wrapper sits on the object accelerate prepared: the model itself or a wrapper around it (PEFT's base model).
    seen: set[int] = set()
    out: list[Any] = []
    todo: list[Any] = [model]
    for _ in range(6):
        nxt: list[Any] = []
        for m in todo:
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            d = getattr(m, "__dict__", {})
            if "_original_forward" in d and "forward" in d:
                out.append(m)
            nxt.extend(getattr(m, attr, None) for attr in ("module", "base_model", "model"))
        todo = nxt
    return out


def _is_sharded(model: Any) -> bool:
    """Whether ``model``'s parameters are sharded across ranks (FSDP, DeepSpeed ZeRO-3): every rank must forward."""
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled, is_fsdp_managed_module
    except ImportError:  # older transformers
        return False
    from ..checkpoints import _is_zero3  # partitioned by DeepSpeed without the Trainer's global ZeRO-3 config too

    try:
        return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model) or _is_zero3(model))
    except Exception:  # noqa: BLE001 - detection only; a plain model answers False
        return False
