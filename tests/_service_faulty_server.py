"""``evalstop-server`` with one extra detector, ``faulty``, that raises arbitrary exceptions (for the isolation tests).

Run as ``python tests/_service_faulty_server.py serve --db ... --port ...``: it registers the detector through the
core's public registry, then runs the real command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from platform_sim.core import KDeclineDetector, register_detector

FAULTS: tuple[type[BaseException] | None, ...] = (
    None,
    OverflowError,
    ZeroDivisionError,
    None,
    RuntimeError,
    KeyError,
    TypeError,
    None,
    MemoryError,
    RecursionError,
    ValueError,
    AssertionError,
    IndexError,
    AttributeError,
    None,
    ArithmeticError,
)
"""What the detector does at a report of step ``s``: ``FAULTS[s % len(FAULTS)]`` (None: a normal k-decline step)."""


@register_detector
class FaultyDetector(KDeclineDetector):
    """The k-decline rule, except that at the steps :data:`FAULTS` names it raises; at odd steps it first changes its
    state (so that a store which kept the half-changed state would answer wrongly later)."""

    name = "faulty"

    def update(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        fault = FAULTS[step % len(FAULTS)]
        if fault is None:
            return super().update(step, score, scores)
        if step % 2:
            super().update(step, score, scores)
            self.declines += 1000  # visibly wrong if it were ever kept
        raise fault(f"injected fault at step {step}")

    def params(self) -> dict[str, Any]:
        return super().params()


if __name__ == "__main__":
    from platform_sim.service.cli import main

    sys.exit(main(sys.argv[1:]))
