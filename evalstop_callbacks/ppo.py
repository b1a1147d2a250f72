"""What TRL 1.12's ``PPOTrainer`` (``trl.experimental.ppo``) needs: one wrapper call around ``train()``.

Its loop ignores ``control.should_training_stop``, so :class:`~evalstop_callbacks.EvalStopCallback` ends a PPO run by
raising :class:`~evalstop_callbacks.callback.EvalStopTrainingStopped` from ``on_save`` right after the stop step's
checkpoint is written (having restored the best weights, closed the trace and told the scheduler first, because
``on_train_end`` does not run after a raise). Replace ``trainer.train()`` by ``train_with_evalstop(trainer)`` to get a
normal return instead of that exception. The callback also unwraps PPO's ``PolicyAndValueWrapper`` by itself: it
evaluates and restores ``.policy`` (PPO checkpoints hold the policy only).
"""

from __future__ import annotations

import logging
from typing import Any

from .callback import EvalStopCallback, EvalStopTrainingStopped

logger = logging.getLogger(__name__)


def train_with_evalstop(trainer: Any, **train_kwargs: Any) -> EvalStopTrainingStopped | None:
    """Run ``trainer.train(**train_kwargs)`` and return normally when EvalStop stops it.

    Works for any trainer (for those that honour ``should_training_stop`` it is just ``trainer.train()``).

    Args:
        trainer: A trainer with an :class:`EvalStopCallback` among its callbacks.
        **train_kwargs: Passed to ``trainer.train``.

    Returns:
        The stop (step, best step, best score, reason) if EvalStop ended the run by raising, else ``None``.
    """
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
    if not any(isinstance(cb, EvalStopCallback) for cb in callbacks):
        logger.warning("train_with_evalstop: the trainer has no EvalStopCallback")
    try:
        trainer.train(**train_kwargs)
    except EvalStopTrainingStopped as stop:
        logger.info("%s", stop)
        return stop
    return None
