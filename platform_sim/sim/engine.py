"""The discrete-event cluster simulator: a plain heap of events, no fixed ticks.

A running job's progress is linear in time while it holds its GPUs, so the engine knows exactly when its next eval
happens and schedules only that (the last eval, at progress 1, is its completion). Arrivals come from the workload's
sorted submit times and are merged with the heap. Events of a job that was preempted or stopped are invalidated by a
per-job version number (lazy deletion) instead of being searched for in the heap.

Ranking is incremental: waiting jobs sit in one heap per GPU demand, keyed by the base policy's key (constant while a
job waits), so starting the best job that fits costs a look at a handful of heap tops. For policies that preempt on
arrival (SRTF-Est) running jobs sit in a lazy max-heap of upper bounds of their key (which only falls while they run):
the worst running job is found by popping, recomputing and re-pushing until the top is exact.

Mechanics (the base policy only ranks): gang allocation from a pooled GPU count, greedy start in key order with
backfill, preemption with a resume cost (the job holds its GPUs that long before it progresses again; it checkpoints
at preemption, so no progress is lost). On each eval of a job it covers, the stop policy may stop it: its GPUs are
freed at once, it delivers the verdict's checkpoint, and the freed GPUs go back to the base policy.

The engine never imports the runner, the metrics or the CLI; it returns plain per-job outcomes.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from platform_sim.core.policies import PREEMPTION_COST_H
from platform_sim.core.stop_policies import Scheduler
from platform_sim.core.views import JobView, ViewWriter

from .observe import ObservationModel
from .workload import Workload

logger = logging.getLogger(__name__)

_PENDING, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


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


def simulate(workload: Workload, scheduler: Scheduler, gpus: int = 64,
             preemption_cost_h: float = PREEMPTION_COST_H,
             observation: ObservationModel | None = None) -> SimResult:
    """Run ``workload`` on a cluster of ``gpus`` GPUs under ``scheduler`` (a base policy composed with a stop policy).

    Args:
        workload: Jobs and their truth (see :func:`~platform_sim.sim.workload.generate_workload`).
        scheduler: From :func:`~platform_sim.core.stop_policies.with_stop` or ``evalstop``. Its stop policy keeps
            per-job state: use a fresh one per run.
        gpus: Cluster size; every job's demand must fit.
        preemption_cost_h: Resume cost after a preemption, in hours (default 2 minutes).
        observation: How evals are observed (default: Gaussian noise of the workload's sigma).
    """
    t_wall = time.perf_counter()
    jobs = workload.jobs
    n = len(jobs)
    if any(j.gpus > gpus for j in jobs):
        raise ValueError(f"a job needs more GPUs than the cluster's {gpus}")
    if preemption_cost_h < 0:
        raise ValueError("preemption_cost_h must be >= 0")
    base, stop = scheduler.base, scheduler.stop
    obs = observation or ObservationModel(workload)
    n_evals = workload.n_evals
    inv_n = 1.0 / n_evals
    key = base.key
    preempt_on_arrival = base.preempt_on_arrival
    preempt_on_eval = base.preempt_on_eval
    should_yield = base.should_yield
    w = ViewWriter
    heappush, heappop = heapq.heappush, heapq.heappop  # locals: the event loop runs ~10^6 times
    observe_eval, on_eval = obs.observe_eval, stop.on_eval

    views = [JobView(j.job_id, j.job_type, j.gpus, j.submit_time, j.planned_steps, j.est_duration_h) for j in jobs]
    # Jobs whose evals a policy reads (the stop policy's types; every job for LossAware). The others need no eval
    # events at all: their next event is their completion, and their progress is computed when a policy asks.
    consult_stop = [stop.covers(v) for v in views]
    record = [preempt_on_eval or c for c in consult_stop]
    losses = workload.losses.tolist()
    peak_idx = workload.peak_index.tolist()
    true_evals = workload.true_evals
    dur = [j.duration_h for j in jobs]
    g_of = [j.gpus for j in jobs]
    planned = [j.planned_steps for j in jobs]

    state = [_PENDING] * n
    version = [0] * n
    p0 = [0.0] * n          # progress at the start of the current segment
    seg_start = [0.0] * n   # time the current segment starts progressing (after any resume overhead)
    alloc_t = [0.0] * n     # time the job got its GPUs
    next_k = [1 if r else n_evals for r in record]  # next eval index (1-based); n_evals: straight to completion
    gpu_h = [0.0] * n
    first_start = [math.nan] * n
    preempts = [0] * n
    outcomes: list[Any] = [None] * n

    free = gpus
    demands = sorted({g for g in g_of})
    waiting: dict[int, list[tuple[float, int, int]]] = {g: [] for g in demands}
    running_heap: list[tuple[float, int, int, int]] = []  # (-key upper bound, seq, job, version)
    events: list[tuple[float, int, int, int]] = []        # (time, seq, job, version)
    seq = 0
    n_events = 0
    busy = 0.0
    last_end = 0.0

    def progress_at(i: int, t: float) -> float:
        dt = t - seg_start[i]
        return p0[i] + dt / dur[i] if dt > 0 else p0[i]

    def push_waiting(i: int) -> None:
        nonlocal seq
        seq += 1
        heappush(waiting[g_of[i]], (key(views[i]), seq, i))
        state[i] = _WAITING
        w.set_state(views[i], "waiting")

    def start(i: int, t: float) -> None:
        nonlocal free, seq
        free -= g_of[i]
        if free < 0:  # fill() only starts jobs that fit: this would be an engine bug, never a policy's doing
            raise AssertionError(f"GPU pool overcommitted by {-free} at t={t}")
        state[i] = _RUNNING
        version[i] += 1
        alloc_t[i] = t
        resume = preemption_cost_h if preempts[i] else 0.0
        seg_start[i] = t + resume
        if first_start[i] != first_start[i]:  # NaN: first start
            first_start[i] = t
        w.set_state(views[i], "running")
        seq += 1
        t_next = seg_start[i] + (next_k[i] * inv_n - p0[i]) * dur[i]
        heappush(events, (t_next, seq, i, version[i]))
        if preempt_on_arrival:
            heappush(running_heap, (-key(views[i]), seq, i, version[i]))

    def release(i: int, t: float) -> None:
        nonlocal free, busy
        free += g_of[i]
        held = (t - alloc_t[i]) * g_of[i]
        gpu_h[i] += held
        busy += held
        version[i] += 1

    def preempt(i: int, t: float) -> None:
        release(i, t)
        p = progress_at(i, t)
        p0[i] = p
        views[i]._progress = p
        preempts[i] += 1
        w.add_preemption(views[i])
        push_waiting(i)

    def best_waiting(limit: int) -> tuple[float, int, int] | None:
        best = None
        for g in demands:
            if g > limit:
                break
            h = waiting[g]
            if h and (best is None or h[0] < best):
                best = h[0]
        return best

    def fill(t: float) -> None:
        while free > 0:
            best = best_waiting(free)
            if best is None:
                return
            heappop(waiting[g_of[best[2]]])
            start(best[2], t)

    def try_preempt_for(j: int, t: float) -> None:
        # SRTF-style: free enough GPUs for the arriving job j by preempting the running jobs that rank worst,
        # only if all of them rank worse than j and together they free enough.
        nonlocal seq
        need = g_of[j] - free
        kj = key(views[j])
        victims: list[int] = []
        got = 0
        while running_heap and got < need:
            negk, _, i, ver = heappop(running_heap)
            if state[i] != _RUNNING or version[i] != ver:
                continue  # stale entry
            views[i]._progress = progress_at(i, t)
            k = key(views[i])
            if running_heap and -running_heap[0][0] > k:
                seq += 1
                heappush(running_heap, (-k, seq, i, ver))  # bound was loose: re-rank
                continue
            if not k > kj:
                seq += 1
                heappush(running_heap, (-k, seq, i, ver))
                break
            victims.append(i)
            got += g_of[i]
        if got >= need:
            for i in victims:
                preempt(i, t)
        else:
            for i in victims:
                seq += 1
                heappush(running_heap, (-key(views[i]), seq, i, version[i]))

    def finish(i: int, t: float, k: int, stopped: bool, deliver_k: int) -> None:
        nonlocal last_end
        release(i, t)
        state[i] = _DONE
        p_end = k * inv_n
        pk = peak_idx[i] + 1
        job = jobs[i]
        waste = max(0.0, p_end - pk * inv_n) * dur[i] * g_of[i]
        outcomes[i] = JobOutcome(
            job.job_id, job.job_type, job.hacking, g_of[i], job.submit_time, first_start[i], t, stopped,
            k if stopped else None, deliver_k, pk, float(true_evals[i, pk - 1]),
            float(true_evals[i, deliver_k - 1]), gpu_h[i], waste, preempts[i],
        )
        w.set_state(views[i], "stopped" if stopped else "completed")
        stop.forget(job.job_id)
        if t > last_end:
            last_end = t

    arrivals = [j.submit_time for j in jobs]
    a = 0
    while a < n or events:
        if a < n and (not events or arrivals[a] <= events[0][0]):
            t = arrivals[a]
            i = a
            a += 1
            n_events += 1
            push_waiting(i)
            if preempt_on_arrival and g_of[i] > free:
                try_preempt_for(i, t)
            fill(t)
            continue
        t, _, i, ver = heappop(events)
        if version[i] != ver:
            continue
        n_events += 1
        k = next_k[i]
        p = k * inv_n
        p0[i] = p
        seg_start[i] = t
        view = views[i]
        view._progress = p  # the engine owns its views: direct slot writes on the hot path (ViewWriter elsewhere)
        if record[i]:
            score, examples = observe_eval(jobs[i], k, p)
            view._eval_steps.append((k * planned[i]) // n_evals)
            view._eval_scores.append(score)
            view._losses.append(losses[i][k - 1])
            view._last_example_scores = tuple(examples) if examples is not None else None
            if consult_stop[i]:
                verdict = on_eval(view)
                if verdict is not None:
                    # The delivered checkpoint is the first eval at or after the verdict's step (exact on our grid).
                    deliver_k = min(max(-(-verdict.deliver_step * n_evals // planned[i]), 1), k)
                    finish(i, t, k, True, deliver_k)
                    fill(t)
                    continue
        if k == n_evals:
            finish(i, t, k, False, k)
            fill(t)
            continue
        next_k[i] = k + 1
        if preempt_on_eval:
            best = best_waiting(free + g_of[i])
            if best is not None and should_yield(key(view), best[0]):
                preempt(i, t)
                fill(t)
                continue
        seq += 1
        heappush(events, (t + inv_n * dur[i], seq, i, version[i]))

    first = arrivals[0] if n else 0.0
    return SimResult(outcomes, gpus, n_evals, last_end - first, busy, n_events, time.perf_counter() - t_wall,
                     f"{base.name}+{stop.name}")
