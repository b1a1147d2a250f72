"""Following the scheduler's best step in enforce mode: keep its weights, point the trainer state at them, and load
them back at the end of the run.

The scheduler's decision names the best evaluation so far. Only the step being evaluated can still be saved, so a
new best is kept at once: written weights-only as ``<output_dir>/evalstop-best-<step>``, or, when the trainer saves
that step's full checkpoint anyway (its own schedule, or the stop), linked from it once it is on disk
(:meth:`BestFollower.protect_saved`, called from ``on_save``). :class:`~evalstop_callbacks.keeper.BestCheckpoints`
owns the folders.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import Decision

from .checkpoints import best_weights_dir, checkpoint_dir, mark_best, restore_best, save_weights
from .evaluators import unwrap_model
from .keeper import BestCheckpoints
from .state import CallbackState

logger = logging.getLogger(__name__)


@dataclass
class BestFollower:
    """The best evaluation so far and the folder that keeps its weights.

    Args:
        best_step: Step of the scheduler's best evaluation so far, or None.
        best_score: Its score.
        best_checkpoint: The folder of its weights (``<output_dir>/evalstop-best-<step>``), or None.
        keeper: Keeps that folder through checkpoint rotation (set at train start).
        save_seconds: The time of each weights-only save of a new best.
        link_at: A best step whose full checkpoint the trainer saves in this event (linked in :meth:`protect_saved`).
    """

    best_step: int | None = None
    best_score: float | None = None
    best_checkpoint: str | None = None
    keeper: BestCheckpoints | None = None
    save_seconds: list[float] = field(default_factory=list)
    link_at: int | None = None

    def follow(self, decision: Decision, step: int, stopping: bool, enforce: bool, place: SavePlace) -> None:
        """Take the decision's best step; in enforce mode keep its weights and point the trainer state at them.

        Args:
            decision: The scheduler's decision for the evaluation of ``step``.
            step: The step just evaluated (the only one whose weights can still be saved).
            stopping: The decision stops the run now (the trainer saves this step's checkpoint anyway).
            enforce: Enforce mode (observe mode follows the best step but keeps no weights).
            place: Where and how this event can save weights.
        """
        if decision.best_step is None:
            return
        if decision.best_step != self.best_step:
            if decision.best_step != step:
                # A scheduler naming another step as best (a history this run does not share) would point restore at
                # a checkpoint that was never written.
                logger.warning(
                    "EvalStop: the scheduler names step %s as best, but this run evaluated step %s "
                    "and has no checkpoint of step %s",
                    decision.best_step,
                    step,
                    decision.best_step,
                )
            self.best_step, self.best_score = decision.best_step, decision.best_score
            if enforce:
                self.best_checkpoint = self._keep(step, stopping, place)
        if enforce and self.best_checkpoint and self.best_step is not None and self.best_score is not None:
            # The trainer's own best-metric bookkeeping (and other tools, and a resume) see the kept folder.
            mark_best(place.state, self.best_checkpoint, self.best_step, float(place.to_metric(self.best_score)))

    def _keep(self, step: int, stopping: bool, place: SavePlace) -> str | None:
        """Keep the new best step's weights; the folder (or the previous one, when step 0 cannot be saved).

        A step the trainer saves anyway is linked from its full checkpoint once saved (:meth:`protect_saved`); any
        other is written weights-only (no optimizer state) and the previous one deleted.
        """
        assert self.keeper is not None and self.best_score is not None
        path = best_weights_dir(place.args.output_dir, step)
        if not (place.control.should_save or stopping):
            t0 = time.perf_counter()
            if save_weights(place.trainer, unwrap_model(place.model), place.tok, path, place.is_main):
                self.save_seconds.append(time.perf_counter() - t0)
                self.keeper.add(step, self.best_score, path)
                return path
        if step == 0:
            logger.warning(
                "EvalStop: the step-0 weights of a sharded model are saved only through the trainer "
                "(cb.attach(trainer)); restore cannot go back to them"
            )
            return self.best_checkpoint
        place.control.should_save = True
        self.link_at = step
        return path

    def protect_saved(self, output_dir: str, step: int) -> None:
        """The trainer saved the full checkpoint of ``step``: if it is the best step's, link it into
        ``evalstop-best-<step>``."""
        if self.link_at != step:
            return
        assert self.keeper is not None and self.best_score is not None
        self.link_at = None
        source = checkpoint_dir(output_dir, step)
        if self.keeper.writer and not os.path.isdir(source):
            logger.warning("EvalStop: the best step %d has no checkpoint %s to keep", step, source)
            return
        self.keeper.protect(step, self.best_score, source)

    def saved(self) -> dict[str, Any]:
        """The best step's part of :class:`~evalstop_callbacks.state.CallbackState`."""
        return {
            "best_step": self.best_step,
            "best_score": self.best_score,
            "best_checkpoint": self.best_checkpoint,
            "keeper": self.keeper.state_dict() if self.keeper is not None else None,
        }

    def resume(self, saved: CallbackState) -> None:
        """Continue the best step of a resumed checkpoint, and its keeper's folders."""
        self.best_step = saved.best_step
        self.best_score = saved.best_score
        self.best_checkpoint = saved.best_checkpoint
        if self.keeper is not None and saved.keeper is not None:
            self.keeper.load_state_dict(saved.keeper)
        elif self.keeper is not None:
            self.keeper.adopt()  # a checkpoint saved without the keeper's state: its folders' markers

    def restore(self, model: Any, global_step: int) -> str | None:
        """Load the best weights into ``model`` unless the best step is the live one; the folder loaded, or None."""
        if self.best_step in (None, global_step):
            return None
        return restore_best(model and unwrap_model(model), self.best_checkpoint, self.best_step, self.best_score)


@dataclass
class SavePlace:
    """What one trainer event offers for saving weights (a view, built per event, never stored).

    Args:
        args: The trainer's ``TrainingArguments`` (``output_dir``).
        state: The ``TrainerState`` the best checkpoint is marked on.
        control: The event's ``TrainerControl`` (a full save is asked through it).
        trainer: The attached trainer, or None (weights-only saves of sharded models need it).
        model, tok: The event's model and processing class.
        is_main: Whether this process writes files.
        to_metric: The evaluator's score-to-metric conversion (the trainer's ``best_metric`` is in metric units).
    """

    args: Any
    state: Any
    control: Any
    trainer: Any
    model: Any
    tok: Any
    is_main: bool
    to_metric: Callable[[float], Any]
