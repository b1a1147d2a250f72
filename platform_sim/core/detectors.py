"""Decline detectors: the one place where "should this job stop?" is computed from its eval history.

Every consumer (the trainer callback's embedded client, the HTTP service, the simulator) builds detectors through
:func:`make_detector` and feeds them through :class:`~platform_sim.core.monitor.JobMonitor`, so there is exactly one
implementation of each rule. Detectors assume validated input (finite scores, strictly increasing steps); the monitor
does the validation.

A detector's whole state is a plain dict (:meth:`Detector.state_dict`) so that the service can persist it and a
trainer can resume it from a checkpoint.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Mapping, Sequence


class Detector(ABC):
    """Interface of a stop detector.

    Subclasses set :attr:`name`, validate their parameters in ``__init__`` (raising ``ValueError`` that names the
    parameter) and implement :meth:`observe`, :meth:`params`, :meth:`state_dict` and :meth:`load_state_dict`.
    """

    name: ClassVar[str]

    #: Current evidence count towards a stop (for the k-decline rule: consecutive declines).
    declines: int = 0

    @abstractmethod
    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        """Take one evaluation; return True if the job should stop now.

        Args:
            step: Training step of the evaluation; strictly greater than every step observed before.
            score: Finite mean score of the evaluation (higher is better).
            scores: Optional per-example scores of the evaluation (same examples at every eval).
        """

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The constructor parameters, so that ``make_detector(d.name, **d.params())`` rebuilds an equal detector."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The mutable state as JSON-serializable plain data."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict`."""

    def reason(self) -> str:
        """Why the detector stops (meaningful once :meth:`observe` returned True)."""
        return f"{self.name} fired"

    def spec(self) -> dict[str, Any]:
        """``{"name": ..., "params": {...}}``: what :func:`detector_from_spec` takes back."""
        return {"name": self.name, "params": self.params()}


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class KDeclineDetector(Detector):
    """The EvalStop paper's rule: stop after ``k`` consecutive declines of the eval score.

    A decline at eval t is ``score_t < score_{t-1} - min_delta``; any other eval resets the count to 0. The job stops
    when the count reaches ``k``.

    Args:
        k: Consecutive declines that stop the job (paper: 2). Integer >= 1.
        min_delta: Tolerance: a drop must exceed it to count as a decline (paper: 0). Finite, >= 0.
        warmup: The first ``warmup`` evaluations count no decline (paper: 0, no warm-up). Real RL runs can dip at
            the very start, before the policy improves at all (docs/real-traces.md); a warm-up keeps the rule from
            taking that dip for overoptimization. Integer >= 0. Left out of :meth:`params` and the state when 0, so
            specs and states of the paper's rule are unchanged.
    """

    name: ClassVar[str] = "k-decline"

    def __init__(self, k: int = 2, min_delta: float = 0.0, warmup: int = 0) -> None:
        self.k = _check_int("k", k, 1)
        self.min_delta = _check_nonneg("min_delta", min_delta)
        self.warmup = _check_int("warmup", warmup, 0)
        self.prev_score: float | None = None
        self.declines = 0
        self.seen = 0

    def observe(self, step: int, score: float, scores: Sequence[float] | None = None) -> bool:
        prev = self.prev_score
        self.seen += 1
        if prev is not None and score < prev - self.min_delta and self.seen > self.warmup:
            self.declines += 1
        else:
            self.declines = 0
        self.prev_score = score
        return self.declines >= self.k

    def reason(self) -> str:
        return f"{self.declines} consecutive declines (k={self.k}, min_delta={self.min_delta:g})"

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"k": self.k, "min_delta": self.min_delta}
        if self.warmup:
            params["warmup"] = self.warmup
        return params

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"prev_score": self.prev_score, "declines": self.declines}
        if self.warmup:
            state["seen"] = self.seen
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prev_score = state["prev_score"]
        self.declines = int(state["declines"])
        # States written without a warm-up have no "seen"; past the warm-up is the only safe reading of them.
        self.seen = int(state.get("seen", self.warmup if state["prev_score"] is not None else 0))


# Detector classes by name. Other modules add theirs with :func:`register_detector` at import time of this package
# (see ``platform_sim/core/__init__.py``); the mapping holds classes only, never instances or run state.
DETECTORS: dict[str, type[Detector]] = {KDeclineDetector.name: KDeclineDetector}


def register_detector(cls: type[Detector]) -> type[Detector]:
    """Class decorator that makes a detector selectable by its ``name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no detector name")
    DETECTORS[cls.name] = cls
    return cls


def make_detector(name: str = KDeclineDetector.name, **params: Any) -> Detector:
    """Build a detector by name with its parameters; unknown names and bad parameters raise ``ValueError``."""
    try:
        cls = DETECTORS[name]
    except KeyError:
        raise ValueError(f"unknown detector {name!r}; choose one of {', '.join(sorted(DETECTORS))}") from None
    try:
        return cls(**params)
    except TypeError as exc:  # unexpected keyword: name the detector so the user knows where to look
        raise ValueError(f"bad parameters for detector {name!r}: {exc}") from None


def detector_from_spec(spec: str | Mapping[str, Any] | None) -> Detector:
    """Build a detector from ``None`` (the paper's rule), a name, or ``{"name": ..., "params": {...}}``."""
    if spec is None:
        return make_detector()
    if isinstance(spec, str):
        return make_detector(spec)
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ValueError(f"a detector spec is a name or {{'name': ..., 'params': {{...}}}}, got {spec!r}")
    unknown = set(spec) - {"name", "params"}
    if unknown:
        raise ValueError(f"unknown detector spec field(s): {', '.join(sorted(unknown))}")
    return make_detector(spec["name"], **dict(spec.get("params") or {}))


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
