"""Which engine samples the held-out completions, with which settings: the trainer's vLLM engine or HF ``generate``.

TRL's GRPO/RLOO trainers with ``use_vllm=True`` generate through a vLLM engine (``trainer.vllm_generation``):
colocated in the training process (TRL's default), or a separate server reached by a client that TRL gives to the main
process only. The generating evaluators use that engine when the trainer they serve has one (seconds per evaluation
instead of minutes at 7B), and HF ``generate`` on the live model otherwise. Either way the sampling settings are the
evaluator's own, set explicitly (never the training temperature, never the model's ``generation_config`` defaults,
which transformers merges into any value a request leaves unset), and the result names the engine and the settings.

Before generating, the engine gets the live weights of the step being evaluated (TRL syncs them only before its next
training generation), on every rank, as TRL itself does; the trainer is told, so it does not sync the same weights
again.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The engine names an :class:`~evalstop_callbacks.evaluators.EvalResult` reports.
HF = "hf"
ENGINES = ("auto", "vllm", HF)


@dataclass(frozen=True)
class Sampling:
    """The evaluator's sampling settings, the same on either engine.

    Args:
        do_sample: Sample, or decode greedily.
        temperature: Sampling temperature (ignored when greedy).
        top_k: Top-k filter (0: none).
        top_p: Nucleus filter (1.0: none).
        max_new_tokens: Tokens per completion.
        seed: The evaluation's seed.
    """

    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    seed: int

    def settings(self) -> dict[str, Any]:
        """Every setting that shapes a completion, as reported with the scores (no penalty, no min-p filter)."""
        return {
            "do_sample": self.do_sample,
            "temperature": self.temperature if self.do_sample else 0.0,
            "top_k": self.top_k if self.do_sample else 0,
            "top_p": self.top_p if self.do_sample else 1.0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }


def trainer_engine(trainer: Any) -> Any:
    """The trainer's vLLM engine (TRL's ``VLLMGeneration``), or None when it generates without vLLM."""
    if trainer is None or not getattr(getattr(trainer, "args", None), "use_vllm", False):
        return None
    return getattr(trainer, "vllm_generation", None)


def check_engine(engine: Any, rank: int) -> None:
    """Refuse, in one line, an engine the evaluators cannot generate through from this rank.

    Args:
        engine: The trainer's ``vllm_generation``.
        rank: This process's rank, for the message.
    """
    mode = getattr(engine, "mode", None)
    if mode == "server" and getattr(engine, "vllm_client", None) is None:
        raise ValueError(
            f"the trainer's vLLM engine runs in server mode and rank {rank} holds no client (TRL gives it to the main "
            "process only), while EvalStop's evaluators generate on every rank; pass engine='hf' to the evaluator, "
            "or use vllm_mode='colocate'"
        )
    if mode == "colocate" and getattr(engine, "tensor_parallel_size", 1) != 1:
        raise ValueError(
            f"the trainer's colocated vLLM engine spans {engine.tensor_parallel_size} ranks "
            "(vllm_tensor_parallel_size), and EvalStop's evaluators give each rank its own prompts; pass engine='hf' "
            "to the evaluator, or vllm_tensor_parallel_size=1"
        )
    if mode not in ("colocate", "server"):
        raise ValueError(f"the trainer's vLLM engine has mode {mode!r}; EvalStop knows 'colocate' and 'server'")


class VLLMEngine:
    """Held-out completions from the trainer's vLLM engine, with the evaluator's sampling settings.

    Args:
        trainer: A TRL trainer with ``vllm_generation`` (held weakly: the trainer holds the callback and evaluator).
    """

    def __init__(self, trainer: Any) -> None:
        self._trainer = weakref.ref(trainer)

    @property
    def engine(self) -> Any:
        trainer = self._trainer()
        return None if trainer is None else trainer_engine(trainer)

    @property
    def name(self) -> str:
        """``vllm-colocate`` or ``vllm-server``."""
        return f"vllm-{getattr(self.engine, 'mode', '?')}"

    def sync(self) -> None:
        """Load the live weights into the engine (every rank calls it: a sharded model gathers its weights)."""
        trainer = self._trainer()
        if trainer is None:
            raise RuntimeError("the trainer whose vLLM engine this evaluator generates through is gone")
        trainer_engine(trainer).sync_weights()
        # TRL syncs before a training generation when the step changed since its last sync: this one counts.
        trainer._last_loaded_step = trainer.state.global_step

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], index: Sequence[int], sampling: Sampling
    ) -> list[list[int]]:
        """Completion token ids of ``prompt_ids`` (the held-out examples ``index``), one per prompt.

        Colocated, example ``i`` is sampled with seed ``sampling.seed + i``, so its completion depends on the weights
        alone, not on the batch or rank it was generated in. Through the server one request carries one seed, so the
        prompts of a call share it and a prompt asked several times gets that many samples of one request.
        """
        engine = self.engine
        if engine.mode == "server":
            return self._generate_server(engine, prompt_ids, sampling)
        from vllm import SamplingParams

        params = [SamplingParams(**_vllm_settings(sampling), n=1, seed=sampling.seed + i) for i in index]
        if getattr(engine, "enable_sleep_mode", False):
            engine.llm.wake_up(tags=["kv_cache"])
        try:
            outputs = engine.llm.generate(
                [{"prompt_token_ids": list(ids)} for ids in prompt_ids], sampling_params=params, use_tqdm=False
            )
        finally:
            if getattr(engine, "enable_sleep_mode", False):
                engine.llm.sleep(level=2)
                engine._llm_weights_sleeping = True  # TRL re-pushes the weights before its next generation
        return [list(out.outputs[0].token_ids) for out in outputs]

    @staticmethod
    def _generate_server(engine: Any, prompt_ids: Sequence[Sequence[int]], sampling: Sampling) -> list[list[int]]:
        where: dict[tuple[int, ...], list[int]] = {}  # each distinct prompt: the positions that ask for it
        for j, ids in enumerate(prompt_ids):
            where.setdefault(tuple(ids), []).append(j)
        n = max(len(positions) for positions in where.values())
        out = engine.vllm_client.generate(
            prompts=[list(ids) for ids in where],
            n=n,
            generation_kwargs={"seed": sampling.seed},
            **_vllm_settings(sampling),
        )
        result: list[list[int]] = [[] for _ in prompt_ids]
        for k, positions in enumerate(where.values()):
            for m, j in enumerate(positions):
                result[j] = list(out["completion_ids"][k * n + m])
        return result


def _vllm_settings(sampling: Sampling) -> dict[str, Any]:
    """``sampling`` as vLLM's sampling fields (temperature 0 decodes greedily; top-k 0 is no filter)."""
    s = sampling.settings()
    return {
        "temperature": s["temperature"],
        "top_k": s["top_k"],
        "top_p": s["top_p"],
        "min_p": s["min_p"],
        "repetition_penalty": s["repetition_penalty"],
        "max_tokens": s["max_new_tokens"],
    }
