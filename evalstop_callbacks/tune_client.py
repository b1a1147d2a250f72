"""``TuneClient``: the trainer callback inside a Ray Tune trainable, with Tune's scheduler deciding.

Pass it as the callback's client and nothing else changes::

    EvalStopCallback(evaluator, eval_steps=10, client=TuneClient(args.output_dir))

Each evaluation becomes one ``ray.tune.report`` of the report's boundary fields (``step``, ``eval_score`` and, when
known, ``eval_scores`` and the run's ``planned_steps``, the trainer's ``max_steps``). The decision comes from the trial scheduler
(:class:`platform_sim.integrations.ray_tune.EvalStopScheduler`), not from this process: when it says STOP, Tune stops
the trial and frees its resources. The answer this client gives the callback is therefore always CONTINUE, with the
best step so far (highest score, earliest on ties), so that the callback keeps saving and protecting the best
checkpoint as it does with any other client.

Checkpoints: the callback saves the checkpoint of a new best step (the Trainer's ``checkpoint-<step>`` when that step is
saved anyway, else its weights-only ``evalstop-best-<step>``) right after the evaluation that found it, i.e. after
that report was sent. So the client attaches the best checkpoint to the *next* report (or to a last re-send of the
final eval when training ends), with two extra keys that Tune's checkpoint manager can rank by:
``evalstop_checkpoint_step`` and ``evalstop_checkpoint_score`` (the checkpoint's own eval score). With
``CheckpointConfig(checkpoint_score_attribute="evalstop_checkpoint_score", checkpoint_score_order="max")`` Tune keeps the
best checkpoint. A stop always comes after the best eval (a decline is needed to stop), so by the time a trial is
stopped its best checkpoint is in Tune's storage.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from platform_sim.core import Action, Decision, Report
from platform_sim.core.boundary import check_job_type

from .checkpoints import best_weights_dir, checkpoint_dir

logger = logging.getLogger(__name__)

CHECKPOINT_STEP_KEY = "evalstop_checkpoint_step"
CHECKPOINT_SCORE_KEY = "evalstop_checkpoint_score"


class TuneClient:
    """A boundary client that reports to Ray Tune from inside a trainable (see the module docstring).

    Args:
        output_dir: The trainer's ``output_dir``, where the best checkpoint (``checkpoint-<step>``) is saved; None
            reports no checkpoints.
        metric: Result key of the eval score (the scheduler's ``metric``).
        step_attr: Result key of the step (the scheduler's ``step_attr``).
        scores_attr: Result key of the per-example scores; None never sends them.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        metric: str = "eval_score",
        step_attr: str = "step",
        scores_attr: str | None = "eval_scores",
    ) -> None:
        for name, value in (("metric", metric), ("step_attr", step_attr)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty result key, got {value!r}")
        self.output_dir = None if output_dir is None else str(output_dir)
        self.metric, self.step_attr, self.scores_attr = metric, step_attr, scores_attr
        self.job_id: str | None = None
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.sent_checkpoints: list[int] = []
        self._last: Report | None = None

    def register(
        self,
        job_type: str,
        detector: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        gpus: int | None = None,
    ) -> str:
        """The job is the Tune trial: its id is the trial id unless ``job_id`` is given.

        Raises:
            RuntimeError: not inside a Ray Tune trainable.
        """
        check_job_type(job_type)
        from ray import tune

        trial_id = tune.get_context().get_trial_id()
        if trial_id is None:
            raise RuntimeError(
                "TuneClient reports through ray.tune.report and must run inside a Ray Tune trainable "
                "(tune.Tuner(...).fit()); use EmbeddedClient or PlatformClient elsewhere"
            )
        if detector is not None:
            logger.info(
                "TuneClient: the detector is the trial scheduler's (EvalStopScheduler(detector=...)); the "
                "callback's detector spec %s is not used to decide",
                detector,
            )
        self.job_id = job_id or trial_id
        return self.job_id

    def report(self, report: Report) -> Decision:
        """Send the report's boundary fields (and the best checkpoint not sent yet) to Tune; answer CONTINUE."""
        if self.job_id is None or report.job_id != self.job_id:
            raise KeyError(f"job {report.job_id!r} is not registered; call register() first")
        self._send(report)
        self._last = report
        if self.best_score is None or report.eval_score > self.best_score:
            self.best_step, self.best_score = report.step, report.eval_score
        return Decision(Action.CONTINUE, "the Ray Tune trial scheduler decides", 0, self.best_step, self.best_score)

    def finish(self, job_id: str, reason: str = "completed") -> None:
        """At the end of training, send the final best checkpoint if Tune does not have it yet."""
        if self._last is not None and self._checkpoint_path() is not None:
            self._send(self._last)  # the same step and score again: the scheduler's decision does not change

    def _checkpoint_path(self) -> str | None:
        if self.output_dir is None or self.best_step is None or self.best_step in self.sent_checkpoints:
            return None
        # The Trainer's full folder when the best step was saved anyway, else the callback's weights-only one.
        for path in (
            checkpoint_dir(self.output_dir, self.best_step),
            best_weights_dir(self.output_dir, self.best_step),
        ):
            if os.path.isdir(path):
                return path
        return None

    def _send(self, report: Report) -> None:
        from ray import tune

        metrics: dict[str, Any] = {self.step_attr: report.step, self.metric: report.eval_score}
        if report.eval_scores is not None and self.scores_attr is not None:
            metrics[self.scores_attr] = list(report.eval_scores)
        if report.planned_steps is not None:  # the scheduler's per-run test reads it (ray_tune.PLANNED_KEY)
            metrics["planned_steps"] = report.planned_steps
        path = self._checkpoint_path()
        checkpoint = None
        if path is not None:
            if self.best_step is None:  # _checkpoint_path names a directory only for a known best step
                raise RuntimeError(f"checkpoint {path!r} chosen without a best step")
            checkpoint = tune.Checkpoint.from_directory(path)
            metrics[CHECKPOINT_STEP_KEY] = self.best_step
            metrics[CHECKPOINT_SCORE_KEY] = self.best_score
            self.sent_checkpoints.append(int(self.best_step))
        tune.report(metrics, checkpoint=checkpoint)

    # -- saved with the callback's state in every trainer checkpoint -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "sent_checkpoints": list(self.sent_checkpoints),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.job_id = state.get("job_id")
        self.best_step, self.best_score = state.get("best_step"), state.get("best_score")
        self.sent_checkpoints = [int(s) for s in state.get("sent_checkpoints", [])]
