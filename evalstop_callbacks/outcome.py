"""How a run's end is told to its user: the stop reason in each mode, and the end-of-training summary of the YAML
integrations (Axolotl, LLaMA-Factory), which have no Python code of the user's to print the callback's attributes."""

from __future__ import annotations

import os
from typing import Any

from platform_sim.core import EvidenceMode


def worded(reason: str, mode: str) -> str:
    """``reason`` as the mode makes it true: the core says ``"stopped at step N: ..."`` at its stop, but observe mode
    stops nothing, so there it reads ``"would stop at step N (observe mode: not stopped): ..."``."""
    if mode != "observe" or "stopped at step" not in reason:
        return reason
    head, tail = reason.split("stopped at step", 1)
    number, sep, rest = tail.strip().partition(":")
    return f"{head}would stop at step {number} (observe mode: not stopped){sep}{rest}"


def _metric_units(callback: Any, score: float | None) -> float | None:
    """A score of the core (higher is better) in the evaluator's own units (a loss is positive again)."""
    to_metric = getattr(callback.evaluator, "to_metric", None)
    if score is None or to_metric is None:
        return score
    return float(to_metric(score))


def _metric_name(callback: Any) -> str:
    evaluator = callback.evaluator
    return str(getattr(evaluator, "metric", None) or type(evaluator).__name__)


def run_summary(callback: Any, output_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """What an :class:`~evalstop_callbacks.EvalStopCallback` decided over a run, for a user who has only a YAML file:
    scores in the metric's own units (``best_score`` of a loss is the loss), paths absolute.

    Args:
        callback: The run's callback, after training.
        output_dir: The framework's output folder (where it saves the final model), or None if unknown.
    """
    history = list(callback.history)
    best_checkpoint = callback.best_checkpoint
    return {
        "job_id": callback.job_id,
        "mode": callback.mode,
        "detector": callback.detector_spec,
        "metric": _metric_name(callback),
        "stopped_at": callback.stopped_at,
        "would_stop_at": callback.would_stop_at,
        "stop_reason": worded(callback.stop_reason, callback.mode) or None,
        "last_step": history[-1]["step"] if history else None,
        "best_step": callback.best_step,
        "best_score": _metric_units(callback, callback.best_score),
        "best_checkpoint": None if best_checkpoint is None else os.path.abspath(best_checkpoint),
        "restored_from": None if callback.restored_from is None else os.path.abspath(callback.restored_from),
        "output_dir": None if output_dir is None else os.path.abspath(output_dir),
        "non_finite": [h["step"] for h in history if h.get("non_finite")],
        "history": history,
    }


def _weights_line(s: dict[str, Any], restore_best: bool) -> str:
    """Where the best weights are, and what the framework's final save in ``output_dir`` holds."""
    out = s["output_dir"] or "output_dir"
    if s["best_step"] is None:
        return f"no evaluation finished: the model saved in {out} is the last step's"
    if s["mode"] == "observe":
        return f"observe mode keeps and restores nothing: the model saved in {out} is the last step's"
    copy = f"; a copy stays in {s['best_checkpoint']}" if s["best_checkpoint"] else ""
    if s["restored_from"] is not None:
        return f"restored into the model at the end: the model saved in {out} holds the best weights{copy}"
    if s["best_step"] == s["last_step"] and s["stopped_at"] is None:
        return f"the last evaluation is the best: the model saved in {out} holds the best weights{copy}"
    if not restore_best:
        return f"not restored (restore_best is off): the model saved in {out} is the last step's{copy}"
    return f"not restored (no weights of step {s['best_step']} were kept): the model saved in {out} is the last step's"


def summary_text(summary: dict[str, Any], restore_best: bool = True) -> str:
    """:func:`run_summary` as the few lines printed at the end of training."""
    s = summary
    if s["stopped_at"] is not None:
        said = f"stopped at step {s['stopped_at']}"
        reason = str(s["stop_reason"] or "")
        mode = EvidenceMode.of_reason(reason)  # the core's reason: "<mode>: stopped at step N: why"
        reason = reason.removeprefix(f"{mode.value}: " if mode is not None else "").removeprefix(f"{said}: ")
        head = f"{said} ({reason}{f'; decided on {mode.value}' if mode is not None else ''})"
    elif s["would_stop_at"] is not None:
        head = f"not stopped: {s['stop_reason']}"
    else:
        last = "" if s["last_step"] is None else f", last evaluation at step {s['last_step']}"
        head = f"not stopped: trained to the end{last}"
    lines = [f"EvalStop summary{' (observe mode)' if s['mode'] == 'observe' else ''}: {head}"]
    if s["best_step"] is not None:
        lines.append(f"  best evaluation: step {s['best_step']}, {s['metric']} = {s['best_score']:.6g}")
    lines.append(f"  best weights: {_weights_line(s, restore_best)}")
    if s["non_finite"]:
        lines.append(f"  non-finite evaluations (not decided on): steps {', '.join(map(str, s['non_finite']))}")
    return "\n".join(lines)
