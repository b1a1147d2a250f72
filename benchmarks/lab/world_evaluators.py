"""The held-out evaluators of the environments beyond ``bow-proxy`` (whose own is
:class:`~evalstop_callbacks.demo.overopt.OveroptEvaluator`): gold on sampled completions with the proxy of the same
completions kept (:class:`WorldEvaluator`), and the held-out likelihood of good demonstrations of an SFT run
(:class:`HeldoutNLLEvaluator`). Each gives ``trace_extras`` for ``EvalStopCallback(trace_extras=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from evalstop_callbacks.evaluators import EvalResult, Evaluator, RewardFunctionEvaluator, isolated_eval, unwrap_model


class WorldEvaluator(RewardFunctionEvaluator):
    """Gold on sampled completions of the held-out prompts (the eval score), keeping the proxy of the same completions.

    Args:
        prompts: The held-out prompts (each repeated for several samples).
        gold: The gold score, a TRL reward function.
        proxy: The proxy, a TRL reward function; its mean on the evaluation's completions goes into the trace as
            ``proxy_reward`` (research data, never reported to the scheduler). None: no proxy of the completions
            (the callback then records the trainer's own logged reward, if any, as ``proxy_reward``).
        **kwargs: Passed to ``RewardFunctionEvaluator``.
    """

    def __init__(self, prompts: Sequence[str], gold: Callable, proxy: Callable | None, **kwargs: Any) -> None:
        super().__init__(prompts, gold, **kwargs)
        self.proxy = proxy
        self.last_proxy = float("nan")

    def evaluate(self, model: Any, tokenizer: Any = None, *, local: bool = False) -> EvalResult:
        result = super().evaluate(model, tokenizer, local=local)
        if self.proxy is not None:
            values = self.proxy(list(self.prompts), list(result.completions or ()))
            self.last_proxy = float(sum(values) / len(values))
        return result

    def trace_extras(self, args: Any = None, state: Any = None) -> dict[str, float]:
        """For ``EvalStopCallback(trace_extras=...)``: the held-out proxy of the evaluation just made."""
        return {} if self.proxy is None else {"proxy_reward": self.last_proxy}


class HeldoutNLLEvaluator(Evaluator):
    """Held-out likelihood of good demonstrations: per example ``-`` mean token negative log-likelihood.

    The score of an SFT run: it rises while the model learns the task and falls when it overfits its few training
    demonstrations. The same quantity on the training demonstrations goes into the trace as ``proxy_reward`` (the
    training objective, which keeps improving).

    Args:
        prompts: The held-out examples' prompts.
        completions: Their good completions.
        train_prompts: The training demonstrations' prompts.
        train_completions: Their completions.
        tokenizer: The policy's tokenizer.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        train_prompts: Sequence[str],
        train_completions: Sequence[str],
        tokenizer: Any,
    ) -> None:
        self.prompts, self.completions = list(prompts), list(completions)
        self.train = (list(train_prompts), list(train_completions))
        self.tokenizer = tokenizer
        self.last_proxy = float("nan")

    def _nll(self, model: Any, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        import torch

        tok = self.tokenizer
        out: list[float] = []
        with isolated_eval(model, None):
            for p, c in zip(prompts, completions):
                p_ids = tok(p)["input_ids"]
                c_ids = tok(c)["input_ids"] + [tok.eos_token_id]
                ids = torch.tensor([p_ids + c_ids], device=model.device)
                logits = model(input_ids=ids).logits[0, len(p_ids) - 1 : -1]
                nll = torch.nn.functional.cross_entropy(logits.float(), ids[0, len(p_ids) :])
                out.append(-float(nll))
        return out

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        model = unwrap_model(model)
        scores = self._nll(model, self.prompts, self.completions)
        train = self._nll(model, *self.train)
        self.last_proxy = sum(train) / len(train)
        return EvalResult(sum(scores) / len(scores), tuple(scores))

    def describe(self) -> dict:
        return {"evaluator": type(self).__name__, "n_prompts": len(self.prompts)}

    def trace_extras(self, args: Any = None, state: Any = None) -> dict[str, float]:
        """For ``EvalStopCallback(trace_extras=...)``: the likelihood of the training demonstrations."""
        return {"proxy_reward": self.last_proxy}
