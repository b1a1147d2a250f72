"""``EvalStopCallback``: world-feedback early stopping inside any transformers or TRL trainer.

This module holds the trainer events and the loop "evaluate, report, apply the decision". Each part of the work is
an object beside it that owns its state: the checked arguments (:mod:`~evalstop_callbacks.settings`), when to evaluate
(:mod:`~evalstop_callbacks.schedule`), the job at the scheduler (:mod:`~evalstop_callbacks.job_reporter`), the best
step and its weights (:mod:`~evalstop_callbacks.best_follower`), the run record and saved state
(:mod:`~evalstop_callbacks.state`), the trace (:mod:`~evalstop_callbacks.trace_sink`) and the trainer's quirks
(:mod:`~evalstop_callbacks.trainer_compat`). The decision rule is the scheduler core's, reached through the client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from platform_sim.core import Decision

from . import trainer_compat as compat
from .attributes import CallbackAttributes
from .best_follower import BestFollower, SavePlace
from .client import BoundaryClient, EmbeddedClient
from .distributed import failure, share_outcome
from .eval_round import run_evaluator
from .evaluators import Evaluator
from .job_reporter import JobReporter
from .keeper import BestCheckpoints
from .nonfinite import DEFAULT_MAX_CONSECUTIVE
from .outcome import worded
from .schedule import EvalSchedule, max_steps, resolve_cadence
from .settings import MODES, CallbackSettings
from .state import RunRecord, export_state, resume_state, saved_state
from .trace_sink import TraceSink, trace_header
from .wandb_logging import WandbLogger, reports_to

__all__ = ["MODES", "EvalStopCallback"]

logger = logging.getLogger(__name__)


class EvalStopCallback(CallbackAttributes, TrainerCallback, ExportableState):
    """A [`TrainerCallback`] that stops training when a held-out world-feedback score declines.

    It evaluates the live model at step 0 (the baseline) and on its cadence, reports the score through a boundary
    client to the scheduler core and applies the decision: at a new best it keeps that step's weights (and points
    ``state.best_model_checkpoint`` at them); on a stop it ends training and loads the best weights back. Every
    evaluation is logged through the trainer (``evalstop/*`` keys). Works with transformers' and TRL's trainers (PPO
    through :mod:`evalstop_callbacks.ppo`); its state survives ``resume_from_checkpoint``. Call :meth:`attach` with
    the trainer for what transformers does not hand a callback.

    Args (each one in full in :class:`~evalstop_callbacks.settings.CallbackSettings`, which checks them; all but
    ``evaluator`` keyword-only, so that no positional argument can switch the detector):
        evaluator: The world-feedback [`Evaluator`]; `None`: a [`MetricEvaluator`] of the trainer's own metric.
        eval_steps: Every `eval_steps` optimizer steps (and the last), or `"epoch"`; `None`: the trainer's cadence.
        k, min_delta: The paper's `k-decline` rule (no `detector`); with neither nor `detector`: `default_spec()`.
        client: Where decisions come from; `None`: [`EmbeddedClient`], the core in this process.
        job_id, job_type: The job at the scheduler (`job_type`: `"rlhf"`, `"dpo"`, `"lora"`, `"sft"`, `"other"`).
        mode: `"enforce"` (stop, keep and restore the best) or `"observe"` (evaluate, report, record only).
        restore_best, trace_path: Load the best weights at the end (enforce mode); the run's JSONL trace file.
        detector, trace_extras: A detector spec or name; research fields for each trace line.
        cadence, max_extra_evals, max_eval_share: Cadence hints from the scheduler and their budget.
        eval_on_start: Evaluate at step 0, the baseline (errors raise before training starts).
        max_non_finite: NaN or inf evaluations in a row that end the run gracefully (default 3; fewer: recorded).

    Attributes: see :class:`~evalstop_callbacks.attributes.CallbackAttributes` (``history``, ``best_step``,
        ``best_score``, ``best_checkpoint``, ``stopped_at``, ``would_stop_at``, ``restored_from``, ...).
    """

    def __init__(
        self,
        evaluator: Evaluator | None = None,
        *,
        eval_steps: int | str | None = None,
        k: int | None = None,
        min_delta: float | None = None,
        client: BoundaryClient | None = None,
        job_id: str | None = None,
        job_type: str = "rlhf",
        mode: str = "enforce",
        restore_best: bool = True,
        trace_path: str | None = None,
        detector: str | Mapping[str, Any] | None = None,
        trace_extras: Callable[[Any, Any], Mapping[str, float]] | None = None,
        cadence: str | Mapping[str, Any] | None = None,
        max_extra_evals: int = 4,
        max_eval_share: float | None = None,
        eval_on_start: bool = True,
        max_non_finite: int = DEFAULT_MAX_CONSECUTIVE,
    ) -> None:
        arguments = {name: value for name, value in locals().items() if name != "self"}  # each argument, by name
        self.client: BoundaryClient = client if client is not None else EmbeddedClient()
        self.settings = CallbackSettings.check(**{**arguments, "client": self.client})
        self.evaluator = evaluator
        self.job = JobReporter(self.client, self.settings, self.settings.job_id)
        self.schedule = EvalSchedule(self.settings.eval_budget)
        self.best = BestFollower()
        self.record = RunRecord()
        self._set_eval_on_start = False  # args.eval_on_start set for the step-0 evaluation, to be set back
        self._finished = False
        self._raise_after_save = False  # PPO ignores should_training_stop: on_save raises after the stop's save
        self._is_main = True
        self._own_time = 0.0
        self._trace = TraceSink()
        self._link = compat.TrainerLink()
        self._wandb = WandbLogger(False)

    def attach(self, trainer: Any) -> EvalStopCallback:
        """Serve ``trainer`` with what transformers does not hand a callback (:meth:`TrainerLink.attach
        <evalstop_callbacks.trainer_compat.TrainerLink.attach>` says what); returns the callback."""
        self._link.attach(trainer, self)
        return self

    def state(self) -> dict[str, Any]:
        """ExportableState: what every checkpoint's ``trainer_state.json`` keeps of this callback."""
        return export_state(self)

    def on_init_end(self, args, state, control, **kwargs):
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            raise ValueError(compat.RESTORE_REFUSED)  # why: evalstop_callbacks/state.py

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.evaluator = compat.resolve_evaluator(self.evaluator, self.eval_steps, args, self._link.trainer)
        self.schedule.cadence = resolve_cadence(self.eval_steps, self.evaluator, args, state)
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        self._finished = self._raise_after_save = False  # this run's end is still to come
        resuming = state.global_step > 0
        if not resuming and (self.history or self.job.registered):
            # A second run would re-report steps the core has seen (conflicts) and inherit this run's best step.
            raise ValueError("this EvalStopCallback already served a training run; create a new one for a new run")
        writer = self._is_main and bool(getattr(args, "should_save", True))
        self.best.keeper = BestCheckpoints(args.output_dir, 1, writer=writer)
        saved = resuming and saved_state(getattr(state, "stateful_callbacks", None), type(self).__name__, self.job_id)
        if saved:
            resume_state(self, saved)
        compat.warn_competing_best(args, self.mode, self.evaluator)
        self.schedule.start_clock()
        if self._is_main:
            self.job.register(max_steps(state) or None)
            self._wandb = WandbLogger(reports_to(args, "wandb"))
            if self.trace_path is not None:
                header = trace_header(self, args, state, model)
                self._trace.open(self.trace_path, state.global_step if resuming else None, header)
        logger.info("EvalStop job %s: cadence %s, detector %s", self.job_id, self.schedule.cadence, self.detector_spec)
        if self.eval_on_start and not resuming and self.schedule.last_eval_step is None:  # step 0: the baseline
            if self.evaluator.uses_trainer_metrics:  # its on_evaluate reports step 0
                self._set_eval_on_start = compat.evaluate_at_start(self._link.trainer, args)
            else:
                self._evaluate_now(args, state, control, 0, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._trace.flush(state.global_step, self.overhead_seconds)
        return self._on_cadence("steps", args, state, control, model, processing_class)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        return self._on_cadence("epoch", args, state, control, model, processing_class)

    def _on_cadence(self, kind: str, args: Any, state: Any, control: Any, model: Any, tok: Any) -> Any:
        """A step or epoch ended: evaluate now if it is due (trainer metrics: ask the trainer to evaluate)."""
        step, ended = state.global_step, self.stopped_at is not None or self._finished
        if ended or self.schedule.cadence[0] != kind or not self.schedule.due(step, max_steps(state), kind == "epoch"):
            return control
        assert self.evaluator is not None
        if not self.evaluator.uses_trainer_metrics:
            self._evaluate_now(args, state, control, step, model, tok)
            return control
        if kind == "epoch":
            self.schedule.epoch_eval_at = step
        control.should_evaluate = True  # the report happens in on_evaluate, with the trainer's metrics
        return control

    def on_evaluate(self, args, state, control, metrics=None, model=None, processing_class=None, **kwargs):
        if self._set_eval_on_start:
            self._set_eval_on_start, args.eval_on_start = False, False
        if self._link.emitting or self.evaluator is None or not self.evaluator.uses_trainer_metrics:
            return control
        step, ended = state.global_step, self.stopped_at is not None or self._finished
        if ended or not self.schedule.metrics_due(step, max_steps(state), self.eval_on_start):
            return control
        result = self._link.metrics_result(step, metrics or {}, self.evaluator, args, kwargs.get("eval_dataloader"))
        if result is None:
            return control  # the metric belongs to a dataset evaluated next
        payload = self._report(args, state, step, result) if self._is_main else None
        self._apply(args, state, control, step, payload, model, processing_class)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The transformers loop logs a step after on_step_end, PPO before: the trace sink merges either way.
        if logs and self._is_main and not self._link.emitting:
            self._trace.logged(state.global_step, logs)
        return control

    def on_save(self, args, state, control, model=None, **kwargs):
        self.best.protect_saved(args.output_dir, state.global_step)
        if self._raise_after_save:
            # PPO (TRL 1.12) ignores should_training_stop: end train() here, after the stop step's checkpoint.
            self._raise_after_save = False
            self._finish(args, state, model)
            stop = self.stopped_at or state.global_step
            raise compat.EvalStopTrainingStopped(stop, self.best_step, self.best_score, self.stop_reason)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._finish(args, state, model)
        return control

    def _evaluate_now(self, args: Any, state: Any, control: Any, step: int, model: Any, tok: Any) -> None:
        """Evaluate (on every rank for sharding evaluators, else on the main process), report, apply everywhere."""
        assert self.evaluator is not None
        done = run_evaluator(self.evaluator, model, tok, step, self._is_main)
        if done.ran:
            self.schedule.eval_seconds.append(done.seconds)
        if done.every_rank and done.error is not None:
            raise done.error  # the evaluator gathered the failure: every rank raises it at this step, none waits
        payload: dict[str, Any] | None = None
        if self._is_main:
            payload = failure(done.error) if done.error is not None else self._report(args, state, step, done.result)
        self._apply(args, state, control, step, payload, model, tok)

    def _report(self, args: Any, state: Any, step: int, result: Any) -> dict[str, Any]:
        """Main process: send the report, return the payload every rank applies (or the error every rank raises)."""
        t0 = time.perf_counter()
        try:
            if (reported := self.job.report(step, result, self.evaluator, max_steps(state) or None)) is None:
                return self.job.skipped(step)  # NaN or inf: recorded on every rank, not decided on (nonfinite.py)
            checked, decision = reported
            extras = dict(self.trace_extras(args, state) or {}) if self.trace_extras is not None else {}
            self._trace.hold(step, checked, extras, self.schedule.wall())
            allowed = self.schedule.hint_allowed(step)
        except Exception as exc:  # noqa: BLE001 - shared with every rank by _apply, then raised everywhere
            return failure(exc)
        self._own_time = time.perf_counter() - t0
        return self.job.payload(step, checked, decision, allowed)

    def _apply(
        self, args: Any, state: Any, control: Any, step: int, payload: dict[str, Any] | None, model: Any, tok: Any
    ) -> None:
        """Every rank: apply the main process's decision (best checkpoint, stop, logs), or raise its error."""
        t0, saves_before = time.perf_counter(), sum(self.save_seconds)  # the weights-only save is timed apart
        shared = share_outcome(payload, step)  # a failure raises on every rank here
        if "non_finite" in shared:
            return self._skip(control, step, shared, model)
        decision = self.record.last_decision = Decision.from_dict(shared["decision"])
        score = shared["score"]
        self.record.add(step, score, decision, self.schedule.record(step), shared.get("mode"))
        self.schedule.take_hint(step, decision, max_steps(state), bool(shared.get("hint_allowed", True)))
        stopping = decision.should_stop and self.would_stop_at is None
        assert self.evaluator is not None
        place = SavePlace(args, state, control, self._link.trainer, model, tok, self._is_main, self.evaluator.to_metric)
        self.best.follow(decision, step, stopping, self.mode == "enforce", place)
        if stopping:
            self._stop(control, step, decision.reason, compat.is_ppo_model(model))
        stop_step = step if stopping else None  # the stop event (in observe mode: where enforce would stop)
        logs = compat.evalstop_logs(
            score, decision.declines, self.stopped_at, self.best_step, self.best_score, stop_step
        )
        self._link.log(args, state, control, logs)
        if self._is_main:
            saved = sum(self.save_seconds) - saves_before
            self.record.overhead_seconds.append(self._own_time + (time.perf_counter() - t0) - saved)
            self._own_time = 0.0

    def _skip(self, control: Any, step: int, shared: dict[str, Any], model: Any) -> None:
        """Every rank: a NaN or inf evaluation is recorded, not decided on; the last one a run may take stops it."""
        self.record.add_non_finite(step, shared["non_finite"], extra=self.schedule.record(step))
        self._trace.non_finite(step, shared["non_finite"], self.record.overhead_seconds)  # main process: its trace
        if shared["stop_reason"] is not None and self.would_stop_at is None:
            self._stop(control, step, shared["stop_reason"], compat.is_ppo_model(model))

    def _stop(self, control: Any, step: int, reason: str, is_ppo: bool) -> None:
        """The first stop (the scheduler's or a broken evaluation's): enforce mode ends training; observe notes it."""
        self.record.would_stop_at, self.record.stop_reason = step, worded(reason, self.mode)  # observe: "would stop"
        if self.mode != "enforce":
            logger.info("EvalStop (observe): %s", self.stop_reason)
            return
        self.record.stopped_at = step
        control.should_training_stop = True
        control.should_save = True  # the stop step's full checkpoint, for inspection and resume
        self._raise_after_save = is_ppo
        logger.warning("EvalStop: stopping at step %d (%s); best step %s", step, reason, self.best_step)
        if self._is_main:
            self._wandb.on_stop(step, reason, self.best_step, self.best_score)

    def _finish(self, args: Any, state: Any, model: Any) -> None:
        """End of the run (stop or completion): restore the best weights, close the trace, tell the scheduler."""
        if self._finished:
            return
        self._finished = True
        self._trace.flush(None, self.overhead_seconds)
        if self.mode == "enforce" and self.restore_best:
            self.record.restored_from = self.best.restore(model, state.global_step)
        if not self._is_main:
            return
        reason = "stopped" if self.stopped_at is not None else "completed"
        self._trace.end(reason, best_step=self.best_step, best_score=self.best_score, stopped_at=self.stopped_at)
        self.job.finish(reason)
