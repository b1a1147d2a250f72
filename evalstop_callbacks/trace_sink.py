"""The callback's trace file: one ``evalstop-trace/1`` JSONL trace per run, written on the main process.

Each evaluation's line is held back until the trainer has logged that step (its training loss, proxy reward and KL
go into the line; PPO logs a step before the callback's evaluation, the transformers loop after it), then written.
A resumed run keeps the eval lines up to its checkpoint and continues the same file. The lines themselves are
written by :class:`~evalstop_callbacks.trace.TraceRecorder`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .distributed import world
from .evaluators import EvalResult, unwrap_model
from .trace import TraceRecorder, eval_prefix
from .trainer_compat import trainer_name

# Keys of the trainers' own logs that the trace may carry (first match wins). Research data only: never reported.
LOG_KEYS: dict[str, tuple[str, ...]] = {
    "train_loss": ("loss", "train_loss", "loss/policy_avg"),
    "proxy_reward": ("reward", "objective/scores", "objective/rlhf_reward", "rewards/chosen"),
    "kl": ("kl", "objective/kl"),
}


class TraceSink:
    """The open trace of one run (or none) and the eval line waiting for its step's logs."""

    def __init__(self) -> None:
        self.recorder: TraceRecorder | None = None
        self._pending: dict[str, Any] | None = None
        self._last_logs: tuple[int, dict[str, Any]] | None = None

    def open(self, path: str, resume_step: int | None, header: Mapping[str, Any]) -> None:
        """Start the trace at ``path`` with the header fields ``header`` (TraceRecorder's keywords).

        Args:
            path: The trace file.
            resume_step: On a resume, the checkpoint's step: the file's eval lines up to it are kept (a crash may
                have cut the last line); None starts a new file.
            header: ``job_id``, ``job_type``, ``trainer``, ``model``, ``planned_steps``, ``world_size``, ``config``.
        """
        kept = eval_prefix(path, resume_step) if resume_step is not None else []
        self.recorder = TraceRecorder(path, **header)
        if kept:  # a resumed run continues the trace of the checkpoint it resumed from
            self.recorder.append_raw(kept)
        self._pending = None

    def hold(self, step: int, result: EvalResult, extras: Mapping[str, Any], wall_s: float) -> None:
        """Hold the eval line of ``step`` (the evaluation's score, per-example scores and spread, as reported) until
        the step's logs are in; ``extras`` (from ``trace_extras``) win over the logged values."""
        fixed = {k: v for k, v in extras.items() if v is not None}
        if result.std is not None:  # the spread that was reported with the score
            fixed.update(eval_std=result.std, eval_n=result.n)
        scores: Sequence[float] | None = result.scores
        self._pending = {"step": step, "score": result.score, "scores": scores, "fields": fixed, "fixed": set(fixed)}
        self._pending["wall_s"] = wall_s
        if self._last_logs is not None and self._last_logs[0] == step:
            self._merge(self._last_logs[1])

    def logged(self, step: int, logs: Mapping[str, Any]) -> None:
        """The trainer logged ``logs`` at ``step``: merge them into the held line of that step, or keep them for it."""
        self._last_logs = (step, dict(logs))
        if self._pending is not None and step == self._pending["step"]:
            self._merge(logs)

    def _merge(self, logs: Mapping[str, Any]) -> None:
        assert self._pending is not None
        for name, keys in LOG_KEYS.items():
            if name in self._pending["fixed"]:
                continue
            for key in keys:
                value = logs.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._pending["fields"][name] = float(value)
                    break

    def flush(self, now_step: int | None, overhead: list[float]) -> None:
        """Write the held line (unless ``now_step`` is still its step; None: always).

        Args:
            now_step: The step training is at, or None at the end of the run.
            overhead: The callback's own seconds per evaluation: the time spent writing counts to the last one.
        """
        pending = self._pending
        if pending is None or (now_step is not None and now_step <= pending["step"]):
            return
        self._pending = None
        if self.recorder is None or self.recorder.closed:
            return
        t0 = time.perf_counter()
        self.recorder.eval(
            pending["step"],
            pending["score"],
            eval_scores=list(pending["scores"] or []) or None,
            wall_s=pending["wall_s"],
            **pending["fields"],
        )
        if overhead:
            overhead[-1] += time.perf_counter() - t0

    def non_finite(self, step: int, what: str, overhead: list[float]) -> None:
        """Record the NaN or inf evaluation of ``step`` (``what`` was non-finite) as a ``non_finite`` line, after the
        held eval line of an earlier step (no-op without a trace)."""
        self.flush(step, overhead)
        if self.recorder is not None and not self.recorder.closed:
            self.recorder.non_finite(step, what)

    def end(self, reason: str, **fields: Any) -> None:
        """Close the trace with its ``end`` line (no-op without a trace)."""
        if self.recorder is not None:
            self.recorder.end(reason, **fields)


def trace_header(callback: Any, args: Any, state: Any, model: Any) -> dict[str, Any]:
    """The header fields of an :class:`~evalstop_callbacks.EvalStopCallback`'s trace (for :meth:`TraceSink.open`).

    Raises:
        RuntimeError: The callback has no registered job id yet.
    """
    if callback.job_id is None:
        raise RuntimeError("EvalStop: a trace needs trace_path and a registered job id")
    cadence = callback.schedule.cadence
    config = {
        "eval_steps": callback.eval_steps if callback.eval_steps is not None else cadence[1] or cadence[0],
        "detector": callback.detector_spec,
        "mode": callback.mode,
        **callback.evaluator.describe(),
    }
    if callback.cadence_spec is not None:  # extra evals are the trace's eval lines off the eval_steps cadence
        config.update(cadence=callback.cadence_spec, max_extra_evals=callback.max_extra_evals)
        if callback.max_eval_share is not None:
            config["max_eval_share"] = callback.max_eval_share
    policy = unwrap_model(model) if model is not None else None
    return {
        "job_id": callback.job_id,
        "job_type": callback.job_type,
        "trainer": trainer_name(args),
        "model": type(policy).__name__ if policy is not None else None,
        "planned_steps": int(state.max_steps or 0),
        "world_size": world()[1],
        "config": config,
    }
