"""Detector classes by name, and the factory and spec functions every consumer builds detectors through."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from .base import Detector
from .bounds import check_param_bounds

#: The EvalStop paper's rule: stop at the 2nd consecutive decline, no tolerance. Asked for by name (``paper_spec()``,
#: or ``"k-decline"`` whose parameters default to these); the simulator's experiments (``evalstop-sim paper``) and
#: its policies given no detector run it, to keep the paper's semantics.
PAPER_SPEC: dict[str, Any] = {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}

#: The project's default for real jobs: what ``detector_from_spec(None)``, ``EvalStopCallback()``, ``evalstop-server``
#: (a job registered without a detector) and ``evalstop demo`` use. Chosen by the multi-environment real-trace benchmark: every number tuned on
#: the tune-split environments only, the candidates judged once on the held-out test-split environments, and this is
#: the one that did best there (``evalstop-sim benchmark``; results in docs/results/detector-selection.md). Its window
#: and alpha are the per-look test's, used when the reports carry no ``planned_steps``; with them every evidence mode
#: tests per run (``means_test`` "auto", left out of the spec; ``trend_per_run.PROGRESS_DEFAULTS``).
DEFAULT_SPEC: dict[str, Any] = {
    "name": "trend",
    "params": {"window": 6, "alpha": 0.01, "k": 1, "min_drop": 0.0, "test": "t", "warmup": 0},
}

DEFAULT_DETECTOR = DEFAULT_SPEC["name"]
"""The default detector's name."""


def default_spec() -> dict[str, Any]:
    """A fresh copy of :data:`DEFAULT_SPEC` (callers may change their copy)."""
    return copy.deepcopy(DEFAULT_SPEC)


def paper_spec() -> dict[str, Any]:
    """A fresh copy of :data:`PAPER_SPEC`."""
    return copy.deepcopy(PAPER_SPEC)


# Detector classes by name. Each detector module adds its class with :func:`register_detector` when the package is
# imported (``platform_sim/core/detectors/__init__.py`` imports them all); the mapping holds classes only, never
# instances or run state.
DETECTORS: dict[str, type[Detector]] = {}


def register_detector(cls: type[Detector]) -> type[Detector]:
    """Class decorator that makes a detector selectable by its ``name``.

    Raises:
        TypeError: The class has no (or an empty) ``name``.
    """
    if not getattr(cls, "name", None):  # a class attribute that subclasses must set: absent on a bad class
        raise TypeError(f"{cls.__name__} has no detector name")
    DETECTORS[cls.name] = cls
    return cls


def make_detector(name: str, **params: Any) -> Detector:
    """Build a detector by name with its parameters; unknown names and bad or out-of-bounds parameters
    (:data:`~platform_sim.core.detectors.bounds.PARAM_BOUNDS`) raise ``ValueError`` naming them."""
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ValueError(f"unknown detector {name!r}; choose one of {', '.join(sorted(DETECTORS))}") from None
    check_param_bounds(name, params)  # the upper bounds no constructor checks (bounds.PARAM_BOUNDS)
    try:
        return cls(**params)
    except TypeError as exc:  # unexpected keyword: name the detector so the user knows where to look
        raise ValueError(f"bad parameters for detector {name!r}: {exc}") from None


def detector_from_spec(spec: str | Mapping[str, Any] | None) -> Detector:
    """Build a detector from a spec.

    Args:
        spec: ``None`` (the project's default, :data:`DEFAULT_SPEC`), a registered name (its default parameters), or
            ``{"name": ..., "params": {...}}``. The paper's rule is ``paper_spec()`` (or the name ``"k-decline"``).

    Raises:
        ValueError: An unknown name, an unknown spec field or a bad parameter (named).
    """
    if spec is None:
        return make_detector(DEFAULT_SPEC["name"], **DEFAULT_SPEC["params"])
    if isinstance(spec, str):
        return make_detector(spec)
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ValueError(f"a detector spec is a name or {{'name': ..., 'params': {{...}}}}, got {spec!r}")
    unknown = set(spec) - {"name", "params"}
    if unknown:
        raise ValueError(f"unknown detector spec field(s): {', '.join(sorted(unknown))}")
    return make_detector(spec["name"], **dict(spec.get("params") or {}))


def spec_plan_matters(spec: Mapping[str, Any]) -> bool:
    """:attr:`Detector.plan_matters` of the detector ``spec`` builds (a normalized ``{"name", "params"}``, as a job
    stores it), without building it.

    Raises:
        ValueError: An unknown detector name.
    """
    try:
        cls = DETECTORS[spec["name"]]
    except KeyError:
        raise ValueError(
            f"unknown detector {spec.get('name')!r}; choose one of {', '.join(sorted(DETECTORS))}"
        ) from None
    return cls.plan_matters_for(spec.get("params") or {})


def parse_detector_param(text: str) -> tuple[str, Any]:
    """``"key=value"`` as given on a command line (``--detector-param``): the value parsed as JSON, else kept as text.

    Raises:
        ValueError: No ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


DetectorFactory = Callable[[], Detector]
