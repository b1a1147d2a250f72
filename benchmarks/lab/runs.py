"""What one recorded run is (:class:`RunSpec`: trainer, reward, KL, seed, length, cadence, environment, model) and
the grid of the shipped ``bow-proxy`` corpus (:func:`default_grid`).

Pure data: nothing here imports a trainer, so the environments' registry (:mod:`lab.envs`)
and the command line can build grids without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
        env: The environment (:mod:`lab.envs`); ``bow-proxy`` is the learned bag-of-words one.
        model: Policy shape: ``gpt2`` (2 layers, width 64) or ``llama`` (a Llama-style config of the same size).
        data: Training examples of a DPO or SFT run (preference pairs, demonstrations); 0 for RL.
        noise: Fraction of flipped preference labels (DPO only).
        dense: Recorded at a denser eval cadence than its environment's grid (``python -m lab traces record
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
