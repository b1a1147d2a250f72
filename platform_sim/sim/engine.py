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

How the code reads: :func:`simulate` checks its arguments and hands one run to :class:`_Run`, which holds the
cluster's state in per-job lists (indexed by the job's position in the workload) and names each part of the
mechanics: the event loop (:meth:`_Run.run`), an arrival (:meth:`_Run.arrive`), admission (:meth:`_Run.fill`, the
waiting heaps, :meth:`_Run.try_preempt_for`), placement (:meth:`_Run.start`, :meth:`_Run.release`,
:meth:`_Run.preempt`), the evals (:meth:`_Run.regular_eval`, :meth:`_Run.extra_eval`, the cadence hint
:meth:`_Run.ask_hint`) and finishing (:meth:`_Run.finish`, :meth:`_Run.delivered_at`).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from platform_sim.core.cadence import EvalBudget
from platform_sim.sim.policies.policies import PREEMPTION_COST_H
from platform_sim.sim.policies.stop_policies import Scheduler
from platform_sim.sim.policies.views import JobView, ViewWriter

from .observe import ObservationModel
from .outcomes import JobOutcome, SimResult
from .workload import Workload

logger = logging.getLogger(__name__)

_PENDING, _WAITING, _RUNNING, _DONE = 0, 1, 2, 3


def _example_row(examples: Any) -> Sequence[float] | None:
    """An eval's per-example scores as a job's view holds them: a tuple, or the observation model's read-only float64
    array as it is (the monitor checks it in two reductions and the default detector reads it without converting
    each score to a Python float); any other sequence as a tuple, as before."""
    if examples is None or type(examples) is tuple or type(examples) is np.ndarray:
        return cast("Sequence[float] | None", examples)
    return tuple(examples)


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

    Raises:
        ValueError: A job needs more GPUs than the cluster has, or a negative cost.
        TypeError: ``eval_budget`` is not an :class:`~platform_sim.core.cadence.EvalBudget`.
    """
    t_wall = time.perf_counter()
    if any(j.gpus > gpus for j in workload.jobs):
        raise ValueError(f"a job needs more GPUs than the cluster's {gpus}")
    if preemption_cost_h < 0:
        raise ValueError("preemption_cost_h must be >= 0")
    if not (eval_cost >= 0 and math.isfinite(eval_cost)):
        raise ValueError(f"eval_cost must be a finite number >= 0, got {eval_cost!r}")
    if eval_budget is not None and not isinstance(eval_budget, EvalBudget):
        raise TypeError(f"eval_budget must be an EvalBudget or None, got {type(eval_budget).__name__}")
    budget = None if eval_budget is None or eval_budget.unlimited else eval_budget
    run = _Run(
        workload, scheduler, gpus, preemption_cost_h, observation or ObservationModel(workload), eval_cost, budget
    )
    run.run()
    first = workload.jobs[0].submit_time if workload.jobs else 0.0
    return SimResult(
        cast("list[JobOutcome]", run.outcomes),  # every job has finished: no None is left
        gpus,
        run.n_evals,
        run.last_end - first,
        run.busy,
        run.n_events,
        time.perf_counter() - t_wall,
        f"{scheduler.base.name}+{scheduler.stop.name}",
    )


class _Run:
    """The state of one simulation and the steps that change it (see the module docstring for the mechanics).

    Per-job state lives in plain lists indexed by the job's position (the event loop runs ~10^6 times; a list index
    is cheaper than an object per job). A job's ``version`` grows whenever its pending event becomes stale
    (started, preempted, finished), so events are deleted lazily.
    """

    def __init__(
        self,
        workload: Workload,
        scheduler: Scheduler,
        gpus: int,
        preemption_cost_h: float,
        observation: ObservationModel,
        eval_cost: float,
        budget: EvalBudget | None,
    ) -> None:
        jobs = self.jobs = workload.jobs
        n = self.n = len(jobs)
        self.base, self.stop = scheduler.base, scheduler.stop
        self.obs = observation
        self.preemption_cost_h = preemption_cost_h
        self.budget = budget
        self.n_evals = workload.n_evals
        self.inv_n = 1.0 / self.n_evals
        self.key = self.base.key
        self.preempt_on_arrival = self.base.preempt_on_arrival
        self.preempt_on_eval = self.base.preempt_on_eval
        # Only a stop policy with a cadence policy can hint; the others skip the hint look-up on the hot path.
        self.hints = getattr(self.stop, "cadence", None) is not None

        views = self.views = [
            JobView(j.job_id, j.job_type, j.gpus, j.submit_time, j.planned_steps, j.est_duration_h) for j in jobs
        ]
        # Jobs whose evals a policy reads (the stop policy's types; every job for LossAware). The others need no eval
        # events at all: their next event is their completion, and their progress is computed when a policy asks.
        self.consult_stop = [self.stop.covers(v) for v in views]
        self.record = [self.preempt_on_eval or c for c in self.consult_stop]
        self.losses = workload.losses.tolist()
        self.peak_idx = workload.peak_index.tolist()
        self.true_evals = workload.true_evals
        self.dur = [j.duration_h for j in jobs]
        self.g_of = [j.gpus for j in jobs]
        self.planned = [j.planned_steps for j in jobs]

        self.state = [_PENDING] * n
        self.version = [0] * n
        self.p0 = [0.0] * n  # progress at the start of the current segment
        self.seg_start = [0.0] * n  # time the current segment starts progressing (after any resume overhead)
        self.alloc_t = [0.0] * n  # time the job got its GPUs
        # Next eval index (1-based); n_evals: straight to completion.
        self.next_k = [1 if r else self.n_evals for r in self.record]
        self.gpu_h = [0.0] * n
        self.first_start = [math.nan] * n
        self.preempts = [0] * n
        self.outcomes: list[JobOutcome | None] = [None] * n
        self.extra_p = [-1.0] * n  # progress of the pending extra eval (-1: the next eval is the regular one)
        self.extra_n = [0] * n  # extra evals done
        self.extra_waste_h = [0.0] * n  # hours of extra evals after the true peak
        self.eval_h = [eval_cost * d * self.inv_n for d in (j.duration_h for j in jobs)]  # hours one eval takes

        self.free = gpus
        self.demands = sorted({g for g in self.g_of})
        self.waiting: dict[int, list[tuple[float, int, int]]] = {g: [] for g in self.demands}
        self.running_heap: list[tuple[float, int, int, int]] = []  # (-key upper bound, seq, job, version)
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, job, version)
        self.seq = 0  # tie-breaker of every heap entry, in push order
        self.n_events = 0
        self.busy = 0.0
        self.last_end = 0.0

    # -- the event loop ----------------------------------------------------------------------------------------

    def run(self) -> None:
        """Merge the sorted arrivals with the event heap until every job has finished."""
        arrivals = [j.submit_time for j in self.jobs]
        events, version, extra_p = self.events, self.version, self.extra_p
        n = self.n
        a = 0
        while a < n or events:
            if a < n and (not events or arrivals[a] <= events[0][0]):
                self.arrive(a, arrivals[a])
                a += 1
                continue
            t, _, i, ver = heapq.heappop(events)
            if version[i] != ver:
                continue  # stale: the job was preempted, stopped or restarted since this event was pushed
            self.n_events += 1
            finished = self.extra_eval(i, t) if extra_p[i] >= 0.0 else self.regular_eval(i, t)
            if finished:
                self.fill(t)

    def arrive(self, i: int, t: float) -> None:
        """Job ``i`` is submitted at ``t``: it waits, may preempt worse running jobs (SRTF-style), then admission."""
        self.n_events += 1
        self.push_waiting(i)
        if self.preempt_on_arrival and self.g_of[i] > self.free:
            self.try_preempt_for(i, t)
        self.fill(t)

    # -- admission ---------------------------------------------------------------------------------------------

    def push_waiting(self, i: int) -> None:
        """Queue job ``i`` in the heap of its GPU demand, keyed by the base policy."""
        self.seq += 1
        heapq.heappush(self.waiting[self.g_of[i]], (self.key(self.views[i]), self.seq, i))
        self.state[i] = _WAITING
        ViewWriter.set_state(self.views[i], "waiting")

    def best_waiting(self, limit: int) -> tuple[float, int, int] | None:
        """The best-ranked waiting entry among the demands of at most ``limit`` GPUs (None: nothing fits)."""
        best = None
        for g in self.demands:
            if g > limit:
                break
            h = self.waiting[g]
            if h and (best is None or h[0] < best):
                best = h[0]
        return best

    def fill(self, t: float) -> None:
        """Start the best waiting job that fits, again and again, while GPUs are free (greedy, with backfill)."""
        while self.free > 0:
            best = self.best_waiting(self.free)
            if best is None:
                return
            heapq.heappop(self.waiting[self.g_of[best[2]]])
            self.start(best[2], t)

    def try_preempt_for(self, j: int, t: float) -> None:
        """Free enough GPUs for the arriving job ``j`` by preempting the running jobs that rank worst, only if all of
        them rank worse than ``j`` and together they free enough (SRTF-style)."""
        need = self.g_of[j] - self.free
        kj = self.key(self.views[j])
        running_heap, state, version, views, key = self.running_heap, self.state, self.version, self.views, self.key
        victims: list[int] = []
        got = 0
        while running_heap and got < need:
            negk, _, i, ver = heapq.heappop(running_heap)
            if state[i] != _RUNNING or version[i] != ver:
                continue  # stale entry
            views[i]._progress = self.progress_at(i, t)
            k = key(views[i])
            if running_heap and -running_heap[0][0] > k:
                self.seq += 1
                heapq.heappush(running_heap, (-k, self.seq, i, ver))  # bound was loose: re-rank
                continue
            if not k > kj:
                self.seq += 1
                heapq.heappush(running_heap, (-k, self.seq, i, ver))
                break
            victims.append(i)
            got += self.g_of[i]
        if got >= need:
            for i in victims:
                self.preempt(i, t)
        else:
            for i in victims:
                self.seq += 1
                heapq.heappush(running_heap, (-key(views[i]), self.seq, i, version[i]))

    # -- placement ---------------------------------------------------------------------------------------------

    def progress_at(self, i: int, t: float) -> float:
        """Job ``i``'s progress (0-1) at time ``t`` of its current segment."""
        dt = t - self.seg_start[i]
        return self.p0[i] + dt / self.dur[i] if dt > 0 else self.p0[i]

    def start(self, i: int, t: float) -> None:
        """Give job ``i`` its GPUs at ``t`` (after a preemption it progresses only after the resume cost) and push
        its next event: the pending extra eval, else the next regular eval (or its completion)."""
        self.free -= self.g_of[i]
        if self.free < 0:  # fill() only starts jobs that fit: this would be an engine bug, never a policy's doing
            raise AssertionError(f"GPU pool overcommitted by {-self.free} at t={t}")
        self.state[i] = _RUNNING
        self.version[i] += 1
        self.alloc_t[i] = t
        resume = self.preemption_cost_h if self.preempts[i] else 0.0
        self.seg_start[i] = t + resume
        if self.first_start[i] != self.first_start[i]:  # NaN: first start
            self.first_start[i] = t
        ViewWriter.set_state(self.views[i], "running")
        self.seq += 1
        target = self.extra_p[i] if self.extra_p[i] >= 0.0 else self.next_k[i] * self.inv_n
        t_next = self.seg_start[i] + (target - self.p0[i]) * self.dur[i]
        heapq.heappush(self.events, (t_next, self.seq, i, self.version[i]))
        if self.preempt_on_arrival:
            heapq.heappush(self.running_heap, (-self.key(self.views[i]), self.seq, i, self.version[i]))

    def release(self, i: int, t: float) -> None:
        """Job ``i`` gives its GPUs back at ``t``; the time it held them is counted, its pending event goes stale."""
        self.free += self.g_of[i]
        held = (t - self.alloc_t[i]) * self.g_of[i]
        self.gpu_h[i] += held
        self.busy += held
        self.version[i] += 1

    def preempt(self, i: int, t: float) -> None:
        """Take job ``i``'s GPUs at ``t``; it keeps its progress (checkpointed) and waits again."""
        self.release(i, t)
        p = self.progress_at(i, t)
        self.p0[i] = p
        self.views[i]._progress = p
        self.preempts[i] += 1
        ViewWriter.add_preemption(self.views[i])
        self.push_waiting(i)

    # -- evaluations -------------------------------------------------------------------------------------------

    def regular_eval(self, i: int, t: float) -> bool:
        """Job ``i`` reaches its next regular eval (or its completion) at ``t``: observe it if a policy reads it,
        then stop, complete, yield its GPUs or go on to its next event. Returns whether its GPUs were freed."""
        k = self.next_k[i]
        p = k * self.inv_n
        self.p0[i] = p
        self.seg_start[i] = t
        view = self.views[i]
        view._progress = p  # the engine owns its views: direct slot writes on the hot path (ViewWriter elsewhere)
        if self.record[i]:
            score, examples = self.obs.observe_row(self.jobs[i], k, p)
            view._eval_steps.append((k * self.planned[i]) // self.n_evals)
            view._eval_scores.append(score)
            view._losses.append(self.losses[i][k - 1])
            view._last_example_scores = _example_row(examples)
            if self.consult_stop[i]:
                verdict = self.stop.on_eval(view)
                if verdict is not None:
                    # The delivered checkpoint is the first eval at or after the verdict's step (exact on our grid).
                    deliver_k, deliver_p = self.delivered_at(i, verdict.deliver_step, k, p)
                    self.finish(i, t, k, True, deliver_k, -1.0, deliver_p)
                    return True
        if k == self.n_evals:
            self.finish(i, t, k, False, k)
            return True
        self.next_k[i] = k + 1
        if self.hints and self.consult_stop[i]:
            self.ask_hint(i, view, p)
        if self.preempt_on_eval:
            best = self.best_waiting(self.free + self.g_of[i])
            if best is not None and self.base.should_yield(self.key(view), best[0]):
                self.preempt(i, t)
                return True
        self.seq += 1
        extra_p = self.extra_p[i]
        # Without an extra eval the original expression, so that the fixed cadence's event times are unchanged.
        dt = (extra_p - p) * self.dur[i] if extra_p >= 0.0 else self.inv_n * self.dur[i]
        heapq.heappush(self.events, (t + dt, self.seq, i, self.version[i]))
        return False

    def extra_eval(self, i: int, t: float) -> bool:
        """An extra eval of job ``i`` reached at ``t``: it takes ``eval_h[i]`` on the GPUs, then the job stops or goes
        on. Returns whether the job finished (its GPUs are free)."""
        p = self.extra_p[i]
        self.extra_p[i] = -1.0
        self.extra_n[i] += 1
        eval_h = self.eval_h[i]
        done_at = t + eval_h
        if p > (self.peak_idx[i] + 1) * self.inv_n:
            self.extra_waste_h[i] += eval_h
        self.p0[i] = p
        self.seg_start[i] = done_at  # no progress while evaluating
        view = self.views[i]
        view._progress = p
        step = round(p * self.planned[i])
        score, examples = self.obs.observe_at(self.jobs[i], p, step)
        view._eval_steps.append(step)
        view._eval_scores.append(score)
        view._losses.append(float(self.jobs[i].loss_curve.value(p)))
        view._last_example_scores = _example_row(examples)
        verdict = self.stop.on_eval(view)
        if verdict is not None:
            k_reg = self.next_k[i] - 1
            deliver_k, deliver_p = self.delivered_at(i, verdict.deliver_step, k_reg, p)
            self.finish(i, done_at, k_reg, True, deliver_k, p, deliver_p)
            return True
        self.ask_hint(i, view, p)
        self.seq += 1
        target = self.extra_p[i] if self.extra_p[i] >= 0.0 else self.next_k[i] * self.inv_n
        heapq.heappush(self.events, (done_at + (target - p) * self.dur[i], self.seq, i, self.version[i]))
        return False

    def ask_hint(self, i: int, view: JobView, p: float) -> None:
        """The cadence hint after an eval at progress ``p``: an extra eval if it comes before the next regular one
        and the job's budget is not spent. Time is the job's own: its progress hours plus its extra evals' hours."""
        extra_n, eval_h = self.extra_n[i], self.eval_h[i]
        if self.budget is not None and not self.budget.allows(
            extra_n, len(view._eval_steps) * eval_h, p * self.dur[i] + extra_n * eval_h
        ):
            return
        h = self.stop.next_eval_step(view)
        # Compared in steps, not progress: a hint on the next regular eval's step can come out just below that
        # eval's progress in floating point, and would then report the same step twice.
        if h is not None and view._eval_steps[-1] < h < (self.next_k[i] * self.planned[i]) // self.n_evals:
            self.extra_p[i] = h / self.planned[i]

    # -- finishing ---------------------------------------------------------------------------------------------

    def delivered_at(self, i: int, d: int, k: int, p: float) -> tuple[int, float]:
        """The delivered checkpoint of step ``d``, at most the eval just done (regular index ``k``, progress ``p``):
        a regular eval's index (and -1.0), or (with a cadence hint) ``k`` and an extra eval's progress."""
        planned, n_evals = self.planned[i], self.n_evals
        if d * n_evals % planned and self.extra_n[i]:
            return k, min(d / planned, p)
        return min(max(-(-d * n_evals // planned), 1), k), -1.0

    def finish(
        self, i: int, t: float, k: int, stopped: bool, deliver_k: int, p_extra: float = -1.0, deliver_p: float = -1.0
    ) -> None:
        """Job ``i`` ends at ``t``, at regular eval ``k``, and its outcome is written.

        Args:
            p_extra: >= 0: stopped at an extra eval at that progress (``k``: the last regular eval before it).
            deliver_p: >= 0: the delivered checkpoint is an extra eval's, at that progress (else ``deliver_k``'s).
        """
        self.release(i, t)
        self.state[i] = _DONE
        n_evals, inv_n, g = self.n_evals, self.inv_n, self.g_of[i]
        p_end = p_extra if p_extra >= 0.0 else k * inv_n
        pk = self.peak_idx[i] + 1
        job = self.jobs[i]
        waste = (max(0.0, p_end - pk * inv_n) * self.dur[i] + self.extra_waste_h[i]) * g
        stop_eval: Any = (p_extra * n_evals if p_extra >= 0.0 else k) if stopped else None
        if deliver_p >= 0.0:
            deliver_eval: Any = deliver_p * n_evals
            delivered = float(job.curve.value(deliver_p))
        else:
            deliver_eval, delivered = deliver_k, float(self.true_evals[i, deliver_k - 1])
        self.outcomes[i] = JobOutcome(
            job.job_id,
            job.job_type,
            job.hacking,
            g,
            job.submit_time,
            self.first_start[i],
            t,
            stopped,
            stop_eval,
            deliver_eval,
            pk,
            float(self.true_evals[i, pk - 1]),
            delivered,
            self.gpu_h[i],
            waste,
            self.preempts[i],
            (k + self.extra_n[i]) * self.eval_h[i] * g,
            self.extra_n[i],
        )
        ViewWriter.set_state(self.views[i], "stopped" if stopped else "completed")
        self.stop.forget(job.job_id)
        self.obs.forget(job)
        if t > self.last_end:
            self.last_end = t
