"""The dashboard tests' scenario: a real server process on a real SQLite file with two tenants and jobs in every
state, one of them reported until the scheduler stopped it."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from service_support import Server, add_tenant, auth, free_port

# Rises to a peak at step 60, then declines: the k=2 rule stops it at the second decline (step 80).
STOPPED_SCORES = (0.20, 0.31, 0.42, 0.50, 0.55, 0.58, 0.54, 0.49, 0.45, 0.40)
STOPPED_JOB = "rlhf-7b.run:1"
RUNNING_JOB = "sft-lora-a"
FINISHED_JOB = "dpo-finished"
OTHER_TENANTS_JOB = "beta-secret-job"
HOSTILE_REASON = '<script>alert("x")</script> & <b>bold</b>'
"""A finish reason (free text from the client) that must show as text, never as markup."""


@dataclass
class Scenario:
    """The running server and what the test knows about it."""

    server: Server
    alpha: str
    beta: str
    stop_step: int
    best_step: int
    best_score: float


def _post_reports(
    client: httpx.Client, token: str, job_id: str, job_type: str, scores: tuple[float, ...]
) -> list[dict]:
    decisions = []
    for i, value in enumerate(scores):
        body = {"job_id": job_id, "job_type": job_type, "step": 10 * (i + 1), "eval_score": value}
        r = client.post(f"/v1/jobs/{job_id}/evals", json=body, headers=auth(token))
        assert r.status_code == 200, r.text
        decisions.append(r.json())
        if decisions[-1]["action"] == "stop":
            break
    return decisions


def _register(client: httpx.Client, token: str, job_id: str, job_type: str, **extra: object) -> None:
    body = {"job_id": job_id, "job_type": job_type, "detector": {"name": "k-decline", "params": {"k": 2}}, **extra}
    r = client.post("/v1/jobs", json=body, headers=auth(token))
    assert r.status_code == 201, r.text


@contextmanager
def dashboard_scenario(folder: Path) -> Iterator[Scenario]:
    """A started server: tenant ``alpha`` with a stopped, a running and a finished job, tenant ``beta`` with one."""
    db = folder / "service.db"
    alpha, beta = add_tenant(db, "alpha"), add_tenant(db, "beta")
    # The tests sign in many times from one address: well within the sign-in rate's reach by default.
    server = Server(db, free_port(), extra_args=("--sign-ins-per-minute", "600")).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as client:
            _register(client, alpha, STOPPED_JOB, "rlhf", gpus=8, planned_steps=1000)
            decisions = _post_reports(client, alpha, STOPPED_JOB, "rlhf", STOPPED_SCORES)
            assert decisions[-1]["action"] == "stop", decisions
            _register(client, alpha, RUNNING_JOB, "sft")
            _post_reports(client, alpha, RUNNING_JOB, "sft", (0.1, 0.2, 0.3))
            _register(client, alpha, FINISHED_JOB, "dpo")
            _post_reports(client, alpha, FINISHED_JOB, "dpo", (0.3, 0.35))
            r = client.post(f"/v1/jobs/{FINISHED_JOB}/finish", json={"reason": HOSTILE_REASON}, headers=auth(alpha))
            assert r.status_code == 200, r.text
            _register(client, beta, OTHER_TENANTS_JOB, "rlhf")
            _post_reports(client, beta, OTHER_TENANTS_JOB, "rlhf", (0.5,))
        last = decisions[-1]
        yield Scenario(server, alpha, beta, 10 * len(decisions), last["best_step"], last["best_score"])
    finally:
        server.stop()


def sign_in_form(client: httpx.Client, token: str) -> httpx.Response:
    """Send the sign-in form with ``token`` (fetching the form first for its nonce, signed out first if the client
    is signed in); the answer to the form."""
    client.cookies.clear()
    form = client.get("/login")
    assert form.status_code == 200, form.text
    nonce = re.search(r'name="login_nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    return client.post("/login", data={"token": token, "login_nonce": html.unescape(nonce.group(1))})


def browser(url: str, source: str | None = None) -> httpx.Client:
    """A client with a cookie jar (a browser), connecting from the loopback address ``source`` if given."""
    transport = httpx.HTTPTransport(local_address=source) if source else None
    return httpx.Client(base_url=url, timeout=30.0, transport=transport)


@contextmanager
def sign_in(url: str, token: str, source: str | None = None) -> Iterator[httpx.Client]:
    """A browser signed in with ``token`` through the sign-in form."""
    with browser(url, source) as client:
        r = sign_in_form(client, token)
        assert r.status_code == 303 and r.headers["location"] == "/", r.text
        yield client
