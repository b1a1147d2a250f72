"""The information boundary in the simulator: no policy (except the Oracle bound) can reach ground truth.

Every base and stop policy is run in a real simulation with spies that record every object the engine hands to a
policy. Then the object graph reachable from those arguments and from the policies' own state is walked: it must not
contain any simulator-private object (job specs, curves, the workload, its arrays) nor any attribute that carries the
hacking label, the true curve or the true duration.
"""

from __future__ import annotations

import gc
import types

import numpy as np
import pytest

from platform_sim.sim.curves import Curve
from platform_sim.sim.engine import simulate
from platform_sim.sim.experiments import PolicySpec
from platform_sim.sim.policies.policies import BASE_POLICIES, BasePolicy
from platform_sim.sim.policies.stop_policies import STOP_POLICIES, StopPolicy
from platform_sim.sim.policies.views import JobView
from platform_sim.sim.workload import JobSpec, Workload, WorkloadConfig, generate_workload

_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    property,
    staticmethod,
    classmethod,
)


def reachable(roots):
    """Every object reachable from ``roots`` through instance data (not through classes, modules or functions)."""
    seen, stack, out = set(), list(roots), []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        out.append(obj)
        stack.extend(gc.get_referents(obj))
    return out


def spy(scheduler, seen):
    base, stop = scheduler.base, scheduler.stop
    key, on_eval = base.key, stop.on_eval

    def key_spy(job):
        seen.append(job)
        return key(job)

    def on_eval_spy(job):
        seen.append(job)
        return on_eval(job)

    # instance attributes shadow the methods, so the engine calls the spies
    base.key = key_spy
    stop.on_eval = on_eval_spy
    if hasattr(base, "should_yield"):
        yield_ = base.should_yield

        def yield_spy(a, b):
            seen.extend([a, b])
            return yield_(a, b)

        base.should_yield = yield_spy


@pytest.fixture(scope="module")
def workload():
    return generate_workload(WorkloadConfig(n_jobs=40, load=1.2), seed=3)


@pytest.mark.parametrize("base", list(BASE_POLICIES))
@pytest.mark.parametrize("stop", [s for s, c in STOP_POLICIES.items() if not c.uses_ground_truth])
def test_policies_cannot_reach_ground_truth(workload, base, stop):
    sched = PolicySpec(base=base, stop=stop).build(workload)
    seen: list = []
    spy(sched, seen)
    simulate(workload, sched, gpus=64)
    assert seen, "the spies saw nothing: the test would prove nothing"
    assert all(isinstance(x, (JobView, float, int)) for x in seen), {type(x) for x in seen}
    truth_arrays = {id(workload.true_evals), id(workload.losses), id(workload.noise), id(workload.peak_index)}
    views = [x for x in seen if isinstance(x, JobView)]
    for obj in reachable(views + [sched.base, sched.stop]):
        assert not isinstance(obj, (JobSpec, Curve, Workload, WorkloadConfig)), type(obj)
        assert id(obj) not in truth_arrays
        assert not isinstance(obj, np.ndarray)
        for attr in ("hacking", "curve", "duration_h", "loss_curve", "true_evals", "peak_index"):
            assert not hasattr(obj, attr) or isinstance(obj, type), (type(obj), attr)


def test_views_hold_only_observable_slots(workload):
    job = workload.jobs[0]
    v = JobView(job.job_id, job.job_type, job.gpus, job.submit_time, job.planned_steps, job.est_duration_h)
    slots = set(JobView.__slots__)
    assert slots == {
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
    }
    assert not hasattr(v, "__dict__")  # no room for anything else


def test_the_oracle_is_the_declared_exception(workload):
    sched = PolicySpec(stop="oracle").build(workload)
    assert sched.stop.uses_ground_truth
    hacking = {j.job_id for j in workload.jobs if j.hacking}
    assert set(sched.stop.peak_steps) == hacking
    assert isinstance(sched.base, BasePolicy) and isinstance(sched.stop, StopPolicy)
