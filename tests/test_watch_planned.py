"""``evalstop watch --planned-steps N``: every report carries the run's planned steps, and the default detector's
means-only test then bounds its false stops per run; a bad value is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _watch_helpers import watch

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.watch import Watcher, WatchError


def _log(path: Path) -> None:
    """Means that rise to step 100, then fall fast: plain JSONL, one eval per 10 steps."""
    with open(path, "w") as fh:
        for step in range(10, 301, 10):
            score = step / 100 if step <= 100 else 1.0 - (step - 100) / 100
            fh.write(json.dumps({"step": step, "eval/score": score + 0.01 * ((step // 10) % 3 - 1)}) + "\n")


def test_planned_steps_reach_the_detector_with_every_report(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    _log(log)
    client = EmbeddedClient()
    watcher = Watcher(log, "eval/score", client=client, planned_steps=300, warm_up=False)
    result = watcher.finish()
    assert result.stop_step is not None and result.stop_step > 100
    state = client.monitor(watcher.job_id).detector.state_dict()
    assert state["planned"]["planned"][0] == 300
    assert "of planned progress (300 planned steps" in result.reason


def test_a_bad_planned_steps_is_refused_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    _log(log)
    with pytest.raises(WatchError, match=r"^--planned-steps: planned_steps must be an integer >= 1"):
        Watcher(log, "eval/score", planned_steps=0, warm_up=False)
    done = watch(str(log), "--metric", "eval/score", "--planned-steps", "-5")
    assert done.returncode == 2 and "--planned-steps" in done.stderr.strip().splitlines()[-1]


def test_without_planned_steps_the_watcher_says_once_what_the_default_gives_up(tmp_path: Path, caplog) -> None:
    # The default's per-run control needs the plan: without it the watcher warns at start; with it, or with a
    # detector that the plan does not change (the paper's rule), it does not.
    log = tmp_path / "run.jsonl"
    _log(log)
    caplog.set_level("WARNING", logger="evalstop_callbacks")

    def warned(**kwargs) -> bool:
        caplog.clear()
        Watcher(log, "eval/score", warm_up=False, **kwargs)
        return any("no --planned-steps" in r.getMessage() for r in caplog.records)

    assert warned()
    assert not warned(planned_steps=300)
    assert not warned(detector={"name": "k-decline", "params": {"k": 2}})
    assert not warned(detector={"name": "trend", "params": {"means_test": "window"}})


def test_the_command_says_it_once_not_again_for_its_warm_up_or_its_job(tmp_path: Path) -> None:
    # The watcher's own core (and the warm-up's) would warn as any embedded client does without a plan; the watch
    # says it once, in its own terms.
    log = tmp_path / "run.jsonl"
    _log(log)
    done = watch(str(log), "--metric", "eval/score", "--timeout", "1")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no --planned-steps") == 1
    assert "reports no planned_steps" not in done.stderr
