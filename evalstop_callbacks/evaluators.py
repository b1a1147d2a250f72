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

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class EvaluatorError(ValueError):
    """An evaluator was misconfigured or produced an unusable score (NaN, wrong length, not a number)."""


@dataclass(frozen=True)
class EvalResult:
    """One evaluation of the live model.

    Args:
        score: Mean world-feedback score (higher is better). Finite.
        scores: Per-example scores in the fixed order of the held-out set, or ``None`` when the evaluator has only
            an aggregate (e.g. :class:`MetricEvaluator`).
        completions: The generated completions, for inspection and traces (not sent to the scheduler).
    """

    score: float
    scores: tuple[float, ...] | None = None
    completions: tuple[str, ...] | None = None


class Evaluator(ABC):
    """Interface of a world-feedback evaluator used by :class:`~evalstop_callbacks.EvalStopCallback`.

    Subclasses implement :meth:`evaluate`. Evaluators that read the trainer's own metrics instead of running the model
    set :attr:`uses_trainer_metrics` to ``True`` and implement :meth:`from_metrics`; the callback then reports at each
    ``on_evaluate`` event instead of running the evaluator itself.
    """

    #: True for evaluators fed by the trainer's ``on_evaluate`` metrics (the callback then forces evaluations).
    uses_trainer_metrics: bool = False
    #: True for evaluators whose :meth:`evaluate` runs on every rank (each on its shard) and returns the same gathered
    #: result everywhere. False: the callback runs :meth:`evaluate` on the main process only (whole model needed there).
    shards: bool = False

    def to_metric(self, score: float) -> float:
        """The score in the trainer's own convention for ``state.best_metric`` (identity: higher is better)."""
        return score

    @abstractmethod
    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        """Score ``model`` (the unwrapped live policy) on the held-out set.

        Args:
            model: The live model, already unwrapped from PPO's policy-and-value wrapper and from DDP.
            tokenizer: The trainer's processing class, used when the evaluator was built without its own tokenizer.

        Returns:
            An :class:`EvalResult` with a finite mean score.
        """

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        """Turn the trainer's evaluation metrics into a result (only for ``uses_trainer_metrics`` evaluators)."""
        raise NotImplementedError(f"{type(self).__name__} does not read trainer metrics")

    def describe(self) -> dict[str, Any]:
        """Plain-data description of the evaluator, recorded in trace headers."""
        return {"evaluator": type(self).__name__}


def _example(i: int, prompts: Sequence[Any] | None, index: Sequence[int] | None) -> str:
    number = index[i] if index is not None and i < len(index) else i
    if prompts is None or i >= len(prompts):
        return f"example {number}"
    text = str(prompts[i])
    return f"example {number} (prompt {text[:60] + '...' if len(text) > 60 else text!r})"


def _finite_scores(
    raw: Any, n: int, who: str, prompts: Sequence[Any] | None = None, index: Sequence[int] | None = None
) -> tuple[float, ...]:
    """Check that ``raw`` is ``n`` finite numbers; raise :class:`EvaluatorError` naming ``who`` and the bad entry.

    Args:
        raw: What the scorer returned.
        n: Number of examples scored.
        who: The scorer, for the message.
        prompts: The prompts of those examples, quoted in the message of a bad entry.
        index: Their positions in the held-out set (default ``0..n-1``).
    """
    if isinstance(raw, (int, float)) or (hasattr(raw, "ndim") and getattr(raw, "ndim", 1) == 0):
        raise EvaluatorError(f"{who} must return a list of {n} numbers (one per example), got one scalar {raw!r}")
    try:
        values = list(raw)
    except TypeError:
        raise EvaluatorError(f"{who} must return a list of {n} numbers, got {type(raw).__name__}") from None
    if len(values) != n:
        raise EvaluatorError(f"{who} returned {len(values)} scores for {n} held-out examples")
    out = []
    for i, v in enumerate(values):
        if hasattr(v, "item"):  # 0-d tensors and numpy scalars
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise EvaluatorError(f"{who} returned a non-number for {_example(i, prompts, index)}: {v!r}")
        if not math.isfinite(v):
            raise EvaluatorError(
                f"{who} returned a non-finite score ({v}) for {_example(i, prompts, index)}; EvalStop never "
                "decides on NaN or inf"
            )
        out.append(float(v))
    return tuple(out)


def unwrap_model(model: Any) -> Any:
    """The policy inside the wrappers trainers hand to callbacks.

    Unwraps DDP/DataParallel (``.module``) and TRL's PPO ``PolicyAndValueWrapper`` (``.policy``), in any nesting.
    PEFT models are kept as they are: they generate with their adapters active.
    """
    for _ in range(8):  # wrappers nest at most a few levels; a bound avoids a loop on odd objects
        if type(model).__name__ == "PolicyAndValueWrapper" or (
            hasattr(model, "policy") and hasattr(model, "value_model")
        ):
            model = model.policy
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model
    return model


@contextlib.contextmanager
def preserved_rng(seed: int | None = None) -> Iterator[None]:
    """Run a block without touching the training RNG streams.

    Saves and restores the torch CPU and CUDA RNG states (evaluation sampling would otherwise shift the random
    stream of training) and Python's and NumPy's global ones (a reward function may draw from them). With ``seed``
    the block starts from ``torch.manual_seed(seed)``, so the same weights always get the same completions.
    """
    import random

    import torch

    py_state = random.getstate()
    try:
        import numpy as np
    except ImportError:  # numpy is optional here
        np_state = None
    else:
        np_state = np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        if seed is not None:
            torch.manual_seed(seed)  # also seeds every CUDA device
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(py_state)
        if np_state is not None:  # numpy was imported
            np.random.set_state(np_state)


@contextlib.contextmanager
def isolated_eval(model: Any, seed: int | None) -> Iterator[None]:
    """:func:`preserved_rng` plus eval mode and no gradients; the model gets its previous train/eval mode back."""
    import torch

    was_training = model.training
    try:
        with preserved_rng(seed):
            model.eval()
            with torch.no_grad():
                yield
    finally:
        if was_training:
            model.train()


@contextlib.contextmanager
def scoring_precision(model: Any) -> Iterator[None]:
    """Score in the dtype of the model's weights, with autocast off.

    accelerate's mixed precision (the Trainer's ``bf16=True``/``fp16=True``) replaces the prepared model's ``forward``
    by an autocast wrapper and keeps the original as ``_original_forward``; inside this block the original is back,
    and any autocast context the caller opened is disabled. Without this the live model would score in bf16 while the
    same weights reloaded from the best checkpoint score in fp32.
    """
    import torch

    wrapped = []
    for module in _modules_with_forward_wrapper(model):
        wrapped.append((module, module.__dict__["forward"]))
        module.forward = module.__dict__["_original_forward"]
    try:
        with contextlib.ExitStack() as stack:
            for device_type in ("cpu", "cuda"):
                if device_type == "cpu" or torch.cuda.is_available():
                    stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
            yield
    finally:
        for module, forward in wrapped:
            module.forward = forward


def _modules_with_forward_wrapper(model: Any) -> list[Any]:
    # The wrapper sits on the object accelerate prepared: the model itself or a wrapper around it (PEFT's base model).
    seen: set[int] = set()
    out: list[Any] = []
    todo: list[Any] = [model]
    for _ in range(6):
        nxt: list[Any] = []
        for m in todo:
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            d = getattr(m, "__dict__", {})
            if "_original_forward" in d and "forward" in d:
                out.append(m)
            nxt.extend(getattr(m, attr, None) for attr in ("module", "base_model", "model"))
        todo = nxt
    return out


def _is_sharded(model: Any) -> bool:
    """Whether ``model``'s parameters are sharded across ranks (FSDP, DeepSpeed ZeRO-3): every rank must forward."""
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled, is_fsdp_managed_module
    except ImportError:  # older transformers
        return False
    from .checkpoints import _is_zero3  # partitioned by DeepSpeed without the Trainer's global ZeRO-3 config too

    try:
        return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model) or _is_zero3(model))
    except Exception:  # noqa: BLE001 - detection only; a plain model answers False
        return False


def _check_prompts(prompts: Any) -> list[Any]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise EvaluatorError(f"prompts must be a list of held-out prompts, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise EvaluatorError("prompts is empty: a world-feedback evaluator needs at least one held-out prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            continue
        if isinstance(p, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in p):
            continue  # conversational prompt, as TRL accepts
        raise EvaluatorError(f"prompts[{i}] must be a string or a list of chat messages, got {type(p).__name__}")
    return prompts


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EvaluatorError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class _GeneratingEvaluator(Evaluator):
    """Shared part of the evaluators that sample completions from the live policy."""

    def __init__(
        self,
        prompts: Sequence[Any],
        tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.prompts = _check_prompts(prompts)
        self.tokenizer = tokenizer
        self.max_new_tokens = _check_positive_int("max_new_tokens", max_new_tokens)
        self.batch_size = _check_positive_int("batch_size", batch_size)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise EvaluatorError(f"temperature must be a number > 0, got {temperature!r}")
        self.do_sample = bool(do_sample)
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self._conversational = not isinstance(self.prompts[0], str)

    def describe(self) -> dict[str, Any]:
        return {
            "evaluator": type(self).__name__,
            "n_prompts": len(self.prompts),
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "temperature": self.temperature,
            "seed": self.seed,
        }

    def _tokenizer(self, tokenizer: Any) -> Any:
        tok = self.tokenizer if self.tokenizer is not None else tokenizer
        # Processors (multimodal) carry the text tokenizer as .tokenizer.
        if tok is not None and not callable(getattr(tok, "batch_decode", None)) and hasattr(tok, "tokenizer"):
            tok = tok.tokenizer
        if tok is None:
            raise EvaluatorError(
                f"{type(self).__name__} has no tokenizer: pass tokenizer= or train with a processing_class"
            )
        return tok

    def _prompt_texts(self, tok: Any) -> list[str]:
        if not self._conversational:
            return list(self.prompts)
        return [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in self.prompts]

    shards = True

    def batches(self) -> list[tuple[int, int]]:
        """The fixed batches ``(start, end)`` of the held-out set; batch ``b`` is sampled with seed ``seed + b``."""
        n, bs = len(self.prompts), self.batch_size
        return [(start, min(n, start + bs)) for start in range(0, n, bs)]

    def _gen_config(self, tok: Any) -> Any:
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=self.do_sample,
            temperature=self.temperature if self.do_sample else None,
            top_k=self.top_k if self.do_sample else None,
            top_p=self.top_p if self.do_sample else None,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
        )

    def _generate_batch(
        self, model: Any, tok: Any, texts: list[str], gen_config: Any, seed: int, synced: bool
    ) -> tuple[list[str], list[list[int]]]:
        torch = _torch()
        device = next(model.parameters()).device
        torch.manual_seed(seed)  # inside preserved_rng: the training streams are restored afterwards
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
        extra = {"synced_gpus": True} if synced else {}
        out = model.generate(**batch, generation_config=gen_config, **extra)
        new = out[:, batch["input_ids"].shape[1] :]
        ids = [[t for t in row if t != gen_config.pad_token_id] for row in new.tolist()]
        return tok.batch_decode(new, skip_special_tokens=True), ids

    def generate(
        self, model: Any, tokenizer: Any = None, batch_ids: Sequence[int] | None = None, rounds: int | None = None
    ) -> tuple[list[str], list[list[int]]]:
        """Completions (text and token ids) of held-out batches, with the fixed generation settings.

        Args:
            model: The live policy (unwrapped here from DDP and PPO wrappers).
            tokenizer: Used when the evaluator has no tokenizer of its own.
            batch_ids: Which of :meth:`batches` to generate (default: all), in this order.
            rounds: Number of ``generate`` calls to make in all (>= ``len(batch_ids)``): the extra calls repeat the
                first batch and are discarded. A sharded model needs every rank to make the same number of calls.

        Returns:
            Completions of the prompts of ``batch_ids``, concatenated in that order.
        """
        tok = self._tokenizer(tokenizer)
        model = unwrap_model(model)
        texts = self._prompt_texts(tok)
        spans = self.batches()
        ids_wanted = list(range(len(spans))) if batch_ids is None else list(batch_ids)
        gen_config = self._gen_config(tok)
        sharded = _is_sharded(model)
        completions: list[str] = []
        completion_ids: list[list[int]] = []
        padding_side = getattr(tok, "padding_side", "left")
        calls = max(len(ids_wanted), rounds or 0)
        with isolated_eval(model, None), scoring_precision(model):
            tok.padding_side = "left"  # decoder-only generation needs left padding
            try:
                for i in range(calls):
                    b = ids_wanted[i] if i < len(ids_wanted) else 0
                    start, end = spans[b]
                    out_texts, out_ids = self._generate_batch(
                        model, tok, texts[start:end], gen_config, self.seed + b, sharded
                    )
                    if i < len(ids_wanted):
                        completions.extend(out_texts)
                        completion_ids.extend(out_ids)
            finally:
                tok.padding_side = padding_side
        return completions, completion_ids

    def _score(
        self, model: Any, tokenizer: Any, index: list[int], texts: list[str], ids: list[list[int]]
    ) -> tuple[float, ...]:
        """Scores of the held-out examples ``index`` (their completions ``texts``/``ids``)."""
        raise NotImplementedError

    def evaluate(self, model: Any, tokenizer: Any = None, *, local: bool = False) -> EvalResult:
        """Generate and score the held-out set; in a process group, each rank does its batches (see module doc).

        Args:
            model: The live policy.
            tokenizer: Used when the evaluator has no tokenizer of its own.
            local: Score the whole set in this process alone, even in a process group (e.g. on rank 0 only, with an
                unsharded model). Without it every rank of the group must call :meth:`evaluate` together.
        """
        from .distributed import all_gather_objects, world

        rank, size = (0, 1) if local else world()
        spans = self.batches()
        mine = list(range(rank, len(spans), size))
        rounds = -(-len(spans) // size)
        index = [i for b in mine for i in range(*spans[b])]
        error: BaseException | None = None
        mine_result: tuple[tuple[float, ...], tuple[str, ...]] = ((), ())
        try:
            gen_texts, gen_ids = self.generate(model, tokenizer, mine, rounds)
            gen_scores = self._score(model, tokenizer, index, gen_texts, gen_ids) if index else ()
            mine_result = (tuple(gen_scores), tuple(gen_texts))
        except Exception as exc:  # noqa: BLE001 - shared with every rank below, so no rank waits for a broken one
            error = exc
        scores: tuple[float, ...]
        texts: tuple[str, ...]
        if size == 1:
            if error is not None:
                raise error
            scores, texts = mine_result
        else:
            message = None if error is None else f"{type(error).__name__}: {error}"
            gathered = all_gather_objects((message, mine, mine_result))
            failed = [(r, m) for r, (m, _, _) in enumerate(gathered) if m is not None]
            if failed:
                if error is not None:
                    raise error
                r, m = failed[0]
                raise EvaluatorError(f"evaluation failed on rank {r}: {m}")
            by_batch: dict[int, tuple[list[float], list[str]]] = {}
            for _, batch_ids, (sc, tx) in gathered:
                pos = 0
                for b in batch_ids:
                    n = spans[b][1] - spans[b][0]
                    by_batch[b] = (list(sc[pos : pos + n]), list(tx[pos : pos + n]))
                    pos += n
            scores = tuple(s for b in range(len(spans)) for s in by_batch[b][0])
            texts = tuple(t for b in range(len(spans)) for t in by_batch[b][1])
        # math.fsum: the mean does not depend on how the examples were split across ranks
        return EvalResult(math.fsum(scores) / len(scores), tuple(scores), tuple(texts))


def _torch() -> Any:
    import torch

    return torch


def _reward_fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_reward_fn(fn: Any) -> Callable[..., Any]:
    """Check that ``fn`` has TRL's reward-function signature ``fn(prompts, completions, **kwargs)``.

    Raises:
        EvaluatorError: ``fn`` is not callable, or cannot take ``prompts`` and ``completions`` as keyword arguments.
    """
    if not callable(fn):
        raise EvaluatorError(f"reward_fn must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn  # builtins without a signature: the first call will tell
    params = sig.parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in ("prompts", "completions"):
        p = params.get(name)
        if p is None and not has_var_kw:
            raise EvaluatorError(
                f"reward_fn {_reward_fn_name(fn)!r} has the wrong signature {sig}: TRL reward functions take "
                f"keyword arguments prompts and completions (fn(prompts, completions, **kwargs) -> list[float]); "
                f"{name!r} is missing"
            )
        if p is not None and p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise EvaluatorError(f"reward_fn {_reward_fn_name(fn)!r}: {name!r} must be accepted as a keyword")
    required = [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and n not in ("prompts", "completions")
    ]
    if required:
        raise EvaluatorError(
            f"reward_fn {_reward_fn_name(fn)!r} has the wrong signature {sig}: it requires {', '.join(required)}, "
            "which a world-feedback evaluation cannot supply (only prompts, completions and **kwargs)"
        )
    return fn


class RewardFunctionEvaluator(_GeneratingEvaluator):
    """Generate completions for held-out prompts and score them with a TRL-style reward function.

    Args:
        prompts: Held-out prompts (strings, or lists of chat messages as TRL accepts). Never empty. They should not
            appear in the training data: the point is a world-feedback score the policy cannot fit directly.
        reward_fn: The gold score, ``fn(prompts, completions, **kwargs) -> list[float]`` (TRL's reward-function
            signature, checked at construction). It also receives ``completion_ids`` and, per example, every column
            of ``reward_kwargs``.
        tokenizer: Tokenizer of the policy. Defaults to the trainer's ``processing_class`` at evaluation time.
        max_new_tokens: Tokens generated per completion.
        batch_size: Prompts per ``generate`` call.
        do_sample: Sample (default) or decode greedily. Sampling uses ``seed``, so equal weights give equal scores.
        temperature: Sampling temperature (> 0).
        top_k: Top-k filter when sampling (0: none).
        top_p: Nucleus filter when sampling (1.0: none).
        seed: Seed of the evaluation's own random stream (the training stream is saved and restored around it).
        reward_kwargs: Optional per-example columns passed to ``reward_fn`` by name, each a list as long as
            ``prompts`` (like the extra dataset columns TRL passes, e.g. reference answers).
    """

    def __init__(
        self,
        prompts: Sequence[Any],
        reward_fn: Callable[..., Sequence[float]],
        tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        reward_kwargs: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        super().__init__(prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed)
        self.reward_fn = check_reward_fn(reward_fn)
        self.reward_kwargs = dict(reward_kwargs or {})
        for key, column in self.reward_kwargs.items():
            if key in ("prompts", "completions", "completion_ids"):
                raise EvaluatorError(f"reward_kwargs may not redefine {key!r}")
            if len(column) != len(self.prompts):
                raise EvaluatorError(
                    f"reward_kwargs[{key!r}] has {len(column)} entries for {len(self.prompts)} prompts"
                )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "reward_fn": _reward_fn_name(self.reward_fn)}

    def score(
        self,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        index: Sequence[int] | None = None,
    ) -> tuple[float, ...]:
        """Score completions of held-out prompts with ``reward_fn`` (checked: one finite number each).

        Args:
            completions: One completion per prompt of ``index``.
            completion_ids: Their token ids, passed on as ``completion_ids``.
            index: Positions in the held-out set of the prompts completed (default: all of them, in order).
        """
        idx = list(range(len(self.prompts))) if index is None else list(index)
        prompts = [self.prompts[i] for i in idx]
        raw = self.reward_fn(
            prompts=prompts,
            completions=list(completions),
            completion_ids=list(completion_ids) if completion_ids is not None else None,
            **{k: [v[i] for i in idx] for k, v in self.reward_kwargs.items()},
        )
        return _finite_scores(raw, len(idx), f"reward_fn {_reward_fn_name(self.reward_fn)!r}", prompts, idx)

    def _score(
        self, model: Any, tokenizer: Any, index: list[int], texts: list[str], ids: list[list[int]]
    ) -> tuple[float, ...]:
        completions: list[Any] = texts
        if self._conversational:  # TRL hands conversational reward functions message lists
            completions = [[{"role": "assistant", "content": t}] for t in texts]
        with preserved_rng():
            return self.score(completions, ids, index)


class RewardModelEvaluator(_GeneratingEvaluator):
    """Generate completions for held-out prompts and score them with a local sequence-classification gold model.

    Args:
        prompts: Held-out prompts (strings). Never empty.
        reward_model: A ``*ForSequenceClassification`` model with one output (``num_labels=1``): the gold model.
            It is only read, never trained.
        tokenizer: Tokenizer of the policy. Defaults to the trainer's ``processing_class``.
        reward_tokenizer: Tokenizer of the gold model (default: the policy's).
        max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed: As in
            :class:`RewardFunctionEvaluator`.
    """

    def __init__(
        self,
        prompts: Sequence[str],
        reward_model: Any,
        tokenizer: Any = None,
        reward_tokenizer: Any = None,
        max_new_tokens: int = 16,
        batch_size: int = 32,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(prompts, tokenizer, max_new_tokens, batch_size, do_sample, temperature, top_k, top_p, seed)
        if self._conversational:
            raise EvaluatorError("RewardModelEvaluator takes string prompts; apply the chat template first")
        if not callable(reward_model) or not hasattr(reward_model, "parameters"):
            raise EvaluatorError(f"reward_model must be a torch model, got {type(reward_model).__name__}")
        num_labels = getattr(getattr(reward_model, "config", None), "num_labels", 1)
        if num_labels != 1:
            raise EvaluatorError(f"reward_model must have one output (num_labels=1), it has {num_labels}")
        self.reward_model = reward_model
        self.reward_tokenizer = reward_tokenizer

    def _score(
        self, model: Any, tokenizer: Any, index: list[int], texts: list[str], ids: list[list[int]]
    ) -> tuple[float, ...]:
        tok = self.reward_tokenizer if self.reward_tokenizer is not None else self._tokenizer(tokenizer)
        prompts = [self.prompts[i] for i in index]
        full = [
            p + (" " if p and t and not p.endswith(" ") and not t.startswith(" ") else "") + t
            for p, t in zip(prompts, texts)
        ]
        device = next(self.reward_model.parameters()).device
        raw: list[float] = []
        with isolated_eval(self.reward_model, None), scoring_precision(self.reward_model):
            for start in range(0, len(full), self.batch_size):
                batch = tok(full[start : start + self.batch_size], return_tensors="pt", padding=True)
                batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
                logits = self.reward_model(**batch).logits
                raw.extend(logits[:, 0].float().tolist())
        return _finite_scores(raw, len(index), "reward_model", prompts, index)


class MetricEvaluator(Evaluator):
    """Use a metric of the trainer's own evaluation (``trainer.evaluate()`` on an ``eval_dataset``) as the score.

    The callback reports at the trainer's ``on_evaluate`` events (asking for them every ``eval_steps`` steps when
    given); the trainer needs an ``eval_dataset``. With a dict of eval datasets the trainer names the metrics
    ``eval_<dataset>_<metric>``: pass e.g. ``"b_loss"``.

    Args:
        metric: Name of the metric, with or without the ``eval_`` prefix (e.g. ``"loss"``, ``"eval_accuracy"``,
            ``"b_loss"``).
        greater_is_better: ``True`` or ``False``; ``None`` (default) infers it as transformers does for
            ``metric_for_best_model``: ``False`` for a name ending in ``loss``, else ``True``. When ``False`` the
            reported score is the negated metric, since EvalStop treats higher as better.
    """

    uses_trainer_metrics = True

    def __init__(self, metric: str, greater_is_better: bool | None = None) -> None:
        if not isinstance(metric, str) or not metric:
            raise EvaluatorError(f"metric must be a non-empty metric name, got {metric!r}")
        if greater_is_better is None:
            greater_is_better = not metric.endswith("loss")
        elif not isinstance(greater_is_better, bool) and type(greater_is_better).__name__ != "bool_":
            raise EvaluatorError(f"greater_is_better must be True, False or None, got {greater_is_better!r}")
        self.metric = metric
        self.greater_is_better = bool(greater_is_better)

    def describe(self) -> dict[str, Any]:
        return {"evaluator": "MetricEvaluator", "metric": self.metric, "greater_is_better": self.greater_is_better}

    def to_metric(self, score: float) -> float:
        return score if self.greater_is_better else -score

    def evaluate(self, model: Any, tokenizer: Any = None) -> EvalResult:
        raise EvaluatorError("MetricEvaluator reads the trainer's on_evaluate metrics; it cannot run by itself")

    def key(self, metrics: Mapping[str, Any]) -> str | None:
        """The key of this metric in ``metrics``, or ``None`` when they do not hold it."""
        for key in (self.metric, f"eval_{self.metric}"):
            if key in metrics:
                return key
        return None

    def from_metrics(self, metrics: Mapping[str, float]) -> EvalResult:
        key = self.key(metrics)
        if key is None:
            raise EvaluatorError(
                f"metric {self.metric!r} is not among the trainer's eval metrics ({', '.join(sorted(metrics))})"
            )
        (value,) = _finite_scores([metrics[key]], 1, f"metric {key!r}")
        return EvalResult(value if self.greater_is_better else -value, None)
