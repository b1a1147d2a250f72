"""Per-example score rows in a detector's state, packed: base64 of the scores as little-endian float64.

A detector state is JSON. Written as a list of numbers, a row of 1,000 example scores is about 19 KB that the
``json`` module formats one float at a time. ``trend`` (the default) keeps the rows of its window and of its planned
window, about 70 of them for a run of 300 planned steps evaluated at every step, and the service writes the state
with every report: as lists, 1.4 MB and a report of 52 ms in the service's single writer, 39 ms of them
``json.dumps``; packed, 0.76 MB and 10 ms (``benchmarks/bench_state_rows.py``). A packed score takes 10.7 characters
instead of about 19, exact to the bit, and a row packs and unpacks with one numpy call each.

Reading takes both forms: a list of numbers (every state written before rows were packed, and states written by
hand) or a packed string. A state with packed rows cannot be read by a release from before this format: its reader
fails on the string (a refusal, never a wrong decision).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np

_FLOAT64_LE = np.dtype("<f8")


def pack_row(scores: Sequence[float]) -> str:
    """``scores`` (a sequence of floats, or a float64 array) as base64 of their little-endian float64 bytes."""
    return base64.b64encode(np.asarray(scores, dtype=_FLOAT64_LE).tobytes()).decode("ascii")


def unpack_row(value: Any, what: str) -> list[float]:
    """The scores of a state's row, packed (:func:`pack_row`) or a list of numbers, as a list of Python floats.

    Args:
        value: The row as the state holds it.
        what: The field's name, for the error (``"recent_scores[3]"``).

    Raises:
        ValueError: Neither form, not base64 of whole float64 values, or a value that is not finite.
    """
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError(f"detector state: {what} is not base64 ({exc})") from None
        if len(raw) % _FLOAT64_LE.itemsize:
            raise ValueError(f"detector state: {what} holds {len(raw)} bytes, not whole 8-byte float64 scores")
        values = np.frombuffer(raw, dtype=_FLOAT64_LE)
    elif isinstance(value, list | tuple):
        # A bool is an int to numpy: refused here as a state's lists of scores never hold one.
        if not all(type(v) in (int, float) for v in value):
            raise ValueError(f"detector state: {what} must be a list of numbers or a packed row")
        values = np.asarray(value, dtype=float)
    else:
        raise ValueError(
            f"detector state: {what} must be a list of numbers or a packed row, got {type(value).__name__}"
        )
    if values.size and not np.isfinite(values).all():
        raise ValueError(f"detector state: {what} holds a score that is not finite")
    scores: list[float] = values.tolist()
    return scores
