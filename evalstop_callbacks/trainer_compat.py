"""What the callback needs to know about the trainer it serves.

transformers hands every callback event the trainer's ``model``, ``processing_class``, ``optimizer``,
``lr_scheduler`` and dataloaders, never the trainer itself. What only the trainer has is reached through
:class:`TrainerLink`, filled by an explicit ``EvalStopCallback.attach(trainer)`` (as transformers' own
``JITCheckpointCallback.set_trainer``): logging through ``trainer.callback_handler`` to every ``report_to``
backend, ``trainer.save_model`` for weights-only best folders of a sharded model, and ``trainer.evaluate()`` for a
step-0 evaluation of the trainer's own metrics. Without it the callback works from what the events pass (see
``EvalStopCallback.attach``). Also here: telling online RL trainers apart (their own eval metrics score the reward
being optimized), choosing the default evaluator, and TRL 1.12's ``PPOTrainer``, whose loop ignores
``control.should_training_stop`` (:class:`EvalStopTrainingStopped`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .evaluators import Evaluator, MetricEvaluator, error_at_step, unwrap_model
from .schedule import check_has_cadence

logger = logging.getLogger(__name__)

# transformers' restore_callback_states_from_checkpoint rebuilds the callback from JSON args, without its evaluator
# and client; the callback reads its saved state back itself (evalstop_callbacks/state.py).
RESTORE_REFUSED = (
    "EvalStopCallback restores its own state from the checkpoint; leave "
    "restore_callback_states_from_checkpoint=False (the default): transformers would rebuild the "
    "callback without its evaluator"
)


class EvalStopTrainingStopped(RuntimeError):
    """Raised to end a trainer whose loop ignores ``control.should_training_stop`` (TRL 1.12's ``PPOTrainer``).

    By the time it is raised the stop step's checkpoint is saved, the best weights are restored into the live model,
    the trace is closed and the scheduler was told. :func:`evalstop_callbacks.ppo.train_with_evalstop` catches it.

    Args:
        step: Step at which EvalStop stopped the run.
        best_step: Step of the restored best checkpoint.
        best_score: Its eval score.
        reason: The scheduler's reason.
    """

    def __init__(self, step: int, best_step: int | None, best_score: float | None, reason: str) -> None:
        self.step, self.best_step, self.best_score, self.reason = step, best_step, best_score, reason
        super().__init__(
            f"EvalStop stopped training at step {step} ({reason}); best checkpoint: step {best_step} "
            f"(score {best_score}), restored into the model. TRL's PPOTrainer ignores should_training_stop, so the "
            "stop ends trainer.train() with this exception: call "
            "evalstop_callbacks.ppo.train_with_evalstop(trainer) instead of trainer.train() to return normally."
        )


def trainer_name(args: Any) -> str:
    """The trainer's class name read from its arguments' class (GRPOConfig -> GRPOTrainer, else Trainer)."""
    name = type(args).__name__
    return name[:-6] + "Trainer" if name.endswith("Config") else "Trainer"


RL_TRAINERS = ("PPOTrainer", "GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer")


def is_rl_trainer(trainer: Any, args: Any = None) -> bool:
    """Whether the trainer is an online RL trainer, whose eval metrics score its own reward (the proxy).

    Args:
        trainer: The attached trainer, or None (then its arguments' class tells: ``GRPOConfig`` -> ``GRPOTrainer``).
        args: The trainer's arguments.
    """
    if trainer is None:
        return args is not None and trainer_name(args) in RL_TRAINERS
    return (
        any(hasattr(trainer, a) for a in ("reward_funcs", "value_model", "reward_model"))
        or type(trainer).__name__ in RL_TRAINERS
    )


def is_ppo_model(model: Any) -> bool:
    """Whether ``model`` is TRL's PPO ``PolicyAndValueWrapper`` (PPO's loop ignores ``should_training_stop``)."""
    return model is not None and unwrap_model(model) is not model and hasattr(model, "value_model")


def resolve_evaluator(evaluator: Evaluator | None, eval_steps: int | str | None, args: Any, trainer: Any) -> Evaluator:
    """The evaluator to use: ``evaluator``, or for ``EvalStopCallback()`` a :class:`MetricEvaluator` of the trainer's
    ``metric_for_best_model`` (else ``"loss"``); raise a one-line error when the trainer cannot serve it or there is
    no cadence.

    Args:
        evaluator: The callback's evaluator, or None.
        eval_steps: The callback's ``eval_steps`` (None: the trainer's ``eval_strategy`` must give a cadence).
        args: The trainer's ``TrainingArguments``.
        trainer: The attached trainer, or None (its arguments' class then names it).
    """
    name = type(trainer).__name__ if trainer is not None else trainer_name(args)
    if evaluator is None:
        if is_rl_trainer(trainer, args):
            raise ValueError(
                f"EvalStopCallback() needs a world evaluator on {name}: its own eval metrics score the reward "
                "it optimizes; pass e.g. EvalStopCallback(RewardFunctionEvaluator(heldout_prompts, gold_fn), "
                "eval_steps=10)"
            )
        metric = getattr(args, "metric_for_best_model", None)
        gib = getattr(args, "greater_is_better", None) if metric else False
        evaluator = MetricEvaluator(metric or "loss", gib)
    if evaluator.uses_trainer_metrics and trainer is not None:
        if is_rl_trainer(trainer) and hasattr(trainer, "value_model"):
            raise ValueError(
                f"{type(evaluator).__name__} reads trainer.evaluate() metrics, which {name} "
                "does not produce; pass a world evaluator (e.g. RewardFunctionEvaluator)"
            )
        if getattr(trainer, "eval_dataset", None) is None:
            raise ValueError(
                f"{type(evaluator).__name__}({getattr(evaluator, 'metric', '')!r}) reads "
                f"the trainer's eval metrics, but {name} has no eval_dataset; pass eval_dataset= "
                "to the trainer or a world evaluator to the callback"
            )
    check_has_cadence(eval_steps, args)
    return evaluator


def evaluate_at_start(trainer: Any, args: Any) -> bool:
    """Step 0 of a trainer-metric evaluator: the trainer's own evaluation, whose ``on_evaluate`` reports the score
    (and a metric that does not exist raises before training).

    With the attached trainer it runs ``trainer.evaluate()``; without one it sets ``args.eval_on_start``, which the
    Trainer reads right after ``on_train_begin`` (the callback sets it back at that evaluation); nothing to do when
    the arguments ask for it anyway.

    Returns:
        Whether ``args.eval_on_start`` was set here (for the caller to set it back).
    """
    if getattr(args, "eval_on_start", False):
        return False  # the trainer evaluates at step 0 itself, right after on_train_begin
    if trainer is None:
        args.eval_on_start = True
        return True
    trainer.evaluate()
    return False


def warn_competing_best(args: Any, mode: str) -> None:
    """Warn when the trainer's ``load_best_model_at_end`` competes with enforce mode for the best checkpoint."""
    if mode == "enforce" and getattr(args, "load_best_model_at_end", False):
        logger.warning(
            "EvalStop keeps and restores its own best checkpoint (by the world score); "
            "load_best_model_at_end with metric_for_best_model competes for state.best_model_checkpoint"
        )


def evalstop_logs(
    score: float,
    declines: int,
    stopped_at: int | None,
    best_step: int | None,
    best_score: float | None,
    stop_step: int | None = None,
) -> dict[str, float]:
    """The ``evalstop/*`` values of one evaluation, as logged through the trainer (every ``report_to`` backend);
    ``stop_step``: the scheduler's first stop is at this evaluation (``evalstop/stop_step``, the stop event)."""
    logs: dict[str, float] = {
        "evalstop/eval_score": score,
        "evalstop/declines": declines,
        "evalstop/stopped": int(stopped_at is not None),
    }
    if best_score is not None and best_step is not None:
        logs["evalstop/best_score"], logs["evalstop/best_step"] = best_score, best_step
    if stop_step is not None:
        logs["evalstop/stop_step"] = stop_step
    return logs


class TrainerLink:
    """The trainer a callback serves, held weakly (the trainer holds the callback), and logging through it.

    Attributes:
        emitting: True while :meth:`log` hands the callback's own logs to the trainer's callbacks (the callback's
            ``on_log``/``on_evaluate`` then ignore them).
    """

    def __init__(self) -> None:
        self._ref: Callable[[], Any] = lambda: None
        self.emitting = False
        self._warned = False
        self._metrics_at: tuple[int, dict[str, Any]] | None = None

    @property
    def trainer(self) -> Any:
        """The attached trainer, or None (never attached, or gone)."""
        return self._ref()

    def attach(self, trainer: Any) -> None:
        """Hold ``trainer`` (weakly: the trainer holds the callback)."""
        self._ref = weakref.ref(trainer)

    def log(self, args: Any, state: Any, control: Any, logs: Mapping[str, float]) -> None:
        """Into the trainer's logs, as ``Trainer.log`` does: ``log_history`` and every callback's ``on_log``.

        Every ``report_to`` backend (TensorBoard, wandb, MLflow, ...) is a callback of the trainer, so each receives
        the ``evalstop/*`` keys at the evaluation's ``global_step``.
        """
        if getattr(state, "epoch", None) is not None:
            logs = {**logs, "epoch": state.epoch}
        state.log_history.append({**logs, "step": state.global_step})
        handler = getattr(self.trainer, "callback_handler", None)
        if handler is None:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "EvalStop: the evalstop/* values go to state.log_history only; call cb.attach(trainer) to send "
                    "them to the trainer's report_to backends too (transformers does not hand callbacks the trainer)"
                )
            return
        self.emitting = True
        should_log = control.should_log  # the handler resets it; the trainer's own log of this step must still run
        try:
            handler.on_log(args, state, control, dict(logs))
        finally:
            self.emitting = False
            control.should_log = should_log

    def all_datasets_seen(self, metrics: Mapping[str, Any]) -> bool:
        """Whether ``metrics`` hold every eval dataset's metrics (a dict ``eval_dataset`` has one event each)."""
        eval_dataset = getattr(self.trainer, "eval_dataset", None)
        if not isinstance(eval_dataset, Mapping):
            return True
        return all(any(k.startswith(f"eval_{name}_") for k in metrics) for name in eval_dataset)

    def metrics_result(self, step: int, metrics: Mapping[str, Any], evaluator: Evaluator) -> Any:
        """The evaluator's result from the trainer's eval metrics of ``step``, or None while its metric is still to
        come (see :meth:`gather_metrics`).

        Raises:
            EvaluatorError: The evaluator failed on the metrics (named with the step; the same on every rank).
        """
        seen = self.gather_metrics(step, metrics, evaluator)
        if seen is None:
            return None
        try:
            return evaluator.from_metrics(seen)
        except Exception as exc:  # noqa: BLE001 - trainer metrics are the same on every rank: all raise here
            raise error_at_step(exc, step) from exc

    def gather_metrics(self, step: int, metrics: Mapping[str, Any], evaluator: Evaluator) -> dict[str, Any] | None:
        """The trainer's eval metrics of ``step`` so far, or None while the evaluator's metric is still to come (a
        dict ``eval_dataset`` gives one ``on_evaluate`` per dataset, each with its own ``eval_<name>_*`` metrics)."""
        if self._metrics_at is None or self._metrics_at[0] != step:
            self._metrics_at = (step, {})
        seen = self._metrics_at[1]
        seen.update(metrics)
        key = getattr(evaluator, "key", None)
        if key is not None and key(seen) is None:
            if self.trainer is None and any(k.startswith("eval_") and k.endswith("_runtime") for k in seen):
                if "eval_runtime" not in seen:  # one dataset of a dict eval_dataset: which are still to come?
                    raise ValueError(
                        f"EvalStop: metric {getattr(evaluator, 'metric', '')!r} is not among the eval metrics of "
                        f"step {step} ({', '.join(sorted(seen))}); with a dict eval_dataset call cb.attach(trainer), "
                        "so that EvalStop waits for every dataset's metrics"
                    )
            if not self.all_datasets_seen(seen):
                return None
        return seen
