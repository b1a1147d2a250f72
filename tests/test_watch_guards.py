"""``evalstop watch`` never leaves a run unprotected in silence: the mistakes people make every day, against real
processes (the stand-in trainer ``tests/_watch_child.py``, a shell wrapper around it, a process that is gone).

- a misspelt ``--metric`` is warned about while the run goes on (naming the series seen and the closest one), and the
  watch exits non-zero at the end because it decided on nothing;
- a log path that does not exist is said to be missing, and the watch exits non-zero if it never appears;
- a NaN evaluation mid-run is recorded and skipped: the watch still stops the run at its later decline;
  three in a row stop it, the reason naming the broken evaluation;
- ``--pid`` of a wrapper (``bash -c "python child.py; ..."``): the trainer child ends at the stop, not only bash;
- ``--pid`` of no process is refused at the start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from _watch_helpers import CHILD, HACKING, HEALTHY, child, env, evals, last_json, trace_path, watch

from evalstop_callbacks.client import EmbeddedClient
from platform_sim.core import Report, default_spec

METRIC = "val-core/openai/gsm8k/reward/mean@1"
PACE = "0.3"  # seconds per log line: the child outlives the watch's start and decision on a loaded machine


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (absent, or a zombie waiting for a parent that does not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _core_stop(skip: set[int]) -> int | None:
    """Where the embedded core stops the HACKING curve with the steps in ``skip`` left out."""
    client = EmbeddedClient()
    job = client.register("rlhf", detector=default_spec(), job_id="ref")
    for ev in evals(HACKING):
        if ev["step"] not in skip and client.report(Report(job, "rlhf", ev["step"], ev["eval_score"])).should_stop:
            return int(ev["step"])
    return None


def test_a_misspelt_metric_is_warned_about_early_and_fails_at_the_end(tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    proc = child(HEALTHY, log, "verl", METRIC, "--pace", "0.05")
    try:
        done = watch(str(log), "--metric", "val-core/openai/gsm8k/reward/mean@l", "--pid", str(proc.pid), timeout=120)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0  # the run itself went on to its end
    assert done.returncode == 2, done.stderr
    early = [line for line in done.stderr.splitlines() if "has not appeared" in line]
    assert len(early) == 1 and f"closest: {METRIC!r}" in early[0] and "train/loss" in early[0], done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("evalstop watch: error: --metric 'val-core/openai/gsm8k/reward/mean@l' never appeared")
    assert f"closest: {METRIC!r}" in error
    result = json.loads((tmp_path / "verl.jsonl.evalstop.json").read_text())
    assert result["decision"] == "continue" and result["evals"] == [] and "never appeared" in result["ended"]


def test_a_missing_log_is_said_and_fails_if_it_never_appears(tmp_path: Path) -> None:
    log = tmp_path / "nowhere" / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(6)"])
    try:
        done = watch(str(log), "--metric", METRIC, "--pid", str(proc.pid), timeout=120)
    finally:
        proc.wait(timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{log} does not exist yet: waiting for the trainer to create it" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"evalstop watch: error: the log {log} never appeared: nothing was watched (check the path the run writes)"
    )
    # A log that appears late is followed from its start once it does.
    late = tmp_path / "late.jsonl"
    proc = child(HACKING, late, "verl", METRIC, "--pace", "0.02", "--start-after", "3")
    try:
        done = watch(str(late), "--metric", METRIC, timeout=120)
    finally:
        proc.wait(timeout=60)
    assert "does not exist yet" in done.stderr  # said, then watched: stopped at the curve's decline (no --pid)
    assert done.returncode == 0 and last_json(done.stdout)["stop_step"] == _core_stop(set()), done.stderr


def test_a_nan_mid_run_is_recorded_and_the_later_decline_still_stops_the_run(tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    proc = child(HACKING, log, "verl", METRIC, "--pace", PACE, "--nan-at", "30")
    try:
        done = watch(str(log), "--metric", METRIC, "--pid", str(proc.pid), "--grace", "5", timeout=120)
    finally:
        proc.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    want = _core_stop({30})
    assert want is not None and want > 30
    assert (result["decision"], result["stop_step"]) == ("stop", want)
    assert result["non_finite"] == [[30, "eval score nan"]]
    assert 30 not in [step for step, _ in result["evals"]]
    assert proc.returncode != 0  # terminated at the stop, not run to its end
    warned = [line for line in done.stderr.splitlines() if "non-finite eval score nan" in line]
    assert len(warned) == 1 and "at step 30" in warned[0] and METRIC in warned[0], done.stderr
    assert json.loads((tmp_path / "verl.jsonl.evalstop.json").read_text()) == result


def test_three_nans_in_a_row_stop_the_run_naming_the_broken_evaluation(tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    proc = child(HEALTHY, log, "verl", METRIC, "--pace", PACE, *("--nan-at", "40", "--nan-at", "50", "--nan-at", "60"))
    try:
        done = watch(str(log), "--metric", METRIC, "--pid", str(proc.pid), "--grace", "5", timeout=120)
    finally:
        proc.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert (result["decision"], result["stop_step"]) == ("stop", 60)
    assert [step for step, _ in result["non_finite"]] == [40, 50, 60]
    assert (
        "non-finite evaluation: 3 non-finite evaluations" in result["reason"] and "steps 40, 50, 60" in result["reason"]
    )
    assert result["best_step"] in (10, 20, 30)  # the best among the evaluations that were finite
    assert proc.returncode != 0


def test_the_trainer_under_a_shell_wrapper_ends_at_the_stop(tmp_path: Path) -> None:
    log, pid_file = tmp_path / "verl.jsonl", tmp_path / "trainer.pid"
    trainer = [sys.executable, str(CHILD), str(trace_path(HACKING)), str(log), "--format", "verl"]
    trainer += ["--metric", METRIC, "--pace", PACE, "--pid-file", str(pid_file)]
    script = f"{subprocess.list2cmdline(trainer)}; echo wrapper-done"  # not the last command: bash does not exec it
    wrapper = subprocess.Popen(["bash", "-c", script], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        trainer_pid = int(pid_file.read_text())
        assert trainer_pid != wrapper.pid
        done = watch(str(log), "--metric", METRIC, "--pid", str(wrapper.pid), "--grace", "5", timeout=120)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 10
        while not _gone(trainer_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(trainer_pid), "the trainer under the wrapper still runs after the stop"
    finally:
        wrapper.wait(timeout=60)
    result = last_json(done.stdout)
    assert result["stop_step"] == _core_stop(set())
    assert result["ended"].startswith(f"stop at step {result['stop_step']}: process {wrapper.pid} terminated (2 proc")
    assert str(trainer_pid) in result["ended"]
    assert "wrapper-done" not in (wrapper.stdout.read() if wrapper.stdout else "")  # the wrapper ended there too


def test_a_pid_of_no_process_is_refused_at_the_start(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "data": {"val/score": 0.5}}\n{"step": 2, "data": {"val/score": 0.4}}\n')
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert _gone(gone.pid)
    done = watch(str(log), "--metric", "val/score", "--pid", str(gone.pid))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"evalstop watch: error: --pid {gone.pid}: no such process (the trainer must run when the watch starts)"
    ]
    assert not (tmp_path / "log.jsonl.evalstop.json").exists()
