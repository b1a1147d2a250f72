"""The callback's state, saved in every checkpoint's ``trainer_state.json`` and read back on resume.

transformers' ``ExportableState`` protocol saves ``callback.state()`` (``{"args": ..., "attributes": ...}``) under
``state.stateful_callbacks["EvalStopCallback"]``. :class:`CallbackState` is what the callback keeps under
``attributes["evalstop"]``: the history, the best step and checkpoint, the stop, the schedule's position and the
client's own state (an :class:`~evalstop_callbacks.EmbeddedClient`'s detector, so that declines survive a resume).

The callback builds and reads it itself (``EvalStopCallback.state`` and its ``_resume``: the helpers here return
values, the callback assigns them), at ``on_train_begin`` rather than through transformers'
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
