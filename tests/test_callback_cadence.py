"""The callback follows the scheduler core's cadence hint in a real tiny GRPO run (GPT-2 built locally, CPU, TRL).

The proxy rewards negative words, so the held-out world score declines. With the fixed cadence the run is evaluated
every 4 steps; with the adaptive cadence the core asks, after a first decline, for the next eval half an interval
later: the callback evaluates there, and the confirming decline comes (and the run stops) sooner.
"""

from __future__ import annotations

import json

import pytest
from _callback_helpers import tiny_grpo, world_evaluator

from evalstop_callbacks import EvalStopCallback
from evalstop_callbacks.platform_client import PlatformClient
from evalstop_callbacks.tune_client import TuneClient
from platform_sim.trace_format import read_trace


def test_grpo_follows_the_hint_and_stops_sooner(tmp_path) -> None:
    fixed = EvalStopCallback(world_evaluator(), eval_steps=4, k=2)
    tiny_grpo(tmp_path / "fixed", fixed).train()
    trace = tmp_path / "adaptive.jsonl"
    adaptive = EvalStopCallback(
        world_evaluator(),
        eval_steps=4,
        k=2,
        trace_path=str(trace),
        cadence={"name": "adaptive", "params": {"fraction": 0.5}},
        max_extra_evals=2,
    )
    tiny_grpo(tmp_path / "adaptive", adaptive).train()

    assert fixed.stopped_at is not None, fixed.history
    assert adaptive.extra_eval_steps, adaptive.history
    # Every extra eval is at the step the core hinted after a first decline: 2 steps (half of 4) later.
    steps = [h["step"] for h in adaptive.history]
    for extra in adaptive.extra_eval_steps:
        before = adaptive.history[steps.index(extra) - 1]
        assert before["declines"] == 1 and extra == before["step"] + 2 and before["step"] % 4 == 0
    assert [h["step"] for h in adaptive.history if h.get("extra")] == adaptive.extra_eval_steps
    assert len(adaptive.extra_eval_steps) <= 2
    # It stopped sooner after its best (peak) eval than the fixed cadence did.
    assert adaptive.stopped_at is not None and adaptive.stopped_at < fixed.stopped_at
    assert adaptive.stopped_at - adaptive.best_step < fixed.stopped_at - fixed.best_step
    # The trace records the extra evals as eval lines at their steps, and the cadence in its header.
    lines = read_trace(trace).lines()  # a valid trace: the extra evals are eval lines like any other
    assert lines[0]["config"]["cadence"] == {"name": "adaptive", "params": {"fraction": 0.5}}
    assert set(adaptive.extra_eval_steps) <= {x["step"] for x in lines if x["kind"] == "eval"}


def test_zero_budget_ignores_hints_and_bad_arguments(tmp_path) -> None:
    cb = EvalStopCallback(world_evaluator(), eval_steps=4, k=2, cadence="adaptive", max_extra_evals=0)
    tiny_grpo(tmp_path, cb, max_steps=12).train()
    assert cb.extra_eval_steps == [] and all(h["step"] % 4 == 0 for h in cb.history)
    with pytest.raises(ValueError, match="unknown cadence"):
        EvalStopCallback(world_evaluator(), eval_steps=4, cadence="often")
    with pytest.raises(ValueError, match="max_extra_evals"):
        EvalStopCallback(world_evaluator(), eval_steps=4, cadence="adaptive", max_extra_evals=-1)
    # A client whose register takes no cadence (Tune's trial scheduler decides there) is refused, naming it; the
    # HTTP client takes one (the service decides the hints).
    with pytest.raises(ValueError, match="TuneClient.register takes no cadence"):
        EvalStopCallback(world_evaluator(), eval_steps=4, cadence="adaptive", client=TuneClient())
    with PlatformClient("http://127.0.0.1:9", "token") as http_client:
        cb = EvalStopCallback(world_evaluator(), eval_steps=4, cadence="adaptive", client=http_client)
        assert cb.cadence_spec == {"name": "adaptive", "params": {"fraction": 0.25}}


def test_embedded_client_keeps_the_cadence_across_a_resume() -> None:
    from evalstop_callbacks.client import EmbeddedClient
    from platform_sim.core import Report, paper_spec

    client = EmbeddedClient()
    paper = paper_spec()  # the hints below are the paper rule's (after a first decline)
    job = client.register("rlhf", paper, job_id="j", cadence={"name": "adaptive", "params": {"fraction": 0.5}})
    client.report(Report(job, "rlhf", 4, 1.0))
    assert client.report(Report(job, "rlhf", 8, 0.5)).next_eval_step == 10
    resumed = EmbeddedClient()
    resumed.load_state_dict(json.loads(json.dumps(client.state_dict())))
    again = resumed.register("rlhf", paper, job_id="j", cadence={"name": "adaptive", "params": {"fraction": 0.5}})
    assert again == "j"  # re-registration after a resume (same type, detector, cadence) keeps the state
    assert resumed.report(Report(job, "rlhf", 8, 0.5)).next_eval_step == 10  # the re-sent eval's decision
    assert resumed.report(Report(job, "rlhf", 10, 0.6)).next_eval_step is None  # no decline: regular interval


def test_a_resumed_run_keeps_the_cadence_it_was_registered_with() -> None:
    from evalstop_callbacks.client import EmbeddedClient
    from platform_sim.core import Report

    client = EmbeddedClient()
    job = client.register("rlhf", None, job_id="j")  # fixed cadence: no hints
    client.report(Report(job, "rlhf", 4, 1.0))
    resumed = EmbeddedClient()
    resumed.load_state_dict(json.loads(json.dumps(client.state_dict())))
    # as the service answers 409 to another cadence for a registered job
    with pytest.raises(ValueError, match="already registered with cadence fixed"):
        resumed.register("rlhf", None, job_id="j", cadence="adaptive")
    assert resumed.register("rlhf", None, job_id="j") == "j"


def test_grpo_confirms_a_weak_stop_at_the_hinted_step(tmp_path) -> None:
    # trend (k=1) stops at its first significant fall; with confirm=0 every such stop (its p-value is above 0) is
    # first answered CONTINUE with a hint half an interval later, and the run stops there if the fall holds.
    detector = {"name": "trend", "params": {"window": 3, "alpha": 0.2}}
    fixed = EvalStopCallback(world_evaluator(), eval_steps=4, detector=detector)
    tiny_grpo(tmp_path / "fixed", fixed, max_steps=24).train()
    cb = EvalStopCallback(
        world_evaluator(),
        eval_steps=4,
        detector=detector,
        cadence={"name": "adaptive", "params": {"fraction": 0.5, "p_hint": 0.0, "confirm": 0.0}},
        max_extra_evals=4,
    )
    tiny_grpo(tmp_path / "confirm", cb, max_steps=24).train()

    assert fixed.stopped_at is not None, fixed.history
    decisions = cb.client.monitor(cb.job_id).decisions
    steps = [h["step"] for h in cb.history]
    confirming = [s for s, d in zip(steps, decisions) if "confirming a stop" in d.reason]
    # The fixed cadence's stop is the first weak stop here: it is confirmed at the hinted step, an extra eval.
    assert confirming[0] == fixed.stopped_at
    for s in confirming:
        assert steps[steps.index(s) + 1] == s + 2 and s + 2 in cb.extra_eval_steps
    assert cb.stopped_at == confirming[-1] + 2 and cb.history[-1]["action"] == "stop"


def test_the_time_budget_declines_hints_once_evaluation_has_taken_its_share(tmp_path, monkeypatch) -> None:
    # A fake clock for the callback: each training step takes 1 s, each evaluation `cost` s. Evaluating every 4
    # steps at 10 s an eval spends about 70% of the run evaluating, over a budget of half; at 0.1 s about 2.5%.
    import types

    from transformers import TrainerCallback

    from evalstop_callbacks import eval_round as eval_round_module
    from evalstop_callbacks import schedule as schedule_module

    now = [0.0]
    for module in (eval_round_module, schedule_module):  # the evaluator's timer and the schedule's wall clock
        monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class _Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            now[0] += 1.0

    def run(name: str, cost: float) -> EvalStopCallback:
        evaluator = world_evaluator()
        evaluate = evaluator.evaluate

        def timed(model, tok):
            now[0] += cost
            return evaluate(model, tok)

        evaluator.evaluate = timed  # type: ignore[method-assign]
        cb = EvalStopCallback(
            evaluator,
            eval_steps=4,
            k=2,
            cadence={"name": "adaptive", "params": {"fraction": 0.5}},
            max_extra_evals=2,
            max_eval_share=0.5,
            trace_path=str(tmp_path / f"{name}.jsonl"),
        )
        trainer = tiny_grpo(tmp_path / name, cb)
        trainer.add_callback(_Steps())
        trainer.train()
        return cb

    cheap, dear = run("cheap", 0.1), run("dear", 10.0)
    assert cheap.extra_eval_steps, cheap.history  # within the budget: the hint is followed
    hinted = [d.next_eval_step for d in dear.client.monitor(dear.job_id).decisions if d.next_eval_step is not None]
    assert hinted and dear.extra_eval_steps == []  # the core hinted; the spent budget declined it
    assert all(h["step"] % 4 == 0 for h in dear.history)
    assert read_trace(tmp_path / "dear.jsonl").lines()[0]["config"]["max_eval_share"] == 0.5
    for bad in (0, 1, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="max_eval_share"):
            EvalStopCallback(world_evaluator(), eval_steps=4, cadence="adaptive", max_eval_share=bad)


def test_the_count_budget_stops_following_hints_once_spent(tmp_path) -> None:
    # k=3 at a quarter of a 4-step interval: the core hints after each of the first two declines.
    def run(name: str, budget: int) -> EvalStopCallback:
        cb = EvalStopCallback(
            world_evaluator(),
            eval_steps=4,
            k=3,
            cadence={"name": "adaptive", "params": {"fraction": 0.25}},
            max_extra_evals=budget,
        )
        tiny_grpo(tmp_path / name, cb).train()
        return cb

    free = run("free", 10)
    assert len(free.extra_eval_steps) >= 2, free.history  # the run asks for more than one extra eval
    one = run("one", 1)
    assert len(one.extra_eval_steps) == 1, one.history
    # The core hinted again at a later regular eval (one look per interval); the spent budget declined it: nothing
    # was evaluated at that step.
    monitor = one.client.monitor(one.job_id)
    extra = one.extra_eval_steps[0]
    later = [d.next_eval_step for s, d in zip(monitor.steps, monitor.decisions) if s > extra and d.next_eval_step]
    assert later and not set(later) & set(monitor.steps), one.history
