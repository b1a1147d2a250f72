"""The callback's state, saved in every checkpoint's ``trainer_state.json`` and read back on resume.

transformers' ``ExportableState`` protocol saves ``callback.state()`` (``{"args": ..., "attributes": ...}``) under
``state.stateful_callbacks["EvalStopCallback"]``. :class:`CallbackState` is what the callback keeps under
``attributes["evalstop"]``: the history, the best step and checkpoint, the stop, the schedule's position and the
client's own state (an :class:`~evalstop_callbacks.EmbeddedClient`'s detector, so that declines survive a resume).

The callback reads it back itself at ``on_train_begin`` rather than through transformers'
``restore_callback_states_from_checkpoint``: that path rebuilds the callback as ``EvalStopCallback(**args)`` from
JSON and drops the instance the user built, and with it the evaluator, the client and ``trace_extras``, which are
objects, not JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class CallbackState:
    """What a resumed run needs to continue the same EvalStop job (the JSON keys are the field names).

    Args:
        job_id: The job's id at the scheduler.
        detector: The detector spec the job runs (a resume with another one is refused).
        history: One entry per evaluation (``step``, ``eval_score``, ``declines``, ``action``, maybe ``extra``).
        best_step, best_score, best_checkpoint: The best evaluation so far and the folder of its weights.
        stopped_at: Step at which enforce mode stopped, or None.
        would_stop_at: First step at which the scheduler said stop, or None.
        last_eval_step: Step of the last evaluation, or None.
        extra_eval_steps: Steps of the hinted evaluations.
        hinted_step: The step a followed hint asks to evaluate, or None.
        wall_s, eval_s: Wall and evaluator seconds of the run so far (the budget's time share continues from them).
        client_state: The client's ``state_dict()``, for clients that keep local state, else None.
    """

    job_id: str | None = None
    detector: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    best_score: float | None = None
    best_checkpoint: str | None = None
    stopped_at: int | None = None
    would_stop_at: int | None = None
    last_eval_step: int | None = None
    extra_eval_steps: list[int] = field(default_factory=list)
    hinted_step: int | None = None
    wall_s: float = 0.0
    eval_s: float = 0.0
    client_state: Any = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, the keys in field order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> CallbackState:
        """Read a saved state back (missing keys take their defaults)."""
        return cls(
            job_id=saved.get("job_id"),
            detector=saved.get("detector"),
            history=list(saved.get("history") or []),
            best_step=saved.get("best_step"),
            best_score=saved.get("best_score"),
            best_checkpoint=saved.get("best_checkpoint"),
            stopped_at=saved.get("stopped_at"),
            would_stop_at=saved.get("would_stop_at"),
            last_eval_step=saved.get("last_eval_step"),
            extra_eval_steps=list(saved.get("extra_eval_steps") or []),
            hinted_step=saved.get("hinted_step"),
            wall_s=float(saved.get("wall_s") or 0.0),
            eval_s=float(saved.get("eval_s") or 0.0),
            client_state=saved.get("client_state"),
        )

    def check_resumable(self, detector_spec: Mapping[str, Any], job_id: str | None) -> None:
        """Raise unless a callback with ``detector_spec`` and ``job_id`` (None: any) may continue this state."""
        if self.detector != detector_spec:
            raise ValueError(
                f"the checkpoint's EvalStop detector {self.detector} differs from this callback's "
                f"{detector_spec}; resume with the same k, min_delta and detector"
            )
        if job_id is not None and self.job_id not in (None, job_id):
            raise ValueError(f"the checkpoint belongs to EvalStop job {self.job_id!r}, not {job_id!r}")


def exported(args: Mapping[str, Any], state: CallbackState) -> dict[str, Any]:
    """The ``ExportableState`` record: the JSON constructor ``args`` and the state under ``attributes["evalstop"]``."""
    return {"args": dict(args), "attributes": {"evalstop": state.to_dict()}}


def saved_state(stateful_callbacks: Mapping[str, Any] | None, name: str, job_id: str | None) -> CallbackState | None:
    """The state saved for the callback class ``name`` in a checkpoint's ``stateful_callbacks``, or None.

    Args:
        stateful_callbacks: ``TrainerState.stateful_callbacks`` of the resumed checkpoint.
        name: The callback's class name (the key transformers saves it under).
        job_id: With several saved EvalStop callbacks, the one of this job is taken (else the first).
    """
    saved = (stateful_callbacks or {}).get(name)
    if isinstance(saved, list):
        saved = next(
            (s for s in saved if s.get("attributes", {}).get("evalstop", {}).get("job_id") == job_id), saved[0]
        )
    if not saved or "evalstop" not in saved.get("attributes", {}):
        return None
    return CallbackState.from_dict(saved["attributes"]["evalstop"])


def export_state(callback: Any) -> dict[str, Any]:
    """The ``ExportableState`` record of an :class:`~evalstop_callbacks.EvalStopCallback` (its ``state()``)."""
    save = getattr(callback.client, "state_dict", None)  # optional: clients that keep local state offer it
    schedule = callback.schedule
    saved = CallbackState(
        job_id=callback.job_id,
        detector=callback.detector_spec,
        history=list(callback.history),
        best_step=callback.best_step,
        best_score=callback.best_score,
        best_checkpoint=callback.best_checkpoint,
        stopped_at=callback.stopped_at,
        would_stop_at=callback.would_stop_at,
        last_eval_step=schedule.last_eval_step,
        extra_eval_steps=list(schedule.extra_eval_steps),
        hinted_step=schedule.hinted_step,
        wall_s=schedule.wall(),
        eval_s=schedule.eval_time(),
        client_state=save() if callable(save) else None,
    )
    keys = ("eval_steps", "job_id", "job_type", "mode", "restore_best", "trace_path")
    return exported({**{key: getattr(callback, key) for key in keys}, "detector": callback.detector_spec}, saved)


def load_state(callback: Any, saved: CallbackState) -> None:
    """Continue ``saved`` (a resumed checkpoint's state) in ``callback``, its client's state included.

    Raises:
        ValueError: The checkpoint ran another detector or belongs to another job.
    """
    saved.check_resumable(callback.detector_spec, callback.job_id)
    callback.job_id, callback.history = saved.job_id, saved.history
    callback.best_step, callback.best_score, callback.best_checkpoint = (
        saved.best_step,
        saved.best_score,
        saved.best_checkpoint,
    )
    callback.stopped_at, callback.would_stop_at = saved.stopped_at, saved.would_stop_at
    schedule = callback.schedule
    schedule.last_eval_step, schedule.hinted_step = saved.last_eval_step, saved.hinted_step
    schedule.extra_eval_steps = saved.extra_eval_steps
    schedule.wall_offset, schedule.eval_offset = saved.wall_s, saved.eval_s
    load = getattr(callback.client, "load_state_dict", None)
    if saved.client_state is not None and callable(load):
        load(saved.client_state)
    logger.info(
        "EvalStop resumed job %s: %d evals, best step %s, declines %s",
        callback.job_id,
        len(callback.history),
        callback.best_step,
        callback.history[-1]["declines"] if callback.history else 0,
    )
