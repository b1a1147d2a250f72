"""What TRL 1.12's ``PPOTrainer`` (``trl.experimental.ppo``) needs: one wrapper call around ``train()``.

Its loop ignores ``control.should_training_stop``, so :class:`~evalstop_callbacks.EvalStopCallback` ends a PPO run by
raising :class:`~evalstop_callbacks.EvalStopTrainingStopped` from ``on_save`` right after the stop step's
checkpoint is written (having restored the best weights, closed the trace and told the scheduler first, because
``on_train_end`` does not run after a raise). Replace ``trainer.train()`` by ``train_with_evalstop(trainer)`` to get a
normal return instead of that exception; it also attaches the trainer to its EvalStop callbacks
(:meth:`~evalstop_callbacks.EvalStopCallback.attach`). The callback also unwraps PPO's ``PolicyAndValueWrapper`` by itself: it
evaluates and restores ``.policy`` (PPO checkpoints hold the policy only).
"""

from __future__ import annotations

import logging
from typing import Any

from . import trainer_compat
from .callback import EvalStopCallback

logger = logging.getLogger(__name__)


def train_with_evalstop(trainer: Any, **train_kwargs: Any) -> trainer_compat.EvalStopTrainingStopped | None:
    """Run ``trainer.train(**train_kwargs)`` and return normally when EvalStop stops it.

    Works for any trainer (for those that honour ``should_training_stop`` it is ``trainer.train()`` with the
    trainer attached to its EvalStop callbacks).

    Args:
        trainer: A trainer with an :class:`EvalStopCallback` among its callbacks.
        **train_kwargs: Passed to ``trainer.train``.

    Returns:
        The stop (step, best step, best score, reason) if EvalStop ended the run by raising, else ``None``.
    """
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    ours = [cb for cb in callbacks if isinstance(cb, EvalStopCallback)]
    if not ours:
        logger.warning("train_with_evalstop: the trainer has no EvalStopCallback")
    for cb in ours:
        cb.attach(trainer)
    try:
        trainer.train(**train_kwargs)
    except trainer_compat.EvalStopTrainingStopped as stop:
        logger.info("%s", stop)
        return stop
    return None
