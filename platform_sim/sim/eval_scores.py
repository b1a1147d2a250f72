"""Per-example eval scores for simulated jobs, so that paired detectors can be simulated.

A real eval scores a checkpoint on the same held-out examples every time and reports their mean. Two things matter to
a detector and are modelled here:

- *Spread and pairing*: examples differ in difficulty (a persistent per-example offset ``a_j``, the same at every
  checkpoint of a job), and each checkpoint's score on an example also has its own sampling noise ``b_tj``
  (generation is stochastic). The correlation between two checkpoints' scores on the same example is
  ``rho = var(a) / (var(a) + var(b))``. The difficulty is fixed, so it shifts every eval's mean by the same amount
  and adds no checkpoint-to-checkpoint noise; only ``b`` does, with std ``sigma * sqrt(n)`` so that the mean's noise
  has std ``sigma``. A paired test sees exactly that noise in the per-example differences; the plain standard error
  of one eval (spread of its scores over sqrt(n)) overstates it by ``1 / sqrt(1 - rho)``, as it does on real evals.
- *Consistency with the plain simulator*: the mean of the per-example scores is *exactly* the observation the
  simulator draws without them (true curve plus Gaussian noise of std ``sigma``): the deviations are centered per
  eval and the simulator's own noise draw is added back, which for Gaussian noise has exactly the distribution of
  uncentered noise (a Gaussian sample's mean is independent of its deviations). So turning per-example scores on
  changes nothing for detectors that use only the mean.

Per-example scores come from their own random stream (seeded by the run's seed and the job's id), so generating them
never shifts the draws of the rest of the simulation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .observe import ObservationModel, register_observation_model
from .workload import JobSpec, Workload

#: Held-out examples per eval: as in the shipped real traces (24 held-out prompts x 2 samples).
DEFAULT_EXAMPLES = 48

#: Correlation between two checkpoints' scores on the same example. Measured on the shipped real traces: the median
#: correlation of consecutive checkpoints' per-example gold scores is 0.69 to 0.96 per trace (median 0.88), so the
#: paired standard error of a difference is 2 to 5 times smaller than the unpaired one; 0.85 was taken from the
#: first traces recorded.
DEFAULT_RHO = 0.85

# Mixed into the seed so this stream never coincides with a stream the simulator uses for something else.
_STREAM_TAG = 0x5E_E7A1 % 1000


@dataclass(frozen=True, slots=True)
class PerExampleConfig:
    """How per-example scores are generated.

    Args:
        examples: Held-out examples per eval, an integer >= 2.
        rho: Correlation between two checkpoints' scores on the same example, in [0, 1).
    """

    examples: int = DEFAULT_EXAMPLES
    rho: float = DEFAULT_RHO

    def __post_init__(self) -> None:
        if isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 2:
            raise ValueError(f"examples must be an integer >= 2, got {self.examples!r}")
        if not isinstance(self.rho, (int, float)) or not 0.0 <= self.rho < 1.0:
            raise ValueError(f"rho must be in [0, 1), got {self.rho!r}")


@register_observation_model("per-example")
class PerExampleObservation(ObservationModel):
    """Gaussian observation noise on the mean, plus per-example scores whose mean is that observation.

    Each job's per-example noise is drawn in one block, on first use, from the job's private generator
    (:meth:`ObservationModel.job_rng`), so results do not depend on the order in which jobs are evaluated and never
    shift the draws of the plain simulation.

    Args:
        workload: The run's workload (truth and pre-drawn noise of the means).
        examples: Held-out examples per eval, an integer >= 2.
        rho: Correlation between two checkpoints' scores on the same example, in [0, 1).
    """

    per_example: bool = True

    def __init__(self, workload: Workload, examples: int = DEFAULT_EXAMPLES, rho: float = DEFAULT_RHO) -> None:
        super().__init__(workload)
        self.config = PerExampleConfig(examples, rho)
        # Per-checkpoint noise so that the mean's noise has std sigma; the difficulty's std follows from rho.
        self._noise_sd = float(workload.sigma) * math.sqrt(self.config.examples)
        self._difficulty_sd = self._noise_sd * math.sqrt(self.config.rho / (1.0 - self.config.rho))
        self._blocks: dict[int, np.ndarray] = {}
        # Each regular eval's per-example scores, per job: one read-only (n_evals, examples) array made in one
        # vectorized pass per job, whose rows the engine reads as they are (:meth:`observe_row`), dropped when the job
        # ends (:meth:`forget`).
        self._rows: dict[int, np.ndarray] = {}
        # Whether observe_eval is this class's (a subclass that overrides it is honoured by observe_row).
        self._own_eval = type(self).observe_eval is PerExampleObservation.observe_eval
        self._difficulty: dict[int, tuple[np.ndarray, float]] = {}  # centred difficulty and noise std, per job
        self._extra_rngs_examples: dict[int, np.random.Generator] = {}

    def _block(self, job: JobSpec) -> np.ndarray:
        """``(n_evals, examples)`` zero-mean deviations of every eval of ``job`` from its observed mean."""
        block = self._blocks.get(job.index)
        if block is None:
            rng = self.job_rng(job, _STREAM_TAG)
            n = self.config.examples
            noise_sd, difficulty_sd = self._noise_sd, self._difficulty_sd
            if self.workload.job_sigma is not None:  # per-job noise (real-calibrated curves)
                noise_sd = float(self.workload.job_sigma[job.index]) * math.sqrt(n)
                difficulty_sd = noise_sd * math.sqrt(self.config.rho / (1.0 - self.config.rho))
            difficulty = rng.normal(0.0, difficulty_sd, n)
            noise = rng.normal(0.0, noise_sd, (self.workload.n_evals, n))
            # Means as numpy's mean computes them (the sum over the count), without its per-call overhead.
            centred = difficulty - difficulty.sum() / n
            block = centred + (noise - noise.sum(axis=1, keepdims=True) / n)
            self._blocks[job.index] = block
            self._difficulty[job.index] = (centred, noise_sd)
        return block

    def _example_rows(self, job: JobSpec) -> np.ndarray:
        """Every regular eval's per-example scores of ``job``, read-only: its observed mean plus the eval's deviations
        (:meth:`_block`). One broadcast add over the job's block: elementwise the same float additions as adding the
        mean to one row at a time, so the same scores."""
        rows = self._rows.get(job.index)
        if rows is None:
            means = np.asarray(self._observed[job.index], dtype=float)
            rows = self._rows[job.index] = means[:, None] + self._block(job)
            rows.flags.writeable = False  # a detector keeps its rows as they are
        return rows

    def observe_eval(self, job: JobSpec, k: int, progress: float) -> tuple[float, tuple[float, ...] | None]:
        score, _ = super().observe_eval(job, k, progress)
        return score, tuple(self._example_rows(job)[k - 1].tolist())

    def observe_row(self, job: JobSpec, k: int, progress: float) -> tuple[float, Sequence[float] | None]:
        """:meth:`observe_eval` with the scores as a read-only view of the job's rows (the engine's hot path: the same
        values, no Python float per score), unless a subclass overrides :meth:`observe_eval` (then its answer)."""
        if not self._own_eval:
            return self.observe_eval(job, k, progress)
        score, _ = ObservationModel.observe_eval(self, job, k, progress)
        return score, self._example_rows(job)[k - 1]  # type: ignore[return-value]

    def forget(self, job: JobSpec) -> None:
        """``job`` ended: drop its per-example draws (memory grows with the jobs alive, not with every job of the
        run). Drawn again from the job's own generator, they would be the same."""
        self._rows.pop(job.index, None)
        self._blocks.pop(job.index, None)
        self._difficulty.pop(job.index, None)
        self._extra_rngs_examples.pop(job.index, None)

    def observe_at(self, job: JobSpec, progress: float, step: int) -> tuple[float, tuple[float, ...] | None]:
        """An extra eval (a cadence hint) with per-example scores: the job's own example difficulties, fresh
        sampling noise from a private stream (the regular evals' draws are unchanged), centred on the mean."""
        score, _ = super().observe_at(job, progress, step)
        self._block(job)  # draws the job's difficulties if no regular eval has yet
        difficulty, noise_sd = self._difficulty[job.index]
        rng = self._extra_rngs_examples.get(job.index)
        if rng is None:
            rng = self._extra_rngs_examples[job.index] = self.job_rng(job, _STREAM_TAG + 1)
        noise = rng.normal(0.0, noise_sd, difficulty.size)
        return score, tuple((score + difficulty + (noise - noise.mean())).tolist())


def observation_for(detector: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """The observation-model spec a run needs for ``detector``: per-example scores when the detector reads them
    (its class sets ``uses_example_scores``), else None (plain Gaussian observations, the fast path). ``detector``
    None is the paper's rule, as the simulator's stop policy reads it."""
    from platform_sim.core.detectors import detector_from_spec, paper_spec

    if detector_from_spec(paper_spec() if detector is None else detector).uses_example_scores:
        return {"name": "per-example", "params": {}}
    return None


@register_observation_model("recorded-examples")
class RecordedExamplesObservation(PerExampleObservation):
    """Per-example scores for a replay workload: the recorded ones for trace jobs, generated ones for the others.

    A trace job is recognised by its noise-free curve on the eval grid, which a replay sets to the trace's recorded
    (scaled) means; its per-example scores are the recorded ones on the same scale. An extra eval off the grid (a
    cadence hint) of a trace job whose entry carries its whole record reads the recorded eval nearest in progress:
    its mean and its per-example scores, as that run produced them.

    Args:
        workload: A replay workload (:func:`~platform_sim.studies.replay.build_replay_workload`).
        traces: ``[(scaled means on the grid, scaled per-example scores per grid eval[, progress of every recorded
            eval, its scaled mean, its scaled per-example scores]), ...]`` for every trace.
        examples, rho: Generation of the other jobs' per-example scores.
    """

    def __init__(
        self,
        workload: Workload,
        traces: Sequence[Sequence[Any]] = (),
        examples: int = DEFAULT_EXAMPLES,
        rho: float = DEFAULT_RHO,
    ) -> None:
        super().__init__(workload, examples, rho)
        self._recorded: dict[int, Sequence[Sequence[float]]] = {}
        self._full: dict[int, tuple[np.ndarray, Sequence[float], Sequence[Sequence[float]]]] = {}
        for job in workload.jobs:
            row = workload.true_evals[job.index]
            for entry in traces:
                means, per_example = entry[0], entry[1]
                if len(means) == len(row) and np.allclose(row, means, rtol=0.0, atol=1e-12):
                    self._recorded[job.index] = per_example
                    if len(entry) >= 5:
                        self._full[job.index] = (np.asarray(entry[2], dtype=float), entry[3], entry[4])
                    break

    def observe_eval(self, job: JobSpec, k: int, progress: float) -> tuple[float, tuple[float, ...] | None]:
        recorded = self._recorded.get(job.index)
        if recorded is None:
            return super().observe_eval(job, k, progress)
        score, _ = ObservationModel.observe_eval(self, job, k, progress)
        return score, tuple(recorded[k - 1]) if recorded[k - 1] else None

    def observe_at(self, job: JobSpec, progress: float, step: int) -> tuple[float, tuple[float, ...] | None]:
        full = self._full.get(job.index)
        if full is None:
            if job.index in self._recorded:  # a trace job without its whole record: the recorded curve's mean
                return ObservationModel.observe_at(self, job, progress, step)
            return super().observe_at(job, progress, step)
        xs, means, per = full
        j = int(np.searchsorted(xs, progress))  # xs[j-1] < progress <= xs[j]
        if j >= len(xs) or (j > 0 and progress - xs[j - 1] <= xs[j] - progress):
            j -= 1
        return float(means[j]), tuple(per[j]) if per[j] else None
