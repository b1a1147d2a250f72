"""The callback's state, saved in every checkpoint's ``trainer_state.json`` and read back on resume.

transformers' ``ExportableState`` protocol saves ``callback.state()`` (``{"args": ..., "attributes": ...}``) under
``state.stateful_callbacks["EvalStopCallback"]``. :class:`CallbackState` is what the callback keeps under
``attributes["evalstop"]``: the history, the best step and checkpoint, the stop, the schedule's position and the
client's own state (an :class:`~evalstop_callbacks.EmbeddedClient`'s detector, so that declines survive a resume).

The callback's parts each save and resume their own share (:func:`export_state`, :func:`resume_state`), read at
``on_train_begin`` rather than through transformers'
``restore_callback_states_from_checkpoint``: that path rebuilds the callback as ``EvalStopCallback(**args)`` from
JSON and drops the instance the user built, and with it the evaluator, the client and ``trace_extras``, which are
objects, not JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from platform_sim.core import Decision

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
        keeper: The keeper's ``state_dict()`` (:class:`~evalstop_callbacks.keeper.BestCheckpoints`), or None.
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
    keeper: dict[str, Any] | None = None

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
            keeper=saved.get("keeper"),
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


@dataclass
class RunRecord:
    """What the run has seen and done so far: its evaluations, the stop, the restore.

    Args:
        history: One entry per evaluation (``step``, ``eval_score``, ``declines``, ``action``, maybe ``extra``).
        stopped_at: Step at which enforce mode stopped, or None.
        would_stop_at: First step at which the scheduler said stop (both modes), or None.
        stop_reason: That decision's reason.
        last_decision: The last decision applied, or None.
        restored_from: The checkpoint folder whose weights were loaded into the model at the end, or None.
        overhead_seconds: The callback's own time per evaluation on the main process.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: int | None = None
    would_stop_at: int | None = None
    stop_reason: str = ""
    last_decision: Decision | None = None
    restored_from: str | None = None
    overhead_seconds: list[float] = field(default_factory=list)

    def add(self, step: int, score: float, decision: Decision, extra: bool) -> dict[str, Any]:
        """Record the evaluation of ``step`` and its decision; the history entry.

        Args:
            step, score: The evaluation.
            decision: The scheduler's decision on it.
            extra: It was made at a cadence hint, off the regular interval (``"extra": True`` in the entry).
        """
        entry: dict[str, Any] = {
            "step": step,
            "eval_score": score,
            "declines": decision.declines,
            "action": decision.action.value,
        }
        if extra:
            entry["extra"] = True
        self.history.append(entry)
        return entry

    def saved(self) -> dict[str, Any]:
        """The record's part of :class:`CallbackState`."""
        return {"history": list(self.history), "stopped_at": self.stopped_at, "would_stop_at": self.would_stop_at}

    def resume(self, saved: CallbackState) -> None:
        """Continue the record of a resumed checkpoint."""
        self.history = saved.history
        self.stopped_at = saved.stopped_at
        self.would_stop_at = saved.would_stop_at


def export_state(callback: Any) -> dict[str, Any]:
    """The ``ExportableState`` record of an :class:`~evalstop_callbacks.EvalStopCallback`: its JSON constructor
    arguments, and its parts' state (the run record, the best step, the schedule, the client's) as a
    :class:`CallbackState`."""
    save = getattr(callback.client, "state_dict", None)  # optional: clients that keep local state offer it
    saved = CallbackState(
        job_id=callback.job_id,
        detector=callback.detector_spec,
        client_state=save() if callable(save) else None,
        **callback.record.saved(),
        **callback.best.saved(),
        **callback.schedule.saved(),
    )
    keys = ("eval_steps", "job_id", "job_type", "mode", "restore_best", "trace_path")
    return exported({**{key: getattr(callback, key) for key in keys}, "detector": callback.detector_spec}, saved)


def resume_state(callback: Any, saved: CallbackState) -> None:
    """Give ``saved`` (a resumed checkpoint's state) back to the callback's parts, each of which continues its own.

    Raises:
        ValueError: The checkpoint ran another detector or belongs to another job.
    """
    saved.check_resumable(callback.detector_spec, callback.job_id)
    callback.job.job_id = saved.job_id
    callback.record.resume(saved)
    callback.best.resume(saved)
    callback.schedule.resume(saved)
    load = getattr(callback.client, "load_state_dict", None)
    if saved.client_state is not None and callable(load):
        load(saved.client_state)
    declines = saved.history[-1]["declines"] if saved.history else 0
    logger.info("EvalStop resumed job %s: %d evals, declines %s", saved.job_id, len(saved.history), declines)


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
