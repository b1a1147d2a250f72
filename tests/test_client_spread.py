"""The spread of an eval (``eval_std``, ``eval_n``) through the trainer-side clients: ``make_report`` carries it and
refuses bad values in one line naming the job and step; the embedded core takes it; ``PlatformClient`` keeps it in its
re-send queue across an outage and a checkpoint (its state dict), and its local fallback decides with it."""

from __future__ import annotations

import math

import pytest
from service_support import free_port

from evalstop_callbacks.client import EmbeddedClient, NonFiniteScoreError, make_report
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import EvidenceMode, InvalidReportError


def test_make_report_carries_the_spread() -> None:
    report = make_report("j", "rlhf", 10, 0.5, std=0.2, n=64)
    assert (report.eval_std, report.eval_n, report.mode) == (0.2, 64, EvidenceMode.MEAN_AND_SPREAD)
    assert report.to_dict()["eval_std"] == 0.2 and report.to_dict()["eval_n"] == 64
    scores = [0.0, 1.0, 1.0]
    with_scores = make_report("j", "rlhf", 10, 2 / 3, scores, std=math.sqrt(1 / 3), n=3)
    assert with_scores.mode is EvidenceMode.PER_EXAMPLE and with_scores.eval_n == 3
    assert make_report("j", "rlhf", 10, 0.5).mode is EvidenceMode.MEANS_ONLY


@pytest.mark.parametrize(
    ("std", "n", "scores", "words"),
    [
        (0.2, None, None, "eval_std was given without eval_n"),
        (None, 64, None, "eval_n was given without eval_std"),
        (0.2, 1, None, "eval_n must be an integer >= 2"),
        (-0.1, 64, None, "eval_std must be >= 0"),
        (0.2, 3, [0.0, 1.0, 1.0], "disagrees with the sample standard deviation"),
        (0.5, 4, [0.0, 1.0, 1.0], "eval_n is 4 but eval_scores holds 3"),
    ],
)
def test_make_report_refuses_a_bad_spread_naming_job_and_step(std, n, scores, words) -> None:
    with pytest.raises(InvalidReportError) as info:
        make_report("job-a", "rlhf", 7, 0.5, scores, std=std, n=n)
    message = str(info.value)
    assert "\n" not in message and "job 'job-a' step 7" in message and words in message


@pytest.mark.parametrize("std", [math.nan, math.inf])
def test_make_report_refuses_a_non_finite_spread_as_a_non_finite_score(std: float) -> None:
    with pytest.raises(NonFiniteScoreError) as info:
        make_report("job-a", "rlhf", 7, 0.5, std=std, n=10)
    assert "non-finite eval_std" in str(info.value) and "at step 7" in str(info.value)


def test_embedded_client_takes_reports_with_a_spread() -> None:
    client = EmbeddedClient()
    job = client.register("rlhf", job_id="spread")
    for step, mean in enumerate([0.2, 0.4, 0.5]):
        decision = client.report(make_report(job, "rlhf", step * 10, mean, std=0.1, n=32))
        assert decision.action.value == "continue"
        assert EvidenceMode.of_reason(decision.reason) is EvidenceMode.MEAN_AND_SPREAD
    assert client.monitor(job).steps == [0, 10, 20]


def test_platform_client_queues_the_spread_while_the_service_is_down() -> None:
    """No server listens on the port: every report is decided by the local core and kept for re-sending, spread
    included, and the queue survives the client's state dict (a trainer checkpoint)."""
    url = f"http://127.0.0.1:{free_port()}"
    with PlatformClient(url, "token", max_retries=0, connect_timeout=0.2) as client:
        job = client.register("rlhf", job_id="offline")
        local = client.report(make_report(job, "rlhf", 0, 0.3, std=0.12, n=50))
        assert EvidenceMode.of_reason(local.reason) is EvidenceMode.MEAN_AND_SPREAD  # the fallback core used it
        client.report(make_report(job, "rlhf", 10, 0.4))
        assert client.last_source == "fallback" and client.pending(job) == 2
        state = client.state_dict()
    backlog = state["links"][job]["backlog"]
    assert backlog[0]["eval_std"] == 0.12 and backlog[0]["eval_n"] == 50 and "eval_std" not in backlog[1]
    with PlatformClient(url, "token", max_retries=0, connect_timeout=0.2) as resumed:
        resumed.load_state_dict(state)
        assert resumed.pending(job) == 2
        assert resumed.state_dict()["links"][job]["backlog"] == backlog
