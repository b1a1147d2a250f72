"""Read-only job views: what a scheduling or stop policy may see of a job (docs/design.md section 3).

A :class:`JobView` carries the observable fields only: type, GPU demand, submit time, planned steps, progress, the
user's duration estimate, the observed eval history and the training-loss history (for the loss-based baselines). It
holds no reference to the simulator's job record, so the hacking label, the true curve and the true duration are not
reachable from a policy (``tests/test_core_boundary_views.py`` walks the object graph to prove it).

The owner of the job (the simulator, the service) updates a view through :class:`ViewWriter` (the simulator's engine,
which owns its views, writes the private slots directly on its hot path); policies get only the view, whose public
surface is read-only properties without setters (``view.progress = 1`` raises ``AttributeError``) on ``__slots__``
(no new attributes). Histories are exposed as tuples so that a policy cannot edit them.
"""

from __future__ import annotations

from collections.abc import Sequence

from platform_sim.core.boundary import check_job_type


class JobView:
    """Observable state of one job.

    Args:
        job_id: The job's identifier.
        job_type: One of :data:`~platform_sim.core.boundary.JOB_TYPES`.
        gpus: Number of GPUs the job needs (gang allocation: all or none).
        submit_time: Submission time in hours.
        planned_steps: Training steps the user planned.
        est_duration_h: The user's estimate of the run time in hours on its GPUs (may be wrong; -Est policies use it).
    """

    __slots__ = (
        "_job_id",
        "_job_type",
        "_gpus",
        "_submit_time",
        "_planned_steps",
        "_est_duration_h",
        "_progress",
        "_state",
        "_eval_steps",
        "_eval_scores",
        "_last_example_scores",
        "_losses",
        "_preemptions",
    )

    def __init__(
        self, job_id: str, job_type: str, gpus: int, submit_time: float, planned_steps: int, est_duration_h: float
    ) -> None:
        check_job_type(job_type)
        if gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {gpus}")
        if est_duration_h <= 0:
            raise ValueError(f"est_duration_h must be > 0, got {est_duration_h}")
        self._job_id = job_id
        self._job_type = job_type
        self._gpus = int(gpus)
        self._submit_time = float(submit_time)
        self._planned_steps = int(planned_steps)
        self._est_duration_h = float(est_duration_h)
        self._progress = 0.0
        self._state = "waiting"
        self._eval_steps: list[int] = []
        self._eval_scores: list[float] = []
        # A tuple, or the per-example observation model's read-only float64 array (the engine hands it on as it is).
        self._last_example_scores: Sequence[float] | None = None
        self._losses: list[float] = []
        self._preemptions = 0

    @property
    def job_id(self) -> str:
        """The job's identifier."""
        return self._job_id

    @property
    def job_type(self) -> str:
        """rlhf, dpo, lora, sft or other."""
        return self._job_type

    @property
    def gpus(self) -> int:
        """GPUs the job needs."""
        return self._gpus

    @property
    def submit_time(self) -> float:
        """Submission time in hours."""
        return self._submit_time

    @property
    def planned_steps(self) -> int:
        """Planned training steps."""
        return self._planned_steps

    @property
    def est_duration_h(self) -> float:
        """User's run-time estimate in hours."""
        return self._est_duration_h

    @property
    def progress(self) -> float:
        """Fraction of planned steps done, as of the last update."""
        return self._progress

    @property
    def state(self) -> str:
        """waiting, running, preempted, stopped or completed."""
        return self._state

    @property
    def preemptions(self) -> int:
        """How often the job was preempted."""
        return self._preemptions

    @property
    def eval_steps(self) -> tuple[int, ...]:
        return tuple(self._eval_steps)

    @property
    def eval_scores(self) -> tuple[float, ...]:
        return tuple(self._eval_scores)

    @property
    def last_example_scores(self) -> Sequence[float] | None:
        """Per-example scores of the latest eval, when the job reports them: a tuple, or a read-only float64 array."""
        return self._last_example_scores

    @property
    def loss_history(self) -> tuple[float, ...]:
        """Training loss observed at each eval (for LossAware and LossPlateau only)."""
        return tuple(self._losses)

    @property
    def n_evals(self) -> int:
        return len(self._eval_scores)

    @property
    def last_step(self) -> int | None:
        return self._eval_steps[-1] if self._eval_steps else None

    @property
    def last_score(self) -> float | None:
        return self._eval_scores[-1] if self._eval_scores else None

    def recent_losses(self, n: int) -> tuple[float, ...]:
        """The last ``n`` observed losses (fewer if the job has fewer), oldest first."""
        return tuple(self._losses[-n:]) if n > 0 else ()

    @property
    def est_remaining_h(self) -> float:
        """The user's estimate scaled by the remaining fraction: what SRTF-Est ranks by."""
        return self._est_duration_h * (1.0 - self._progress)

    def __repr__(self) -> str:
        return (
            f"JobView({self._job_id!r}, {self._job_type}, gpus={self._gpus}, progress={self._progress:.3f}, "
            f"state={self._state}, evals={len(self._eval_scores)})"
        )


class ViewWriter:
    """The owner's handle to update views; policies never get one. Stateless, so one instance serves all views."""

    __slots__ = ()

    @staticmethod
    def set_progress(view: JobView, progress: float) -> None:
        view._progress = progress

    @staticmethod
    def set_state(view: JobView, state: str) -> None:
        view._state = state

    @staticmethod
    def add_preemption(view: JobView) -> None:
        view._preemptions += 1

    @staticmethod
    def add_eval(
        view: JobView, step: int, score: float, loss: float | None = None, example_scores: Sequence[float] | None = None
    ) -> None:
        view._eval_steps.append(step)
        view._eval_scores.append(score)
        if loss is not None:
            view._losses.append(loss)
        view._last_example_scores = tuple(example_scores) if example_scores is not None else None
