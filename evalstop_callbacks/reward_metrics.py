"""The world score from an online RL trainer's own evaluation: a reward function of weight 0.

TRL's GRPO and RLOO trainers evaluate every reward function on ``eval_dataset`` and log each one's mean as
``eval_rewards/<name>/mean``; ``reward_weights`` says how much each counts in the reward they optimize. A reward
function of weight 0.0 is computed on held-out prompts and never trained on: a world score the policy cannot fit
directly, which is what EvalStop must watch. Any other eval metric of these trainers (the total ``eval_reward``, a
reward function of nonzero weight) scores the reward being optimized, which rises while the policy games it.

:func:`reward_metric_evaluator` turns the trainer's ``metric_for_best_model`` into the evaluator of
``EvalStopCallback()``, or refuses in one line naming why. With the trainer attached (``cb.attach(trainer)``) the
reward functions' names and weights are the trainer's own; without it the arguments give the weights and the first
evaluation's metrics (at step 0, before training) give the names, in the order the trainer logs them, which is the
order of its ``reward_funcs``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .evaluators import EvalResult, EvaluatorError, MetricEvaluator

#: ``eval_rewards/<name>/mean`` (the ``eval_`` prefix optional, as ``metric_for_best_model`` allows).
REWARD_MEAN = re.compile(r"^(?:eval_)?rewards/(?P<name>.+)/mean$")
#: The total reward of GRPO/RLOO (weighted sum of the reward functions): what the trainer optimizes.
TOTAL_REWARD = ("reward", "eval_reward")


def _world_evaluator_hint() -> str:
    return (
        'name a reward function of weight 0 (reward_weights=[..., 0.0], metric_for_best_model="eval_rewards/<name>/mean") '
        "or pass a world evaluator, e.g. EvalStopCallback(RewardFunctionEvaluator(heldout_prompts, gold_fn), "
        "eval_steps=10)"
    )


def _weights_of(trainer: Any, args: Any) -> list[float] | None:
    weights = getattr(trainer, "reward_weights", None) if trainer is not None else None
    if weights is None:
        weights = getattr(args, "reward_weights", None)
    if weights is None:
        return None
    return [float(w) for w in (weights.tolist() if hasattr(weights, "tolist") else weights)]


def check_zero_weight(name: str, names: Sequence[str], weights: Sequence[float] | None, trainer_name: str) -> None:
    """Raise a one-line ``ValueError`` unless ``name`` is one of the reward functions ``names`` with weight 0.

    Args:
        name: The reward function ``metric_for_best_model`` names.
        names: The trainer's reward functions, in the order of its ``reward_funcs``.
        weights: Their ``reward_weights`` (None: every one weighs 1.0, TRL's default).
        trainer_name: The trainer, for the message.
    """
    if name not in names:
        raise ValueError(
            f"metric_for_best_model names reward function {name!r}, which {trainer_name} does not have (its reward "
            f"functions: {', '.join(names)}); {_world_evaluator_hint()}"
        )
    weight = 1.0 if weights is None else weights[list(names).index(name)]
    if weight != 0.0:
        raise ValueError(
            f"metric_for_best_model names reward function {name!r}, which {trainer_name} optimizes (weight {weight:g} "
            f"in reward_weights): its eval mean rises while the policy games it; {_world_evaluator_hint()}"
        )


class ZeroWeightRewardEvaluator(MetricEvaluator):
    """The eval mean of a reward function of weight 0 as the world score (``EvalStopCallback()`` on GRPO/RLOO).

    Args:
        metric: The trainer's ``metric_for_best_model`` (``eval_rewards/<name>/mean``).
        reward_name: ``<name>``.
        weights: The trainer's ``reward_weights``, to check the name against at the first evaluation when the
            trainer's own reward function names were not at hand (None: checked already).
        trainer_name: The trainer, for messages.
    """

    def __init__(self, metric: str, reward_name: str, weights: Sequence[float] | None, trainer_name: str) -> None:
        super().__init__(metric, greater_is_better=True)
        self.reward_name = reward_name
        self._unchecked_weights = list(weights) if weights is not None else None
        self._trainer_name = trainer_name

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "reward_function": self.reward_name, "reward_weight": 0.0}

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        if self._unchecked_weights is not None:
            names = [m.group("name") for m in map(REWARD_MEAN.match, metrics) if m is not None]
            if len(names) != len(self._unchecked_weights):
                raise EvaluatorError(
                    f"the eval metrics name {len(names)} reward functions ({', '.join(names)}) for "
                    f"{len(self._unchecked_weights)} reward_weights; call cb.attach(trainer) so that EvalStop reads "
                    "the trainer's own reward functions"
                )
            check_zero_weight(self.reward_name, names, self._unchecked_weights, self._trainer_name)
            self._unchecked_weights = None
        return super().from_metrics(metrics)


def reward_metric_evaluator(args: Any, trainer: Any, trainer_name: str) -> ZeroWeightRewardEvaluator:
    """The evaluator of ``EvalStopCallback()`` on GRPO/RLOO: the eval mean of the reward function of weight 0 that
    ``metric_for_best_model`` names; a one-line ``ValueError`` naming why when it names anything else.

    Args:
        args: The trainer's arguments (``metric_for_best_model``, ``reward_weights``).
        trainer: The attached trainer (its ``reward_func_names`` and ``reward_weights``), or None.
        trainer_name: The trainer's class name, for messages.
    """
    metric = getattr(args, "metric_for_best_model", None)
    if not metric:
        raise ValueError(
            f"EvalStopCallback() needs a world score on {trainer_name}, and metric_for_best_model is not set: "
            f"{_world_evaluator_hint()}"
        )
    if metric in TOTAL_REWARD:
        raise ValueError(
            f"metric_for_best_model={metric!r} is the total reward {trainer_name} optimizes: it rises while the "
            f"policy games it; {_world_evaluator_hint()}"
        )
    match = REWARD_MEAN.match(metric)
    if match is None:
        raise ValueError(
            f"metric_for_best_model={metric!r} is no reward function's eval mean: on {trainer_name} EvalStopCallback() "
            f"watches eval_rewards/<name>/mean of a reward function of weight 0; {_world_evaluator_hint()}"
        )
    name, weights = match.group("name"), _weights_of(trainer, args)
    names = getattr(trainer, "reward_func_names", None) if trainer is not None else None
    if names is not None:
        check_zero_weight(name, list(names), weights, trainer_name)
        return ZeroWeightRewardEvaluator(metric, name, None, trainer_name)
    if weights is None or 0.0 not in weights:
        raise ValueError(
            f"metric_for_best_model={metric!r} names reward function {name!r}, which {trainer_name} optimizes: no "
            f"reward function has weight 0 (reward_weights={weights}); {_world_evaluator_hint()}"
        )
    return ZeroWeightRewardEvaluator(metric, name, weights, trainer_name)
