"""The evaluators that sample completions from the live policy: held-out batches, sharding over ranks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .base import EvalResult, Evaluator, EvaluatorError
from .engines import ENGINES, HF, Sampling, VLLMEngine, check_engine, trainer_engine
from .model_context import _is_sharded, isolated_eval, preserved_rng, scoring_precision, unwrap_model


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
        engine: str = "auto",
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
        if engine not in ENGINES:
            raise EvaluatorError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.engine = engine
        self._vllm: VLLMEngine | None = None
        self._conversational = not isinstance(self.prompts[0], str)

    @property
    def sampling(self) -> Sampling:
        """The sampling settings of every evaluation, on either engine."""
        return Sampling(self.do_sample, self.temperature, self.top_k, self.top_p, self.max_new_tokens, self.seed)

    @property
    def engine_name(self) -> str:
        """What generates the completions: ``"hf"``, or the trainer's vLLM engine (``"vllm-colocate"``, ...)."""
        return self._vllm.name if self._vllm is not None else HF

    def serve(self, trainer: Any) -> None:
        """Generate through ``trainer``'s vLLM engine when it has one (``engine="auto"`` or ``"vllm"``); called by
        the callback with the attached trainer before step 1.

        Raises:
            ValueError: ``engine="vllm"`` and the trainer has no vLLM engine, or one this rank cannot generate
                through (one line naming why).
        """
        from ..distributed import world

        engine = trainer_engine(trainer) if self.engine != HF else None
        if engine is None:
            if self.engine == "vllm":
                raise ValueError(
                    f"{type(self).__name__}(engine='vllm'): {type(trainer).__name__} has no vLLM engine "
                    "(use_vllm=False); pass engine='auto' to generate with HF generate"
                )
            self._vllm = None
            return
        check_engine(engine, world()[0])
        self._vllm = VLLMEngine(trainer)

    def describe(self) -> dict[str, Any]:
        return {
            "evaluator": type(self).__name__,
            "n_prompts": len(self.prompts),
            "max_new_tokens": self.max_new_tokens,
            "engine": self.engine,
            **self.sampling.settings(),
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

        # Every sampling setting explicit: transformers fills any unset one from the model's generation_config
        # (e.g. a checkpoint's temperature 0.7 or repetition_penalty 1.05), which would change what is measured.
        s = self.sampling.settings()
        return GenerationConfig(
            max_new_tokens=s["max_new_tokens"],
            do_sample=s["do_sample"],
            temperature=s["temperature"] if self.do_sample else None,
            top_k=s["top_k"] if self.do_sample else None,
            top_p=s["top_p"] if self.do_sample else None,
            min_p=s["min_p"] if self.do_sample else None,
            repetition_penalty=s["repetition_penalty"],
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
        if self._vllm is not None:
            return self._generate_vllm(self._vllm, tok, texts, [spans[b] for b in ids_wanted])
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

    def _generate_vllm(
        self, vllm: VLLMEngine, tok: Any, texts: list[str], spans: list[tuple[int, int]]
    ) -> tuple[list[str], list[list[int]]]:
        """Completions of the prompts of ``spans`` from the trainer's vLLM engine, after loading the live weights."""
        vllm.sync()  # every rank, as TRL does: a sharded model gathers its weights for it
        completions: list[str] = []
        completion_ids: list[list[int]] = []
        with preserved_rng():
            for start, end in spans:
                prompt_ids = tok(texts[start:end], add_special_tokens=False)["input_ids"]
                out = vllm.generate(prompt_ids, range(start, end), self.sampling)
                completion_ids.extend(out)
                completions.extend(tok.batch_decode(out, skip_special_tokens=True))
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
        from ..distributed import all_gather_objects, world

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
        # math.fsum: the mean does not depend on how the examples were split across ranks. A NaN or inf example
        # score makes the mean NaN (fsum raises on inf - inf): the non-finite policy records it, decides nothing.
        finite = all(math.isfinite(v) for v in scores)
        mean = math.fsum(scores) / len(scores) if finite else math.nan
        settings = self.sampling.settings()
        return EvalResult(mean, tuple(scores), tuple(texts), engine=self.engine_name, sampling=settings)


def _torch() -> Any:
    import torch

    return torch
