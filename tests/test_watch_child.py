"""``evalstop watch`` following a stand-in trainer process (``tests/_watch_child.py``) that writes a shipped real
trace's curve at training pace: a verl-format log, TensorBoard event files from ``torch.utils.tensorboard``, a plain
JSONL log. The watcher must stop the child at the step where the embedded core stops the same curve, name and protect
the best checkpoint folder the child wrote (and rotated away), leave a healthy run alone to its end, and reach the same
decision after a restart mid-run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from _watch_helpers import HACKING, HEALTHY, PER_EXAMPLE, WATCH, child, embedded_stop, env, evals, last_json, watch

PACE = "0.06"  # seconds per log line: a training step's pace, slow enough that the child outlives the decision
VERL_METRIC = "val-core/openai/gsm8k/reward/mean@1"


def steps_logged(log: Path) -> list[int]:
    return [json.loads(line)["step"] for line in log.read_text().splitlines() if VERL_METRIC in line]


def test_verl_log_stopped_at_the_core_step_with_the_best_checkpoint_protected(tmp_path: Path) -> None:
    log, ckpt = tmp_path / "verl.jsonl", tmp_path / "ckpt"
    # A slower pace than the other tests: the child removes a checkpoint four log lines after writing it (--keep 2),
    # and the watch must see the best one before then to protect it (at 0.06 s a line, a loaded machine missed it).
    proc = child(HACKING, log, "verl", VERL_METRIC, "--checkpoints", str(ckpt), "--keep", "2", "--pace", "0.15")
    try:
        done = watch(
            str(log),
            "--metric",
            "val-core/*/reward/mean@1",
            "--pid",
            str(proc.pid),
            "--checkpoints",
            str(ckpt),
            "--grace",
            "5",
        )
    finally:
        proc.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    want_stop, want_best = embedded_stop(HACKING)
    result = last_json(done.stdout)
    assert result == json.loads((tmp_path / "verl.jsonl.evalstop.json").read_text())
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", want_stop, want_best)
    assert result["format"] == "verl" and result["metric"] == VERL_METRIC
    assert proc.returncode == -signal.SIGTERM  # stopped, not finished
    assert steps_logged(log)[-1] < evals(HACKING)[-1]["step"]
    assert result["evals"] == [[ev["step"], ev["eval_score"]] for ev in evals(HACKING) if ev["step"] <= want_stop]
    # The child kept two checkpoints: the best one is gone from its folder, its mirror is not.
    assert result["best_checkpoint"] == str(ckpt / f"checkpoint-{want_best}")
    assert not (ckpt / f"checkpoint-{want_best}").exists()
    protected = ckpt / f"evalstop-best-{want_best}"
    assert result["protection"] == "hard-linked" and result["protected_checkpoint"] == str(protected)
    assert (protected / "model.safetensors").read_text() == f"weights at step {want_best}\n"
    assert [k["step"] for k in result["kept"]] == [want_best] and result["mode"] == "enforce"
    assert done.stderr.count("no --examples: the detector decides on each eval's mean") == 1


def test_tensorboard_event_files_from_summarywriter(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = child(HACKING, runs / "exp1", "tensorboard", "eval/reward", "--pace", PACE)
    try:
        done = watch(str(runs), "--metric", "eval/*", "--pid", str(proc.pid), "--grace", "5")
    finally:
        proc.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert (result["format"], result["metric"]) == ("tensorboard", "exp1/eval/reward")
    assert (result["stop_step"], result["best_step"]) == embedded_stop(HACKING)
    assert proc.returncode == -signal.SIGTERM
    assert "format tensorboard chosen" in done.stderr


def test_a_healthy_run_is_left_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "plain.jsonl"
    assert embedded_stop(HEALTHY)[0] is None
    proc = child(HEALTHY, log, "jsonl", "eval_score", "--pace", "0.02")
    try:
        done = watch(str(log), "--metric", "eval_score", "--pid", str(proc.pid))
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0 and done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert result["format"] == "jsonl" and result["decision"] == "continue" and result["stop_step"] is None
    assert len(result["evals"]) == len(evals(HEALTHY))  # every evaluation, the last one included
    assert result["ended"] == f"process {proc.pid} exited, status 0"


def test_a_watcher_restarted_mid_run_reaches_the_same_decision(tmp_path: Path) -> None:
    log, dumps = tmp_path / "verl.jsonl", tmp_path / "val"
    want_stop, want_best = embedded_stop(PER_EXAMPLE, per_example=True)
    assert want_stop is not None and embedded_stop(PER_EXAMPLE)[0] != want_stop  # decided by the per-example scores
    proc = child(PER_EXAMPLE, log, "verl", VERL_METRIC, "--examples", str(dumps), "--pace", PACE)
    first = subprocess.Popen(
        [*WATCH, str(log), "--metric", VERL_METRIC, "--examples", str(dumps)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not log.exists() or len(steps_logged(log)) < 3):
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # a crash mid-run, before the stop
        first.wait(timeout=10)
        assert len(steps_logged(log)) < next(i for i, ev in enumerate(evals(PER_EXAMPLE)) if ev["step"] == want_stop)
        done = watch(
            str(log), "--metric", VERL_METRIC, "--examples", str(dumps), "--pid", str(proc.pid), "--grace", "5"
        )
    finally:
        proc.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    assert (result["stop_step"], result["best_step"], result["per_example"]) == (want_stop, want_best, True)
    assert proc.returncode == -signal.SIGTERM


def test_observe_mode_keeps_the_three_best_checkpoints_through_rotation(tmp_path: Path) -> None:
    """--mode observe --keep-best 3 on a run whose trainer keeps only its 2 newest checkpoints: the run is never
    stopped, and exactly the 3 best evaluations' checkpoints are left, as evalstop-best-<step>."""
    log, ckpt = tmp_path / "verl.jsonl", tmp_path / "ckpt"
    # The child starts once the watcher is reading (its detector warmed up): a checkpoint rotated away before the
    # watcher saw its evaluation could not be kept.
    proc = child(
        HACKING, log, "verl", VERL_METRIC, "--checkpoints", str(ckpt), "--keep", "2", "--pace", "0.1",
        "--start-after", "4",
    )  # fmt: skip
    try:
        done = watch(
            str(log),
            "--metric",
            "val-core/*/reward/mean@1",
            "--pid",
            str(proc.pid),
            "--checkpoints",
            str(ckpt),
            "--keep-best",
            "3",
            "--mode",
            "observe",
        )
    finally:
        proc.wait(timeout=60)
    assert done.returncode == 0 and proc.returncode == 0, done.stderr  # the child ran to its end
    result = last_json(done.stdout)
    curve = evals(HACKING)
    want_stop, _ = embedded_stop(HACKING)
    assert (result["decision"], result["stop_step"], result["would_stop_step"]) == ("continue", None, want_stop)
    assert len(result["evals"]) == len(curve) and result["mode"] == "observe"
    best3 = [ev["step"] for ev in sorted(curve, key=lambda ev: (-ev["eval_score"], ev["step"]))[:3]]
    assert [k["step"] for k in result["kept"]] == best3 and result["keep_best"] == 3
    assert sorted(int(p.name.rsplit("-", 1)[1]) for p in ckpt.glob("evalstop-best-*")) == sorted(best3)
    for step in best3:
        assert (ckpt / f"evalstop-best-{step}" / "model.safetensors").read_text() == f"weights at step {step}\n"
    assert not all((ckpt / f"checkpoint-{s}").exists() for s in best3)  # the child's rotation took some of them
    assert all(p.startswith(str(ckpt / "evalstop-best-")) for p in result["pruned"])
