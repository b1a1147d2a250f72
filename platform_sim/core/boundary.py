"""The information boundary: what may cross from a training job to the scheduler, and what comes back.

A :class:`Report` is a whitelist of the eight fields below. Unknown fields are rejected, never ignored, so a client that
tries to send a training loss, a proxy reward or a path fails loudly instead of leaking it. A :class:`Decision` is
the scheduler's only answer. Both are plain frozen dataclasses with ``to_dict``/``from_dict`` so that the embedded
client, the HTTP service and the simulator all speak the same objects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeGuard, cast

import numpy as np

JOB_TYPES: tuple[str, ...] = ("rlhf", "dpo", "lora", "sft", "other")
"""Job types a report may name. Schedulers may treat them differently (StopAt-p only stops ``rlhf``)."""

REPORT_FIELDS: frozenset[str] = frozenset(
    {"job_id", "job_type", "step", "eval_score", "eval_scores", "eval_std", "eval_n", "planned_steps"}
)
DECISION_FIELDS: frozenset[str] = frozenset(
    {"action", "reason", "declines", "best_step", "best_score", "next_eval_step"}
)


class BoundaryError(ValueError):
    """A report or decision that violates the boundary contract (bad field, bad value)."""


class InvalidReportError(BoundaryError):
    """The report itself is malformed: unknown field, wrong type, non-finite score, negative step."""


class ConflictError(BoundaryError):
    """The report contradicts what the job already reported (different score for a seen step, step went back)."""


class EvidenceMode(str, Enum):
    """What a report tells a detector about one evaluation, richest first; each decision's reason names its mode.

    A detector decides on the richest evidence a job's reports carry: the per-example scores (paired tests across
    evals), else each eval's mean with its spread (the standard deviation and count of its example scores, as
    trainers' own evaluations log them), else the means alone.
    """

    PER_EXAMPLE = "per-example"
    MEAN_AND_SPREAD = "mean-and-spread"
    MEANS_ONLY = "means only"

    def label(self, reason: str) -> str:
        """``reason`` as a decision states it: led by this mode (``"mean-and-spread: ..."``)."""
        return f"{self.value}: {reason}"

    @classmethod
    def of_reason(cls, reason: str) -> EvidenceMode | None:
        """The mode a decision's reason names (written by :meth:`label`), or ``None`` for a reason without one."""
        for mode in cls:
            if reason.startswith(f"{mode.value}: "):
                return mode
        return None


SPREAD_REL_TOL: float = 1e-6
"""How closely ``eval_std`` must match the sample standard deviation of ``eval_scores`` when a report carries both
(relative, with an absolute floor of 1e-12): room for float32 arithmetic on the sender's side, none for another eval."""


class Action(str, Enum):
    """What the scheduler tells a job to do after an evaluation."""

    CONTINUE = "continue"
    STOP = "stop"


MAX_ABS_SCORE: float = 1e100
"""Largest magnitude a score (``eval_score`` or one of ``eval_scores``) may have.

Eval scores are means of per-example scores (accuracies, rewards, win rates): real ones are far below this. The
bound exists so that every detector's arithmetic stays finite: they square scores, sum the squares of up to
hundreds of thousands of per-example differences and fit curves through them, and a score of 1e200 overflows
(``OverflowError``, or an infinite state that cannot be stored). With ``|score| <= 1e100`` a squared difference is at
most 4e200 and a sum over a million of them about 4e206, far from the float limit of 1.8e308. Values closer to zero
(subnormals included) are accepted."""


def check_finite_score(value: Any, field: str = "eval_score") -> float:
    """Return ``value`` as a float, or raise :class:`InvalidReportError` naming ``field`` if it is not a finite number
    of magnitude at most :data:`MAX_ABS_SCORE`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReportError(f"{field} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        raise InvalidReportError(f"{field} must be a number of magnitude at most {MAX_ABS_SCORE:g}") from None
    if not math.isfinite(number):
        raise InvalidReportError(f"{field} must be finite, got {number}")
    if not -MAX_ABS_SCORE <= number <= MAX_ABS_SCORE:
        raise InvalidReportError(f"{field} must have a magnitude of at most {MAX_ABS_SCORE:g}, got {number:g}")
    return number


def check_finite_scores(values: Sequence[Any], field: str = "eval_scores[]") -> tuple[float, ...]:
    """Return ``values`` as a tuple of floats, each checked as by :func:`check_finite_score`.

    The common case (every value already a float within the bound) is checked in a few C-level passes without a call
    per value: reports may carry tens of thousands of per-example scores, and the check ran on the server's event loop.
    """
    # C-level passes only (the generators of a per-value check were half the default detector's cost per eval in
    # the simulator): every value a float, their sum finite (a NaN or an infinity makes it NaN or infinite; floats
    # within the bound cannot overflow it), then the bound on the smallest and the largest.
    if len(values) and set(map(type, values)) == {float} and math.isfinite(sum(values)):
        if -MAX_ABS_SCORE <= min(values) and max(values) <= MAX_ABS_SCORE:
            return tuple(values)
    return tuple(check_finite_score(v, field) for v in values)


def is_array(values: object) -> TypeGuard[np.ndarray]:
    """Whether ``values`` is a ``numpy`` array (exactly: not a subclass such as a masked array)."""
    return type(values) is np.ndarray


def check_finite_score_array(values: np.ndarray, field: str = "eval_scores[]") -> np.ndarray | tuple[float, ...]:
    """A one-dimensional float64 array of per-example scores, checked as :func:`check_finite_scores` checks a sequence
    (every value finite, of magnitude at most :data:`MAX_ABS_SCORE`) in two reductions, and returned read-only (a
    copy if it was writable, so that a caller cannot change what a detector keeps): the simulator's rows.

    Anything else (another dtype or shape, an empty array, a bad value) goes through :func:`check_finite_scores`,
    whose tuple of floats or error it gives: the same refusals as for a list.
    """
    # min and max are NaN if any value is (and the comparisons then false); an infinity is beyond the bound. (The
    # ufuncs' reductions are what ndarray.min and .max call, without their argument handling.)
    if values.dtype == np.float64 and values.ndim == 1 and values.size:
        if -MAX_ABS_SCORE <= np.minimum.reduce(values) and np.maximum.reduce(values) <= MAX_ABS_SCORE:
            if values.flags.writeable:
                values = values.copy()
                values.flags.writeable = False
            return values
    return check_finite_scores(cast("Sequence[Any]", values), field)


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation (``ddof=1``) of at least two values, by Welford's update (no catastrophic
    cancellation for scores far from zero)."""
    mean = m2 = 0.0
    for count, value in enumerate(values, start=1):
        delta = value - mean
        mean += delta / count
        m2 += delta * (value - mean)
    return math.sqrt(m2 / (len(values) - 1))


def check_step(value: Any) -> int:
    """Return ``value`` as an int step, or raise :class:`InvalidReportError` if it is not an integer >= 0."""
    step: int
    if isinstance(value, bool) or not isinstance(value, int):
        # Accept integral floats from JSON encoders that write 10.0, nothing else.
        if isinstance(value, float) and value.is_integer():
            step = int(value)
        else:
            raise InvalidReportError(f"step must be an integer >= 0, got {value!r}")
    else:
        step = value
    if step < 0:
        raise InvalidReportError(f"step must be >= 0, got {step}")
    return step


def check_planned_steps(value: Any) -> int | None:
    """Return ``value`` as the run's planned number of steps (None stays None), or raise :class:`InvalidReportError`
    if it is not an integer >= 1 (an integral float, as some JSON encoders write one, is accepted as ``step`` is)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidReportError(f"planned_steps must be an integer >= 1 (the run's planned steps), got {value!r}")
    return value


def check_job_type(value: Any) -> str:
    if not isinstance(value, str) or value not in JOB_TYPES:
        raise InvalidReportError(f"job_type must be one of {', '.join(JOB_TYPES)}; got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Report:
    """One evaluation of one job, as seen by the scheduler.

    Args:
        job_id: Identifier of the job, unique within its tenant.
        job_type: One of :data:`JOB_TYPES`.
        step: Training step of the evaluated checkpoint, an integer >= 0. Steps of one job strictly increase.
        eval_score: Mean held-out world-feedback score of the checkpoint (higher is better). Must be finite.
        eval_scores: Optional per-example scores of the same evaluation, for detectors that use paired tests.
            All finite; the same held-out examples in the same order at every eval of a job.
        eval_std: Optional sample standard deviation (``ddof=1``) of the evaluation's example scores, finite and
            >= 0, when only the mean and its spread are known (a trainer's ``.../std`` metric). Given with
            ``eval_n`` or not at all; with ``eval_scores`` it must agree with them.
        eval_n: Optional count of the evaluation's example scores, an integer >= 2, together with ``eval_std``; with
            ``eval_scores`` it must equal their length.
        planned_steps: Optional number of training steps the run is planned to take (a trainer's ``max_steps``), an
            integer >= 1: a fact about the run's schedule, like ``step``, that lets a detector measure its window and
            spend its false-stop level in training progress (``step / planned_steps``) instead of in evals. A
            ``step`` beyond it is valid (runs get extended); what a detector then does is its own documented rule.
    """

    job_id: str
    job_type: str
    step: int
    eval_score: float
    eval_scores: tuple[float, ...] | None = None
    eval_std: float | None = None
    eval_n: int | None = None
    planned_steps: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InvalidReportError(f"job_id must be a non-empty string, got {self.job_id!r}")
        check_job_type(self.job_type)
        object.__setattr__(self, "step", check_step(self.step))
        object.__setattr__(self, "eval_score", check_finite_score(self.eval_score))
        if self.eval_scores is not None:
            if isinstance(self.eval_scores, (str, bytes)) or not isinstance(self.eval_scores, Sequence):
                raise InvalidReportError("eval_scores must be a list of numbers")
            if len(self.eval_scores) == 0:
                raise InvalidReportError("eval_scores must not be empty when given")
            scores = check_finite_scores(self.eval_scores)
            object.__setattr__(self, "eval_scores", scores)
        self._check_spread()
        object.__setattr__(self, "planned_steps", check_planned_steps(self.planned_steps))

    def _check_spread(self) -> None:
        """``eval_std`` and ``eval_n`` come together, are valid, and agree with ``eval_scores`` when both are given."""
        if (self.eval_std is None) != (self.eval_n is None):
            given, missing = ("eval_std", "eval_n") if self.eval_n is None else ("eval_n", "eval_std")
            raise InvalidReportError(f"{given} was given without {missing}: the spread needs both")
        if self.eval_std is None:
            return
        std = check_finite_score(self.eval_std, "eval_std")
        if std < 0:
            raise InvalidReportError(f"eval_std must be >= 0, got {std}")
        n = self.eval_n
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise InvalidReportError(f"eval_n must be an integer >= 2 (a spread needs two scores), got {n!r}")
        object.__setattr__(self, "eval_std", std)
        if self.eval_scores is None:
            return
        if n != len(self.eval_scores):
            raise InvalidReportError(f"eval_n is {n} but eval_scores holds {len(self.eval_scores)} scores")
        actual = sample_std(self.eval_scores)
        if not math.isclose(std, actual, rel_tol=SPREAD_REL_TOL, abs_tol=1e-12):
            raise InvalidReportError(
                f"eval_std {std:g} disagrees with the sample standard deviation {actual:g} of eval_scores"
            )

    @property
    def mode(self) -> EvidenceMode:
        """The richest evidence this report carries (see :class:`EvidenceMode`)."""
        if self.eval_scores is not None:
            return EvidenceMode.PER_EXAMPLE
        if self.eval_std is not None:
            return EvidenceMode.MEAN_AND_SPREAD
        return EvidenceMode.MEANS_ONLY

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Build a report from a mapping, rejecting any field outside the whitelist."""
        if not isinstance(data, Mapping):
            raise InvalidReportError(f"a report must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - REPORT_FIELDS)
        if unknown:
            raise InvalidReportError(
                f"unknown report field(s) {', '.join(unknown)}: only {', '.join(sorted(REPORT_FIELDS))} may cross "
                "the information boundary"
            )
        missing = sorted({"job_id", "job_type", "step", "eval_score"} - set(data))
        if missing:
            raise InvalidReportError(f"missing report field(s): {', '.join(missing)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "job_type": self.job_type,
            "step": self.step,
            "eval_score": self.eval_score,
        }
        if self.eval_scores is not None:
            out["eval_scores"] = list(self.eval_scores)
        if self.eval_std is not None:
            out["eval_std"] = self.eval_std
            out["eval_n"] = self.eval_n
        if self.planned_steps is not None:
            out["planned_steps"] = self.planned_steps
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """The scheduler's answer to a report.

    Args:
        action: :attr:`Action.CONTINUE` or :attr:`Action.STOP`. Once a job is stopped every later decision is STOP.
        reason: Human-readable reason, e.g. ``"2 consecutive declines (k=2, min_delta=0)"``.
        declines: The detector's current evidence count (consecutive declines for the k-decline rule).
        best_step: Step of the best checkpoint observed so far (highest score, earliest on ties); once the job is
            stopped, the best among the evaluations up to the stop (later ones never move it).
        best_score: Its score.
        next_eval_step: Optional cadence hint, from the scheduler to the job only: the step at which the scheduler
            wants the next evaluation (sooner than the regular interval while a decline may have begun). None: the
            job keeps its regular interval. Left out of :meth:`to_dict` when None, so decisions without a hint
            serialize as before.
    """

    action: Action
    reason: str
    declines: int
    best_step: int | None
    best_score: float | None
    next_eval_step: int | None = None

    @property
    def should_stop(self) -> bool:
        return self.action is Action.STOP

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.value,
            "reason": self.reason,
            "declines": self.declines,
            "best_step": self.best_step,
            "best_score": self.best_score,
        }
        if self.next_eval_step is not None:
            out["next_eval_step"] = self.next_eval_step
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        unknown = sorted(set(data) - DECISION_FIELDS)
        if unknown:
            raise BoundaryError(f"unknown decision field(s): {', '.join(unknown)}")
        try:
            action = Action(data["action"])
        except (KeyError, ValueError) as exc:
            raise BoundaryError(f"decision has no valid action: {data.get('action')!r}") from exc
        hint = data.get("next_eval_step")
        if hint is not None:
            try:
                hint = check_step(hint)
            except InvalidReportError as exc:
                raise BoundaryError(f"decision next_eval_step: {exc}") from None
        return cls(
            action=action,
            reason=str(data.get("reason", "")),
            declines=int(data.get("declines", 0)),
            best_step=data.get("best_step"),
            best_score=data.get("best_score"),
            next_eval_step=hint,
        )
