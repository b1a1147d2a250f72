"""The report endpoint's two ways in (the ASGI fast path and the FastAPI route) share one parser: the same random
bodies sent to a real server of each kind get the same status and the same answer, message included."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import SERVER_WITHOUT_FAST_PATH_CMD, Server, add_tenant, auth, free_port

from platform_sim.service.routes.reports import parse_report

JOB = "j-1"
GOOD = {"job_id": JOB, "job_type": "rlhf", "step": 0, "eval_score": 0.5}

_numbers = st.one_of(
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2**62, 2**62 + 1, 10.0, 10.5, 1e308]),
)
_anything = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
_field_values = {
    "job_id": st.one_of(st.just(JOB), st.just("other"), st.just(""), st.just("bad id!"), _anything),
    "job_type": st.one_of(st.sampled_from(["rlhf", "dpo", "pretraining", "RLHF"]), _anything),
    "step": st.one_of(st.integers(-5, 10_000), st.sampled_from([2**62, 2**62 + 1, 3.0, 3.5, True, "7"]), _anything),
    "eval_score": st.one_of(_numbers, st.sampled_from([True, "0.5", None]), _anything),
    "eval_scores": st.one_of(
        st.lists(st.one_of(_numbers, st.sampled_from([True, "x", None])), max_size=4), st.just([]), _anything
    ),
    "eval_std": st.one_of(_numbers, st.sampled_from([0.0, -0.5, 0.25, True, "0.2", None]), _anything),
    "eval_n": st.one_of(st.integers(-2, 5), st.sampled_from([2**62 + 1, 3.0, 3.5, True, "7", None]), _anything),
}


@st.composite
def report_bodies(draw: st.DrawFn) -> bytes:
    """A request body: mostly a report with some fields changed, dropped or added; sometimes not JSON at all."""
    kind = draw(st.sampled_from(["report", "report", "report", "raw", "non-finite", "other-json"]))
    if kind == "raw":
        return draw(
            st.one_of(
                st.binary(max_size=40),
                st.sampled_from([b"", b"{", b'{"job_id": "j-1",', b"\xff\xfe", b"[" * 600 + b"]" * 600, b"null"]),
            )
        )
    if kind == "other-json":
        return json.dumps(draw(_anything)).encode()
    body: dict = dict(GOOD)
    body["step"] = draw(st.integers(0, 10_000))
    for name in draw(st.sets(st.sampled_from(sorted(_field_values)), max_size=3)):
        body[name] = draw(_field_values[name])
    for name in draw(st.sets(st.sampled_from(sorted(GOOD)), max_size=1)):
        body.pop(name, None)
    if draw(st.booleans()) and draw(st.booleans()):
        body[draw(st.sampled_from(["loss", "proxy_reward", "checkpoint", "extra"]))] = draw(_anything)
    text = json.dumps(body, allow_nan=True)
    if kind == "non-finite":  # NaN / Infinity literals, which Python's json writes and strict JSON refuses
        text = json.dumps({**body, "eval_score": draw(st.sampled_from([math.nan, math.inf, -math.inf]))})
    return text.encode()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """A real server with the fast path and one without, each on its own SQLite file with the same job."""
    folder = tmp_path_factory.mktemp("parser")
    started: list[Server] = []
    clients = []
    try:
        for name, cmd in (("fast", None), ("route", SERVER_WITHOUT_FAST_PATH_CMD)):
            db = Path(folder) / f"{name}.db"
            token = add_tenant(db, "t")
            srv = Server(db, free_port(), **({"cmd": cmd} if cmd else {})).start()
            started.append(srv)
            c = httpx.Client(base_url=srv.url, headers=auth(token), timeout=10)
            assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": JOB}).status_code == 201
            clients.append(c)
        yield clients[0], clients[1]
    finally:
        for c in clients:
            c.close()
        for srv in started:
            srv.stop()


def _answer(c: httpx.Client, job: str, body: bytes) -> tuple[int, object]:
    resp = c.post(f"/v1/jobs/{job}/evals", content=body, headers={"Content-Type": "application/json"})
    return resp.status_code, resp.json()


@settings(max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=report_bodies(), job=st.sampled_from([JOB, JOB, JOB, "other", "bad%20id", "x" * 130]))
def test_both_ways_in_answer_every_body_alike(servers: tuple[httpx.Client, httpx.Client], body: bytes, job: str):
    fast, route = servers
    # Both servers get the same requests in the same order, so their jobs' histories (and decisions) stay equal.
    assert _answer(fast, job, body) == _answer(route, job, body)


def test_the_property_reaches_every_outcome(servers: tuple[httpx.Client, httpx.Client]):
    """The random bodies above are not all refused alike: a valid report, a bad body, a bad path, a bad score."""
    fast, route = servers
    job = "j-outcomes"  # a job of its own: the property's reports above moved the other one's step on
    for c in servers:
        assert c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job}).status_code == 201
    good = {**GOOD, "job_id": job}
    cases = [
        (job, json.dumps(good).encode(), 200, None),
        (job, b"{", 422, "body: Invalid JSON"),
        ("bad%20id", json.dumps(good).encode(), 422, "path.job_id: String should match pattern"),
        (job, json.dumps({**good, "step": 1, "eval_score": math.nan}).encode(), 422, "eval_score"),
        (job, json.dumps({**good, "step": 2, "loss": 1.0}).encode(), 422, "loss: unknown field"),
        (job, json.dumps({**good, "step": 0, "eval_score": 0.7}).encode(), 409, "conflict"),
        ("other", json.dumps({**good, "job_id": "other"}).encode(), 404, "no job 'other'"),
    ]
    for path_job, body, status, words in cases:
        got = _answer(fast, path_job, body)
        assert got == _answer(route, path_job, body)
        assert got[0] == status, (path_job, body, got)
        if words is not None:
            assert words in json.dumps(got[1]), got


def test_parse_report_is_the_one_validation() -> None:
    # The function both ways call: the path's id first, then the body; one line naming the problem.
    assert parse_report(JOB, json.dumps(GOOD).encode()).eval_score == 0.5
    from platform_sim.service.errors import ApiError

    with pytest.raises(ApiError, match="path.job_id"):
        parse_report("bad id", b"{")
    with pytest.raises(ApiError, match=r"step: Input should be greater than or equal to 0"):
        parse_report(JOB, json.dumps({**GOOD, "step": -1}).encode())
