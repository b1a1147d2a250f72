"""Cadence hints: when the scheduler wants a job's next evaluation, sooner than its regular interval.

A decline can only be confirmed some evaluations after a job's peak, and at a regular interval those evaluations are a
whole interval apart: most of EvalStop's waste against the Oracle is that wait. A :class:`CadencePolicy` looks at the
detector's evidence after each evaluation and, once evidence has started to build up but is not yet enough to stop
(for the k-decline rule: at least one decline, fewer than ``k``; for a detector with a doubt, such as ``trend``'s
p-value or ``shape``'s posterior: a doubt below ``p_hint``), asks for the next evaluation after only a share of the regular interval.
Without evidence it asks for nothing, and the job keeps its regular interval. With ``confirm`` set, the policy also
takes a second look before a weak stop: the job is stopped a share of an interval later, and only if the detector
stops it again (:meth:`CadencePolicy.confirm_step`, applied by the monitor).

The hint is the decision's optional ``next_eval_step``; it flows from the scheduler to the job only. The policy is
pure (no I/O, no clock) and decided here in the core, so that the trainer's embedded client, the HTTP service and the
simulator give the same hint for the same history.

*Cadence* means one thing here and everywhere in the project: the rule of when a job is evaluated (``fixed``: at its
regular interval; ``adaptive``: that interval plus the hinted evaluations). The spacing of the regular evaluations is
the *regular interval* (:meth:`CadencePolicy.regular_interval`).

Specs: ``None`` or ``"fixed"`` (no hints, the regular interval), ``"adaptive"``, or
``{"name": "adaptive", "params": {"fraction": 0.25}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .checks import check_int, check_prob
from .detectors import Detector, se_from_history

CADENCES: tuple[str, ...] = ("fixed", "adaptive")
"""Cadence names a spec may give: ``fixed`` (no hints) and ``adaptive`` (:class:`CadencePolicy`)."""
P_HINT_DEFAULT = 0.5
"""The default ``p_hint`` of :class:`CadencePolicy` (chosen on the tune environments' dense traces)."""


@dataclass(frozen=True, slots=True)
class CadencePolicy:
    """Ask for the next evaluation sooner while a detector's evidence builds up.

    The regular interval is read from the job's own history (the largest gap between two consecutive evaluated
    steps, since hinted evaluations only ever shorten gaps), so the policy needs no knowledge of the job's plan.

    A drop that noise alone could make is a poor reason to look again soon: an eval that came out low by chance is
    followed, at nearly the same checkpoint, by a higher one about two times in three, but on a healthy run that
    still rises, a confirming eval only a share of an interval later has less rise to protect it from a chance second
    decline. ``min_drop`` therefore asks for the sooner eval only when the latest drop is large against the noise of
    an eval-to-eval difference, estimated from the job's own history of means.

    Args:
        fraction: The hinted evaluation comes this share of the regular interval after the evaluation that showed
            evidence. A number strictly between 0 and 1 (default 0.25: a quarter of an interval).
        min_drop: Hint only when the latest drop is at least this many standard errors of a difference of two eval
            means (noise estimated from the history, no hint before it can be estimated); 0 (the default): any
            evidence asks for the sooner eval. Finite, >= 0.
        p_hint: For a detector that gives a doubt (:meth:`~platform_sim.core.detectors.Detector.doubt`: ``trend``'s
            last p-value, ``shape``'s one minus its posterior of being past an overoptimization peak): a doubt below
            ``p_hint`` is evidence building up, so a detector that stops at its first significant eval (``k`` = 1)
            can hint too. The hinted eval is a look that the detector forgets unless it stops the job
            (:mod:`~platform_sim.core.monitor`; ``shape`` keeps it as one more point of its curve). In [0, 1); 0:
            p-values are never read. The default, 0.5, was chosen on the tune environments' dense traces
            (``benchmarks/cadence_dense_traces.py``) when hinted evals stayed in the detector's history; with looks
            the same choice picks 0.05 there (the same delays for under a tenth of the extra evals), but the default
            stays, since a stored spec without ``p_hint`` means it.
        p_hint_at_best: The doubt bar instead of ``p_hint`` after an eval that is the job's best so far (not below
            any earlier eval). No stop can come before an eval falls below the best, so a sooner eval after a new
            best pays for itself only when the detector already places the peak here; on weaker evidence the job
            waits for its regular eval, which costs at most one interval of delay and saves an eval on every
            still-rising run. In [0, 1); None (the default): ``p_hint`` everywhere.
        confirm: Confirm a weak stop before taking it: when the detector stops the job with a doubt above
            ``confirm`` (a test's p-value, or one minus a posterior), the decision is CONTINUE with a hint
            ``fraction`` of an interval later, and the job stops at that next eval only if the detector stops it
            again (whatever its doubt then). A noise dip on a healthy run rarely survives a second look, a real
            decline does, and the look costs a share of an interval instead of the whole interval that a second
            regular eval would. A client that cannot honour the hint (its budget of extra evals is spent) confirms
            at its next regular eval. In [0, 1); None (the default): every stop is taken at once. Detectors without
            a doubt (``k-decline``) are never confirmed.
    """

    name: ClassVar[str] = "adaptive"

    fraction: float = 0.25
    min_drop: float = 0.0
    p_hint: float = P_HINT_DEFAULT
    p_hint_at_best: float | None = None
    confirm: float | None = None

    def __post_init__(self) -> None:
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0.0 < f < 1.0:
            raise ValueError(f"cadence fraction must be a number strictly between 0 and 1, got {f!r}")
        object.__setattr__(self, "fraction", float(f))
        m = self.min_drop
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0:
            raise ValueError(f"cadence min_drop must be a finite number >= 0, got {m!r}")
        object.__setattr__(self, "min_drop", float(m))
        p = self.p_hint
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p < 1.0:
            raise ValueError(f"cadence p_hint must be a number in [0, 1), got {p!r}")
        object.__setattr__(self, "p_hint", float(p))
        for name in ("p_hint_at_best", "confirm"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v < 1.0:
                raise ValueError(f"cadence {name} must be a number in [0, 1) or None, got {v!r}")
            object.__setattr__(self, name, float(v))

    @staticmethod
    def regular_interval(steps: Sequence[int]) -> int | None:
        """The job's regular gap between evaluations in steps: the largest gap seen (the first eval's step counts
        as a gap from step 0). None before any evaluation, or when every evaluation was at step 0."""
        if not steps:
            return None
        gap = max((b - a for a, b in zip(steps, steps[1:])), default=0)
        gap = max(gap, steps[0])
        return gap if gap > 0 else None

    def next_eval_step(
        self,
        steps: Sequence[int],
        evidence: int,
        needed: int | None,
        scores: Sequence[float] = (),
        p_value: float | None = None,
    ) -> int | None:
        """The step at which the next evaluation is wanted, or None for the regular interval.

        Args:
            steps: The job's evaluated steps so far, strictly increasing; the last is the evaluation just judged.
            evidence: The detector's current evidence count (consecutive declines for k-decline).
            needed: The evidence count that stops the job (``k``), or None when the detector has no such count (then
                any evidence asks for a sooner evaluation).
            scores: The mean scores of those evaluations (read only when ``min_drop`` > 0 or ``p_hint_at_best`` is
                set).
            p_value: The detector's doubt after the last eval (a test's p-value, or one minus a posterior; None:
                it has none); below ``p_hint`` (``p_hint_at_best`` after a new best, when set) it counts as
                evidence.

        Returns:
            A step strictly after ``steps[-1]`` and strictly before the regular next evaluation, or None.
        """
        if (needed is not None and evidence >= needed) or not steps:
            return None
        bar = self.p_hint
        if self.p_hint_at_best is not None and len(scores) == len(steps) and scores[-1] >= max(scores):
            bar = self.p_hint_at_best  # the eval is the job's best so far: no drop to confirm yet
        tested = p_value is not None and bar > 0.0 and p_value < bar
        if evidence <= 0 and not tested:
            return None
        if self.min_drop > 0.0:
            se = se_from_history(scores) if len(scores) == len(steps) else None
            if se is None or scores[-2] - scores[-1] < self.min_drop * se * math.sqrt(2.0):
                return None
        return self._sooner(steps)

    def _sooner(self, steps: Sequence[int]) -> int | None:
        """``fraction`` of the regular interval after the last evaluated step; None when that is not sooner than the
        regular interval."""
        interval = self.regular_interval(steps)
        if interval is None:
            return None
        gap = max(1, round(self.fraction * interval))
        if gap >= interval:  # intervals of one or two steps: the regular interval is already as soon as it gets
            return None
        return steps[-1] + gap

    def confirm_step(self, steps: Sequence[int], doubt: float | None) -> int | None:
        """Where to confirm a stop the detector just gave, or None to take it now.

        Args:
            steps: The job's evaluated steps, the last being the eval that stopped it.
            doubt: The detector's doubt after that eval (None: it has none, and the stop is taken).

        Returns:
            ``fraction`` of an interval after ``steps[-1]`` when ``confirm`` is set and ``doubt`` exceeds it (and such
            a step comes before the regular next eval); else None.
        """
        if self.confirm is None or doubt is None or doubt <= self.confirm:
            return None
        return self._sooner(steps)

    def for_history(self, steps: Sequence[int], scores: Sequence[float], detector: Detector) -> int | None:
        """:meth:`next_eval_step` for a job's history, with the evidence and the stop count read from ``detector``."""
        p_value = detector.doubt() if self.p_hint > 0.0 else None  # trend's needs scipy: only when it can matter
        return self.next_eval_step(steps, int(detector.declines), getattr(detector, "k", None), scores, p_value)

    def spec(self) -> dict[str, Any]:
        """``{"name": "adaptive", "params": {...}}``: what :func:`cadence_from_spec` takes (``min_drop``,
        ``p_hint_at_best`` and ``confirm`` only when set, ``p_hint`` only when not the default, so that specs written
        before these existed read the same)."""
        params: dict[str, Any] = {"fraction": self.fraction}
        if self.min_drop:
            params["min_drop"] = self.min_drop
        if self.p_hint != P_HINT_DEFAULT:
            params["p_hint"] = self.p_hint
        for name in ("p_hint_at_best", "confirm"):
            if getattr(self, name) is not None:
                params[name] = getattr(self, name)
        return {"name": self.name, "params": params}


#: ``{parameter: (lowest, highest)}`` of the adaptive cadence, both ends allowed by this table; the constructor
#: refuses the open ends (``fraction`` 0 and 1, the probabilities 1) with its own message. docs/reference/detectors.md
#: lists them beside the detectors' bounds.
CADENCE_PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    "fraction": (0.0, 1.0),
    "min_drop": (0.0, 1e9),
    "p_hint": (0.0, 1.0),
    "p_hint_at_best": (0.0, 1.0),
    "confirm": (0.0, 1.0),
}


def cadence_from_spec(spec: str | Mapping[str, Any] | None) -> CadencePolicy | None:
    """Build a cadence policy from ``None``/``"fixed"`` (None: no hints), ``"adaptive"``, or a spec mapping.

    Raises:
        ValueError: Unknown name, unknown spec field or bad parameter.
    """
    if spec is None or spec == "fixed":
        return None
    if isinstance(spec, str):
        name, params = spec, {}
    elif isinstance(spec, Mapping) and "name" in spec:
        unknown = set(spec) - {"name", "params"}
        if unknown:
            raise ValueError(f"unknown cadence spec field(s): {', '.join(sorted(unknown))}")
        name, params = spec["name"], dict(spec.get("params") or {})
    else:
        raise ValueError(f"a cadence spec is a name or {{'name': ..., 'params': {{...}}}}, got {spec!r}")
    if name == "fixed":
        if params:
            raise ValueError("the fixed cadence takes no parameters")
        return None
    if name != CadencePolicy.name:
        raise ValueError(f"unknown cadence {name!r}; choose one of {', '.join(CADENCES)}")
    try:
        policy = CadencePolicy(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for cadence {name!r}: {exc}") from None
    for param, (low, high) in CADENCE_PARAM_BOUNDS.items():  # the top ends the constructor does not check
        value = getattr(policy, param)
        if value is not None and not low <= value <= high:
            raise ValueError(f"cadence {name!r} parameter {param} must be in [{low:g}, {high:g}], got {value!r}")
    return policy


@dataclass(frozen=True, slots=True)
class EvalBudget:
    """How much a job may spend on hinted evaluations: the user's side of a cadence hint.

    The scheduler hints; the job decides whether it can afford the hint. The trainer callback (with measured
    seconds) and the simulator (with simulated GPU-hours) ask this one object, so that a budget means the same in a
    real run and in a replay of it.

    Args:
        max_extra_evals: At most this many hinted (extra) evaluations per job. Integer >= 0; None: no count limit.
        max_eval_share: A hint is not followed while the evaluations so far (regular and extra) took more than this
            share of the job's time so far (training and evaluating, not queueing). A number strictly between 0 and
            1; None: no time limit. The regular interval alone spends its own share (in the simulator, ``eval_cost``
            of every interval): a share below that follows no hint once the first regular eval is done, and one
            just above it lets a job take one hinted eval at any time and more only as its run goes on.
    """

    max_extra_evals: int | None = None
    max_eval_share: float | None = None

    def __post_init__(self) -> None:
        if self.max_extra_evals is not None:
            check_int("max_extra_evals", self.max_extra_evals, 0)
        if self.max_eval_share is not None:
            object.__setattr__(self, "max_eval_share", check_prob("max_eval_share", self.max_eval_share))

    @property
    def unlimited(self) -> bool:
        """Whether neither limit is set (every hint is followed)."""
        return self.max_extra_evals is None and self.max_eval_share is None

    def allows(self, extra_evals: int, eval_time: float = 0.0, wall_time: float = 0.0) -> bool:
        """Whether one more hinted evaluation may be taken.

        Args:
            extra_evals: Hinted evaluations the job has taken so far.
            eval_time: Time its evaluations so far took (any unit, the same as ``wall_time``); read only with
                ``max_eval_share``.
            wall_time: The job's time so far, training and evaluating.
        """
        if self.max_extra_evals is not None and extra_evals >= self.max_extra_evals:
            return False
        # The check is on what was spent, not on what the next eval will cost: the eval's cost is not known before
        # it runs, so a budget can be passed by at most one eval (as with the count).
        return self.max_eval_share is None or eval_time <= self.max_eval_share * wall_time

    def to_dict(self) -> dict[str, Any]:
        """``{"max_extra_evals": ..., "max_eval_share": ...}`` (None where unset), for run records."""
        return {"max_extra_evals": self.max_extra_evals, "max_eval_share": self.max_eval_share}
