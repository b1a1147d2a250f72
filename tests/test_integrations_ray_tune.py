"""EvalStopScheduler inside real Ray Tune experiments (a local Ray instance with 2 CPUs, started once per module).

- recorded traces as trials: Tune's stop steps equal the embedded core's, with ASHA as the base and, through the
  command line (its own Ray instance, one JSON object), with FIFO;
- the scheduler's state survives an interrupted experiment and ``Tuner.restore``;
- a real tiny GRPO run with EvalStopCallback(client=TuneClient(...)) is stopped by the scheduler, not by itself, and
  Tune keeps the best checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from platform_sim.core import default_spec, detector_from_spec, paper_spec  # noqa: E402
from platform_sim.integrations.ray_tune import LOG_FILE, EvalStopScheduler  # noqa: E402
from platform_sim.sim.corpora import corpus_dir  # noqa: E402
from platform_sim.sim.traces import load_trace  # noqa: E402
from platform_sim.studies.trace_detection import corpus_scale, trace_detection  # noqa: E402
from platform_sim.studies.tune_replay import RESOURCE, TuneReplayConfig, tune_replay  # noqa: E402

TESTS = Path(__file__).resolve().parent
# Two hacking traces and two healthy ones (the paper's rule stops grpo-gold-kl0-s0, the default detector neither).
# The default stops grpo-proxy-kl0-s4 at step 130 when its reports carry the header's planned_steps (per run), at 120
# without them (per look): Tune's trials must report the plan as the core's check reads it.
FOUR = (
    "bow-proxy-grpo-proxy-kl0-s0",
    "bow-proxy-grpo-proxy-kl0-s4",
    "bow-proxy-grpo-gold-kl0-s0",
    "bow-proxy-grpo-gold-kl0-s2",
)


@pytest.fixture(scope="module")
def local_ray():
    # The workers import the test helpers (GRPO test) from this folder.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS)] + ([old] if old else []))
    ray.init(num_cpus=2, resources={RESOURCE: 2}, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def four_traces():
    return [load_trace(corpus_dir("real") / f"{name}.jsonl") for name in FOUR]


def _assert_stops_equal_the_core(results, traces, base):
    """Tune's stop steps in ``results`` (tune_replay's, or the CLI's JSON) are the embedded core's, run with the
    default detector on the same traces."""
    scale = corpus_scale(traces)
    core = {t.name: trace_detection(t, default_spec(), scale)["stop_step"] for t in traces}
    rows = {r["trace"]: r for r in results["traces"]}
    assert results["decisions_equal_core"] is True
    for name, stop in core.items():
        if base == "fifo":  # FIFO never ends a trial itself: every stop is EvalStop's, at the core's step
            assert rows[name]["tune_stop_step"] == stop, name
            assert rows[name]["last_step_with"] == (stop if stop is not None else read_last(traces, name))
        assert rows[name]["last_step_without"] <= read_last(traces, name)
    assert core["bow-proxy-grpo-gold-kl0-s2"] is None and core["bow-proxy-grpo-proxy-kl0-s0"] is not None
    if base == "fifo":
        # What EvalStop saves, counted in steps the trials ran (each step is one paced eval): deterministic, where the
        # trial-hours and makespan that follow from it are wall-clock figures that a loaded machine can blur at a
        # 20 ms pace; those are measured in docs/integrations.md, not asserted here.
        ran_with = sum(rows[name]["last_step_with"] for name in core)
        ran_without = sum(rows[name]["last_step_without"] for name in core)
        assert ran_without == sum(read_last(traces, name) for name in core)  # FIFO alone ends no trial early
        assert ran_with < ran_without
        assert results["without"]["stopped_hacking"] == results["without"]["stopped_healthy"] == 0
        assert results["with"]["stopped_hacking"] == 2


def test_tune_stops_equal_the_embedded_core_with_asha(local_ray):
    # With FIFO as the base the same comparison runs through the command line, in
    # test_cli_json_with_fifo_is_one_object_whose_stops_equal_the_embedded_core.
    traces = four_traces()
    results = tune_replay(traces, TuneReplayConfig(base="asha", gpus=2, eval_seconds=0.02, detector=default_spec()))
    _assert_stops_equal_the_core(results, traces, "asha")


def read_last(traces, name):
    return next(t.steps[-1] for t in traces if t.name == name)


def _resumable(config):
    """Reports config['scores'] one per step, with a checkpoint of its position; fails once after config['fail_after']."""
    import tempfile

    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = json.loads(Path(d, "pos.json").read_text())["next"]
    for i in range(start, len(config["scores"])):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "pos.json").write_text(json.dumps({"next": i + 1}))
            tune.report(
                {"step": i + 1, "eval_score": config["scores"][i]}, checkpoint=tune.Checkpoint.from_directory(d)
            )
        marker = Path(config["marker"])
        if i + 1 == config["fail_after"] and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("simulated node loss")


def test_state_survives_experiment_restore(local_ray, tmp_path):
    # One decline before the failure, one after: only a scheduler that kept its state stops at step 5. A fresh one
    # would count the declines again from the resumed evals and stop at step 7.
    scores = [0.1, 0.5, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    config = {"scores": scores, "fail_after": 4, "marker": str(tmp_path / "marker")}
    trainable = tune.with_resources(_resumable, {"CPU": 0, RESOURCE: 1})
    tuner = tune.Tuner(
        trainable,
        param_space=config,
        tune_config=tune.TuneConfig(scheduler=EvalStopScheduler(detector=paper_spec())),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), name="exp", verbose=0),
    )
    first = tuner.fit()
    assert first.errors and first[0].metrics["step"] == 4
    log = tmp_path / "results" / "exp" / LOG_FILE
    assert [r["step"] for r in map(json.loads, log.read_text().splitlines()[1:])] == [1, 2, 3, 4]

    restored = tune.Tuner.restore(str(tmp_path / "results" / "exp"), trainable, resume_errored=True)
    second = restored.fit()
    assert not second.errors
    assert second[0].metrics["step"] == 5  # stopped by EvalStop at the second consecutive decline
    assert [r["step"] for r in map(json.loads, log.read_text().splitlines()[1:])] == [1, 2, 3, 4, 5]
    # The log alone rebuilds the stopped state.
    again = EvalStopScheduler(detector=paper_spec(), persist=False)
    again.replay_log(str(log))
    (tid,) = again.stopped_trials
    assert again.monitor(tid).stopped_at == 5 and again.best(tid) == (3, 0.9)


def _grpo_trial(config):
    from _callback_helpers import tiny_grpo, world_evaluator

    from evalstop_callbacks import EvalStopCallback
    from evalstop_callbacks.tune_client import TuneClient

    out = config["output_dir"]
    cb = EvalStopCallback(
        world_evaluator(), eval_steps=4, k=2, client=TuneClient(out)
    )  # the step-0 baseline and every 4 steps: the same run as tests/test_callback_cadence.py's fixed cadence
    trainer = tiny_grpo(out, cb, max_steps=config["max_steps"])
    trainer.train()
    # Only reached when Tune did not stop the trial: record what the callback saw.
    Path(out, "history.json").write_text(json.dumps(cb.history))


def _run_grpo_under_tune(tmp_path, max_steps):
    scheduler = EvalStopScheduler(detector=paper_spec())  # the callback's k=2: two consecutive declines
    trainable = tune.with_resources(_grpo_trial, {"CPU": 1})
    tuner = tune.Tuner(
        trainable,
        param_space={"output_dir": str(tmp_path / "trainer"), "max_steps": max_steps},
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"),
            name="grpo",
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute="evalstop_checkpoint_score", checkpoint_score_order="max"
            ),
        ),
    )
    grid = tuner.fit()
    assert not grid.errors, grid.errors
    return scheduler, grid[0]


def _assert_stopped_by_scheduler(tmp_path, scheduler, result, max_steps):
    (tid,) = scheduler.stopped_trials
    monitor = scheduler.monitor(tid)
    stop = monitor.stopped_at
    assert stop is not None and stop < max_steps
    # Two consecutive declines of the world score that the trial reported, computed from what Tune received.
    scores = dict(zip(monitor.steps, monitor.scores))
    assert scores[stop] < scores[stop - 4] < scores[stop - 8]
    assert result.metrics["step"] == stop  # the trial's last result is the stop eval: it ran no further eval
    # The client sent the trainer's max_steps with every result, and the scheduler keeps it as the trial's plan.
    assert result.metrics["planned_steps"] == max_steps
    assert scheduler.state_dict()["trials"][tid]["planned_steps"] == max_steps
    assert not (tmp_path / "trainer" / "history.json").exists()  # trainer.train() never returned: Tune stopped it
    # The kept checkpoint is the best one (the callback saved it; the client sent it with its score).
    best_step, best_score = scheduler.best(tid)
    ((ckpt, metrics),) = result.best_checkpoints
    assert metrics["evalstop_checkpoint_step"] == best_step
    assert metrics["evalstop_checkpoint_score"] == best_score
    with ckpt.as_directory() as d:
        assert Path(d, "model.safetensors").exists()


def test_tiny_grpo_trial_is_stopped_by_the_scheduler(local_ray, tmp_path):
    scheduler, result = _run_grpo_under_tune(tmp_path, max_steps=16)
    _assert_stopped_by_scheduler(tmp_path, scheduler, result, 16)


def _cli(*argv, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "platform_sim.cli", "tune", *argv], capture_output=True, text=True, timeout=timeout
    )


def test_cli_json_with_fifo_is_one_object_whose_stops_equal_the_embedded_core(tmp_path):
    # The command line as a user runs it: its own Ray instance, FIFO and the default detector unless told otherwise.
    # Its JSON carries the whole comparison, so the FIFO case of the core comparison is checked on it (one Tune run
    # for both; the ASHA case runs on the module's Ray instance above).
    for name in FOUR:
        (tmp_path / f"{name}.jsonl").write_text((corpus_dir("real") / f"{name}.jsonl").read_text())
    proc = _cli("--traces", str(tmp_path), "--gpus", "2", "--eval-seconds", "0.02", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)  # Tune's own boxes went to stderr
    for side in ("with", "without"):
        assert {"stopped_hacking", "stopped_healthy", "trial_hours", "makespan_s"} <= set(out[side])
    assert out["config"]["base"] == "fifo" and out["config"]["detector"] == detector_from_spec(default_spec()).spec()
    _assert_stops_equal_the_core(out, four_traces(), "fifo")


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--gpus", "2", "--gpus-per-trial", "3"), "--gpus-per-trial (3) exceeds --gpus (2)"),
        (("--eval-seconds", "0"), "--eval-seconds must be a finite number > 0"),
        (("--traces", "/nonexistent-evalstop"), "--traces:"),
        (("--detector", "no-such"), "--detector: unknown detector"),
    ],
)
def test_cli_bad_input_names_the_flag(argv, message):
    proc = _cli(*argv, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stdout == ""


def test_default_detector_is_the_projects_default():
    assert EvalStopScheduler(persist=False).detector_spec == detector_from_spec(default_spec()).spec()


def test_a_trial_that_goes_back_continues_from_its_earlier_evals():
    s = EvalStopScheduler(detector=paper_spec(), persist=False)
    for step, score in [(1, 0.5), (2, 0.9), (3, 0.8)]:
        assert not s.observe("t", {"step": step, "eval_score": score, "loss": 99.0}).should_stop
    assert s.observe("t", {"step": 3, "eval_score": 0.8}).declines == 1  # a re-send: the same decision
    # Restored from the checkpoint of step 2: step 3 again, with another score; the decline of the lost step 3 is gone.
    d = s.observe("t", {"step": 3, "eval_score": 0.95})
    assert d.declines == 0 and d.best_step == 3
    assert s.observe("t", {"step": 4, "eval_score": 0.9}).declines == 1
    assert s.observe("t", {"step": 5, "eval_score": 0.7}).should_stop
    assert s.monitor("t").steps == [1, 2, 3, 4, 5] and set(s.stopped_trials) == {"t"}


def test_state_round_trip_and_bad_results(tmp_path):
    s = EvalStopScheduler(detector=paper_spec(), persist=False)
    for step, score in [(1, 0.9), (2, 0.8), (3, 0.7)]:
        s.observe("t", {"step": step, "eval_score": score})
    s.save(str(tmp_path / "state.json"))
    again = EvalStopScheduler(detector=paper_spec(), persist=False)
    again.restore(str(tmp_path / "state.json"))
    assert again.monitor("t").stopped_at == 3 and set(again.stopped_trials) == {"t"}
    with pytest.raises(ValueError, match="same detector"):
        EvalStopScheduler(detector={"name": "k-decline", "params": {"k": 3}}).restore(str(tmp_path / "state.json"))
    with pytest.raises(ValueError, match="without the step key 'step'"):
        s.observe("u", {"eval_score": 0.5})
    with pytest.raises(ValueError, match="trial u: eval_score must be finite"):
        s.observe("u", {"step": 1, "eval_score": float("nan")})


def test_planned_steps_bound_false_stops_per_trial_and_are_part_of_the_state(tmp_path):
    # Healthy trials reporting at every step with noise of a quarter of the gain: per look the default stops most of
    # them; told the trials' planned steps, none, and a trial whose score falls is still stopped, per run.
    rng = np.random.default_rng(11)
    x = np.arange(1, 301)
    runs = [0.2 + 0.4 * (1 - np.exp(-x / 60)) + rng.normal(0, 0.1, x.size) for _ in range(6)]

    def stopped(s: EvalStopScheduler) -> int:
        for i, run in enumerate(runs):
            for step, value in zip(x, run):
                if s.observe(f"h{i}", {"step": int(step), "eval_score": float(value)}).should_stop:
                    break
        return len(s.stopped_trials)

    assert stopped(EvalStopScheduler(persist=False)) >= 3
    planned = EvalStopScheduler(persist=False, planned_steps=300)
    assert stopped(planned) == 0
    for step in x:
        value = 0.2 + 0.4 * min(step, 100) / 100 - 0.4 * max(0, step - 100) / 100
        d = planned.observe("falls", {"step": int(step), "eval_score": float(value)})
        if d.should_stop:
            break
    assert d.should_stop and 100 < step < 200 and "planned progress (300 planned steps" in d.reason
    planned.save(str(tmp_path / "state.json"))
    again = EvalStopScheduler(persist=False, planned_steps=300)
    again.restore(str(tmp_path / "state.json"))
    assert set(again.stopped_trials) == {"falls"}
    with pytest.raises(ValueError, match="planned_steps=300.*planned_steps=None"):
        EvalStopScheduler(persist=False).restore(str(tmp_path / "state.json"))
    with pytest.raises(ValueError, match="planned_steps must be an integer >= 1"):
        EvalStopScheduler(persist=False, planned_steps=0)


def test_a_results_own_planned_steps_decide_per_trial_and_survive_a_rewind_and_a_restore(tmp_path):
    # TuneClient sends the trainer's max_steps as the result's planned_steps: no scheduler argument needed.
    rng = np.random.default_rng(11)
    x = np.arange(1, 301)
    run = 0.2 + 0.4 * (1 - np.exp(-x / 60)) + rng.normal(0, 0.1, x.size)
    s = EvalStopScheduler(persist=False)
    per_look = EvalStopScheduler(persist=False)
    for step, value in zip(x, run):
        s.observe("t", {"step": int(step), "eval_score": float(value), "planned_steps": 300})
        if not per_look.stopped_trials:
            per_look.observe("t", {"step": int(step), "eval_score": float(value)})
    assert set(per_look.stopped_trials) == {"t"} and not s.stopped_trials
    # A rewind re-feeds the kept evals with the trial's plan: the same state as feeding them afresh.
    s.observe("t", {"step": 150, "eval_score": 0.9})
    fresh = EvalStopScheduler(persist=False)
    for step, value in zip(x[:149], run[:149]):
        fresh.observe("t", {"step": int(step), "eval_score": float(value), "planned_steps": 300})
    fresh.observe("t", {"step": 150, "eval_score": 0.9})
    assert s.monitor("t").state_dict() == fresh.monitor("t").state_dict()
    assert s.state_dict()["trials"]["t"]["planned_steps"] == 300
    s.save(str(tmp_path / "state.json"))
    again = EvalStopScheduler(persist=False)
    again.restore(str(tmp_path / "state.json"))
    assert again.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="trial u: planned_steps must be an integer >= 1"):
        s.observe("u", {"step": 1, "eval_score": 0.5, "planned_steps": 0})
