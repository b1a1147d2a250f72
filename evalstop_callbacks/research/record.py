"""Recording real training runs of the overoptimization environments as JSONL traces (``evalstop traces record``).

Each run is one :class:`RunSpec` of one environment (:mod:`evalstop_callbacks.research.envs`): GRPO or RLOO (TRL >=
1.13), PPO (TRL 1.12's ``trl.experimental.ppo``, ``bow-proxy`` only), DPO or SFT, of a GPT-2 or Llama-style policy,
rewarded by the environment's proxy or by gold itself, with a KL coefficient (DPO: beta), for a seed. It trains to
its full length with :class:`~evalstop_callbacks.EvalStopCallback` in ``observe`` mode (never stops), which writes
the trace: held-out gold (``eval_score``, per-example ``eval_scores``), the held-out proxy of the same completions
(``proxy_reward``), the trainer's loss and KL, and wall time. The header gets the environment, its split and the
run's spec.

Runs execute one at a time, each in its own Python process (:func:`run_in_subprocess`), because PPO needs the TRL
1.12 environment while GRPO runs on the newest TRL, and because a fresh process per run keeps runs independent.
``python -m evalstop_callbacks.research.record --spec JSON --trace PATH`` runs one spec in the current interpreter.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ALGOS = ("grpo", "ppo", "rloo", "dpo", "sft")
REWARDS = ("proxy", "gold")
MODELS = ("gpt2", "llama")
#: Environments whose eval size a run may set (RunSpec.eval_samples).
EVAL_SAMPLES_ENVS = ("length", "keyword")


@dataclass(frozen=True)
class RunSpec:
    """One recorded run.

    Args:
        algo: ``"grpo"``, ``"ppo"``, ``"rloo"``, ``"dpo"`` or ``"sft"``.
        reward: ``"proxy"`` (the learned reward model: can be hacked) or ``"gold"`` (the world score itself).
        kl: KL coefficient towards the reference policy (GRPO/RLOO/DPO ``beta``, PPO ``kl_coef``; unused by SFT).
        seed: Seed of the environment (reference policy, proxy) and of training.
        steps: Optimizer steps (the run's full length).
        eval_steps: Evaluate every this many steps.
        lr: Learning rate.
        batch: Completions per step.
        ppo_epochs: PPO epochs per batch (PPO only).
        env: The environment (:mod:`evalstop_callbacks.research.envs`); ``bow-proxy`` is the learned bag-of-words one.
        model: Policy shape: ``gpt2`` (2 layers, width 64) or ``llama`` (a Llama-style config of the same size).
        data: Training examples of a DPO or SFT run (preference pairs, demonstrations); 0 for RL.
        noise: Fraction of flipped preference labels (DPO only).
        dense: Recorded at a denser eval cadence than its environment's grid (``evalstop traces record
            --eval-every``); the name then ends in ``-every<eval_steps>``, so that a dense trace never takes the
            place of the regular one.
        eval_samples: Completions per held-out prompt in each evaluation, instead of the environment's own (2, i.e.
            48 completions); 0 keeps the environment's. Sentence-world environments only (``length``, ``keyword``).
            The name then ends in ``-x<eval_samples>``, so that such a trace never takes the place of the default one.
    """

    algo: str
    reward: str
    kl: float
    seed: int
    steps: int
    eval_steps: int
    lr: float = 5e-4
    batch: int = 32
    ppo_epochs: int = 4
    env: str = "bow-proxy"
    model: str = "gpt2"
    data: int = 0
    noise: float = 0.0
    dense: bool = False
    eval_samples: int = 0

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {', '.join(ALGOS)}, got {self.algo!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.algo == "ppo" and self.reward != "proxy":
            raise ValueError("PPO runs use the proxy reward model (reward='proxy')")
        if self.algo == "ppo" and self.env != "bow-proxy":
            raise ValueError("PPO runs need a reward model module: only the bow-proxy environment has one")
        if self.env == "bow-proxy" and (self.algo not in ("grpo", "ppo") or self.model != "gpt2"):
            raise ValueError("the bow-proxy environment records GRPO and PPO runs of the GPT-2 policy")
        if (self.algo == "dpo") != (self.env == "dpo-noisy") or (self.algo == "sft") != (self.env == "sft-overfit"):
            raise ValueError(
                f"{self.algo} runs belong to no environment {self.env!r}: DPO runs are dpo-noisy's, SFT "
                "runs sft-overfit's, and those environments record nothing else"
            )
        if not 0 <= self.noise < 0.5:
            raise ValueError(f"noise must be in [0, 0.5), got {self.noise}")
        for name in ("steps", "eval_steps", "batch", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kl < 0 or self.lr <= 0:
            raise ValueError("kl must be >= 0 and lr > 0")
        if self.eval_samples < 0:
            raise ValueError(f"eval_samples must be >= 0 (0: the environment's own), got {self.eval_samples}")
        if self.eval_samples and self.env not in EVAL_SAMPLES_ENVS:
            raise ValueError(
                f"eval_samples is supported by the {', '.join(EVAL_SAMPLES_ENVS)} environments only, not {self.env!r}"
            )

    @property
    def name(self) -> str:
        """The trace's name, prefixed by its environment (``bow-proxy-grpo-proxy-kl0-s3``), suffixed by its cadence
        when dense (``keyword-grpo-gpt2-proxy-kl0-lr0.0005-s0-every1``) and by its eval size when not the environment's
        own (``...-every1-x8``)."""
        return (
            self._base_name
            + (f"-every{self.eval_steps}" if self.dense else "")
            + (f"-x{self.eval_samples}" if self.eval_samples else "")
        )

    @property
    def _base_name(self) -> str:
        if self.env == "bow-proxy":  # the shipped names, kept
            return f"bow-proxy-{self.algo}-{self.reward}-kl{self.kl:g}-s{self.seed}"
        if self.algo == "sft":
            return f"{self.env}-sft-{self.model}-lr{self.lr:g}-n{self.data}-s{self.seed}"
        if self.algo == "dpo":
            return (
                f"{self.env}-dpo-{self.model}-beta{self.kl:g}-lr{self.lr:g}-n{self.data}-flip{self.noise:g}"
                f"-s{self.seed}"
            )
        return f"{self.env}-{self.algo}-{self.model}-{self.reward}-kl{self.kl:g}-lr{self.lr:g}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_grid(
    seeds: int = 6, ppo_seeds: int = 5, ppo_kl_seeds: int = 2, grpo_steps: int = 300, ppo_steps: int = 120
) -> list[RunSpec]:
    """The shipped corpus's grid (27 runs with the defaults).

    Hacking by construction: GRPO vs the proxy with no KL (``seeds`` runs), PPO vs the proxy with no KL
    (``ppo_seeds``). Healthy by construction: GRPO on gold itself and GRPO vs the proxy with a strong KL (beta 0.2)
    (``seeds`` runs each). PPO vs the proxy with KL 0.2 (``ppo_kl_seeds``) is in between. Every trace's label is
    derived afterwards from its gold curve (:func:`platform_sim.sim.traces.label_of`), not from this grid.
    """
    runs: list[RunSpec] = []
    for s in range(seeds):
        runs.append(RunSpec("grpo", "proxy", 0.0, s, grpo_steps, 10))
    for s in range(ppo_seeds):
        runs.append(RunSpec("ppo", "proxy", 0.0, s, ppo_steps, 4))
    for s in range(seeds):
        runs.append(RunSpec("grpo", "gold", 0.0, s, grpo_steps, 10))
    for s in range(seeds):
        runs.append(RunSpec("grpo", "proxy", 0.2, s, grpo_steps, 10))
    for s in range(ppo_kl_seeds):
        runs.append(RunSpec("ppo", "proxy", 0.2, s, ppo_steps, 4))
    return runs


def ppo_available() -> bool:
    """True if this interpreter has TRL's ``PPOTrainer`` (TRL 1.12)."""
    try:
        from trl.experimental.ppo import PPOTrainer  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


@dataclass
class RunResult:
    """What a run left behind (the trace is the real output)."""

    name: str
    trace: str
    wall_s: float
    evals: int
    would_stop_at: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def grpo_trainer(
    env,
    spec: RunSpec,
    callbacks: list,
    output_dir: str,
    save: bool = False,
    save_total_limit: int | None = None,
    reward=None,
    model=None,
):
    """A GRPO (or, with ``spec.algo == "rloo"``, RLOO) trainer of ``spec`` on ``env``'s training prompts.

    Args:
        reward: The reward function (default: gold or ``env.proxy`` as ``spec.reward`` says).
        model: The policy to train (default: a fresh copy of ``env``'s reference policy).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    from .overopt import gold_reward

    # Enough rows that the run never exhausts the data (an epoch end would reshuffle mid-run: harmless, but avoidable).
    reps = max(1, (spec.steps * spec.batch) // (8 * len(env.train_prompts)) + 1)
    dataset = Dataset.from_dict({"prompt": env.train_prompts * reps})
    config_cls, trainer_cls = (RLOOConfig, RLOOTrainer) if spec.algo == "rloo" else (GRPOConfig, GRPOTrainer)
    args: Any = config_cls(
        **cpu_run_args(spec, output_dir),
        num_generations=8,
        max_completion_length=env.config.max_new_tokens,
        beta=spec.kl,
        max_steps=spec.steps,
        save_strategy="steps" if save else "no",
        save_steps=10**9,
        save_total_limit=save_total_limit,
        save_only_model=save,
        temperature=1.0,
    )
    if reward is None:
        reward = gold_reward if spec.reward == "gold" else env.proxy
    trainer = trainer_cls(
        model=model if model is not None else env.reference_policy(),
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=env.tokenizer,
        callbacks=callbacks,
    )
    _quiet(trainer)
    return trainer


def cpu_run_args(spec: RunSpec, output_dir: str) -> dict[str, Any]:
    """The training arguments every recorded run shares: CPU in fp32, no reporting or progress bar, the spec's batch,
    learning rate and seed, and the trainer's logs at the eval cadence (so each trace line gets the trainer's loss)."""
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=spec.batch,
        learning_rate=spec.lr,
        logging_steps=spec.eval_steps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=spec.seed,
        disable_tqdm=True,
    )


def _quiet(trainer) -> None:
    # With disable_tqdm the Trainer prints every log dict to stdout; the trace has what matters.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def _ppo_trainer(env, spec: RunSpec, callbacks: list, output_dir: str):
    import torch
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from .tiny import build_scalar_model

    torch.manual_seed(spec.seed)
    dataset = Dataset.from_dict(
        {
            "input_ids": [env.tokenizer(p)["input_ids"] for p in env.train_prompts]
            * max(1, spec.steps * spec.batch // len(env.train_prompts) + 1)
        }
    )
    args = PPOConfig(
        **cpu_run_args(spec, output_dir),
        num_mini_batches=1,
        num_ppo_epochs=spec.ppo_epochs,
        response_length=env.config.max_new_tokens,
        kl_coef=spec.kl,
        total_episodes=spec.batch * spec.steps,
        num_sample_generations=0,
        save_strategy="no",
        temperature=1.0,
        stop_token="eos",
        missing_eos_penalty=None,
    )
    trainer = PPOTrainer(
        args=args,
        processing_class=env.tokenizer,
        model=env.reference_policy(),
        ref_model=env.reference_policy(),
        reward_model=env.proxy_model(),
        train_dataset=dataset,
        value_model=build_scalar_model(env.tokenizer, seed=spec.seed),
        callbacks=callbacks,
    )
    _quiet(trainer)
    return trainer


def record_run(
    spec: RunSpec, trace_path: str | os.PathLike, cache_dir: str | None = None, env_config: Any = None
) -> RunResult:
    """Train ``spec`` to its full length in observe mode in this process, writing the trace to ``trace_path``.

    Args:
        spec: The run.
        trace_path: Where the JSONL trace goes (replaced if it exists).
        cache_dir: Environment cache (default: :func:`~evalstop_callbacks.research.overopt.default_cache_dir`).
        env_config: An :class:`~evalstop_callbacks.research.overopt.EnvConfig` to use instead of the default one of
            ``spec.seed`` (smaller environments for tests).
    """
    import torch

    from ..callback import EvalStopCallback
    from . import envs
    from .overopt import EnvConfig, build_env

    torch.set_num_threads(int(os.environ.get("EVALSTOP_THREADS", "1")))
    if spec.algo == "ppo" and not ppo_available():
        raise RuntimeError(
            f"{spec.name}: this Python has no trl.experimental.ppo.PPOTrainer (needs trl==1.12.0); pass --ppo-python"
        )
    registered = envs.get(spec.env)
    env = build_env(env_config or EnvConfig(seed=spec.seed), cache_dir=cache_dir)
    world = envs.world_of(spec, env, cache_dir)
    evaluator: Any = world.evaluator  # an Evaluator with trace_extras (see envs.World)
    # No step-0 baseline: the shipped corpus starts at the first regular eval, and a re-recording must match it.
    cb = EvalStopCallback(
        evaluator,
        eval_steps=spec.eval_steps,
        job_id=spec.name,
        job_type=registered.job_type,
        eval_on_start=False,
        mode="observe",
        trace_path=str(trace_path),
        trace_extras=evaluator.trace_extras,
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalstop-rec-") as out:
        trainer = world.trainer(spec, [cb], out)
        trainer.train()
    _annotate_header(Path(trace_path), spec, env, registered, world)
    return RunResult(spec.name, str(trace_path), time.perf_counter() - t0, len(cb.history), cb.would_stop_at)


#: Significant digits kept of the floats of a recorded trace (the corpus ships in the repository: small on disk).
TRACE_DIGITS = 4


def _round(value: Any, digits: int = TRACE_DIGITS) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [_round(v, digits) for v in value]
    return value


def _annotate_header(path: Path, spec: RunSpec, env, registered, world) -> None:
    # The callback writes a generic header; the recording adds what re-creates the run (spec, environment, versions),
    # and rounds the eval lines' floats (4 significant digits: far below the evaluation's own sampling noise).
    import transformers
    import trl

    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header.setdefault("config", {})
    header["config"].update(
        {
            "run": spec.to_dict(),
            "env": env.config.key(),
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            **world.header_config,
        }
    )
    header["model"] = world.model_name
    header["environment"] = registered.name
    header["split"] = registered.split
    out = [json.dumps(header)]
    for raw in lines[1:]:
        obj = json.loads(raw)
        if obj.get("kind") == "eval":
            obj = {k: (v if k == "step" else _round(v)) for k, v in obj.items()}
        out.append(json.dumps(obj))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def run_in_subprocess(
    spec: RunSpec,
    trace_path: str | os.PathLike,
    python: str | None = None,
    cache_dir: str | None = None,
    timeout: float | None = 1800,
) -> RunResult:
    """Run :func:`record_run` in a fresh interpreter (``python``, default this one) and return its result."""
    cmd = [
        python or sys.executable,
        "-m",
        "evalstop_callbacks.research.record",
        "--spec",
        json.dumps(spec.to_dict()),
        "--trace",
        str(trace_path),
    ]
    if cache_dir:
        cmd += ["--cache-dir", str(cache_dir)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"run {spec.name} failed (exit {proc.returncode}):\n{tail}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    return RunResult(**json.loads(last))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalstop_callbacks.research.record",
        description="Record one run of the overoptimization environment (internal).",
    )
    parser.add_argument("--spec", required=True, help="RunSpec as JSON")
    parser.add_argument("--trace", required=True, help="trace file to write")
    parser.add_argument("--cache-dir", default=None)
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spec = RunSpec(**json.loads(ns.spec))
    result = record_run(spec, ns.trace, ns.cache_dir)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
