"""A job whose reports carry no ``planned_steps`` is told once that its default detector decides per look: the
embedded client, and the platform client (whose local core is one) for a job registered without them."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from service_support import overoptimization_reports, tenant_server

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import paper_spec

NO_PLAN = "reports no planned_steps"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and NO_PLAN in r.getMessage()]


@pytest.mark.parametrize(
    ("detector", "planned", "told"),
    [
        (None, None, True),  # the default, no plan: per look, said once
        (None, 200, False),  # the default with a plan: per run
        (paper_spec(), None, False),  # the paper's rule needs no plan
        ({"name": "trend", "params": {"means_test": "window"}}, None, False),  # per look by choice
    ],
)
def test_the_embedded_client_says_once_that_a_job_without_a_plan_decides_per_look(
    caplog: pytest.LogCaptureFixture, detector: dict | None, planned: int | None, told: bool
) -> None:
    client = EmbeddedClient()
    job = client.register("rlhf", detector=detector, job_id="j")
    with caplog.at_level(logging.WARNING, logger="evalstop_callbacks.client"):
        for report in overoptimization_reports(job, peak_eval=8, n_evals=12):
            client.report(replace(report, planned_steps=planned))
    said = _warnings(caplog)
    assert len(said) == (1 if told else 0), said
    if told:
        assert "'j'" in said[0] and "per look" in said[0] and "planned_steps=N" in said[0]


def test_the_platform_client_says_it_for_a_job_registered_without_planned_steps(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    with tenant_server(tmp_path) as (srv, token), PlatformClient(srv.url, token) as client:
        with caplog.at_level(logging.WARNING, logger="evalstop_callbacks.client"):
            bare = client.register("rlhf", job_id="bare")
            planned = client.register("rlhf", job_id="planned", planned_steps=200)
            for job in (bare, planned):
                for report in overoptimization_reports(job, peak_eval=8, n_evals=6):
                    client.report(report)
        assert client.last_source == "service"
    said = _warnings(caplog)
    assert len(said) == 1 and "'bare'" in said[0], said
