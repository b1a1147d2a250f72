"""``evalstop watch`` on logs written before or while it reads them, in-process and through its command line:
following (half-written lines, rotation, truncation), the formats and their detection, metric globs, bad input, the
direction of the metric, per-example scores, checkpoints, the stop actions and the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _watch_helpers import HACKING, PER_EXAMPLE, embedded_stop, evals, last_json, watch
from service_support import auth, tenant_server

from evalstop_callbacks.keeper import BestCheckpoints, checkpoint_steps
from evalstop_callbacks.watch import Watcher, WatchError
from evalstop_callbacks.watch.follow import LineTail


def write_verl(path: Path, name: str, metric: str = "val-core/gsm8k/reward/mean@1", sign: float = 1.0) -> None:
    """The whole curve of trace ``name`` as verl's FileLogger writes it (a train line before each eval line)."""
    with open(path, "w") as fh:
        for ev in evals(name):
            fh.write(json.dumps({"step": ev["step"], "data": {"actor/loss": 0.1, "critic/score/mean": 0.5}}) + "\n")
            fh.write(json.dumps({"step": ev["step"], "data": {metric: sign * ev["eval_score"]}}) + "\n")


def test_tail_waits_for_a_half_written_line_and_follows_rotation_and_truncation(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    tail = LineTail(log)
    assert tail.read_lines() == []  # no file yet: nothing, no error
    log.write_bytes(b'{"step": 1}\n{"step": 2, "x"')
    assert tail.read_lines() == [b'{"step": 1}']
    with open(log, "ab") as fh:
        fh.write(b": 1}\n")
    assert tail.read_lines() == [b'{"step": 2, "x": 1}']
    with open(log, "ab") as fh:
        fh.write(b'{"step": 3}\n')
    log.rename(tmp_path / "log.jsonl.1")  # rotated: the old file's last line is read, then the new file's
    log.write_bytes(b'{"step": 4}\n')
    assert tail.read_lines() == [b'{"step": 3}', b'{"step": 4}']
    log.write_bytes(b'{"step": 5}\n')  # truncated and rewritten by a restarted writer (same inode)
    assert tail.read_lines() == [b'{"step": 5}']
    log.write_bytes(b'{"step": 6, "a longer first line than before"}\n{"step": 7}\n')  # rewritten, now longer
    assert tail.read_lines() == [b'{"step": 6, "a longer first line than before"}', b'{"step": 7}']
    assert tail.restarts == 3


def test_formats_are_told_apart_and_the_choice_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tensorboardX import SummaryWriter

    verl, plain, tb = tmp_path / "verl.jsonl", tmp_path / "plain.jsonl", tmp_path / "tb"
    verl.write_text('{"step": 10, "data": {"val/score": 0.5}}\n')
    plain.write_text('{"step": 10, "eval": {"score": 0.5}}\n')
    writer = SummaryWriter(str(tb / "run1"))
    writer.add_scalar("eval/score", 0.5, 10)
    writer.close()
    caplog.set_level("INFO", logger="evalstop_callbacks.watch")
    for log, metric, kind in (
        (verl, "val/score", "verl"),
        (plain, "eval/score", "jsonl"),
        (tb, "eval/score", "tensorboard"),
    ):
        watcher = Watcher(log, metric)
        watcher.poll()
        result = watcher.finish()
        assert (result.format, result.evals) == (kind, [[10, 0.5]])
        assert f"format {kind} chosen for {log}" in caplog.text
    assert Watcher(tb, "run1/eval/score").finish().metric == "run1/eval/score"  # the run folder's name also works


def test_a_glob_matching_two_series_is_refused_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "data": {"val-core/gsm8k/reward/mean@1": 0.1, "val-core/math/reward/mean@1": 0.2}}\n')
    done = watch(str(log), "--metric", "val-core/*/reward/mean@1", "--timeout", "5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "evalstop watch: error: --metric 'val-core/*/reward/mean@1' matches several series "
        "(val-core/gsm8k/reward/mean@1, val-core/math/reward/mean@1): name one of them"
    )


def test_timeout_names_the_metrics_seen_and_bad_input_fails_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "data": {"actor/loss": 0.3, "val/acc": 0.5}}\n')
    done = watch(str(log), "--metric", "val/reward", "--timeout", "0.5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"evalstop watch: error: --metric 'val/reward' never appeared in {log} after 0.5 s; "
        "series seen: actor/loss, val/acc; closest: 'val/acc'"
    )
    never = tmp_path / "never.jsonl"
    done = watch(str(never), "--metric", "val/reward", "--timeout", "0.3")
    assert done.returncode == 2 and f"the log {never} never appeared after 0.3 s" in done.stderr.splitlines()[-1]
    junk = tmp_path / "junk.txt"
    junk.write_text("this is not a metrics log\n")
    for args, says in (
        ((str(junk), "--metric", "x"), "first line is not a JSON object"),
        ((str(log), "--metric", "x", "--detector", "nope"), "--detector: unknown detector 'nope'"),
        ((str(log), "--metric", "x", "--server", "http://127.0.0.1:1"), "--server needs --token"),
        ((str(log), "--metric", "x", "--grace", "-1"), "argument --grace: must be a number > 0"),
    ):
        done = watch(*args)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) >= 1 and says in done.stderr.strip().splitlines()[-1]


def test_lower_is_better_negates_for_the_detector_and_reports_own_units(tmp_path: Path) -> None:
    log = tmp_path / "loss.jsonl"
    write_verl(log, HACKING, metric="val/loss", sign=-1.0)  # a loss that falls, then rises: the same curve negated
    want_stop, want_best = embedded_stop(HACKING)
    result = Watcher(log, "val/loss", greater_is_better=False).finish()
    assert (result.stop_step, result.best_step) == (want_stop, want_best)
    best = next(ev["eval_score"] for ev in evals(HACKING) if ev["step"] == want_best)
    assert result.best_score == -best  # the loss itself, not its negation
    assert Watcher(log, "val/loss").finish().stop_step != want_stop  # read as greater-is-better it is another curve


def test_observe_mode_says_where_it_would_stop_and_never_stopped_at(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_verl(log, HACKING)
    want_stop, _ = embedded_stop(HACKING)
    enforce = Watcher(log, "val-core/gsm8k/reward/mean@1").finish()
    observe = Watcher(log, "val-core/gsm8k/reward/mean@1", mode="observe").finish()
    # the reason leads with the evidence mode it was decided in (a log of means: "means only")
    assert enforce.reason.startswith(f"means only: stopped at step {want_stop}: ")
    assert observe.would_stop_step == want_stop and observe.stop_step is None
    assert observe.reason.startswith(f"means only: would stop at step {want_stop} (observe mode: not stopped): ")
    assert "stopped at" not in observe.reason.replace("not stopped", "")


def test_examples_pair_samples_by_input_and_reach_the_detector(tmp_path: Path) -> None:
    log, dumps = tmp_path / "log.jsonl", tmp_path / "val"
    write_verl(log, PER_EXAMPLE)
    dumps.mkdir()
    for n, ev in enumerate(evals(PER_EXAMPLE)):
        samples = [
            {"input": f"prompt-{i}", "output": "o", "score": s, "step": ev["step"]}
            for i, s in enumerate(ev["eval_scores"])
        ]
        if n % 2:
            samples.reverse()  # another order at every other step: pairing is by input, not by line
        (dumps / f"{ev['step']}.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    with_examples = Watcher(log, "val-core/gsm8k/reward/mean@1", examples=dumps).finish()
    means_alone = Watcher(log, "val-core/gsm8k/reward/mean@1").finish()
    assert with_examples.per_example and not means_alone.per_example
    assert with_examples.stop_step == embedded_stop(PER_EXAMPLE, per_example=True)[0] is not None
    assert means_alone.stop_step == embedded_stop(PER_EXAMPLE)[0]
    assert with_examples.stop_step != means_alone.stop_step
    (dumps / "5.jsonl").write_text('{"input": "prompt-0"}\n')
    with pytest.raises(WatchError, match="5.jsonl:1: a sample needs 'input' and 'score'"):
        Watcher(log, "val-core/gsm8k/reward/mean@1", examples=dumps).finish()


def test_checkpoint_folders_of_each_framework_are_found_by_step(tmp_path: Path) -> None:
    names = [
        "global_step_10",
        "checkpoint-20",
        "global_step30",
        "best_global_step40",
        "step_50",
        "tmp_step_60",
        "evalstop-best",
        "checkpoint-last",
    ]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "step_70").write_text("a file, not a checkpoint folder")
    assert {s: p.name for s, p in checkpoint_steps(tmp_path).items()} == {
        10: "global_step_10",
        20: "checkpoint-20",
        30: "global_step30",
        40: "best_global_step40",
        50: "step_50",
    }


def test_best_step_without_checkpoint_names_the_nearest_before_and_copies_across_devices(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    for step in (10, 30):
        (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True)
        (ckpt / f"global_step_{step}" / "actor" / "model.pt").write_text(f"step {step}")
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "eval_score": v}) + "\n" for s, v in ((10, 0.5), (20, 0.9))))
    result = Watcher(log, "eval_score", checkpoints=ckpt, warm_up=False).finish().to_dict()
    assert result["best_step"] == 20 and result["best_checkpoint"] is None and result["protected_checkpoint"] is None
    nearest = ckpt / "global_step_10"
    assert result["checkpoint_note"] == f"step 20 has no checkpoint in {ckpt}; the nearest one before it is {nearest}"
    # The step that has a checkpoint is kept all the same: one of the K best that have one.
    assert [k["step"] for k in result["kept"]] == [10] and result["keep_best"] == 1
    assert (ckpt / "evalstop-best-10" / "actor" / "model.pt").read_text() == "step 10"
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        return  # no second file system here to refuse hard links
    other = shm / f"evalstop-test-{os.getpid()}"
    try:
        kept = BestCheckpoints(other / "best").protect(30, 1.0, ckpt / "global_step_30")
        assert kept is not None and kept.method == "copied"
        assert (other / "best" / "evalstop-best-30" / "actor" / "model.pt").read_text() == "step 30"
    finally:
        subprocess.run(["rm", "-rf", str(other)], check=False)


def test_on_stop_gets_the_decision_in_its_environment(tmp_path: Path) -> None:
    log, out = tmp_path / "log.jsonl", tmp_path / "env.json"
    write_verl(log, HACKING)
    dump = f'{sys.executable} -c \'import json, os; json.dump({{k: v for k, v in os.environ.items() if k.startswith("EVALSTOP_")}}, open("{out}", "w"))\''
    done = watch(str(log), "--metric", "val-core/*/reward/mean@1", "--on-stop", dump)
    assert done.returncode == 0, done.stderr
    result = last_json(done.stdout)
    stop, best = embedded_stop(HACKING)
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", stop, best)
    env = json.loads(out.read_text())
    assert env["EVALSTOP_STOP_STEP"] == str(stop) and env["EVALSTOP_BEST_STEP"] == str(best)
    assert float(env["EVALSTOP_BEST_SCORE"]) == result["best_score"] and env["EVALSTOP_BEST_CHECKPOINT"] == ""
    assert json.loads(Path(env["EVALSTOP_RESULT"]).read_text())["stop_step"] == stop  # written before the command
    assert Path(env["EVALSTOP_RESULT"]) == tmp_path / "log.jsonl.evalstop.json"
    failing = watch(str(log), "--metric", "val-core/*/reward/mean@1", "--on-stop", "exit 7")
    assert failing.returncode == 1 and "--on-stop command exit status 7" in failing.stderr


def test_a_dead_pid_ends_the_watch_with_its_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "data": {"val/score": 0.5}}\n')
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time, sys; time.sleep(4); sys.exit(3)"]
    )  # outlives the start
    try:
        done = watch(str(log), "--metric", "val/score", "--pid", str(proc.pid))
    finally:
        proc.wait()
    assert done.returncode == 3, done.stderr
    assert last_json(done.stdout)["ended"] == f"process {proc.pid} exited, status 3"


def test_through_a_real_server_only_the_report_crosses(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_verl(log, HACKING)
    with tenant_server(tmp_path) as (server, token):
        done = watch(
            str(log),
            "--metric",
            "val-core/*/reward/mean@1",
            "--server",
            server.url,
            "--token",
            token,
            "--job-id",
            "verl-run-1",
        )
        assert done.returncode == 0, done.stderr
        job = httpx.get(f"{server.url}/v1/jobs/verl-run-1", headers=auth(token), timeout=10).json()
    result = last_json(done.stdout)
    assert result["stop_step"] == embedded_stop(HACKING)[0]
    assert job["status"] == "stopped" and job["detector"] == result["detector"], job
    # Without --planned-steps: the watch says so once; the client's local core does not say it again.
    assert done.stderr.count("no --planned-steps") == 1 and "reports no planned_steps" not in done.stderr
    assert job["per_run_bound"] is False


def test_the_subcommand_plugs_into_another_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from evalstop_callbacks.watch.cli import add_parser

    log = tmp_path / "log.jsonl"
    write_verl(log, HACKING)
    parser = argparse.ArgumentParser(prog="evalstop")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["watch", str(log), "--metric", "val-core/*/reward/mean@1", "--result", str(tmp_path / "r.json")]
    )
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "r.json").read_text())
    assert result["stop_step"] == embedded_stop(HACKING)[0]
