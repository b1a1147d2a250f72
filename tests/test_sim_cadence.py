"""The simulator's eval pricing and cadence hints: extra evals happen where the core hints, cost GPU time, and the
fixed cadence runs exactly as without them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from platform_sim.core.policies import make_base_policy
from platform_sim.core.stop_policies import make_stop_policy, with_stop
from platform_sim.sim.cadence_study import cadence_comparison
from platform_sim.sim.engine import simulate
from platform_sim.sim.metrics import run_metrics
from platform_sim.sim.workload import WorkloadConfig, generate_workload


def _run(wl, stop="evalstop", eval_cost=0.05, **params):
    return simulate(wl, with_stop(make_base_policy("srtf-est"), make_stop_policy(stop, **params)), eval_cost=eval_cost)


@pytest.fixture(scope="module")
def workload():
    return generate_workload(WorkloadConfig(n_jobs=60), seed=3)


def test_fixed_cadence_timing_does_not_depend_on_eval_cost(workload) -> None:
    cheap, dear = _run(workload, eval_cost=0.0), _run(workload, eval_cost=0.2)
    assert [o.end_time for o in cheap.outcomes] == [o.end_time for o in dear.outcomes]
    assert sum(o.eval_gpu_hours for o in cheap.outcomes) == 0.0
    # Priced: every job pays 0.2 of an interval per regular eval it reached, nothing extra.
    for o, j in zip(dear.outcomes, workload.jobs):
        evals = o.stop_eval if o.stopped else workload.n_evals
        assert o.extra_evals == 0
        assert o.eval_gpu_hours == pytest.approx(evals * 0.2 * j.duration_h / workload.n_evals * j.gpus)


def test_adaptive_cadence_adds_evals_at_the_hinted_points(workload) -> None:
    res = _run(workload, cadence={"name": "adaptive", "params": {"fraction": 0.25}})
    fixed = _run(workload)
    extra = [o for o in res.outcomes if o.extra_evals]
    assert extra, "a 60-job workload at sigma 0.02 has first declines"
    assert all(o.job_type == "rlhf" for o in extra)  # only covered jobs are hinted
    # A stop at an extra eval lies a quarter of an interval after a regular eval.
    off_grid = [o.stop_eval for o in res.outcomes if o.stopped and o.stop_eval != int(o.stop_eval)]
    assert off_grid and all(s % 1 == pytest.approx(0.25) for s in off_grid)
    m, f = run_metrics(res), run_metrics(fixed)
    assert m["extra_evals"] == sum(o.extra_evals for o in extra) > 0
    assert m["delay_evals"] < f["delay_evals"]  # the confirming eval comes sooner
    # Extra evals cost time: a job that got them and still completed ran longer than at the fixed cadence.
    for o, o_fixed in zip(res.outcomes, fixed.outcomes):
        if o.extra_evals and not o.stopped and not o_fixed.stopped and o.preemptions == o_fixed.preemptions == 0:
            assert o.end_time - o.start_time > o_fixed.end_time - o_fixed.start_time


def test_cadence_comparison_rows_carry_oracle_shares() -> None:
    rows = cadence_comparison(WorkloadConfig(n_jobs=40), seeds=[0])
    assert [r["stop"] for r in rows] == ["oracle", "evalstop", "evalstop"]
    assert rows[0]["waste_cut_share_of_oracle"] == 1.0
    for r in rows[1:]:
        assert r["waste_cut_share_of_oracle"] == pytest.approx(
            r["wasted_reduction_pct"] / rows[0]["wasted_reduction_pct"]
        )
        assert r["eval_gpu_h"] > 0


def test_cli_run_cadence_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "platform_sim.sim.cli", "run", "--jobs", "40", "--cadence", "adaptive", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = json.loads(out)
    assert m["config"]["cadence"] == "adaptive" and m["extra_evals"] > 0
    assert m["eval_gpu_h"] > 0 and m["waste_cut_share_of_oracle"] is not None
    bad = subprocess.run(
        [sys.executable, "-m", "platform_sim.sim.cli", "run", "--eval-cost", "nan"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "--eval-cost" in bad.stderr


def test_repeated_hints_never_land_on_a_regular_eval_step() -> None:
    # k=3 hints twice in a row; at half an interval the second hint is exactly the next regular eval's step, which
    # in progress (floating point) can compare just below it. It must be left to the regular eval (the monitor would
    # raise a conflict for a second report of that step).
    wl = generate_workload(WorkloadConfig(), seed=0)
    res = _run(
        wl,
        detector={"name": "k-decline", "params": {"k": 3}},
        cadence={"name": "adaptive", "params": {"fraction": 0.5}},
    )
    assert sum(o.extra_evals for o in res.outcomes) > 0
