"""What the ``evalstop`` subcommands share: the argument parser class, the one-line failure, and argparse types.

A subcommand module (see :mod:`evalstop_callbacks.cli`) builds its parser with these, so that bad input ends the same
way everywhere: a one-line reason naming the flag, exit code 2. The lab's command (``benchmarks/lab``) uses them too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from platform_sim.core.detectors import parse_detector_param


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and exit 2 (argparse prints the usage first, which is noise
    here)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def log_warnings() -> None:
    """Log warnings and errors to stderr as ``LEVEL logger: message`` (for a command's own process; library code only
    logs and leaves the configuration to its caller)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def fail(flag: str, reason: str, prog: str = "evalstop") -> int:
    """Print ``PROG: error: FLAG: REASON`` to stderr; returns exit code 2.

    Args:
        flag: The flag the input was wrong in (``--traces``).
        reason: Why, in one line.
        prog: The command that says it (``evalstop demo``).
    """
    print(f"{prog}: error: {flag}: {reason}", file=sys.stderr)
    return 2


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def pos_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def detector_param(text: str) -> tuple[str, Any]:
    """argparse type of ``--detector-param KEY=VALUE`` (:func:`platform_sim.core.detectors.parse_detector_param`)."""
    try:
        return parse_detector_param(text)
    except ValueError as exc:  # argparse prints an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc)) from None
