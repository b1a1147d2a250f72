"""Helpers for the verl tests: shipped real curves, the embedded core's verdict on them, verl's own config.

Not a test module (no ``test_`` prefix); the verl tests import it from the tests folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalstop_callbacks.client import EmbeddedClient
from platform_sim.core import Report, default_spec

REPO = Path(__file__).resolve().parents[1]

# A proxy-reward GRPO run that reward-hacks (the default detector stops it) and a gold-reward run that stays healthy.
HACKING = "bow-proxy-grpo-proxy-kl0-s0"
HEALTHY = "bow-proxy-grpo-gold-kl0-s0"
METRIC = "val-core/bow-proxy/reward/mean@1"


def trace_path(name: str) -> Path:
    """A shipped real trace, in the corpus folder of the new layout or the old ``data/traces`` folder."""
    for folder in ("platform_sim/data/corpora/real", "platform_sim/data/traces"):
        path = REPO / folder / f"{name}.jsonl"
        if path.exists():
            return path
    raise FileNotFoundError(f"no shipped trace {name!r}")


@dataclass(frozen=True)
class Curve:
    """A real run's evaluations: steps, mean scores and per-example scores."""

    name: str
    steps: list[int]
    means: list[float]
    examples: list[list[float]]

    def at(self, step: int) -> tuple[float, list[float]]:
        i = self.steps.index(step)
        return self.means[i], self.examples[i]

    @property
    def every(self) -> int:
        return self.steps[0]


def load_curve(name: str) -> Curve:
    lines = [json.loads(line) for line in trace_path(name).read_text().splitlines() if line.strip()]
    evals = [line for line in lines if line.get("kind") == "eval"]
    return Curve(
        name,
        [int(e["step"]) for e in evals],
        [float(e["eval_score"]) for e in evals],
        [[float(s) for s in e["eval_scores"]] for e in evals],
    )


def core_verdict(curve: Curve, examples: bool = True) -> tuple[int | None, int | None]:
    """``(stop_step, best_step)`` of the embedded core with the default detector on the curve (None: no stop)."""
    client = EmbeddedClient()
    job = client.register("rlhf", detector=default_spec(), job_id="reference")
    decision = None
    for step, mean, per in zip(curve.steps, curve.means, curve.examples):
        decision = client.report(Report(job, "rlhf", step, mean, tuple(per) if examples else None))
        if decision.should_stop:
            return step, decision.best_step
    return None, decision.best_step if decision else None


def verl_config(overrides: list[str]) -> Any:
    """verl's own ``ppo_trainer`` config (its shipped YAML, through hydra), with ``overrides``."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def file_log(path: Path) -> list[dict[str, Any]]:
    """The lines verl's ``FileLogger`` wrote."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
