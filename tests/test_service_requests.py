"""Request headers and bodies every route answers alike (issue 33, findings 4-6): content types, two Authorization
headers, bodies nested too deep. Real server process on loopback with a real SQLite file."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port

JOB = "req-1"
REPORT = {"job_id": JOB, "job_type": "rlhf", "step": 10, "eval_score": 0.5}
# Every route that takes a JSON body, with a valid body.
BODY_ROUTES = [
    ("/v1/jobs", {"job_id": "req-2", "job_type": "rlhf"}),
    (f"/v1/jobs/{JOB}/evals", REPORT),
    (f"/v1/jobs/{JOB}/finish", {"reason": "completed"}),
]
ROUTES = [("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{JOB}"), *[("POST", path) for path, _ in BODY_ROUTES]]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    db = tmp_path_factory.mktemp("requests") / "service.db"
    token = add_tenant(db, "alice")
    srv = Server(db, free_port()).start()
    try:
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=20) as c:
            assert c.post("/v1/jobs", json={"job_id": JOB, "job_type": "rlhf"}).status_code == 201
            yield {"srv": srv, "token": token, "client": c}
    finally:
        srv.stop()


@pytest.mark.parametrize("path,body", BODY_ROUTES)
@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1", None]
)
def test_a_body_that_is_not_json_is_415(env: dict, path: str, body: dict, ctype: str | None) -> None:
    """The report path (its ASGI fast path) stored a text/plain report and POST /v1/jobs answered 422: every body
    route answers 415, and stores nothing."""
    c: httpx.Client = env["client"]
    headers = {} if ctype is None else {"content-type": ctype}
    request = c.build_request("POST", path, content=json.dumps(body).encode(), headers=headers)
    assert ("content-type" in request.headers) == (ctype is not None)
    resp = c.send(request)
    assert resp.status_code == 415, resp.text
    assert resp.json()["error"] == "unsupported_media_type"
    assert c.get(f"/v1/jobs/{JOB}").json()["n_reports"] == 0


@pytest.mark.parametrize(
    "ctype", ["application/json", "application/json; charset=UTF-8", "application/merge-patch+json"]
)
def test_json_content_types_are_taken(env: dict, ctype: str) -> None:
    c: httpx.Client = env["client"]
    resp = c.post("/v1/jobs", content=json.dumps({"job_id": JOB, "job_type": "rlhf"}), headers={"content-type": ctype})
    assert resp.status_code == 200, resp.text  # already registered


@pytest.mark.parametrize("method,path", ROUTES)
def test_two_authorization_headers_are_400(env: dict, method: str, path: str) -> None:
    """The report fast path read the last Authorization header, the other routes the first: each route refuses two."""
    body = dict(BODY_ROUTES).get(path)
    headers = [("authorization", f"Bearer {env['token']}"), ("authorization", "Bearer not-a-token")]
    with httpx.Client(base_url=env["srv"].url, timeout=20) as c:
        resp = c.request(method, path, json=body, headers=headers)
        assert resp.status_code == 400, resp.text
        assert "more than one Authorization header" in resp.json()["message"]
        # the other order too: neither header is picked
        resp = c.request(method, path, json=body, headers=headers[::-1])
        assert resp.status_code == 400, resp.text


@pytest.mark.parametrize("path,body", BODY_ROUTES)
def test_a_body_nested_too_deep_gets_one_message(env: dict, path: str, body: dict) -> None:
    """1,000 levels deep: POST /v1/jobs said "not UTF-8", the report endpoint "recursion limit": one message, the
    same on every route."""
    deep = json.dumps(body)[:-1] + ', "x": ' + "[" * 1000 + "]" * 1000 + "}"
    resp = env["client"].post(path, content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["message"] == "invalid request: body: Invalid JSON: nested too deep (recursion limit exceeded)"
