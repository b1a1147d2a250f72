"""What a simulation returns: one :class:`JobOutcome` per job and the run's :class:`SimResult` (plain data).

The engine (:mod:`.engine`) fills them; the metrics (:mod:`.metrics`), the studies and the CLI read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class JobOutcome:
    """What happened to one job (plain data; the metrics are computed from these).

    Args:
        job_id: The job.
        job_type: Its type.
        hacking: Ground-truth label.
        gpus: GPU demand.
        submit_time: Arrival (hours).
        start_time: First start (hours).
        end_time: Completion or stop (hours).
        stopped: Whether a stop policy ended it early.
        stop_eval: 1-based eval index at which it was stopped (None if it completed).
        deliver_eval: 1-based eval index of the delivered checkpoint.
        peak_eval: 1-based eval index of its true peak (earliest on ties).
        peak_value: True score at the peak eval.
        delivered_value: True score of the delivered checkpoint.
        gpu_hours: GPU-hours it held (preemption overheads included).
        wasted_gpu_hours: GPU-hours of progress after its true peak eval.
        preemptions: How often it was preempted.
        eval_gpu_hours: GPU-hours spent evaluating (regular and extra evals, ``eval_cost`` of an interval each).
        extra_evals: Evals the cadence hint added to the regular ones.
    """

    job_id: str
    job_type: str
    hacking: bool
    gpus: int
    submit_time: float
    start_time: float
    end_time: float
    stopped: bool
    stop_eval: int | None
    deliver_eval: int
    peak_eval: int
    peak_value: float
    delivered_value: float
    gpu_hours: float
    wasted_gpu_hours: float
    preemptions: int
    eval_gpu_hours: float = 0.0
    extra_evals: int = 0

    @property
    def jct(self) -> float:
        return self.end_time - self.submit_time


@dataclass
class SimResult:
    """A finished run.

    Args:
        outcomes: One per job, in workload order.
        gpus: Cluster size.
        n_evals: Evals per full run.
        makespan_h: Time from the first arrival to the last end.
        busy_gpu_hours: GPU-hours held by jobs.
        events: Events processed (evals and arrivals).
        wall_s: Wall-clock seconds the simulation took.
        scheduler: ``base+stop`` name.
    """

    outcomes: list[JobOutcome]
    gpus: int
    n_evals: int
    makespan_h: float
    busy_gpu_hours: float
    events: int
    wall_s: float
    scheduler: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return d
