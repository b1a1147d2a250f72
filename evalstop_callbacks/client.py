"""Information-boundary clients: the only way the trainer side talks to a scheduler.

A client takes whitelisted :class:`~platform_sim.core.boundary.Report` objects and returns
:class:`~platform_sim.core.boundary.Decision` objects. :class:`EmbeddedClient` (the default) runs the scheduler core
in-process with no server; ``PlatformClient`` (``evalstop_callbacks.platform_client``) sends the same reports to an
``evalstop-server`` over HTTP. Switching between them is the only change a user makes.
"""

from __future__ import annotations

import inspect
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeGuard, runtime_checkable

from platform_sim.core import (
    Decision,
    InvalidReportError,
    JobMonitor,
    Report,
    cadence_from_spec,
    default_spec,
    detector_from_spec,
)
from platform_sim.core.boundary import check_job_type

from .nonfinite import non_finite

logger = logging.getLogger(__name__)


def make_report(
    job_id: str,
    job_type: str,
    step: int,
    score: float,
    scores: Sequence[float] | None = None,
    error: type[Exception] | None = None,
    std: float | None = None,
    n: int | None = None,
    planned_steps: int | None = None,
) -> Report:
    """The :class:`Report` of one evaluation, built the one way every entry point builds it: a NaN or inf score is
    refused first by :func:`refuse_non_finite`, with the job and step named.

    Args:
        job_id, job_type, step: The job and the evaluation's step.
        score: The mean score (higher is better).
        scores: Per-example scores in a fixed example order, or None.
        error: The exception class for a non-finite score or spread (default :class:`NonFiniteScoreError`).
        std: The sample standard deviation of the evaluation's example scores (the report's ``eval_std``), or None.
        n: Their count (``eval_n``), given together with ``std``.
        planned_steps: The run's planned training steps (the trainer's ``max_steps``; the report's
            ``planned_steps``), an integer >= 1, or None (unknown: 0 is read as unknown too).

    Raises:
        ``error``: A non-finite score, per-example score or ``std``.
        InvalidReportError: Any other value the :class:`Report` refuses (``std`` without ``n``, ``n`` < 2, a negative
            ``std``, a spread that disagrees with ``scores``), its message led by the job and step.
    """
    refuse_non_finite(job_id, step, score, scores, error or NonFiniteScoreError)
    if isinstance(std, float) and not math.isfinite(std):
        raise (error or NonFiniteScoreError)(
            f"EvalStop job {job_id!r}: non-finite eval_std {std} at step {step}; a NaN or inf spread is refused "
            "(leave the spread out, or fix the metric that logs it)"
        )
    try:
        values = None if scores is None else tuple(scores)
        return Report(job_id, job_type, step, score, values, std, n, planned_steps or None)
    except InvalidReportError as exc:
        if std is None and n is None:
            raise
        raise InvalidReportError(f"EvalStop job {job_id!r} step {step}: {exc}") from None


class NonFiniteScoreError(InvalidReportError):
    """A NaN or infinite eval score handed to :func:`make_report`: no client ever sends one (docs/design.md)."""


def refuse_non_finite(
    job_id: str | None,
    step: int,
    score: Any,
    scores: Sequence[Any] | None = None,
    error: type[Exception] = NonFiniteScoreError,
) -> None:
    """Raise ``error`` with one line naming the job and step if ``score`` (or a per-example score) is NaN or inf.

    The last guard before a client: no report of a non-finite score is ever built, so none reaches the core or the
    service. What a non-finite evaluation does to the run (recorded, warned about, not decided on; a few in a row end
    it gracefully) is decided before this, by :class:`~evalstop_callbacks.nonfinite.NonFinitePolicy`.

    Args:
        job_id: The job's id (None: not registered yet).
        step: The evaluation's step.
        score: The eval score.
        scores: Per-example scores, or None.
        error: The exception class to raise.
    """
    what = non_finite(score, scores)
    if what is not None:
        job = "(not registered yet)" if job_id is None else repr(job_id)
        raise error(
            f"EvalStop job {job}: non-finite {what} at step {step}; a NaN or inf score is never sent to the "
            "scheduler (refused)"
        )


@runtime_checkable
class BoundaryClient(Protocol):
    """What a trainer-side client must do.

    ``register`` is called once per job before its first report, ``report`` at every evaluation and ``finish`` when
    training ends. Implementations never send anything but the fields of :class:`Report`.
    """

    def register(
        self,
        job_type: str,
        detector: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        gpus: int | None = None,
    ) -> str:
        """Register a job and return its id (``job_id`` if given, else a new one)."""

    def report(self, report: Report) -> Decision:
        """Send one evaluation and return the scheduler's decision."""

    def finish(self, job_id: str, reason: str = "completed") -> None:
        """Tell the scheduler the job ended (completed, stopped, failed)."""


class CadenceClient(BoundaryClient, Protocol):
    """A :class:`BoundaryClient` whose ``register`` also takes the job's cadence, so that the scheduler's decisions
    can carry ``next_eval_step`` hints (:class:`EmbeddedClient`, ``PlatformClient``)."""

    def register(
        self,
        job_type: str,
        detector: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        gpus: int | None = None,
        cadence: str | Mapping[str, Any] | None = None,
    ) -> str:
        """Register a job with a cadence spec (None: fixed) and return its id."""


def register_takes(client: BoundaryClient, name: str) -> bool:
    """Whether ``client.register`` takes the keyword ``name`` (read from its signature: a Protocol check at run time
    sees only that the method exists)."""
    try:
        params = inspect.signature(client.register).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin or C callable): assume not
        return False
    param = params.get(name)
    if param is not None:
        return param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def takes_cadence(client: BoundaryClient) -> TypeGuard[CadenceClient]:
    """Whether ``client.register`` takes a ``cadence`` keyword."""
    return register_takes(client, "cadence")


class EmbeddedClient:
    """The scheduler core, in-process: no server, no network, same rule as the service.

    Its state (one :class:`JobMonitor` per job) is a plain dict, so the trainer callback can save it with the
    checkpoint and a resumed run continues with the same declines and best step.

    Args:
        warn_without_plan: Log a warning once for a job whose reports carry no ``planned_steps`` when its detector
            would use them (it then decides per look). Off for a caller that says so in its own terms (``evalstop
            watch`` without ``--planned-steps``).
    """

    def __init__(self, warn_without_plan: bool = True) -> None:
        self._jobs: dict[str, JobMonitor] = {}
        self._finished: dict[str, str] = {}
        self._warn_without_plan = warn_without_plan
        self._told_no_plan: set[str] = set()  # jobs already warned that their reports carry no planned_steps

    def register(
        self,
        job_type: str,
        detector: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        gpus: int | None = None,
        cadence: str | Mapping[str, Any] | None = None,
    ) -> str:
        """Register a job and return its id.

        Args:
            job_type: One of the core's job types.
            detector: Detector spec; None: the project's default, ``platform_sim.core.default_spec()`` (as the
                service registers a job given none).
            job_id: The job's id; made up if not given. Registering an id again keeps its state (a resume).
            gpus: Accepted for the :class:`BoundaryClient` signature; the embedded core does not count GPUs.
            cadence: A spec for :func:`~platform_sim.core.cadence.cadence_from_spec` (None: fixed); with one, the
                core's decisions carry ``next_eval_step`` hints.

        Raises:
            ValueError: Bad job type, detector or cadence, or ``job_id`` is registered with another type, detector
                or cadence.
        """
        check_job_type(job_type)
        detector = default_spec() if detector is None else detector
        policy = cadence_from_spec(cadence)
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
        if job_id in self._jobs:
            # Re-registering after a resume keeps the loaded state; a different type or detector is a user error.
            existing = self._jobs[job_id]
            if existing.job_type != job_type or existing.detector.spec() != detector_from_spec(detector).spec():
                raise ValueError(f"job {job_id!r} is already registered with another type or detector")
            if existing.cadence != policy:  # as the service answers 409: a job's cadence is set once
                have = existing.cadence.spec() if existing.cadence is not None else "fixed"
                raise ValueError(f"job {job_id!r} is already registered with cadence {have}")
            return job_id
        self._jobs[job_id] = JobMonitor(
            job_id=job_id, job_type=job_type, detector=detector_from_spec(detector), cadence=policy
        )
        return job_id

    def report(self, report: Report) -> Decision:
        try:
            monitor = self._jobs[report.job_id]
        except KeyError:
            raise KeyError(f"job {report.job_id!r} is not registered; call register() first") from None
        decision = monitor.observe_report(report)
        if (
            self._warn_without_plan
            and report.planned_steps is None
            and report.job_id not in self._told_no_plan
            and monitor.detector.plan_matters
        ):
            # Said once per job, as `evalstop watch` says it without --planned-steps: the reason of a decision
            # names it too, but only once a test has run.
            self._told_no_plan.add(report.job_id)
            logger.warning(
                "evalstop: job %r reports no planned_steps: its detector then tests every evaluation on its own (per "
                "look), so a run evaluated more often is stopped more often; declare the run's planned steps (the "
                "trainer's max_steps: Report.planned_steps, or PlatformClient.register(planned_steps=N)) to bound "
                "its false stops per run",
                report.job_id,
            )
        return decision

    def finish(self, job_id: str, reason: str = "completed") -> None:
        if job_id not in self._jobs:
            raise KeyError(f"job {job_id!r} is not registered")
        self._finished[job_id] = reason

    def monitor(self, job_id: str) -> JobMonitor:
        """The core's state of one job (read it, do not mutate it)."""
        return self._jobs[job_id]

    def replace_detector(self, job_id: str, detector: Mapping[str, Any]) -> None:
        """Give a registered job that has no report yet another detector (a platform client's local core adopting
        the spec the service registered).

        Raises:
            ValueError: The job already has reports (its detector holds their evidence).
        """
        monitor = self._jobs[job_id]
        if monitor.steps:
            raise ValueError(f"job {job_id!r} already has reports; its detector cannot change")
        monitor.detector = detector_from_spec(detector)

    def state_dict(self) -> dict[str, Any]:
        return {
            "jobs": {job_id: m.state_dict() for job_id, m in self._jobs.items()},
            "finished": dict(self._finished),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._jobs = {job_id: JobMonitor.from_state_dict(s) for job_id, s in state["jobs"].items()}
        self._finished = dict(state.get("finished", {}))
