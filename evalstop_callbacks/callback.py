"""``EvalStopCallback``: world-feedback early stopping inside any transformers or TRL trainer.

This module holds the trainer events and the loop "evaluate, report, apply the decision". The decision rule lives in
the scheduler core (``platform_sim.core``), reached through the client; when to evaluate is in
:mod:`~evalstop_callbacks.schedule`, the checked arguments in :mod:`~evalstop_callbacks.settings`, the saved state in
:mod:`~evalstop_callbacks.state`, the trace in :mod:`~evalstop_callbacks.trace_sink`, the trainer's quirks in
:mod:`~evalstop_callbacks.trainer_compat`, which checkpoints are kept in :mod:`~evalstop_callbacks.keeper` and
saving and restoring them in :mod:`~evalstop_callbacks.checkpoints`. The helpers return values; the callback alone
assigns its own state.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from platform_sim.core import Decision, Report

from . import trainer_compat as compat
from .checkpoints import best_weights_dir, checkpoint_dir, mark_best, restore_best, save_weights
from .client import BoundaryClient, EmbeddedClient, refuse_non_finite
from .distributed import failure, share_outcome, world
from .evaluators import EvalResult, Evaluator, EvaluatorError, checked_result, error_at_step, unwrap_model
from .keeper import BestCheckpoints
from .schedule import EvalSchedule, resolve_cadence
from .settings import MODES, CallbackSettings
from .state import CallbackState, exported, saved_state
from .trace_sink import TraceSink, trace_header
from .wandb_logging import WandbLogger, reports_to

__all__ = ["MODES", "EvalStopCallback"]

logger = logging.getLogger(__name__)


class EvalStopCallback(TrainerCallback, ExportableState):
    """A [`TrainerCallback`] that stops training when a held-out world-feedback score declines.

    It evaluates the live model at step 0 (the baseline) and on its cadence, reports the score through a boundary
    client to the scheduler core and applies the decision: at a new best it keeps that step's weights (and points
    ``state.best_model_checkpoint`` at them); on a stop it ends training and loads the best weights back. Every
    evaluation is logged through the trainer (``evalstop/*`` keys). Works with transformers' and TRL's trainers (PPO
    through :mod:`evalstop_callbacks.ppo`); its state survives ``resume_from_checkpoint``. Call :meth:`attach` with
    the trainer for what transformers does not hand a callback (logging to ``report_to`` backends, weights-only
    saves of a sharded model, a step-0 ``trainer.evaluate()``).

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

    Attributes:
        history (`list[dict]`): One entry per evaluation: `step`, `eval_score`, `declines`, `action`.
        best_step, best_score, best_checkpoint: Best evaluation so far and the folder of its weights
            (``<output_dir>/evalstop-best-<step>``, kept by :attr:`keeper`).
        keeper (:class:`~evalstop_callbacks.keeper.BestCheckpoints` or `None`): The keeper of the best checkpoint
            (from ``on_train_begin``).
        stopped_at, would_stop_at (`int` or `None`): Enforce mode's stop step; the scheduler's first stop (both modes).
        restored_from (`str` or `None`): Checkpoint folder whose weights were loaded into the model.
        extra_eval_steps (`list[int]`): Steps of the evaluations made at a hint (`"extra"` in `history`).
        eval_seconds, overhead_seconds, save_seconds (`list[float]`): Per evaluation, the evaluator's time on this
            process and the callback's own time on the main process; the time of each weights-only best save.
    """

    def __init__(
        self, evaluator: Evaluator | None = None, *, eval_steps: int | str | None = None, k: int | None = None,
        min_delta: float | None = None, client: BoundaryClient | None = None, job_id: str | None = None,
        job_type: str = "rlhf", mode: str = "enforce", restore_best: bool = True, trace_path: str | None = None,
        detector: str | Mapping[str, Any] | None = None,
        trace_extras: Callable[[Any, Any], Mapping[str, float]] | None = None,
        cadence: str | Mapping[str, Any] | None = None, max_extra_evals: int = 4,
        max_eval_share: float | None = None, eval_on_start: bool = True,
    ) -> None:  # fmt: skip
        arguments = {name: value for name, value in locals().items() if name != "self"}  # each argument, by name
        self.client: BoundaryClient = client if client is not None else EmbeddedClient()
        s = self.settings = CallbackSettings.check(**{**arguments, "client": self.client})
        self.evaluator, self.job_id, self.job_type, self.mode = evaluator, s.job_id, s.job_type, s.mode
        self.eval_steps, self.k, self.min_delta, self.restore_best = s.eval_steps, s.k, s.min_delta, s.restore_best
        self.trace_path, self.trace_extras, self.eval_on_start = s.trace_path, s.trace_extras, s.eval_on_start
        self.detector_spec, self.cadence_spec, self.eval_budget = s.detector_spec, s.cadence_spec, s.eval_budget
        self.schedule = EvalSchedule(s.eval_budget)
        self.history: list[dict[str, Any]] = []
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_checkpoint: str | None = None
        self.stopped_at: int | None = None
        self.would_stop_at: int | None = None
        self.stop_reason = ""
        self.last_decision: Decision | None = None
        self.restored_from: str | None = None
        self.keeper: BestCheckpoints | None = None
        self._link_at: int | None = None  # a best step whose full checkpoint the trainer saves in this event
        self._set_eval_on_start = False  # args.eval_on_start set for the step-0 evaluation, to be set back
        self.overhead_seconds: list[float] = []
        self.save_seconds: list[float] = []
        self._registered = self._finished = self._is_ppo = self._raise_after_save = False
        self._is_main, self._own_time = True, 0.0
        self._trace, self._link, self._wandb = TraceSink(), compat.TrainerLink(), WandbLogger(False)

    extra_eval_steps = property(lambda self: self.schedule.extra_eval_steps, doc="Steps of the hinted evaluations.")
    eval_seconds = property(lambda self: self.schedule.eval_seconds, doc="Evaluator seconds of each evaluation.")
    max_extra_evals = property(lambda self: self.eval_budget.max_extra_evals, doc="The budget's count of hints.")
    max_eval_share = property(lambda self: self.eval_budget.max_eval_share, doc="The budget's share of time.")

    def attach(self, trainer: Any) -> EvalStopCallback:
        """Serve ``trainer`` with what transformers does not hand a callback (as ``JITCheckpointCallback.set_trainer``).

        transformers passes every event the model, ``processing_class``, optimizer, scheduler and dataloaders, and the
        callback works from those alone: its weights-only best folders are written with ``save_pretrained``, and a
        sharded model's best is the trainer's own full checkpoint. The trainer adds: the ``evalstop/*`` values sent
        to every ``report_to`` backend (``trainer.callback_handler``; without it they reach ``state.log_history``
        only), ``trainer.save_model`` (weights-only folders of FSDP and ZeRO-3 models), a step-0
        ``trainer.evaluate()`` for trainer-metric evaluators, and checks of the evaluator against the trainer now,
        not at ``train()``. The callback is added to the trainer if it is not among its callbacks yet.

        Args:
            trainer: A transformers or TRL trainer.

        Returns:
            The callback, for ``cb = EvalStopCallback(...).attach(trainer)``.

        Raises:
            ValueError: The trainer cannot serve the evaluator (one line naming why).
        """
        handler = getattr(trainer, "callback_handler", None)
        if handler is not None and not any(cb is self for cb in handler.callbacks):
            trainer.add_callback(self)
        self._link.attach(trainer)
        compat.resolve_evaluator(self.evaluator, self.eval_steps, trainer.args, trainer)  # fails now, not mid-run
        return self

    def state(self) -> dict[str, Any]:
        """ExportableState: what every checkpoint's ``trainer_state.json`` keeps of this callback."""
        save = getattr(self.client, "state_dict", None)  # optional: clients that keep local state offer it
        schedule = self.schedule
        saved = CallbackState(
            job_id=self.job_id,
            detector=self.detector_spec,
            history=list(self.history),
            best_step=self.best_step,
            best_score=self.best_score,
            best_checkpoint=self.best_checkpoint,
            stopped_at=self.stopped_at,
            would_stop_at=self.would_stop_at,
            last_eval_step=schedule.last_eval_step,
            extra_eval_steps=list(schedule.extra_eval_steps),
            hinted_step=schedule.hinted_step,
            wall_s=schedule.wall(),
            eval_s=schedule.eval_time(),
            client_state=save() if callable(save) else None,
            keeper=self.keeper.state_dict() if self.keeper is not None else None,
        )
        keys = ("eval_steps", "job_id", "job_type", "mode", "restore_best", "trace_path")
        return exported({**{key: getattr(self, key) for key in keys}, "detector": self.detector_spec}, saved)

    def _resume(self, saved: CallbackState) -> None:
        """Continue ``saved`` (a resumed checkpoint's state), the client's and the keeper's included.

        Raises:
            ValueError: The checkpoint ran another detector or belongs to another job.
        """
        saved.check_resumable(self.detector_spec, self.job_id)
        self.job_id, self.history = saved.job_id, saved.history
        self.best_step, self.best_score, self.best_checkpoint = saved.best_step, saved.best_score, saved.best_checkpoint
        self.stopped_at, self.would_stop_at = saved.stopped_at, saved.would_stop_at
        schedule = self.schedule
        schedule.last_eval_step, schedule.hinted_step = saved.last_eval_step, saved.hinted_step
        schedule.extra_eval_steps = saved.extra_eval_steps
        schedule.wall_offset, schedule.eval_offset = saved.wall_s, saved.eval_s
        load = getattr(self.client, "load_state_dict", None)
        if saved.client_state is not None and callable(load):
            load(saved.client_state)
        if self.keeper is not None:
            if saved.keeper is not None:
                self.keeper.load_state_dict(saved.keeper)
            else:
                self.keeper.adopt()  # a checkpoint saved without the keeper's state: its folders' markers
        logger.info(
            "EvalStop resumed job %s: %d evals, best step %s, declines %s",
            self.job_id,
            len(self.history),
            self.best_step,
            self.history[-1]["declines"] if self.history else 0,
        )

    def on_init_end(self, args, state, control, **kwargs):
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            raise ValueError(compat.RESTORE_REFUSED)  # why: evalstop_callbacks/state.py

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.evaluator = compat.resolve_evaluator(self.evaluator, self.eval_steps, args, self._link.trainer)
        self.schedule.cadence = resolve_cadence(self.eval_steps, self.evaluator, args, state)
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        self._is_ppo, self._finished, self._raise_after_save = compat.is_ppo_model(model), False, False
        resuming = state.global_step > 0
        if not resuming and (self.history or self._registered):
            # A second run would re-report steps the core has seen (conflicts) and inherit this run's best step.
            raise ValueError("this EvalStopCallback already served a training run; create a new one for a new run")
        self.keeper = BestCheckpoints(
            args.output_dir, 1, writer=self._is_main and bool(getattr(args, "should_save", True))
        )
        saved = resuming and saved_state(getattr(state, "stateful_callbacks", None), type(self).__name__, self.job_id)
        if saved:
            self._resume(saved)
        compat.warn_competing_best(args, self.mode)
        self.schedule.start_clock()
        if self._is_main:
            self.job_id, self._registered = self.settings.register(self.client, self.job_id), True
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

    def _due(self, step: int, state: Any, any_step: bool = False) -> bool:
        return self.stopped_at is None and not self._finished and self.schedule.due(step, _max_steps(state), any_step)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._trace.flush(state.global_step, self.overhead_seconds)
        return self._on_cadence("steps", args, state, control, model, processing_class)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        return self._on_cadence("epoch", args, state, control, model, processing_class)

    def _on_cadence(self, kind: str, args: Any, state: Any, control: Any, model: Any, tok: Any) -> Any:
        """A step or epoch ended: evaluate now if it is due (trainer metrics: ask the trainer to evaluate)."""
        step = state.global_step
        if self.schedule.cadence[0] != kind or not self._due(step, state, kind == "epoch"):
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
        if ended or not self.schedule.metrics_due(step, _max_steps(state), self.eval_on_start):
            return control
        seen = self._link.gather_metrics(step, metrics or {}, self.evaluator)
        if seen is None:
            return control  # the metric belongs to a dataset evaluated next
        try:
            result = self.evaluator.from_metrics(seen)
        except Exception as exc:  # noqa: BLE001 - trainer metrics are the same on every rank: all raise here
            raise error_at_step(exc, step) from exc
        payload = self._report(args, state, step, result) if self._is_main else None
        self._apply(args, state, control, step, payload, model, processing_class)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The transformers loop logs a step after on_step_end, PPO before: the trace sink merges either way.
        if logs and self._is_main and not self._link.emitting:
            self._trace.logged(state.global_step, logs)
        return control

    def on_save(self, args, state, control, model=None, **kwargs):
        if self._link_at is not None and self._link_at == state.global_step:
            self._protect_saved(args, self._link_at)
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
        every_rank = self.evaluator.shards and world()[1] > 1
        result: EvalResult | None = None
        error: BaseException | None = None
        if every_rank or self._is_main:
            t_eval = time.perf_counter()
            try:
                result = self.evaluator.evaluate(unwrap_model(model), tok)
            except Exception as exc:  # noqa: BLE001 - named with the step, raised on every rank below
                error = error_at_step(exc, step)
            self.schedule.eval_seconds.append(time.perf_counter() - t_eval)
        if every_rank and error is not None:
            raise error  # the evaluator gathered the failure: every rank raises it at this step, none waits
        payload: dict[str, Any] | None = None
        if self._is_main:
            payload = failure(error) if error is not None else self._report(args, state, step, result)
        self._apply(args, state, control, step, payload, model, tok)

    def _report(self, args: Any, state: Any, step: int, result: Any) -> dict[str, Any]:
        """Main process: send the report, return the payload every rank applies (or the error every rank raises)."""
        t0 = time.perf_counter()
        try:
            if not self._registered:
                self.job_id, self._registered = self.settings.register(self.client, self.job_id), True
            if self.job_id is None:
                raise RuntimeError("EvalStop: the client returned no job id at registration")
            if isinstance(result, EvalResult):  # the one non-finite policy: refused, naming the job and step
                refuse_non_finite(self.job_id, step, result.score, result.scores, EvaluatorError)
            checked_result(result, self.evaluator, step)
            scores = tuple(result.scores) if result.scores else None
            decision = self.client.report(Report(self.job_id, self.job_type, step, result.score, scores))
            extras = dict(self.trace_extras(args, state) or {}) if self.trace_extras is not None else {}
            self._trace.hold(step, result.score, result.scores, extras, self.schedule.wall())
            allowed = self.schedule.hint_allowed(step)
        except Exception as exc:  # noqa: BLE001 - shared with every rank by _apply, then raised everywhere
            return failure(exc)
        self._own_time = time.perf_counter() - t0
        return {"step": step, "score": result.score, "decision": decision.to_dict(), "hint_allowed": allowed}

    def _apply(
        self, args: Any, state: Any, control: Any, step: int, payload: dict[str, Any] | None, model: Any, tok: Any
    ) -> None:
        """Every rank: apply the main process's decision (best checkpoint, stop, logs), or raise its error."""
        t0, saves_before = time.perf_counter(), sum(self.save_seconds)  # the weights-only save is timed apart
        shared = share_outcome(payload, step)  # a failure raises on every rank here
        decision = self.last_decision = Decision.from_dict(shared["decision"])
        score = shared["score"]
        entry = {"step": step, "eval_score": score, "declines": decision.declines, "action": decision.action.value}
        if self.schedule.record(step):
            entry["extra"] = True
        self.history.append(entry)
        self.schedule.take_hint(step, decision, _max_steps(state), bool(shared.get("hint_allowed", True)))
        stopping = decision.should_stop and self.would_stop_at is None
        self._follow_best(args, state, control, step, decision, stopping, model, tok)
        if stopping:
            self._stop(control, step, decision.reason)
        logs = compat.evalstop_logs(score, decision.declines, self.stopped_at, self.best_step, self.best_score)
        if stopping:
            logs["evalstop/stop_step"] = step  # the stop event (in observe mode: where enforce would stop)
        self._link.log(args, state, control, logs)
        if self._is_main:
            saved = sum(self.save_seconds) - saves_before
            self.overhead_seconds.append(self._own_time + (time.perf_counter() - t0) - saved)
            self._own_time = 0.0

    def _follow_best(
        self, args: Any, state: Any, control: Any, step: int, decision: Decision, stopping: bool, model: Any, tok: Any
    ) -> None:
        """Follow the decision's best step; in enforce mode keep its weights and point the trainer state at them."""
        if decision.best_step is None:
            return
        enforce = self.mode == "enforce"
        if decision.best_step != self.best_step:
            if decision.best_step != step:
                # Only the step being evaluated can still be saved; a scheduler naming another step as best (a history
                # this run does not share) would point restore at a checkpoint that was never written.
                logger.warning(
                    "EvalStop: the scheduler names step %s as best, but this run evaluated step %s "
                    "and has no checkpoint of step %s",
                    decision.best_step,
                    step,
                    decision.best_step,
                )
            self.best_step, self.best_score = decision.best_step, decision.best_score
            if enforce:
                self.best_checkpoint = self._keep_best(args, control, step, stopping, model, tok)
        path, best_step, best_score = self.best_checkpoint, self.best_step, self.best_score
        if enforce and path and best_step is not None and best_score is not None and self.evaluator is not None:
            # kept set (resume, other tools, the trainer's own best-metric bookkeeping)
            mark_best(state, path, best_step, float(self.evaluator.to_metric(best_score)))

    def _keep_best(self, args: Any, control: Any, step: int, stopping: bool, model: Any, tok: Any) -> str | None:
        """Keep the new best step's weights as ``<output_dir>/evalstop-best-<step>``; the folder (or the previous
        one, when step 0 cannot be saved).

        A step the trainer saves anyway (its own schedule, or the stop) is linked from its full checkpoint once saved
        (:meth:`on_save`); any other is written weights-only (no optimizer state), the previous one deleted.
        """
        assert self.keeper is not None and self.best_score is not None
        path = best_weights_dir(args.output_dir, step)
        if not (control.should_save or stopping):
            t0 = time.perf_counter()
            if save_weights(self._link.trainer, unwrap_model(model), tok, path, self._is_main):
                self.save_seconds.append(time.perf_counter() - t0)
                self.keeper.add(step, self.best_score, path)
                return path
        if step == 0:
            logger.warning(
                "EvalStop: the step-0 weights of a sharded model are saved only through the trainer "
                "(cb.attach(trainer)); restore cannot go back to them"
            )
            return self.best_checkpoint
        control.should_save = True
        self._link_at = step
        return path

    def _protect_saved(self, args: Any, step: int) -> None:
        """The trainer saved the best step's full checkpoint: link it into ``evalstop-best-<step>``."""
        assert self.keeper is not None and self.best_score is not None
        self._link_at = None
        source = checkpoint_dir(args.output_dir, step)
        if self.keeper.writer and not os.path.isdir(source):
            logger.warning("EvalStop: the best step %d has no checkpoint %s to keep", step, source)
            return
        self.keeper.protect(step, self.best_score, source)

    def _stop(self, control: Any, step: int, reason: str) -> None:
        """The scheduler's first stop: enforce mode ends training (saving the stop step); observe mode notes it."""
        self.would_stop_at, self.stop_reason = step, reason
        if self.mode != "enforce":
            logger.info("EvalStop (observe): would stop at step %d (%s)", step, reason)
            return
        self.stopped_at = step
        control.should_training_stop = True
        control.should_save = True  # the stop step's full checkpoint, for inspection and resume
        self._raise_after_save = self._is_ppo
        logger.warning("EvalStop: stopping at step %d (%s); best step %s", step, reason, self.best_step)
        if self._is_main:
            self._wandb.on_stop(step, reason, self.best_step, self.best_score)

    def _finish(self, args: Any, state: Any, model: Any) -> None:
        """End of the run (stop or completion): restore the best weights, close the trace, tell the scheduler."""
        if self._finished:
            return
        self._finished = True
        self._trace.flush(None, self.overhead_seconds)
        if self.mode == "enforce" and self.restore_best and self.best_step not in (None, state.global_step):
            policy = model and unwrap_model(model)
            self.restored_from = restore_best(policy, self.best_checkpoint, self.best_step, self.best_score)
        if not self._is_main:
            return
        reason = "stopped" if self.stopped_at is not None else "completed"
        self._trace.end(reason, best_step=self.best_step, best_score=self.best_score, stopped_at=self.stopped_at)
        if self._registered and self.job_id is not None:
            self.client.finish(self.job_id, reason)


def _max_steps(state: Any) -> int:
    return int(getattr(state, "max_steps", 0) or 0)
