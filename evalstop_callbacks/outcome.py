"""How a run's end is told to its user: the stop reason in each mode, and the end-of-training summary of the YAML
integrations (Axolotl, LLaMA-Factory), which have no Python code of the user's to print the callback's attributes."""

from __future__ import annotations


def worded(reason: str, mode: str) -> str:
    """``reason`` as the mode makes it true: the core says ``"stopped at step N: ..."`` at its stop, but observe mode
    stops nothing, so there it reads ``"would stop at step N (observe mode: not stopped): ..."``."""
    if mode != "observe" or "stopped at step" not in reason:
        return reason
    head, tail = reason.split("stopped at step", 1)
    number, sep, rest = tail.strip().partition(":")
    return f"{head}would stop at step {number} (observe mode: not stopped){sep}{rest}"
