"""How a job's evaluation is observed: the one place where an observed eval score is made from the truth.

:meth:`ObservationModel.observe_eval` returns ``(score, per_example_scores | None)`` for the ``k``-th eval of a job.
The default adds Gaussian noise of std ``sigma`` (docs/design.md section 5) from the workload's pre-drawn standard-normal
matrix, so that every policy run on a seed sees the same observations and a sigma sweep uses common random numbers.
Extensions (per-example scores for paired-test detectors, recorded traces) subclass it and override
:meth:`~ObservationModel.observe_eval`; per-example generation is off by default because it costs time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .workload import JobSpec, Workload


class ObservationModel:
    """Gaussian observation noise on the true eval score.

    Args:
        workload: The run's workload (truth and pre-drawn noise).
    """

    #: Whether :meth:`observe_eval` returns per-example scores (detectors that need them check this).
    per_example: bool = False

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        # One vectorized pass instead of two numpy scalar reads per eval: the engine's hot path.
        # Per-job noise std only when the workload has one (real-calibrated curves); else the scalar, as always.
        scale = workload.sigma if workload.job_sigma is None else workload.noise_std()[:, None]
        self._observed: list[list[float]] = (workload.true_evals + scale * workload.noise).tolist()
        self._extra_rngs: dict[int, np.random.Generator] | None = None  # per job, for extra evals (made on first use)
        self._std: list[float] = []

    def observe_eval(self, job: JobSpec, k: int, progress: float) -> tuple[float, tuple[float, ...] | None]:
        """The observed result of the ``k``-th eval (1-based) of ``job``, taken at ``progress``.

        Args:
            job: The job (ground truth available to the model, never to policies).
            k: 1-based eval index.
            progress: Progress of the evaluated checkpoint (``k / n_evals``).

        Returns:
            ``(score, per_example_scores)``; the second is None unless the model makes per-example scores.
        """
        return self._observed[job.index][k - 1], None

    def observe_row(self, job: JobSpec, k: int, progress: float) -> tuple[float, Sequence[float] | None]:
        """:meth:`observe_eval` as the engine reads it: the per-example scores may come as a read-only float64 array
        instead of a tuple (the same values; the monitor checks such a row in two reductions and the default detector
        keeps it without a Python float per score). This one is :meth:`observe_eval`."""
        return self.observe_eval(job, k, progress)

    def observe_at(self, job: JobSpec, progress: float, step: int) -> tuple[float, tuple[float, ...] | None]:
        """An eval off the regular grid (an extra eval asked for by a cadence hint), taken at ``progress``.

        The true curve's value there plus fresh Gaussian noise of the job's noise std, drawn from a generator private
        to the job (:meth:`job_rng`, stream 1), so the regular evals' noise is unchanged and the result does not
        depend on other jobs (no noise for a job whose regular evals have none added, e.g. a replayed trace). No per-example scores: models that make them fall back to this mean-only eval unless
        they override it.

        Args:
            job: The job.
            progress: Progress of the evaluated checkpoint, strictly between two regular evals.
            step: Its training step.
        """
        del step  # the Gaussian model needs only the progress; trace-backed models may read the step
        if self._extra_rngs is None:
            self._extra_rngs = {}
            # A job whose regular evals get no added noise (a replayed trace: its curve carries its recorded noise,
            # and between two recorded evals it is their linear interpolation) gets none on extra evals either.
            noisy = np.any(self.workload.noise != 0.0, axis=1)
            self._std = np.where(noisy, self.workload.noise_std(), 0.0).tolist()
        rng = self._extra_rngs.get(job.index)
        if rng is None:
            rng = self._extra_rngs[job.index] = self.job_rng(job, stream=1)
        return float(job.curve.value(progress)) + self._std[job.index] * float(rng.standard_normal()), None

    def forget(self, job: JobSpec) -> None:
        """``job`` ended (the engine calls this once it is stopped or complete): a model may drop what it keeps for
        it. This one keeps nothing that grows with the jobs."""

    def job_rng(self, job: JobSpec, stream: int = 0) -> np.random.Generator:
        """A generator private to ``job`` (and ``stream``), for extensions that draw more randomness per job,
        so that results do not depend on the order in which jobs are evaluated."""
        key = (self.workload.seed, 7919, stream, job.index)
        if 0 <= key[0] < 1 << 32 and 0 <= stream < 1 << 32 and 0 <= job.index < 1 << 32:
            # The same words the seed sequence makes of the list, handed over as an array: the same generator,
            # without the per-call conversion of each int (a third of the cost of making one, once per job).
            return np.random.default_rng(np.array(key, dtype=np.uint32))
        return np.random.default_rng(list(key))


OBSERVATION_MODELS: dict[str, type[ObservationModel]] = {"gaussian": ObservationModel}
"""Observation models by name; extensions add theirs with :func:`register_observation_model`."""


def register_observation_model(name: str):  # noqa: ANN201 - decorator
    """Class decorator: make an :class:`ObservationModel` subclass selectable as ``{"name": name, "params": ...}``."""

    def deco(cls: type[ObservationModel]) -> type[ObservationModel]:
        OBSERVATION_MODELS[name] = cls
        return cls

    return deco


def make_observation_model(workload: Workload, spec: Mapping[str, Any] | str | None = None) -> ObservationModel:
    """Build the observation model named by ``spec`` (None: Gaussian noise) for ``workload``.

    Args:
        workload: The run's workload.
        spec: A name, ``{"name": ..., "params": {...}}`` (params go to the model's constructor after the workload),
            or None.
    """
    if spec is None:
        return ObservationModel(workload)
    name, params = (spec, {}) if isinstance(spec, str) else (spec.get("name"), dict(spec.get("params") or {}))
    try:
        cls = OBSERVATION_MODELS[name]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown observation model {name!r}; choose one of {', '.join(OBSERVATION_MODELS)}") from None
    return cls(workload, **params)
