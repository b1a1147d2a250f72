"""Runners: same results in the same order whatever the backend and worker count."""

from __future__ import annotations

import pytest

from platform_sim.sim.experiments import PolicySpec, SimTask, run_task
from platform_sim.sim.runner import RUNNERS, ProcessRunner, SerialRunner, make_runner, register_runner
from platform_sim.sim.workload import WorkloadConfig


def _square(x: int) -> int:
    return x * x


def test_serial_and_process_runners_agree_in_order():
    tasks = list(range(7))
    ticks = []
    assert SerialRunner().map(_square, tasks, ticks.append) == [x * x for x in tasks] and sum(ticks) == 7
    with ProcessRunner(2) as r:
        assert r.map(_square, tasks) == [x * x for x in tasks]


def test_simulation_tasks_are_deterministic_regardless_of_workers():
    specs = (PolicySpec(stop="none"), PolicySpec(stop="evalstop"))
    tasks = [SimTask(WorkloadConfig(n_jobs=40), seed, specs) for seed in range(4)]
    serial = SerialRunner().map(run_task, tasks)
    with ProcessRunner(2) as r:
        parallel = r.map(run_task, tasks)
    strip = lambda res: [[{k: v for k, v in m.items() if k != "wall_s"} for m in ms] for ms in res]  # noqa: E731
    assert strip(serial) == strip(parallel)
    assert strip(serial)[0] != strip(serial)[1]


def test_make_runner_and_registry():
    assert isinstance(make_runner("serial"), SerialRunner)
    assert make_runner("process", 3).workers == 3
    with pytest.raises(ValueError, match="unknown runner 'ray9'"):
        make_runner("ray9")
    with pytest.raises(ValueError, match="workers"):
        ProcessRunner(0)

    @register_runner
    class Reverse(SerialRunner):
        name = "test-reverse"

    try:
        assert isinstance(make_runner("test-reverse"), Reverse)
    finally:
        RUNNERS.pop("test-reverse")


def test_rows_for_policies_adds_the_no_stop_baseline_per_base():
    from platform_sim.sim.experiments import rows_for_policies

    specs = [PolicySpec(base="fifo", stop="evalstop"), PolicySpec(base="sjf-est", stop="stop-at-p")]
    rows = rows_for_policies(WorkloadConfig(n_jobs=40), specs, [0, 1])
    assert [(r["base"], r["stop"], r["seeds"]) for r in rows] == [("fifo", "evalstop", 2), ("sjf-est", "stop-at-p", 2)]
    for r in rows:
        assert r["jct_gain_pct"] is not None and r["wasted_reduction_pct"] is not None
