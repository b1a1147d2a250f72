"""A job reporting through PlatformClient while the service is stopped and restarted gets, at every step, the
decision the service would have given (issue 33 finding 2): the local fallback core runs the spec the service
registered, not the paper's rule. Real server processes on loopback with real SQLite files."""

from __future__ import annotations

import math
import random
from pathlib import Path

import httpx
from service_support import Server, add_tenant, auth, free_port

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, Decision, Report, paper_spec


def _trace(seed: int, n: int = 40) -> list[tuple[int, float]]:
    """A run that rises, peaks at 60% of its evals and falls, with noise: the default detector stops it late, the
    paper's k-decline much earlier (on the noise), so a fallback that ran another rule would decide otherwise."""
    rng = random.Random(seed)
    return [(10 * (i + 1), math.sin(math.pi * i / (1.2 * n)) + rng.gauss(0, 0.03)) for i in range(n)]


def _reference(url: str, token: str, job: str, trace: list[tuple[int, float]]) -> list[Decision]:
    """The decisions of a service that was never stopped, for the same job registered without a detector."""
    with httpx.Client(base_url=url, headers=auth(token), timeout=20) as c:
        assert c.post("/v1/jobs", json={"job_id": job, "job_type": "rlhf"}).status_code == 201
        out = []
        for step, score in trace:
            resp = c.post(
                f"/v1/jobs/{job}/evals", json={"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score}
            )
            assert resp.status_code == 200, resp.text
            out.append(Decision.from_dict(resp.json()))
        return out


def test_decisions_through_two_outages_are_the_services(tmp_path: Path) -> None:
    db, ref_db = tmp_path / "service.db", tmp_path / "reference.db"
    token, ref_token = add_tenant(db, "acme"), add_tenant(ref_db, "acme")
    srv, ref = Server(db, free_port()).start(), Server(ref_db, free_port()).start()
    # job -> (the index of the loop at which it registers, its trace); "late" registers while the service is
    # stopped, so the client cannot read the registered spec back and must use the same default.
    jobs = {"early": (0, _trace(1, 40)), "late": (12, _trace(2, 28))}
    down = set(range(10, 18)) | set(range(26, 34))  # loop indices at which the service under test is stopped
    try:
        want = {job: _reference(ref.url, ref_token, job, trace) for job, (_, trace) in jobs.items()}
        got: dict[str, list[Decision]] = {job: [] for job in jobs}
        sources: list[tuple[bool, str | None]] = []
        with PlatformClient(srv.url, token, max_retries=0, backoff=0.01, connect_timeout=0.5) as client:
            for i in range(40):
                running = srv.proc is not None and srv.proc.poll() is None
                if i in down and running:
                    srv.stop()
                elif i not in down and not running:
                    srv.start()
                for job, (first, trace) in jobs.items():
                    if i == first:
                        client.register("rlhf", job_id=job)  # no detector: the service's default
                    if first <= i < first + len(trace):
                        step, score = trace[i - first]
                        got[job].append(client.report(Report(job, "rlhf", step, score)))
                        sources.append((i in down, client.last_source))
        assert {src for is_down, src in sources if is_down} == {"fallback"}
        assert {src for is_down, src in sources if not is_down} == {"service"}
        for job in jobs:
            assert got[job] == want[job], job  # every step, during and after each outage
        # The check has teeth: the paper's rule (the fallback's detector before the fix) decides otherwise here.
        for job, (_, trace) in jobs.items():
            assert _paper(job, trace) != [d.action for d in want[job]]
        assert any(d.action is Action.STOP for d in want["early"])
    finally:
        srv.stop()
        ref.stop()


def _paper(job: str, trace: list[tuple[int, float]]) -> list[Action]:
    emb = EmbeddedClient()
    emb.register("rlhf", detector=paper_spec(), job_id=job)
    return [emb.report(Report(job, "rlhf", s, v)).action for s, v in trace]
