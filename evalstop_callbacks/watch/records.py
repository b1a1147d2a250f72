"""What a metrics log yields to the watcher: scalar points of named series, and the watcher's one error type."""

from __future__ import annotations

from dataclasses import dataclass

FORMATS: tuple[str, ...] = ("auto", "verl", "tensorboard", "jsonl")
"""Values of ``--format``: ``auto`` tells the three log formats apart from the log's first content."""


class WatchError(Exception):
    """A problem the user must fix (bad log, bad flag, metric never seen): its message is one line naming it."""


@dataclass(frozen=True, slots=True)
class Point:
    """One scalar of one series at one training step.

    Args:
        series: The series' name as the log spells it (a TensorBoard tag, prefixed with its run folder when the
            event file is not at the top of the followed folder; a key of a JSONL line).
        step: The training step the value was logged at.
        value: The value, a float (NaN or inf too: the watcher refuses those of the watched metric, by the one
            non-finite policy, rather than skip them).
        alias: Another name the series answers to (a TensorBoard tag without its run folder), or None.
    """

    series: str
    step: int
    value: float
    alias: str | None = None


def scalar(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool), NaN and inf included; else None (text and lists are
    not points)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def integral_step(value: object) -> int | None:
    """``value`` as a step (an int >= 0, or a float with an integral value as some JSON writers emit), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None
