"""Stop policies: which running job to stop early, and which checkpoint it delivers. Composable around any base policy.

A stop policy is asked at every evaluation of a job it covers (by default RLHF jobs, the ones prone to reward
hacking). If it returns a :class:`StopVerdict` the owner stops the job at once, frees its GPUs, delivers the verdict's
checkpoint and hands the cluster back to the base policy. :func:`with_stop` composes a base policy with a stop policy;
:func:`evalstop` is the paper's scheduler: the k-decline rule (through :class:`~platform_sim.core.monitor.JobMonitor`,
the one implementation of the rule) around any base policy.

Policies:

- ``none``: never stops.
- ``evalstop``: the job's detector (default ``k-decline``, k=2, min_delta=0) over its observed eval scores; delivers
  the best observed checkpoint (highest score, earliest on ties).
- ``evalstop-fleet``: EvalStop whose detector for each new job is chosen from the platform's finished jobs
  (:mod:`platform_sim.sim.policies.fleet`): the ``shape`` detector, or ``shape-sens`` once the jobs that finished unstopped
  show that healthy runs here keep rising until the end.
- ``stop-at-p``: stops every covered job at the first eval at or after a fraction ``p`` (0.65) of its planned steps;
  delivers that checkpoint.
- ``loss-plateau``: stops a covered job when its training loss improved by less than ``min_rel_improvement`` (1%,
  relative) over the last ``window`` evals (4, i.e. 20% of the run at the default eval interval); delivers the current
  checkpoint. Training loss keeps falling for hacking runs too, so this rule cannot see hacking: it is the baseline
  that shows why the eval signal is needed.
- ``oracle``: stops a job exactly at its true peak eval and delivers it. It is handed the ground truth explicitly
  (``peak_steps``) and exists only as the bound every policy is compared to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from platform_sim.core.boundary import JOB_TYPES, Action
from platform_sim.core.cadence import cadence_from_spec
from platform_sim.core.checks import check_int, check_nonneg
from platform_sim.core.detectors import Detector, detector_from_spec, paper_spec, shape_sens_spec
from platform_sim.core.monitor import JobMonitor

from .fleet import FleetDetectorChoice
from .policies import BasePolicy
from .views import JobView

DEFAULT_STOP_TYPES: tuple[str, ...] = ("rlhf",)
"""Job types a stop policy covers by default: RLHF, where reward hacking happens (docs/design.md section 5)."""


@dataclass(frozen=True, slots=True)
class StopVerdict:
    """A stop policy's decision to stop a job now.

    Args:
        reason: Why, for logs and reports.
        deliver_step: Step of the checkpoint the job delivers (the best observed one for EvalStop).
        declines: The detector's evidence count at the stop (0 for policies without one).
    """

    reason: str
    deliver_step: int
    declines: int = 0


def _check_types(job_types: Iterable[str]) -> frozenset[str]:
    types = frozenset(job_types)
    bad = sorted(types - set(JOB_TYPES))
    if bad or not types:
        raise ValueError(f"job_types must be a non-empty subset of {', '.join(JOB_TYPES)}; got {sorted(types)}")
    return types


class StopPolicy(ABC):
    """Interface of a stop policy.

    Args:
        job_types: Job types the policy covers; other jobs are never stopped.
    """

    name: ClassVar[str]
    uses_ground_truth: ClassVar[bool] = False

    def __init__(self, job_types: Iterable[str] = DEFAULT_STOP_TYPES) -> None:
        self.job_types = _check_types(job_types)

    def covers(self, job: JobView) -> bool:
        return job.job_type in self.job_types

    @abstractmethod
    def on_eval(self, job: JobView) -> StopVerdict | None:
        """Called after ``job``'s view received a new eval; return a verdict to stop it now, else None."""

    def forget(self, job_id: str) -> None:
        """The job ended: drop any per-job state."""

    def next_eval_step(self, job: JobView) -> int | None:
        """The cadence hint after ``job``'s latest eval (None: its regular interval); asked after :meth:`on_eval`
        returned None. Policies without a cadence policy never hint."""
        return None

    def params(self) -> dict[str, Any]:
        return {"job_types": sorted(self.job_types)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params()})"


class NoStop(StopPolicy):
    """Never stops a job (the base scheduler alone)."""

    name: ClassVar[str] = "none"

    def covers(self, job: JobView) -> bool:
        return False

    def on_eval(self, job: JobView) -> StopVerdict | None:
        return None


class EvalStopPolicy(StopPolicy):
    """The paper's rule: a :class:`JobMonitor` with the configured detector per covered job.

    Args:
        detector: A detector spec for :func:`~platform_sim.core.detectors.detector_from_spec` (None: the paper's
            rule, ``paper_spec()``: k-decline, k=2, min_delta=0). Every job gets its own detector built from it.
        job_types: Job types covered.
        cadence: A cadence spec for :func:`~platform_sim.core.cadence.cadence_from_spec` (None or ``"fixed"``: no
            hints; ``"adaptive"``: ask for a sooner eval while a decline may have begun).
    """

    name: ClassVar[str] = "evalstop"

    def __init__(
        self,
        detector: str | Mapping[str, Any] | None = None,
        job_types: Iterable[str] = DEFAULT_STOP_TYPES,
        cadence: str | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(job_types)
        self.cadence = cadence_from_spec(cadence)
        # Validated now: a bad spec fails at construction, not mid-run.
        probe = detector_from_spec(paper_spec() if detector is None else detector)
        self.detector_spec: dict[str, Any] = probe.spec()
        self._detector_cls = type(probe)
        self._detector_params = probe.params()
        self.monitors: dict[str, JobMonitor] = {}

    def new_detector(self) -> Detector:
        # The spec was validated once in __init__; building from the class skips the registry lookup per job.
        return self._detector_cls(**self._detector_params)

    def monitor(self, job: JobView) -> JobMonitor:
        mon = self.monitors.get(job.job_id)
        if mon is None:
            mon = self.monitors[job.job_id] = JobMonitor(
                job.job_id, job.job_type, self.new_detector(), cadence=self.cadence
            )
        return mon

    def on_eval(self, job: JobView) -> StopVerdict | None:
        step, score = job.last_step, job.last_score
        if step is None or score is None:
            return None
        mon = self.monitors.get(job.job_id) or self.monitor(job)
        decision = mon.observe(step, score, job.last_example_scores, planned_steps=job.planned_steps)
        if decision.action is not Action.STOP:
            return None
        return StopVerdict(
            decision.reason, decision.best_step if decision.best_step is not None else step, decision.declines
        )

    def forget(self, job_id: str) -> None:
        self.monitors.pop(job_id, None)

    def next_eval_step(self, job: JobView) -> int | None:
        mon = self.monitors.get(job.job_id)
        decision = mon.last_decision if mon is not None else None
        return decision.next_eval_step if decision is not None else None

    def params(self) -> dict[str, Any]:
        params = {"detector": self.detector_spec, **super().params()}
        if self.cadence is not None:  # left out when fixed, so the paper's parameters read as before
            params["cadence"] = self.cadence.spec()
        return params


class StopAtP(StopPolicy):
    """Stops every covered job at a fixed fraction of its planned steps.

    Args:
        p: Fraction of planned progress at which to stop, in (0, 1] (paper: 0.65).
        job_types: Job types covered.
    """

    name: ClassVar[str] = "stop-at-p"

    def __init__(self, p: float = 0.65, job_types: Iterable[str] = DEFAULT_STOP_TYPES) -> None:
        super().__init__(job_types)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        self.p = float(p)

    def on_eval(self, job: JobView) -> StopVerdict | None:
        step = job.last_step
        # Compare in steps with a tolerance: 13 * 0.05 is 0.6500000000000001 in floating point.
        if step is None or step + 1e-9 * job.planned_steps < self.p * job.planned_steps:
            return None
        return StopVerdict(f"reached {self.p:g} of planned steps", step)

    def params(self) -> dict[str, Any]:
        return {"p": self.p, **super().params()}


class LossPlateau(StopPolicy):
    """Stops a covered job when its training loss stops improving.

    The rule: with ``L`` the observed losses, stop at eval t once ``t >= window`` and
    ``(L[t - window] - L[t]) / |L[t - window]| < min_rel_improvement``.

    Args:
        window: Evals to look back. Integer >= 1.
        min_rel_improvement: Relative improvement below which the loss counts as flat. Finite, >= 0.
        job_types: Job types covered.
    """

    name: ClassVar[str] = "loss-plateau"

    def __init__(
        self, window: int = 4, min_rel_improvement: float = 0.01, job_types: Iterable[str] = DEFAULT_STOP_TYPES
    ) -> None:
        super().__init__(job_types)
        self.window = check_int("window", window, 1)
        self.min_rel_improvement = check_nonneg("min_rel_improvement", min_rel_improvement)

    def on_eval(self, job: JobView) -> StopVerdict | None:
        losses = job.recent_losses(self.window + 1)
        if len(losses) <= self.window:
            return None
        old, new = losses[0], losses[-1]
        rel = (old - new) / abs(old) if old != 0 else 0.0
        if rel >= self.min_rel_improvement:
            return None
        step = job.last_step
        assert step is not None  # a loss comes with an eval
        return StopVerdict(f"loss improved {rel:.2%} over {self.window} evals (< {self.min_rel_improvement:.2%})", step)

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "min_rel_improvement": self.min_rel_improvement, **super().params()}


class Oracle(StopPolicy):
    """The bound: stops a job exactly at its true peak eval and delivers that checkpoint. Sees ground truth.

    Args:
        peak_steps: Job id -> step of its true (noise-free) peak eval, for the jobs the oracle should stop (the
            hacking ones). Jobs not in it are never stopped.
        job_types: Job types covered.
    """

    name: ClassVar[str] = "oracle"
    uses_ground_truth: ClassVar[bool] = True

    def __init__(
        self, peak_steps: Mapping[str, int] | None = None, job_types: Iterable[str] = DEFAULT_STOP_TYPES
    ) -> None:
        super().__init__(job_types)
        self.peak_steps: dict[str, int] = dict(peak_steps or {})

    def on_eval(self, job: JobView) -> StopVerdict | None:
        peak = self.peak_steps.get(job.job_id)
        step = job.last_step
        if peak is None or step is None or step < peak:
            return None
        return StopVerdict("true peak reached (oracle)", peak)

    def params(self) -> dict[str, Any]:
        return {"peak_steps": f"<{len(self.peak_steps)} jobs>", **super().params()}


class FleetEvalStopPolicy(EvalStopPolicy):
    """EvalStop whose detector for each new job is chosen from the platform's finished jobs.

    A :class:`~platform_sim.sim.policies.fleet.FleetDetectorChoice` picks the ``conservative`` or the ``aggressive`` detector
    spec when a job first reports (from the late gains of the covered jobs that finished without being stopped); the
    job keeps that detector for its whole run. Everything else is :class:`EvalStopPolicy`.

    Args:
        conservative, aggressive, min_late_gain, min_runs, window: See
            :class:`~platform_sim.sim.policies.fleet.FleetDetectorChoice`.
        job_types: Job types covered (and learned from).
    """

    name: ClassVar[str] = "evalstop-fleet"

    def __init__(
        self,
        conservative: Mapping[str, Any] | None = None,
        aggressive: Mapping[str, Any] | None = None,
        min_late_gain: float = 0.3,
        min_runs: int = 8,
        window: int = 50,
        job_types: Iterable[str] = DEFAULT_STOP_TYPES,
    ) -> None:
        # Defaults: the calibrated detectors of docs/results/detectors-synthetic.md (shape at the class default, and shape-sens).
        self.choice = FleetDetectorChoice(
            conservative or {"name": "shape", "params": {}},
            aggressive or shape_sens_spec(),
            min_late_gain,
            min_runs,
            window,
        )
        super().__init__(self.choice.conservative, job_types)
        # job id -> "conservative" / "aggressive", kept after the job ends so a run can report the choices it made.
        self.chosen: dict[str, str] = {}

    def monitor(self, job: JobView) -> JobMonitor:
        mon = self.monitors.get(job.job_id)
        if mon is None:
            spec = self.choice.spec()
            self.chosen[job.job_id] = "aggressive" if spec == self.choice.aggressive else "conservative"
            mon = self.monitors[job.job_id] = JobMonitor(job.job_id, job.job_type, detector_from_spec(spec))
        return mon

    def forget(self, job_id: str) -> None:
        mon = self.monitors.pop(job_id, None)
        if mon is not None and not mon.stopped:  # a run that finished: what this platform's runs look like
            self.choice.record(mon.scores)

    def params(self) -> dict[str, Any]:
        return {**self.choice.params(), "job_types": sorted(self.job_types)}


STOP_POLICIES: dict[str, type[StopPolicy]] = {
    cls.name: cls for cls in (NoStop, EvalStopPolicy, FleetEvalStopPolicy, StopAtP, LossPlateau, Oracle)
}


def make_stop_policy(name: str, **params: Any) -> StopPolicy:
    """Build a stop policy by name (``none``, ``evalstop``, ``stop-at-p``, ``loss-plateau``, ``oracle``)."""
    try:
        cls = STOP_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown stop policy {name!r}; choose one of {', '.join(STOP_POLICIES)}") from None
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for stop policy {name!r}: {exc}") from None


@dataclass(frozen=True)
class Scheduler:
    """A base policy composed with a stop policy: the stop policy decides who ends early, the base who runs.

    Args:
        base: Who gets the GPUs.
        stop: Who stops early (``NoStop`` for the base alone).
    """

    base: BasePolicy
    stop: StopPolicy

    @property
    def name(self) -> str:
        return f"{self.base.name}+{self.stop.name}"


def with_stop(base: BasePolicy, stop: StopPolicy | None = None) -> Scheduler:
    """Compose ``base`` with ``stop`` (None: no stop policy)."""
    return Scheduler(base, stop if stop is not None else NoStop())


def evalstop(
    base: BasePolicy,
    detector: str | Mapping[str, Any] | None = None,
    job_types: Iterable[str] = DEFAULT_STOP_TYPES,
    cadence: str | Mapping[str, Any] | None = None,
) -> Scheduler:
    """The EvalStop wrapper around any base policy: ``evalstop(SRTFEst())`` is the paper's SRTF-Est + EvalStop;
    ``cadence="adaptive"`` adds the core's cadence hints."""
    return Scheduler(base, EvalStopPolicy(detector, job_types, cadence))
