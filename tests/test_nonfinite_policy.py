"""The one non-finite policy: a NaN or inf eval score is refused, in one line naming the job and the step, by every
entry point: the callback, ``evalstop watch``, the verl adapter and the reports every client takes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _watch_helpers import env

from evalstop_callbacks.client import EmbeddedClient, NonFiniteScoreError, make_report
from evalstop_callbacks.watch import Watcher, WatchError


def _one_line(text: str, job: str, step: int) -> None:
    assert "\n" not in text and f"job {job!r}" in text and f"at step {step}" in text and "refused" in text


def test_clients_get_no_report_of_a_nan_or_inf(tmp_path: Path) -> None:
    client = EmbeddedClient()
    job = client.register("rlhf", job_id="clients")
    client.report(make_report(job, "rlhf", 0, 0.5))
    for score, scores in ((math.nan, None), (math.inf, None), (0.5, [0.1, math.nan])):
        with pytest.raises(NonFiniteScoreError) as info:
            make_report(job, "rlhf", 1, score, scores)
        _one_line(str(info.value), job, 1)
    assert client.monitor(job).steps == [0]  # nothing reached the core


def test_watch_refuses_a_nan_of_the_watched_metric(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [{"step": 10, "eval_score": 0.5, "other": float("nan")}, {"step": 20, "eval_score": float("nan")}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))  # json writes NaN, as verl's logger does
    watcher = Watcher(log, "eval_score", job_id="watched", warm_up=False)
    with pytest.raises(WatchError) as info:
        watcher.finish()  # a NaN of another series is no matter; the watched one's is refused
    _one_line(str(info.value), "watched", 20)
    done = subprocess.run(
        [sys.executable, "-m", "evalstop_callbacks.watch", str(log), "--metric", "eval_score", "--job-id", "cli"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "non-finite eval score nan at step 20" in error[0], done.stderr


def test_the_verl_adapter_refuses_a_nan_validation() -> None:
    from evalstop_callbacks.verl_monitor import EvalStopMonitor, VerlEvalStopConfig

    monitor = EvalStopMonitor(VerlEvalStopConfig(metric="val-core/*"), EmbeddedClient(), "verl-job")
    monitor.observe(10, {"val-core/x": 0.5})
    with pytest.raises(NonFiniteScoreError) as info:
        monitor.observe(20, {"val-core/x": float("nan")})
    _one_line(str(info.value), "verl-job", 20)
    assert monitor.evals == [[10, 0.5]]


def test_the_callback_refuses_a_nan_evaluation() -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from evalstop_callbacks import EvalResult, EvalStopCallback, Evaluator, EvaluatorError

    class NaNAtSecond(Evaluator):
        calls = 0

        def evaluate(self, model, tokenizer=None):
            self.calls += 1
            return EvalResult(1.0 if self.calls == 1 else float("inf"))

    cb = EvalStopCallback(NaNAtSecond(), eval_steps=1, job_id="callback-job")  # no trainer: the events by hand
    args, state, control = TrainingArguments(output_dir="unused", report_to="none"), TrainerState(), TrainerControl()
    state.max_steps = 5
    cb.on_train_begin(args, state, control)
    state.global_step = 1
    with pytest.raises(EvaluatorError) as info:
        cb.on_step_end(args, state, control)
    _one_line(str(info.value), "callback-job", 1)
    assert [h["step"] for h in cb.history] == [0]
