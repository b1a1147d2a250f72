"""The one non-finite policy (:mod:`evalstop_callbacks.nonfinite`), the same at every entry point: a NaN or inf eval
is recorded, warned about with its step and metric, never sent to the scheduler and never decided on; three in a row
(``max_non_finite``, configurable) end the run gracefully with a reason naming the broken evaluation. The clients
never send one (the core and the service refuse it)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from evalstop_callbacks.client import EmbeddedClient, NonFiniteScoreError, make_report
from evalstop_callbacks.nonfinite import NonFinitePolicy
from evalstop_callbacks.watch import Watcher


def test_no_client_is_ever_handed_a_nan_or_inf() -> None:
    client = EmbeddedClient()
    job = client.register("rlhf", job_id="clients")
    client.report(make_report(job, "rlhf", 0, 0.5))
    for score, scores in ((math.nan, None), (math.inf, None), (0.5, [0.1, math.nan])):
        with pytest.raises(NonFiniteScoreError) as info:
            make_report(job, "rlhf", 1, score, scores)
        assert "\n" not in str(info.value) and "at step 1" in str(info.value)
    assert client.monitor(job).steps == [0]  # nothing reached the core


def test_the_policy_counts_in_a_row_and_a_finite_eval_resets_it(caplog: pytest.LogCaptureFixture) -> None:
    policy = NonFinitePolicy(max_consecutive=2, where="here")
    with caplog.at_level(logging.WARNING, logger="evalstop_callbacks.nonfinite"):
        assert policy.check(10, 0.5) and not policy.exhausted
        assert not policy.check(20, math.nan, metric="acc") and not policy.exhausted
        assert policy.check(30, 0.4) and policy.consecutive == 0  # a finite eval ends the run of broken ones
        assert not policy.check(40, 0.4, [0.1, math.inf]) and not policy.exhausted
        assert not policy.check(50, math.nan) and policy.exhausted
    assert policy.steps == [20, 40, 50]
    assert "here: non-finite eval score nan of acc at step 20" in caplog.messages[0]
    assert "per-example score inf (example 1)" in caplog.messages[1]
    assert "steps 40, 50" in policy.reason("acc") and "2 non-finite evaluations of acc in a row" in policy.reason("acc")
    with pytest.raises(ValueError, match="max_non_finite must be an integer >= 1, got 0"):
        NonFinitePolicy(max_consecutive=0)


def _jsonl(path: Path, values: list[float]) -> None:
    path.write_text("".join(json.dumps({"step": 10 * (i + 1), "acc": v}) + "\n" for i, v in enumerate(values)))


def test_the_watcher_skips_a_nan_and_stops_at_three_in_a_row(tmp_path: Path) -> None:
    once, broken = tmp_path / "once.jsonl", tmp_path / "broken.jsonl"
    _jsonl(once, [0.5, 0.6, math.nan, 0.7, 0.8])  # json writes NaN, as verl's file logger does
    result = Watcher(once, "acc", job_id="once", warm_up=False).finish()
    assert (result.decision, result.non_finite) == ("continue", [[30, "eval score nan"]])
    assert [step for step, _ in result.evals] == [10, 20, 40, 50] and result.best_step == 50
    _jsonl(broken, [0.5, 0.9, math.nan, math.inf, math.nan, 0.7])
    result = Watcher(broken, "acc", job_id="broken", warm_up=False).finish()
    assert (result.decision, result.stop_step, result.best_step, result.best_score) == ("stop", 50, 20, 0.9)
    assert "3 non-finite evaluations of acc in a row (steps 30, 40, 50" in result.reason
    observed = Watcher(broken, "acc", job_id="observed", warm_up=False, mode="observe").finish()
    assert (observed.decision, observed.would_stop_step, observed.evals[-1]) == ("continue", 50, [60, 0.7])
    assert Watcher(broken, "acc", job_id="four", warm_up=False, max_non_finite=4).finish().decision == "continue"


def test_the_verl_adapter_records_a_nan_validation_and_ends_after_three() -> None:
    from evalstop_callbacks.verl_monitor import EvalStopMonitor, VerlEvalStopConfig

    monitor = EvalStopMonitor(VerlEvalStopConfig(metric="val-core/*"), EmbeddedClient(), "verl-job")
    assert monitor.observe(10, {"val-core/x": 0.5}) is not None
    assert monitor.observe(20, {"val-core/x": float("nan")}) is None  # not decided on
    assert monitor.observe(30, {"val-core/x": 0.6}) is not None and not monitor.stopping
    for step in (40, 50, 60):
        assert monitor.observe(step, {"val-core/x": float("nan")}) is None
    assert monitor.stopping and monitor.evals == [[10, 0.5], [30, 0.6]]
    result = monitor.result(None)
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", 60, 30)
    assert [step for step, _ in result["non_finite"]] == [20, 40, 50, 60]
    assert "non-finite evaluations of val-core/x in a row (steps 40, 50, 60" in result["reason"]
    saved = monitor.state_dict()
    again = EvalStopMonitor(VerlEvalStopConfig(metric="val-core/*"), EmbeddedClient(), "verl-job")
    again.load_state_dict(json.loads(json.dumps(saved)))
    assert again.result(None) == result  # a resumed run keeps the record
    with pytest.raises(ValueError, match="trainer.evalstop.max_non_finite must be an integer >= 1"):
        VerlEvalStopConfig(max_non_finite=0)
