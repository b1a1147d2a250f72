"""Parameter checks shared by the core and its callers; each raises ``ValueError`` naming the parameter and value."""

from __future__ import annotations

import math
from typing import Any


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` if it is an integer (not a bool) >= ``minimum``.

    Args:
        name: Parameter name for the error message.
        value: The value to check.
        minimum: Smallest allowed value.

    Raises:
        ValueError: ``value`` is not such an integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_nonneg(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a finite number (not a bool) >= 0.

    Args:
        name: Parameter name for the error message.
        value: The value to check.

    Raises:
        ValueError: ``value`` is not such a number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_optional_nonneg(name: str, value: Any) -> float | None:
    """``None``, or ``value`` checked by :func:`check_nonneg`."""
    return None if value is None else check_nonneg(name, value)


def check_prob(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a number (not a bool) strictly between 0 and 1.

    Args:
        name: Parameter name for the error message.
        value: The value to check.

    Raises:
        ValueError: ``value`` is not such a number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)
