"""Synthetic workloads: the jobs of one simulated run with their ground truth, deterministic for a seed.

Defaults follow docs/design.md section 5 and are explained in ``docs/simulator.md``. Everything random is drawn here, from
one ``numpy`` generator per seed, before the simulation starts, so a run does not depend on the order in which the
engine asks for things, and every policy run on the same seed sees exactly the same jobs, curves and eval noise
(paired comparisons).

The ground truth (:class:`JobSpec`: hacking label, true curve, true duration) stays in the simulator; policies only see
:class:`~platform_sim.sim.policies.views.JobView` objects built from the observable fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .curve_calibration import CurveCalibration
from .curves import (
    Curve,
    ExpLossCurve,
    GaoHackingCurve,
    PeakDeclineCurve,
    PlateauCurve,
    RiseCurve,
    SaturatingCurve,
    eval_grid,
)

MIXES: dict[str, dict[str, float]] = {
    "rlhf-heavy": {"rlhf": 0.8, "dpo": 0.1, "lora": 0.1},
    "balanced": {"rlhf": 0.34, "dpo": 0.33, "lora": 0.33},
    "lora-heavy": {"rlhf": 0.1, "dpo": 0.2, "lora": 0.7},
}
"""Job-type mixes (fractions of jobs)."""


@dataclass(frozen=True)
class TypeProfile:
    """Per-type resource profile.

    Args:
        gpu_choices: GPU demands a job of this type may have.
        gpu_probs: Their probabilities.
        duration_median_h: Median true run time in hours on its GPUs (log-normal).
        duration_sigma: Log-normal shape (std of the log).
        planned_steps: Planned training steps (a multiple of the eval count, so eval steps are exact).
    """

    gpu_choices: tuple[int, ...]
    gpu_probs: tuple[float, ...]
    duration_median_h: float
    duration_sigma: float
    planned_steps: int

    def mean_gpu_hours(self) -> float:
        mean_g = sum(g * p for g, p in zip(self.gpu_choices, self.gpu_probs))
        return mean_g * self.duration_median_h * math.exp(self.duration_sigma**2 / 2)


PROFILES: dict[str, TypeProfile] = {
    "rlhf": TypeProfile((4, 8, 16), (0.3, 0.5, 0.2), 6.0, 0.6, 2000),
    "dpo": TypeProfile((2, 4, 8), (0.3, 0.5, 0.2), 3.0, 0.5, 2000),
    "lora": TypeProfile((1, 2, 4), (0.5, 0.3, 0.2), 1.0, 0.6, 1000),
}


@dataclass(frozen=True)
class WorkloadConfig:
    """Parameters of a synthetic workload (defaults: the paper's main setting, our calibration).

    Args:
        n_jobs: Jobs in the run.
        gpus: GPUs in the cluster (used to set the arrival rate from ``load``).
        mix: Name of a job-type mix in :data:`MIXES`.
        hack_rate: Fraction of RLHF jobs that reward-hack, in [0, 1].
        sigma: Std of the Gaussian noise on each eval score (0-1 score scale), >= 0.
        n_evals: Evals per run, evenly spaced (20: every 5% of planned progress).
        load: Offered load: arrival rate x mean GPU-hours per job / GPUs (> 0).
        est_error: Std of the log of (user estimate / true duration).
        hack_gamma: Growth exponent of Gao's ``d`` in progress for hacking curves (see :class:`GaoHackingCurve`).
        healthy_tau: Range of the saturation constant of healthy RLHF curves (larger: closer to linear).
        healthy_gain: Range of the total rise of healthy RLHF curves.
        hack_peak: Range of the true peak's progress of hacking curves.
        real_curves: None (the default): synthetic RLHF curves as above. A :class:`CurveCalibration` fitted on
            recorded traces (:mod:`platform_sim.sim.curve_fit`): every RLHF curve's *shape* is drawn from it instead
            (hacking: :class:`PeakDeclineCurve` with a drawn peak position, decline rate and total decline;
            healthy: :class:`RiseCurve` with a drawn plateau share), on the same start and gain draws as the
            synthetic curves, and each RLHF job's eval noise is its drawn noise (a fraction of its gain) instead
            of ``sigma``, which then applies to DPO and LoRA jobs only. ``hack_gamma``, ``healthy_tau`` and
            ``hack_peak`` are unused; ``hack_rate`` still sets which RLHF jobs hack.
    """

    n_jobs: int = 200
    gpus: int = 64
    mix: str = "rlhf-heavy"
    hack_rate: float = 0.6
    sigma: float = 0.02
    n_evals: int = 20
    load: float = 0.8
    est_error: float = 0.3
    hack_gamma: float = 2.0
    healthy_tau: tuple[float, float] = (1.5, 3.0)
    healthy_gain: tuple[float, float] = (0.65, 0.8)
    hack_peak: tuple[float, float] = (0.55, 0.75)
    real_curves: CurveCalibration | None = None

    def __post_init__(self) -> None:
        if self.real_curves is not None and not isinstance(self.real_curves, CurveCalibration):
            raise ValueError(f"real_curves must be a CurveCalibration or None, got {type(self.real_curves).__name__}")
        if self.n_jobs < 1:
            raise ValueError(f"n_jobs must be >= 1, got {self.n_jobs}")
        if self.gpus < 16:
            raise ValueError(f"gpus must be >= 16 (the largest job's demand), got {self.gpus}")
        if self.mix not in MIXES:
            raise ValueError(f"unknown mix {self.mix!r}; choose one of {', '.join(MIXES)}")
        if not (0.0 <= self.hack_rate <= 1.0):
            raise ValueError(f"hack_rate must be in [0, 1], got {self.hack_rate}")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma}")
        if self.n_evals < 2:
            raise ValueError(f"n_evals must be >= 2, got {self.n_evals}")
        if not (self.load > 0 and math.isfinite(self.load)):
            raise ValueError(f"load must be > 0, got {self.load}")
        if self.est_error < 0:
            raise ValueError(f"est_error must be >= 0, got {self.est_error}")

    def arrival_rate(self) -> float:
        """Jobs per hour that offer ``load`` x the cluster's GPU-hours."""
        mix = MIXES[self.mix]
        mean_gh = sum(frac * PROFILES[t].mean_gpu_hours() for t, frac in mix.items())
        return self.load * self.gpus / mean_gh

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; ``real_curves`` appears only when set (synthetic configs keep their old form)."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "real_curves"}
        if self.real_curves is not None:
            out["real_curves"] = self.real_curves.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadConfig:
        args: dict[str, Any] = {
            k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "real_curves"
        }
        if data.get("real_curves") is not None:
            args["real_curves"] = CurveCalibration.from_dict(data["real_curves"])
        return cls(**args)


@dataclass(slots=True)
class JobSpec:
    """One job with its ground truth (simulator-private).

    Args:
        index: Position in the workload (0-based); also selects the job's row of eval noise.
        job_id: Identifier (``j00042``).
        job_type: ``rlhf``, ``dpo`` or ``lora``.
        gpus: GPU demand.
        submit_time: Arrival time in hours.
        duration_h: True run time in hours on its GPUs (hidden from policies).
        est_duration_h: The user's estimate (visible).
        planned_steps: Planned steps (visible).
        hacking: Whether the job reward-hacks (hidden).
        curve: True eval-score curve (hidden).
        loss_curve: True training-loss curve (its values at evals are visible to the loss-based policies).
    """

    index: int
    job_id: str
    job_type: str
    gpus: int
    submit_time: float
    duration_h: float
    est_duration_h: float
    planned_steps: int
    hacking: bool
    curve: Curve
    loss_curve: Curve


@dataclass
class Workload:
    """The jobs of a run plus precomputed truth on the eval grid.

    Args:
        jobs: Jobs sorted by submit time.
        n_evals: Evals per run.
        sigma: Eval noise std.
        true_evals: ``(n_jobs, n_evals)`` noise-free eval scores at the eval grid.
        losses: ``(n_jobs, n_evals)`` training losses at the eval grid.
        noise: ``(n_jobs, n_evals)`` standard-normal draws; the observed score is ``true + sigma * noise``.
        seed: The seed it was generated from (extensions derive per-job generators from it).
        config: The configuration (None for workloads built from traces).
        job_sigma: ``(n_jobs,)`` eval noise std of each job, or None (the default): ``sigma`` for every job. The
            observed score of job ``i`` is ``true + noise_std()[i] * noise``.
    """

    jobs: list[JobSpec]
    n_evals: int
    sigma: float
    true_evals: np.ndarray
    losses: np.ndarray
    noise: np.ndarray
    seed: int = 0
    config: WorkloadConfig | None = None
    job_sigma: np.ndarray | None = None
    peak_index: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.jobs)
        for name in ("true_evals", "losses", "noise"):
            arr = getattr(self, name)
            if arr.shape != (n, self.n_evals):
                raise ValueError(f"{name} has shape {arr.shape}, expected {(n, self.n_evals)}")
        if self.job_sigma is not None and np.shape(self.job_sigma) != (n,):
            raise ValueError(f"job_sigma has shape {np.shape(self.job_sigma)}, expected {(n,)}")
        # Peak eval index (0-based), the earliest on ties: the target of the Oracle and the reference of the metrics.
        self.peak_index = np.argmax(self.true_evals, axis=1) if n else np.zeros(0, dtype=int)

    def noise_std(self) -> np.ndarray:
        """``(n_jobs,)`` eval noise std of each job (``sigma`` for every job unless ``job_sigma`` is set)."""
        if self.job_sigma is not None:
            return np.asarray(self.job_sigma, dtype=float)
        return np.full(len(self.jobs), float(self.sigma))

    def eval_step(self, job: JobSpec, k: int) -> int:
        """Step of the ``k``-th eval (1-based) of ``job``."""
        return (k * job.planned_steps) // self.n_evals

    def peak_steps(self, hacking_only: bool = True) -> dict[str, int]:
        """Job id -> step of its true peak eval (what the Oracle is given)."""
        return {
            j.job_id: self.eval_step(j, int(self.peak_index[j.index]) + 1)
            for j in self.jobs
            if j.hacking or not hacking_only
        }


def generate_workload(config: WorkloadConfig, seed: int) -> Workload:
    """Draw the jobs of one run.

    Args:
        config: Workload parameters.
        seed: Integer >= 0; the same seed and config give the same workload on every machine.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng([int(seed), 20260])
    n, n_evals = config.n_jobs, config.n_evals
    mix = MIXES[config.mix]
    types = np.array(list(mix))
    type_idx = rng.choice(len(types), size=n, p=np.array(list(mix.values())) / sum(mix.values()))
    submit = np.cumsum(rng.exponential(1.0 / config.arrival_rate(), n))
    submit -= submit[0]  # the first job arrives at time 0
    u_hack = rng.random(n)
    est_noise = rng.normal(0.0, 1.0, n)
    dur_noise = rng.normal(0.0, 1.0, n)
    gpu_u = rng.random(n)
    # Curve parameters: drawn for every job in fixed blocks so one type's draws do not shift another's.
    c_s0 = rng.uniform(0.1, 0.2, n)
    c_a = rng.random(n)
    c_b = rng.random(n)
    c_c = rng.random(n)
    l_0 = rng.uniform(1.5, 3.0, n)
    l_ratio = rng.uniform(0.3, 0.6, n)
    l_tau = rng.uniform(0.05, 0.4, n)
    noise = rng.standard_normal((n, n_evals))

    grid = eval_grid(n_evals)
    # Everything below is vectorized per type (10^5 jobs in well under a second); the per-job Curve objects are built
    # from the same parameters and their ``batch`` functions are the ones that compute the matrices here.
    gpus = np.zeros(n, dtype=int)
    dur = np.zeros(n)
    planned = np.zeros(n, dtype=int)
    for t_i, t in enumerate(types):
        mask = type_idx == t_i
        prof = PROFILES[str(t)]
        cum = np.cumsum(prof.gpu_probs)
        pick = np.minimum(np.searchsorted(cum, gpu_u[mask] * cum[-1], side="right"), len(prof.gpu_choices) - 1)
        gpus[mask] = np.asarray(prof.gpu_choices)[pick]
        dur[mask] = prof.duration_median_h * np.exp(prof.duration_sigma * dur_noise[mask])
        planned[mask] = prof.planned_steps
    est = dur * np.exp(config.est_error * est_noise)
    type_names = types[type_idx]
    is_rlhf = type_names == "rlhf"
    hacking = is_rlhf & (u_hack < config.hack_rate)
    lora, dpo, healthy = type_names == "lora", type_names == "dpo", is_rlhf & ~hacking
    (tlo, thi), (glo, ghi), (plo, phi) = config.healthy_tau, config.healthy_gain, config.hack_peak
    # Per-job curve parameters (p1, p2, p3, p4) by kind; unused slots stay 0.
    p1 = np.where(lora | dpo, c_s0 + np.where(lora, 0.2, 0.1), c_s0)
    p2 = np.select(
        [lora, dpo, hacking], [0.15 + 0.2 * c_a, 0.3 + 0.2 * c_a, 0.55 + 0.15 * c_a], glo + (ghi - glo) * c_a
    )
    p3 = np.select(
        [lora, dpo, hacking], [0.1 + 0.2 * c_b, 0.2 + 0.3 * c_b, plo + (phi - plo) * c_b], tlo + (thi - tlo) * c_b
    )
    p4 = np.where(dpo, 0.6 + 0.3 * c_c, 0.0)
    true_evals = np.empty((n, n_evals))
    col = (slice(None), None)
    for mask, fn in (
        (lora | healthy, lambda m: SaturatingCurve.batch(p1[m][col], p2[m][col], p3[m][col], grid)),
        (dpo, lambda m: PlateauCurve.batch(p1[m][col], p2[m][col], p3[m][col], p4[m][col], grid)),
        (hacking, lambda m: GaoHackingCurve.batch(p1[m][col], p2[m][col], p3[m][col], config.hack_gamma, grid)),
    ):
        if mask.any():
            true_evals[mask] = fn(mask)
    l_inf = l_0 * l_ratio
    losses = ExpLossCurve.batch(l_0[col], l_inf[col], l_tau[col], grid)

    kinds = np.select([lora | healthy, dpo, hacking], [0, 1, 2], 0).tolist()
    job_sigma = None
    if config.real_curves is not None:
        # Drawn from their own stream after every synthetic draw, so the jobs, gains, losses and noise of a seed are
        # exactly the synthetic workload's: the two kinds of curves are compared on paired workloads.
        draws = config.real_curves.draw(np.random.default_rng([int(seed), 20260, 1]), n)
        p3 = np.where(hacking, draws.peak, np.where(healthy, draws.plateau_share, p3))
        p4 = np.where(hacking, draws.decline, p4)
        p5 = np.where(hacking, draws.drop, 0.0)
        for mask, fn in (
            (
                hacking,
                lambda m: PeakDeclineCurve.batch(p1[m][col], p2[m][col], p3[m][col], p4[m][col], p5[m][col], grid),
            ),
            (healthy, lambda m: RiseCurve.batch(p1[m][col], p2[m][col], p3[m][col], grid)),
        ):
            if mask.any():
                true_evals[mask] = fn(mask)
        job_sigma = np.full(n, float(config.sigma))
        job_sigma[hacking] = draws.hack_noise[hacking] * p2[hacking]
        job_sigma[healthy] = draws.healthy_noise[healthy] * p2[healthy]
        kinds = np.select([lora, healthy, dpo, hacking], [0, 3, 1, 4], 0).tolist()
    else:
        p5 = np.zeros(n)  # only the real curves' peak-decline kind reads it
    jobs = _job_specs(
        kinds,
        (p1, p2, p3, p4, p5),
        (l_0, l_inf, l_tau),
        (type_names, gpus, submit, dur, est, planned, hacking),
        config.hack_gamma,
    )
    return Workload(jobs, n_evals, config.sigma, true_evals, losses, noise, int(seed), config, job_sigma)


def _job_specs(
    kinds: list[int],
    curve_params: tuple[np.ndarray, ...],
    loss_params: tuple[np.ndarray, np.ndarray, np.ndarray],
    columns: tuple[np.ndarray, ...],
    hack_gamma: float,
) -> list[JobSpec]:
    """The per-job :class:`JobSpec` objects of :func:`generate_workload`'s vectorized draws.

    Args:
        kinds: Per job, its curve: 0 saturating, 1 plateau, 2 Gao hacking, 3 rise, 4 peak-decline (3 and 4 only with
            real curves).
        curve_params: ``(p1, p2, p3, p4, p5)``, the curves' parameters per job (``p5``: the real curves' only).
        loss_params: ``(l_0, l_inf, l_tau)`` of each job's loss curve.
        columns: ``(type names, gpus, submit times, durations, estimates, planned steps, hacking)`` per job.
        hack_gamma: The Gao hacking curves' exponent.
    """
    p1l, p2l, p3l, p4l, p5l = (a.tolist() for a in curve_params)
    l0l, linfl, ltaul = (a.tolist() for a in loss_params)
    names, gl, sl, dl, el, pl, hl = (c.tolist() for c in columns)
    n = len(kinds)
    width = max(len(str(n - 1)), 5)
    jobs: list[JobSpec] = []
    for i in range(n):
        kind = kinds[i]
        curve: Curve
        if kind == 0:
            curve = SaturatingCurve(p1l[i], p2l[i], p3l[i])
        elif kind == 1:
            curve = PlateauCurve(p1l[i], p2l[i], p3l[i], p4l[i])
        elif kind == 2:
            curve = GaoHackingCurve(p1l[i], p2l[i], p3l[i], hack_gamma)
        elif kind == 3:
            curve = RiseCurve(p1l[i], p2l[i], p3l[i])
        else:
            curve = PeakDeclineCurve(p1l[i], p2l[i], p3l[i], p4l[i], p5l[i])
        jobs.append(
            JobSpec(
                i,
                f"j{i:0{width}d}",
                names[i],
                gl[i],
                sl[i],
                dl[i],
                el[i],
                pl[i],
                hl[i],
                curve,
                ExpLossCurve(l0l[i], linfl[i], ltaul[i]),
            )
        )
    return jobs
