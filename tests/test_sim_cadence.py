"""The simulator's eval pricing and cadence hints: extra evals happen where the core hints, cost GPU time, and the
fixed cadence runs exactly as without them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from platform_sim.core.cadence import EvalBudget
from platform_sim.sim.engine import DEFAULT_EVAL_COST, simulate
from platform_sim.sim.metrics import run_metrics
from platform_sim.sim.policies.policies import make_base_policy
from platform_sim.sim.policies.stop_policies import make_stop_policy, with_stop
from platform_sim.sim.workload import WorkloadConfig, generate_workload
from platform_sim.studies.cadence_study import cadence_comparison


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


def _budgeted(wl, budget, share=None):
    stop = make_stop_policy("evalstop", cadence={"name": "adaptive", "params": {"fraction": 0.25}})
    eval_budget = None if budget is None and share is None else EvalBudget(budget, share)
    return simulate(wl, with_stop(make_base_policy("srtf-est"), stop), eval_budget=eval_budget)


def test_a_budget_of_extra_evals_caps_each_job_as_the_callbacks_does(workload) -> None:
    free = _budgeted(workload, None)
    assert max(o.extra_evals for o in free.outcomes) >= 2, "some job of this workload takes several hints"
    one = _budgeted(workload, 1)
    assert max(o.extra_evals for o in one.outcomes) == 1
    # A job that spent its budget is evaluated at the regular interval from then on: hinted jobs that took at most
    # one hint without the budget are the same with it.
    for o, o_free in zip(one.outcomes, free.outcomes):
        if o_free.extra_evals <= 1:
            assert (o.stopped, o.stop_eval, o.extra_evals) == (o_free.stopped, o_free.stop_eval, o_free.extra_evals)
    none = _budgeted(workload, 0)
    fixed = _run(workload)
    assert [(o.stopped, o.stop_eval, o.end_time) for o in none.outcomes] == [
        (o.stopped, o.stop_eval, o.end_time) for o in fixed.outcomes
    ]  # a budget of 0 is the fixed cadence


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_budget_of_extra_evals_is_named(workload, bad) -> None:
    with pytest.raises(ValueError, match="max_extra_evals"):
        _budgeted(workload, bad)


def test_a_budget_that_is_not_an_eval_budget_is_refused(workload) -> None:
    with pytest.raises(TypeError, match="eval_budget must be an EvalBudget"):
        simulate(workload, with_stop(make_base_policy("srtf-est"), make_stop_policy("evalstop")), eval_budget=4)


def test_a_time_share_budget_bounds_each_jobs_evaluation_time(workload) -> None:
    free = _budgeted(workload, None)
    fixed = _run(workload)
    # The regular interval alone spends eval_cost (0.05) of a job's time: a share below it follows no hint.
    below = _budgeted(workload, None, share=0.049)
    assert [(o.stopped, o.stop_eval, o.end_time) for o in below.outcomes] == [
        (o.stopped, o.stop_eval, o.end_time) for o in fixed.outcomes
    ]
    some = _budgeted(workload, None, share=0.053)
    n_some, n_free = (sum(o.extra_evals for o in r.outcomes) for r in (some, free))
    assert 0 < n_some < n_free

    # Each job's evaluating stays within the share of its GPU time, passed by at most the one eval that the last
    # check let in; without the budget some job goes past it.
    def over(res, share):
        return [
            o.job_id
            for o, j in zip(res.outcomes, workload.jobs)
            if o.eval_gpu_hours > share * o.gpu_hours + DEFAULT_EVAL_COST * j.duration_h / workload.n_evals * j.gpus
        ]

    assert over(some, 0.053) == [] and over(free, 0.053) != []
    wide = _budgeted(workload, None, share=0.99)
    assert [o.extra_evals for o in wide.outcomes] == [o.extra_evals for o in free.outcomes]
    # Both limits together: the count still caps.
    both = _budgeted(workload, 1, share=0.99)
    assert max(o.extra_evals for o in both.outcomes) == 1


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
        [sys.executable, "-m", "platform_sim.cli", "run", "--jobs", "40", "--cadence", "adaptive", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = json.loads(out)
    assert m["config"]["cadence"] == "adaptive" and m["extra_evals"] > 0
    assert m["eval_gpu_h"] > 0 and m["waste_cut_share_of_oracle"] is not None
    bad = subprocess.run(
        [sys.executable, "-m", "platform_sim.cli", "run", "--eval-cost", "nan"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "--eval-cost" in bad.stderr


def _cli_run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "platform_sim.cli", "run", "--jobs", "40", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_cli_cadence_params_reach_the_policy_and_bad_ones_name_the_flag() -> None:
    # k-decline, whose hints the fraction moves (the default detector's hints come from its p-value)
    kd = ("--detector", "k-decline")
    loose = json.loads(_cli_run(*kd, "--cadence", "adaptive", "--cadence-param", "fraction=0.75", "--json").stdout)
    tight = _cli_run(
        *kd, "--cadence", "adaptive", "--cadence-param", "fraction=0.25", "--cadence-param", "p_hint=0.8", "--json"
    )
    m = json.loads(tight.stdout)
    assert m["config"]["cadence"] == {"name": "adaptive", "params": {"fraction": 0.25, "p_hint": 0.8}}
    assert loose["config"]["cadence"] == {"name": "adaptive", "params": {"fraction": 0.75}}
    assert m["extra_evals"] > 0 and loose["extra_evals"] > 0 and m["extra_evals"] != loose["extra_evals"]
    for args, needle in (
        (("--cadence-param", "fraction=0.5"), "--cadence-param needs --cadence adaptive"),
        (("--cadence", "adaptive", "--cadence-param", "fraction=1.5"), "fraction"),
        (("--cadence", "adaptive", "--cadence-param", "speed=2"), "speed"),
        (("--cadence", "adaptive", "--cadence-param", "fraction"), "key=value"),
    ):
        bad = _cli_run(*args)
        assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)


def test_cli_max_extra_evals_caps_the_extra_evals_and_bad_ones_name_the_flag() -> None:
    kd = ("--detector", "k-decline")  # hints often enough that a cap of one per job binds
    free = json.loads(_cli_run(*kd, "--cadence", "adaptive", "--json").stdout)
    capped = json.loads(_cli_run(*kd, "--cadence", "adaptive", "--max-extra-evals", "1", "--json").stdout)
    assert capped["config"]["max_extra_evals"] == 1 and free["config"]["max_extra_evals"] is None
    assert 0 < capped["extra_evals"] < free["extra_evals"]
    assert capped["extra_evals"] <= capped["jobs"]  # at most one per job
    for args, needle in (
        (("--max-extra-evals", "2"), "--max-extra-evals needs --cadence adaptive"),
        (("--cadence", "adaptive", "--max-extra-evals", "-1"), "--max-extra-evals must be an integer >= 0"),
        (("--cadence", "adaptive", "--max-extra-evals", "x"), "--max-extra-evals"),
    ):
        bad = _cli_run(*args)
        assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)


def test_cli_max_eval_share_limits_the_extra_evals_and_bad_ones_name_the_flag() -> None:
    kd = ("--detector", "k-decline")  # hints often enough that the share binds
    free = json.loads(_cli_run(*kd, "--cadence", "adaptive", "--json").stdout)
    shared = json.loads(_cli_run(*kd, "--cadence", "adaptive", "--max-eval-share", "0.052", "--json").stdout)
    assert shared["config"]["max_eval_share"] == 0.052 and shared["config"]["max_extra_evals"] is None
    assert free["config"]["max_eval_share"] is None
    assert 0 < shared["extra_evals"] < free["extra_evals"] and shared["eval_gpu_h"] < free["eval_gpu_h"]
    for args, needle in (
        (("--max-eval-share", "0.1"), "--max-eval-share needs --cadence adaptive"),
        (("--cadence", "adaptive", "--max-eval-share", "1"), "--max-eval-share must be a number strictly between"),
        (("--cadence", "adaptive", "--max-eval-share", "nan"), "--max-eval-share must be a number strictly between"),
        (("--cadence", "adaptive", "--max-eval-share", "x"), "--max-eval-share"),
    ):
        bad = _cli_run(*args)
        assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)


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


# -- extra evals with per-example scores, and dense traces on the platform -------------------------------------------


def test_an_extra_eval_gets_per_example_scores_around_its_mean(workload) -> None:
    import numpy as np

    from platform_sim.sim.eval_scores import PerExampleObservation

    job = next(j for j in workload.jobs if j.job_type == "rlhf")
    before = PerExampleObservation(workload).observe_eval(job, 3, 3 / workload.n_evals)
    obs = PerExampleObservation(workload)
    score, examples = obs.observe_at(job, 2.5 / workload.n_evals, 25)
    assert examples is not None and len(examples) == obs.config.examples
    assert float(np.mean(examples)) == pytest.approx(score, abs=1e-12)  # the mean is the extra eval's score
    assert obs.observe_eval(job, 3, 3 / workload.n_evals) == before  # an extra eval shifts no regular draw
    again = PerExampleObservation(workload).observe_at(job, 2.5 / workload.n_evals, 25)
    assert again == (score, examples)  # from the job's private stream: reproducible


def test_a_dense_trace_job_reads_the_nearest_recorded_eval(tmp_path) -> None:
    from dataclasses import replace

    from _trace_factory import hacking_curve, write

    from platform_sim.sim.eval_scores import RecordedExamplesObservation
    from platform_sim.sim.traces import load_trace
    from platform_sim.studies.replay import build_replay_workload, recorded_observation, trace_curves
    from platform_sim.studies.trace_detection import trace_scales

    means = hacking_curve(60)
    trace = load_trace(write(tmp_path / "dense.jsonl", means, every=1, examples=8, noise=0.05))
    scales = trace_scales([trace])
    curves = trace_curves([trace], scales)
    wl = build_replay_workload(replace(WorkloadConfig(n_jobs=20), n_evals=12), curves, seed=0)
    spec = recorded_observation([trace], curves, n_evals=12)
    obs = RecordedExamplesObservation(wl, **spec["params"])
    job = next(j for j in wl.jobs if j.job_type == "rlhf")
    s = scales[trace.name]
    for step in (7, 23, 41):  # off the 12-eval grid (every 5 steps): the recorded eval of that step
        score, examples = obs.observe_at(job, step / 60 + 0.2 / 60, step)  # nearer to `step` than to step + 1
        i = trace.steps.index(step)
        assert score == pytest.approx(s(trace.scores[i]))
        assert examples == pytest.approx([s(v) for v in trace.examples[i]])


def test_replay_takes_a_sparser_regular_grid_for_dense_traces(tmp_path) -> None:
    from _trace_factory import hacking_curve, healthy_curve, write

    from platform_sim.sim.traces import load_traces
    from platform_sim.studies.replay import replay

    write(tmp_path / "hack.jsonl", hacking_curve(60), every=1)
    write(tmp_path / "ok.jsonl", healthy_curve(60), every=1)
    traces = load_traces(tmp_path)
    res = replay(traces, WorkloadConfig(n_jobs=30), None, seeds=1, n_evals=12, cadence="adaptive")
    assert res["config"]["grid_evals"] == 12 and res["config"]["workload"]["n_evals"] == 12
    # the per-trace rows see the 12 regular evals of each 60-step trace, under the labels of the whole curves
    assert [r["evals"] for r in res["traces"]] == [12, 12]
    assert {r["trace"]: r["label"] for r in res["traces"]} == {t.name: t.label for t in traces}
    # The callback's budget reaches the replayed jobs: none at 0, and it is written in the config.
    evalstop = next(r for r in res["main"] if r["stop"] == "evalstop")
    capped = replay(
        traces, WorkloadConfig(n_jobs=30), None, seeds=1, n_evals=12, cadence="adaptive", eval_budget=EvalBudget(0)
    )
    assert evalstop["extra_evals"] > 0 and res["config"]["max_extra_evals"] is None
    assert next(r for r in capped["main"] if r["stop"] == "evalstop")["extra_evals"] == 0
    assert capped["config"]["max_extra_evals"] == 0 and capped["config"]["max_eval_share"] is None
    with pytest.raises(ValueError, match="n_evals"):
        replay(traces, WorkloadConfig(n_jobs=30), None, seeds=1, n_evals=1)
    proc = subprocess.run(
        [sys.executable, "-m", "platform_sim.cli", "replay", "--traces", str(tmp_path), "--grid-evals", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--grid-evals must be an integer >= 2" in proc.stderr


def test_confirmed_stops_are_taken_at_the_second_look(workload) -> None:
    # confirm=0 confirms every stop that has a doubt (shape's is above 0), and p_hint=0 asks for nothing else, so
    # every stop of the run lands at an extra eval half an interval after the regular eval that first stopped it.
    shape = {"name": "shape", "params": {"se": 0.02, "threshold": 0.7, "min_tau": 2.0}}
    fixed = _run(workload, detector=shape)
    confirmed = _run(
        workload,
        detector=shape,
        cadence={"name": "adaptive", "params": {"fraction": 0.5, "p_hint": 0.0, "confirm": 0.0}},
    )
    stops = [o for o in confirmed.outcomes if o.stopped]
    assert stops and all(o.stop_eval % 1 == pytest.approx(0.5) for o in stops)
    assert all(o.extra_evals >= 1 for o in stops)
    first = {o.job_id: o.stop_eval for o in fixed.outcomes if o.stopped}
    # A job the fixed cadence stops is stopped half an interval after that eval at the soonest (later still when
    # the second look did not confirm the first stop).
    for o in stops:
        if o.job_id in first:
            assert o.stop_eval >= first[o.job_id] + 0.5
    # On this workload the second looks veto more stops than the extra points add.
    assert len(stops) <= len(first)


def test_cli_takes_the_confirm_and_p_hint_at_best_params() -> None:
    out = _cli_run(
        "--cadence", "adaptive", "--cadence-param", "confirm=0.3", "--cadence-param", "p_hint_at_best=0.7", "--json"
    )
    assert out.returncode == 0, out.stderr
    params = json.loads(out.stdout)["config"]["cadence"]["params"]
    assert params == {"fraction": 0.25, "p_hint_at_best": 0.7, "confirm": 0.3}
    bad = _cli_run("--cadence", "adaptive", "--cadence-param", "confirm=1.5")
    assert bad.returncode == 2 and "confirm" in bad.stderr
