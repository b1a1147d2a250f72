"""One default: every entry point that runs a detector when given none runs ``default_spec()``.

Each entry point is asked, through its own public surface, which detector it runs when none is named, and every
answer is compared with the core's default (normalized: every parameter filled in). Only ``evalstop-sim paper``
keeps the paper's rule, because it reproduces the paper. The per-command checks of the simulator's own outputs are
in ``test_sim_defaults.py``; this file walks the entry points of every package side by side.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import auth, tenant_server

from platform_sim.core import default_spec, detector_from_spec, paper_spec

DEFAULT = detector_from_spec(default_spec()).spec()
PAPER = detector_from_spec(paper_spec()).spec()


def _norm(spec: Any) -> dict[str, Any]:
    return detector_from_spec(spec).spec()


def _callback() -> dict[str, Any]:
    from evalstop_callbacks import EvalStopCallback

    return _norm(EvalStopCallback().detector_spec)


def _embedded_client() -> dict[str, Any]:
    from evalstop_callbacks import EmbeddedClient

    client = EmbeddedClient()
    return client.monitor(client.register("rlhf", job_id="j")).detector.spec()


def _platform_client_offline() -> dict[str, Any]:
    from service_support import free_port

    from evalstop_callbacks import PlatformClient

    with PlatformClient(f"http://127.0.0.1:{free_port()}", "es_unused", max_retries=0, connect_timeout=0.5) as c:
        return c.monitor(c.register("rlhf", job_id="j")).detector.spec()


def _ray_tune() -> dict[str, Any]:
    pytest.importorskip("ray")
    from platform_sim.integrations.ray_tune import EvalStopScheduler

    return _norm(EvalStopScheduler().detector_spec)


def _optuna() -> dict[str, Any]:
    pytest.importorskip("optuna")
    from platform_sim.integrations.optuna import EvalStopPruner

    return _norm(EvalStopPruner().detector_spec)


def _watch_api() -> dict[str, Any]:
    from evalstop_callbacks.watch.watcher import Watcher

    return _norm(Watcher("unused.jsonl", metric="score").spec)


def _verl_monitor() -> dict[str, Any]:
    from evalstop_callbacks import EmbeddedClient
    from evalstop_callbacks.verl_monitor import EvalStopMonitor, VerlEvalStopConfig

    client = EmbeddedClient()
    monitor = EvalStopMonitor(config=VerlEvalStopConfig(), client=client, job_id="verl")
    return client.monitor(monitor.job_id).detector.spec()


def _demo(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from evalstop_callbacks import cli
    from evalstop_callbacks.demo import command

    seen: dict[str, Any] = {}
    monkeypatch.setattr(command, "run_demo", lambda ns: seen.setdefault("spec", ns.detector_spec) and 0)
    assert cli.main(["demo"]) == 0
    return _norm(seen["spec"])


IN_PROCESS = {
    "EvalStopCallback()": _callback,
    "EmbeddedClient().register": _embedded_client,
    "PlatformClient local fallback (service unreachable)": _platform_client_offline,
    "Ray Tune EvalStopScheduler": _ray_tune,
    "Optuna EvalStopPruner": _optuna,
    "evalstop watch (Python API)": _watch_api,
    "verl adapter's monitor": _verl_monitor,
}


@pytest.mark.parametrize("entry", sorted(IN_PROCESS))
def test_in_process_entry_points_run_the_default(entry):
    assert IN_PROCESS[entry]() == DEFAULT


def test_the_default_is_not_the_papers_rule():
    assert DEFAULT["name"] != PAPER["name"]  # otherwise none of these checks could tell the two apart


def test_the_demo_runs_the_default(monkeypatch):
    assert _demo(monkeypatch) == DEFAULT


def test_every_simulator_command_but_paper_runs_the_default():
    from platform_sim.cli import default_detector_specs

    specs = default_detector_specs()
    assert specs.pop("paper") == PAPER
    assert specs and all(spec == DEFAULT for spec in specs.values()), specs


def test_the_service_and_platform_client_run_the_default(tmp_path):
    from evalstop_callbacks import PlatformClient

    with tenant_server(tmp_path) as (srv, token):
        plain = httpx.post(f"{srv.url}/v1/jobs", json={"job_type": "rlhf"}, headers=auth(token))
        assert plain.status_code == 201 and plain.json()["detector"] == DEFAULT
        with PlatformClient(srv.url, token) as client:
            job = client.register("rlhf", job_id="via-client")
            assert client.monitor(job).detector.spec() == DEFAULT
        view = httpx.get(f"{srv.url}/v1/jobs/via-client", headers=auth(token)).json()
        assert view["detector"] == DEFAULT


def test_evalstop_watch_command_runs_the_default_and_names_it(tmp_path: Path):
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps({"step": 10 * i, "score": 0.1 * i}) + "\n" for i in range(4)))
    result = tmp_path / "result.json"
    out = subprocess.run(
        [sys.executable, "-m", "evalstop_callbacks.watch", str(log), "--metric", "score", "--format", "jsonl"]
        + ["--timeout", "1", "--poll", "0.05", "--result", str(result), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.exists(), out.stderr
    assert _norm(json.loads(result.read_text())["detector"]) == DEFAULT
