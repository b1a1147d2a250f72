"""``evalstop watch`` following a log that verl's own ``FileLogger`` writes, while it is written.

Real: verl's ``Tracking`` logger with the ``file`` backend in a child process (``tests/_verl_log_child.py``), replaying a
shipped real run's validation curve and per-sample validation dump at training pace and writing and rotating
``global_step_<N>`` checkpoint folders as verl does; the ``evalstop watch`` command in another process, stopping the
child by its pid. The expected stop and best steps are the embedded core's on the same curve.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl.utils.tracking", reason="needs verl (the .venv-verl environment)")
if importlib.util.find_spec("evalstop_callbacks.watch") is None:
    pytest.skip("evalstop watch (evalstop_callbacks.watch) is not in this tree yet", allow_module_level=True)

from _verl_helpers import HACKING, HEALTHY, core_verdict, file_log, load_curve  # noqa: E402

pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
PACE = 0.5  # seconds per eval interval: a 30-eval run takes about 15 s


def _run(tmp_path: Path, trace: str) -> tuple[subprocess.CompletedProcess[str], int | None, dict, Path]:
    """The child writing its log and the watcher following it; returns the watch, the child's status, its result."""
    log, ckpt, val = tmp_path / "verl-log.jsonl", tmp_path / "ckpt", tmp_path / "val"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "_verl_log_child.py"), trace, str(ckpt), str(val), str(PACE)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    result = tmp_path / "result.json"
    try:
        watch = subprocess.run(
            [
                sys.executable,
                "-m",
                "evalstop_callbacks.watch",
                str(log),
                "--metric",
                "val-core/*/reward/mean@1",
                "--format",
                "verl",
                "--examples",
                str(val),
                "--checkpoints",
                str(ckpt),
                "--pid",
                str(child.pid),
                "--grace",
                "10",
                "--timeout",
                "120",
                "--result",
                str(result),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        status = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    return watch, status, json.loads(result.read_text()), log


def test_watch_stops_a_verl_run_where_the_core_stops_its_curve(tmp_path: Path) -> None:
    curve = load_curve(HACKING)
    stop, best = core_verdict(curve)
    assert stop is not None and best is not None

    watch, status, result, log = _run(tmp_path, HACKING)

    assert status == -signal.SIGTERM, watch.stderr
    assert file_log(log)[-1]["step"] < curve.steps[-1]  # the child never reached its end
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", stop, best)
    assert json.loads(watch.stdout.strip().splitlines()[-1]) == result
    # The best step's folder was rotated away by the child; the watcher's protected copy holds its weights.
    assert not (tmp_path / "ckpt" / f"global_step_{best}").exists()
    assert Path(result["best_checkpoint"]).name == f"global_step_{best}"
    kept = Path(result["protected_checkpoint"])
    assert (kept / "actor" / "model.pt").read_text() == f"weights of step {best}"


def test_watch_leaves_a_healthy_verl_run_to_its_end(tmp_path: Path) -> None:
    curve = load_curve(HEALTHY)
    assert core_verdict(curve)[0] is None

    watch, status, result, log = _run(tmp_path, HEALTHY)

    assert status == 0, watch.stderr
    assert file_log(log)[-1]["step"] == curve.steps[-1]
    assert result["decision"] == "continue" and result["stop_step"] is None
    assert [e[0] for e in result["evals"]] == curve.steps
