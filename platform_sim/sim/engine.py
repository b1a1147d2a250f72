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

Evaluations are priced: each costs ``eval_cost`` of a regular eval interval of the job's time on its GPUs. The
regular evals (every ``1 / n_evals`` of progress) are part of a job's planned duration, so the fixed cadence runs
exactly as without pricing; what they cost is reported as ``eval_gpu_hours``. When the stop policy gives a cadence
hint (``next_eval_step``) sooner than the next regular eval, the engine schedules an *extra* eval there: the job
holds its GPUs ``eval_cost`` of an interval longer without progressing, the eval is observed off the regular grid
(:meth:`~platform_sim.sim.observe.ObservationModel.observe_at`), and the regular interval then goes on. A stop at an
extra eval ends the job at that progress; its waste counts the extra evals' time after the true peak. A hint is taken
only within the job's :class:`~platform_sim.core.cadence.EvalBudget`, the trainer callback's budget.

The engine never imports the runner, the metrics or the CLI; it returns plain per-job outcomes.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from platform_sim.core.cadence import EvalBudget
from platform_sim.sim.policies.policies import PREEMPTION_COST_H
from platform_sim.sim.policies.stop_policies import Scheduler
from platform_sim.sim.policies.views import JobView, ViewWriter

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


DEFAULT_EVAL_COST: float = 0.05
"""Share of a regular eval interval (1/20 of a run) that one evaluation takes on the job's GPUs."""


def simulate(
    workload: Workload,
    scheduler: Scheduler,
    gpus: int = 64,
    preemption_cost_h: float = PREEMPTION_COST_H,
    observation: ObservationModel | None = None,
    eval_cost: float = DEFAULT_EVAL_COST,
    eval_budget: EvalBudget | None = None,
) -> SimResult:
    """Run ``workload`` on a cluster of ``gpus`` GPUs under ``scheduler`` (a base policy composed with a stop policy).

    Args:
        workload: Jobs and their truth (see :func:`~platform_sim.sim.workload.generate_workload`).
        scheduler: From :func:`~platform_sim.sim.policies.stop_policies.with_stop` or ``evalstop``. Its stop policy keeps
            per-job state: use a fresh one per run.
        gpus: Cluster size; every job's demand must fit.
        preemption_cost_h: Resume cost after a preemption, in hours (default 2 minutes).
        observation: How evals are observed (default: Gaussian noise of the workload's sigma).
        eval_cost: What one evaluation costs, as a share of a regular eval interval of the job's run time (>= 0;
            default :data:`DEFAULT_EVAL_COST`). Regular evals are inside the planned duration; extra evals asked
            for by a cadence hint add this much time each.
        eval_budget: What a job may spend on hinted evals (None: no limit), the same
            :class:`~platform_sim.core.cadence.EvalBudget` as :class:`~evalstop_callbacks.EvalStopCallback`'s: a
            count of extra evals, and a share of the job's time so far (its progress hours plus its extra evals'
            hours; queueing and preemption resumes do not count) spent evaluating, regular evals included.
    """
    t_wall = time.perf_counter()
    jobs = workload.jobs
    n = len(jobs)
    if any(j.gpus > gpus for j in jobs):
        raise ValueError(f"a job needs more GPUs than the cluster's {gpus}")
    if preemption_cost_h < 0:
        raise ValueError("preemption_cost_h must be >= 0")
    if not (eval_cost >= 0 and math.isfinite(eval_cost)):
        raise ValueError(f"eval_cost must be a finite number >= 0, got {eval_cost!r}")
    if eval_budget is not None and not isinstance(eval_budget, EvalBudget):
        raise TypeError(f"eval_budget must be an EvalBudget or None, got {type(eval_budget).__name__}")
    budget = None if eval_budget is None or eval_budget.unlimited else eval_budget
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
    hint_of = stop.next_eval_step
    # Only a stop policy with a cadence policy can hint; the others skip the hint look-up on the hot path.
    hints = getattr(stop, "cadence", None) is not None

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
    p0 = [0.0] * n  # progress at the start of the current segment
    seg_start = [0.0] * n  # time the current segment starts progressing (after any resume overhead)
    alloc_t = [0.0] * n  # time the job got its GPUs
    next_k = [1 if r else n_evals for r in record]  # next eval index (1-based); n_evals: straight to completion
    gpu_h = [0.0] * n
    first_start = [math.nan] * n
    preempts = [0] * n
    outcomes: list[Any] = [None] * n
    extra_p = [-1.0] * n  # progress of the pending extra eval (-1: the next eval is the regular one)
    extra_n = [0] * n  # extra evals done
    extra_waste_h = [0.0] * n  # hours of extra evals after the true peak
    eval_h = [eval_cost * d * inv_n for d in (j.duration_h for j in jobs)]  # hours one eval takes

    free = gpus
    demands = sorted({g for g in g_of})
    waiting: dict[int, list[tuple[float, int, int]]] = {g: [] for g in demands}
    running_heap: list[tuple[float, int, int, int]] = []  # (-key upper bound, seq, job, version)
    events: list[tuple[float, int, int, int]] = []  # (time, seq, job, version)
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
        target = extra_p[i] if extra_p[i] >= 0.0 else next_k[i] * inv_n
        t_next = seg_start[i] + (target - p0[i]) * dur[i]
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

    def finish(
        i: int, t: float, k: int, stopped: bool, deliver_k: int, p_extra: float = -1.0, deliver_p: float = -1.0
    ) -> None:
        # p_extra >= 0: stopped at an extra eval at that progress (k: the last regular eval before it);
        # deliver_p >= 0: the delivered checkpoint is an extra eval's, at that progress.
        nonlocal last_end
        release(i, t)
        state[i] = _DONE
        p_end = p_extra if p_extra >= 0.0 else k * inv_n
        pk = peak_idx[i] + 1
        job = jobs[i]
        waste = (max(0.0, p_end - pk * inv_n) * dur[i] + extra_waste_h[i]) * g_of[i]
        stop_eval: Any = (p_extra * n_evals if p_extra >= 0.0 else k) if stopped else None
        if deliver_p >= 0.0:
            deliver_eval: Any = deliver_p * n_evals
            delivered = float(job.curve.value(deliver_p))
        else:
            deliver_eval, delivered = deliver_k, float(true_evals[i, deliver_k - 1])
        outcomes[i] = JobOutcome(
            job.job_id,
            job.job_type,
            job.hacking,
            g_of[i],
            job.submit_time,
            first_start[i],
            t,
            stopped,
            stop_eval,
            deliver_eval,
            pk,
            float(true_evals[i, pk - 1]),
            delivered,
            gpu_h[i],
            waste,
            preempts[i],
            (k + extra_n[i]) * eval_h[i] * g_of[i],
            extra_n[i],
        )
        w.set_state(views[i], "stopped" if stopped else "completed")
        stop.forget(job.job_id)
        if t > last_end:
            last_end = t

    def delivered_at(i: int, d: int, k: int, p: float) -> tuple[int, float]:
        # The delivered checkpoint of step d, at most the eval just done (regular index k, progress p): a regular
        # eval's index, or (with a cadence hint) an extra eval's progress off the regular grid.
        if d * n_evals % planned[i] and extra_n[i]:
            return k, min(d / planned[i], p)
        return min(max(-(-d * n_evals // planned[i]), 1), k), -1.0

    def ask(i: int, view: JobView, p: float) -> None:
        # The cadence hint after an eval at progress p: an extra eval if it comes before the next regular one and
        # the job's budget is not spent. Time is the job's own: its progress hours plus its extra evals' hours.
        if budget is not None and not budget.allows(
            extra_n[i], len(view._eval_steps) * eval_h[i], p * dur[i] + extra_n[i] * eval_h[i]
        ):
            return
        h = hint_of(view)
        # Compared in steps, not progress: a hint on the next regular eval's step can come out just below that
        # eval's progress in floating point, and would then report the same step twice.
        if h is not None and view._eval_steps[-1] < h < (next_k[i] * planned[i]) // n_evals:
            extra_p[i] = h / planned[i]

    def extra_eval(i: int, t: float) -> bool:
        # An extra eval reached at time t: it takes eval_h[i] on the GPUs, then the job stops or goes on. Returns
        # whether the job finished (its GPUs are free).
        nonlocal seq
        p = extra_p[i]
        extra_p[i] = -1.0
        extra_n[i] += 1
        done_at = t + eval_h[i]
        if p > (peak_idx[i] + 1) * inv_n:
            extra_waste_h[i] += eval_h[i]
        p0[i] = p
        seg_start[i] = done_at  # no progress while evaluating
        view = views[i]
        view._progress = p
        step = round(p * planned[i])
        score, examples = obs.observe_at(jobs[i], p, step)
        view._eval_steps.append(step)
        view._eval_scores.append(score)
        view._losses.append(float(jobs[i].loss_curve.value(p)))
        view._last_example_scores = tuple(examples) if examples is not None else None
        verdict = on_eval(view)
        if verdict is not None:
            k_reg = next_k[i] - 1
            deliver_k, deliver_p = delivered_at(i, verdict.deliver_step, k_reg, p)
            finish(i, done_at, k_reg, True, deliver_k, p, deliver_p)
            return True
        ask(i, view, p)
        seq += 1
        target = extra_p[i] if extra_p[i] >= 0.0 else next_k[i] * inv_n
        heappush(events, (done_at + (target - p) * dur[i], seq, i, version[i]))
        return False

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
        if extra_p[i] >= 0.0:
            if extra_eval(i, t):
                fill(t)
            continue
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
                    deliver_k, deliver_p = delivered_at(i, verdict.deliver_step, k, p)
                    finish(i, t, k, True, deliver_k, -1.0, deliver_p)
                    fill(t)
                    continue
        if k == n_evals:
            finish(i, t, k, False, k)
            fill(t)
            continue
        next_k[i] = k + 1
        if hints and consult_stop[i]:
            ask(i, view, p)
        if preempt_on_eval:
            best = best_waiting(free + g_of[i])
            if best is not None and should_yield(key(view), best[0]):
                preempt(i, t)
                fill(t)
                continue
        seq += 1
        # Without an extra eval the original expression, so that the fixed cadence's event times are unchanged.
        dt = (extra_p[i] - p) * dur[i] if extra_p[i] >= 0.0 else inv_n * dur[i]
        heappush(events, (t + dt, seq, i, version[i]))

    first = arrivals[0] if n else 0.0
    return SimResult(
        outcomes,
        gpus,
        n_evals,
        last_end - first,
        busy,
        n_events,
        time.perf_counter() - t_wall,
        f"{base.name}+{stop.name}",
    )
