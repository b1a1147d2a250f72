"""How a job's evaluation is observed: the one place where an observed eval score is made from the truth.

:meth:`ObservationModel.observe_eval` returns ``(score, per_example_scores | None)`` for the ``k``-th eval of a job.
The default adds Gaussian noise of std ``sigma`` (DESIGN.md section 5) from the workload's pre-drawn standard-normal
matrix, so that every policy run on a seed sees the same observations and a sigma sweep uses common random numbers.
Extensions (per-example scores for paired-test detectors, recorded traces) subclass it and override
:meth:`~ObservationModel.observe_eval`; per-example generation is off by default because it costs time.
"""

from __future__ import annotations

from typing import Any, Mapping

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

    def job_rng(self, job: JobSpec, stream: int = 0) -> np.random.Generator:
        """A generator private to ``job`` (and ``stream``), for extensions that draw more randomness per job,
        so that results do not depend on the order in which jobs are evaluated."""
        return np.random.default_rng([self.workload.seed, 7919, stream, job.index])


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
