"""World-feedback evaluators: the held-out score that EvalStop watches.

An :class:`Evaluator` turns the live model into one number (higher is better) plus, where it has them, one score
per held-out example. Three kinds ship:

- :class:`RewardFunctionEvaluator` generates completions for held-out prompts with the live policy and scores them
  with a function of TRL's reward-function signature ``fn(prompts, completions, **kwargs) -> list[float]``.
- :class:`RewardModelEvaluator` generates the same way and scores prompt + completion with a local
  sequence-classification (gold) model.
- :class:`MetricEvaluator` takes a named metric from the trainer's own evaluation (``on_evaluate`` metrics).

Evaluation must not change training: the generating evaluators save and restore the torch RNG state (CPU and CUDA),
put the model in eval mode and back, and run under ``torch.no_grad()``. Their own sampling uses a fixed seed, so the
same weights always get the same score: that is what lets a test prove that the restored model is the best one.

Precision: scores are computed in the dtype of the model's own weights with autocast off. Mixed-precision training
(``bf16=True``/``fp16=True``) wraps the live model's ``forward`` in autocast; the evaluators bypass that wrapper while
they score, so the live model, the restored best checkpoint and a fresh ``from_pretrained`` of it all score the same.

Several processes: the generating evaluators split the held-out set into fixed batches of ``batch_size`` prompts;
batch ``b`` is generated on rank ``b % world_size`` with its own seed (``seed + b``), so a batch's completions do not
depend on the number of ranks. Ranks run the same number of ``generate`` calls (a sharded model, FSDP or ZeRO-3, needs
every rank in every forward), the per-example scores are gathered in the held-out order, and every rank returns the
same :class:`EvalResult`.
"""

from .base import EvalResult, Evaluator, EvaluatorError, checked_result, error_at_step
from .metric import MetricEvaluator
from .model_context import isolated_eval, preserved_rng, scoring_precision, unwrap_model
from .reward import RewardFunctionEvaluator, RewardModelEvaluator, check_reward_fn

__all__ = [
    "EvalResult",
    "Evaluator",
    "EvaluatorError",
    "MetricEvaluator",
    "RewardFunctionEvaluator",
    "RewardModelEvaluator",
    "check_reward_fn",
    "checked_result",
    "error_at_step",
    "isolated_eval",
    "preserved_rng",
    "scoring_precision",
    "unwrap_model",
]
