"""MetricEvaluator reads the spread of its metric where tools log it: TRL's ``.../mean`` with ``.../std`` (n = the eval
set's prompts x generations), ``X`` with ``X_std``, lm-evaluation-harness's ``X_stderr`` (turned into a standard
deviation with n), or names given explicitly; it says once which evidence the detector gets and why."""

from __future__ import annotations

import logging
import math

import pytest
from datasets import Dataset
from transformers import TrainingArguments
from trl import GRPOConfig

from evalstop_callbacks.evaluators import EvaluatorError, MetricEvaluator
from evalstop_callbacks.evaluators.metric import eval_set_count, spread_siblings

LOGGER = "evalstop_callbacks.evaluators.metric"


def _prompts(n: int) -> Dataset:
    return Dataset.from_dict({"prompt": [f"p{i}" for i in range(n)]})


def test_the_sibling_rules() -> None:
    assert spread_siblings("eval_rewards/gold/mean") == [
        ("eval_rewards/gold/std", False),
        ("eval_rewards/gold/mean_std", False),
        ("eval_rewards/gold/mean_stderr", True),
    ]
    assert spread_siblings("acc,none") == [("acc_std,none", False), ("acc_stderr,none", True)]


def test_grpo_evaluation_mean_and_std_with_n_from_prompts_times_generations(tmp_path, caplog) -> None:
    args = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_eval_batch_size=4,
        use_cpu=True,
        bf16=False,
        report_to=[],
    )
    assert eval_set_count(args, _prompts(16)) == 64
    evaluator = MetricEvaluator("rewards/gold/mean")
    evaluator.use_eval_set(args, _prompts(16))
    metrics = {"eval_rewards/gold/mean": 0.5, "eval_rewards/gold/std": 0.25, "eval_loss": 0.1}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        first = evaluator.from_metrics(metrics)
        second = evaluator.from_metrics({**metrics, "eval_rewards/gold/mean": 0.4})
    assert (first.score, first.std, first.n) == (0.5, 0.25, 64) and (second.std, second.n) == (0.25, 64)
    told = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(told) == 1 and "mean-and-spread" in told[0] and "'eval_rewards/gold/std'" in told[0]


def test_lm_eval_stderr_becomes_a_standard_deviation_with_n() -> None:
    evaluator = MetricEvaluator("acc,none", n=400)
    result = evaluator.from_metrics({"acc,none": 0.6, "acc_stderr,none": 0.02})
    assert result.n == 400 and math.isclose(result.std, 0.02 * 20.0)


def test_x_std_sibling_and_an_eval_set_size(tmp_path) -> None:
    evaluator = MetricEvaluator("reward")
    evaluator.use_eval_set(TrainingArguments(output_dir=str(tmp_path), report_to=[]), _prompts(30))
    result = evaluator.from_metrics({"eval_reward": 0.3, "eval_reward_std": 0.1})
    assert (result.std, result.n) == (0.1, 30)


def test_explicit_names_and_a_loss_metric_negated_with_the_same_spread() -> None:
    evaluator = MetricEvaluator("loss", std_metric="loss_spread", n=12)
    result = evaluator.from_metrics({"eval_loss": 2.0, "eval_loss_spread": 0.5, "eval_loss_std": 9.0})
    assert (result.score, result.std, result.n) == (-2.0, 0.5, 12)  # the explicit name wins over the automatic one
    assert MetricEvaluator("loss", std_metric="ppl_stderr", n=100).from_metrics(
        {"eval_loss": 2.0, "eval_ppl_stderr": 0.01}
    ).std == pytest.approx(0.1)


def test_means_only_when_there_is_no_spread_or_no_count(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        no_sibling = MetricEvaluator("accuracy", n=50).from_metrics({"eval_accuracy": 0.7})
        no_count = MetricEvaluator("reward").from_metrics({"eval_reward": 0.7, "eval_reward_std": 0.1})
    assert (no_sibling.std, no_sibling.n, no_count.std, no_count.n) == (None, None, None, None)
    told = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "logs no spread of 'eval_accuracy'" in told[0] and "std_metric=NAME" in told[0]
    assert "count of its example scores is not known" in told[1] and "n=N" in told[1]
    # An iterable eval set has no size: no count.
    assert eval_set_count(TrainingArguments(output_dir=str(tmp_path), report_to=[]), iter(range(3))) is None
    # A dict of eval sets: the one whose name leads the metric.
    sets = {"a": _prompts(5), "b": _prompts(7)}
    assert eval_set_count(None, sets, "eval_b_accuracy") == 7 and eval_set_count(None, sets, "c_loss") is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1, "x"])
def test_a_bad_spread_is_left_out_with_one_warning(bad, caplog) -> None:
    evaluator = MetricEvaluator("reward", n=10)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = [evaluator.from_metrics({"reward": 0.5, "reward_std": bad}) for _ in range(2)]
    assert all((r.score, r.std, r.n) == (0.5, None, None) for r in results)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize(
    ("kwargs", "words"), [({"n": 1}, "n must be an integer >= 2"), ({"std_metric": ""}, "std_metric")]
)
def test_bad_arguments_are_refused(kwargs, words) -> None:
    with pytest.raises(EvaluatorError, match=words):
        MetricEvaluator("reward", **kwargs)
