"""evalstop's trainer side: world-feedback early stopping for transformers and TRL trainers.

Exports are loaded lazily (PEP 562): ``import evalstop_callbacks.client`` (e.g. from the service or the simulator)
does not import transformers; ``from evalstop_callbacks import EvalStopCallback`` does.
"""

from __future__ import annotations

import importlib
from typing import Any

from platform_sim import __version__ as __version__  # one version for the whole distribution (set there)

_EXPORTS: dict[str, str] = {
    "EvalStopCallback": "callback",
    "EvalStopTrainingStopped": "trainer_compat",
    "BoundaryClient": "client",
    "EmbeddedClient": "client",
    "PlatformClient": "platform_client",
    "EvalResult": "evaluators",
    "Evaluator": "evaluators",
    "EvaluatorError": "evaluators",
    "MetricEvaluator": "evaluators",
    "RewardFunctionEvaluator": "evaluators",
    "RewardModelEvaluator": "evaluators",
    "train_with_evalstop": "ppo",
    "TraceRecorder": "trace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'evalstop_callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
