"""End to end: a real tiny GRPO run on CPU reports to a real ``evalstop-server`` through ``PlatformClient``.

The only change from embedded mode is ``client=PlatformClient(url, token)``. The service's decision stops the run, the
best checkpoint is restored, and the outcome is the embedded core's on the same trace. With the server down for the
whole run, training still finishes and the embedded fallback makes the same decision.
"""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("trl")

from _callback_helpers import (  # noqa: E402  # noqa: E402
    best_weights_steps,
    checkpoint_steps,
    first_k_decline_step,
    tiny_grpo,
    tokenizer,
    world_evaluator,
)
from service_support import Server, add_tenant, auth, free_port  # noqa: E402

from evalstop_callbacks import EvalStopCallback  # noqa: E402
from evalstop_callbacks.client import EmbeddedClient  # noqa: E402
from evalstop_callbacks.platform_client import PlatformClient  # noqa: E402
from platform_sim.core import Report  # noqa: E402


def _embedded_replay(job: str, history: list[dict]) -> list:
    """The embedded core's decisions on the run's own trace."""
    emb = EmbeddedClient()
    emb.register("rlhf", detector={"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}, job_id=job)
    return [emb.report(Report(job, "rlhf", h["step"], h["eval_score"])) for h in history]


def test_grpo_run_is_stopped_by_the_service_and_restores_best(tmp_path):
    db = tmp_path / "e2e.db"
    token = add_tenant(db, "ml-team")
    srv = Server(db, free_port()).start()
    try:
        client = PlatformClient(srv.url, token)
        cb = EvalStopCallback(
            world_evaluator(), eval_steps=2, k=2, client=client, job_id="grpo-e2e", eval_on_start=False
        )
        trainer = tiny_grpo(tmp_path / "out", cb, save_total_limit=1)
        trainer.train()
        assert client.fallback_decisions == 0 and client.last_source == "service"

        # The service's decision stopped the run where the core's rule says, on the run's own trace.
        expected = first_k_decline_step(cb.history, 2)
        assert expected is not None, cb.history
        assert cb.stopped_at == expected == trainer.state.global_step < 16
        replay = _embedded_replay("grpo-e2e", cb.history)
        assert [h["action"] for h in cb.history] == [d.action.value for d in replay]
        assert (cb.best_step, cb.best_score) == (replay[-1].best_step, replay[-1].best_score)

        # The best checkpoint was kept and restored: the live model scores exactly the best eval.
        # the best step's weights are on disk: a full checkpoint, or the weights-only best folder
        kept = checkpoint_steps(tmp_path / "out") + best_weights_steps(tmp_path / "out")
        assert cb.restored_from is not None and cb.best_step in kept
        assert world_evaluator().evaluate(trainer.model, tokenizer()).score == cb.best_score

        # The service holds the same history and outcome, and the job is finished.
        view = httpx.get(f"{srv.url}/v1/jobs/grpo-e2e", headers=auth(token)).json()
        assert view["status"] == "finished" and view["stopped_at"] == cb.stopped_at
        assert (view["best_step"], view["best_score"]) == (cb.best_step, cb.best_score)
        assert view["n_reports"] == len(cb.history)
        client.close()
    finally:
        srv.stop()


def test_grpo_run_with_the_server_down_fails_open_to_the_embedded_core(tmp_path):
    client = PlatformClient(
        f"http://127.0.0.1:{free_port()}", "es_unused", max_retries=1, backoff=0.01, connect_timeout=0.5
    )
    cb = EvalStopCallback(
        world_evaluator(), eval_steps=2, k=2, client=client, job_id="grpo-offline", eval_on_start=False
    )
    trainer = tiny_grpo(tmp_path / "out", cb, save_total_limit=1)
    trainer.train()  # no exception: a network fault never breaks training
    assert client.fallback_decisions == len(cb.history) > 0
    expected = first_k_decline_step(cb.history, 2)
    assert expected is not None and cb.stopped_at == expected  # the fallback still protects the job
    replay = _embedded_replay("grpo-offline", cb.history)
    assert [h["action"] for h in cb.history] == [d.action.value for d in replay]
    assert world_evaluator().evaluate(trainer.model, tokenizer()).score == cb.best_score
    client.close()


def test_grpo_run_survives_kill9_and_restart_of_the_server(tmp_path):
    from transformers import TrainerCallback

    db = tmp_path / "kill.db"
    token = add_tenant(db, "ml-team")
    srv = Server(db, free_port()).start()

    class Chaos(TrainerCallback):
        """kill -9 the server after step 2's eval was acknowledged; start it again on the same database at step 5."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                srv.kill9()
            elif state.global_step == 5:
                srv.start()

    try:
        client = PlatformClient(srv.url, token, max_retries=1, backoff=0.01, connect_timeout=0.5)
        cb = EvalStopCallback(
            world_evaluator(), eval_steps=2, k=2, client=client, job_id="grpo-kill9", eval_on_start=False
        )
        trainer = tiny_grpo(tmp_path / "out", cb, save_total_limit=1)
        trainer.add_callback(Chaos())
        trainer.train()
        assert client.fallback_decisions == 1  # the eval at step 4 met a dead server
        assert client.last_source == "service"  # later ones were answered by the restarted server
        expected = first_k_decline_step(cb.history, 2)
        assert expected is not None and cb.stopped_at == expected > 4, cb.history
        replay = _embedded_replay("grpo-kill9", cb.history)
        assert [h["action"] for h in cb.history] == [d.action.value for d in replay]
        # Nothing acknowledged was lost, and the reports made while it was down were re-sent after the restart.
        view = httpx.get(f"{srv.url}/v1/jobs/grpo-kill9", headers=auth(token)).json()
        assert view["n_reports"] == len(cb.history) and view["stopped_at"] == cb.stopped_at
        assert view["status"] == "finished"
        client.close()
    finally:
        srv.stop()
