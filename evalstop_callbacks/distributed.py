"""Rank-consistent decisions: gather every rank's evaluation, decide on the main process, share the outcome.

If only rank 0 decided to stop, the other ranks would wait in the next step's collectives and the run would crash
(measured: rank 0 aborts, rank 1 gets "connection reset"). So every rank enters :func:`share_from_main` at the same
evaluation step and leaves it with rank 0's payload.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # torch without distributed support
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when not distributed."""
    dist = _dist()
    if dist is None:
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def share_from_main(payload: T | None) -> T:
    """Return rank 0's ``payload`` on every rank (a broadcast; identity when not distributed).

    Every rank must call it at the same point; non-main ranks pass ``None``.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return payload  # type: ignore[return-value]  # the only rank is the main one, which passes a T
    box: list[Any] = [payload]  # the broadcast overwrites it with rank 0's payload, a T
    dist.broadcast_object_list(box, src=0)
    result: T = box[0]
    return result


def failure(exc: BaseException) -> dict[str, Any]:
    """The payload of a main-process failure: its message for every rank, the exception itself for the main one."""
    return {"error": f"{type(exc).__name__}: {exc}", "exc": exc}


def share_outcome(payload: dict[str, Any] | None, step: int) -> dict[str, Any]:
    """Rank 0's ``payload`` on every rank (the exception object stays on rank 0); a :func:`failure` raises everywhere:
    the main process its exception, the other ranks a ``RuntimeError`` with its message.

    Args:
        payload: The main process's outcome of the evaluation at ``step`` (None on the other ranks).
        step: The evaluation's step, for the other ranks' message.
    """
    shared: dict[str, Any] = share_from_main(
        None if payload is None else {k: v for k, v in payload.items() if k != "exc"}
    )
    if "error" in shared:
        if payload is not None and "exc" in payload:
            raise payload["exc"]
        raise RuntimeError(f"EvalStop evaluation failed on the main process at step {step}: {shared['error']}")
    return shared


def barrier() -> None:
    """Wait for every rank (no-op when not distributed): e.g. before reading a checkpoint rank 0 wrote."""
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` when not distributed).

    Every rank must call it at the same point.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
