"""Schema-driven fuzzing (schemathesis) of the real server against its own OpenAPI spec: no request gives a 5xx."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from service_support import Server, add_tenant, auth, free_port

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

# Bounded: about 2 x 150 examples in well under a minute on two busy cores.
EXAMPLES = 150


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    token = add_tenant(db, "fuzzer")
    srv = Server(db, free_port()).start()
    # Some real jobs, so that generated ids sometimes hit one and reach the core.
    with httpx.Client(base_url=srv.url, headers=auth(token)) as c:
        for job in ("a", "b", "0", "job-1"):
            c.post("/v1/jobs", json={"job_type": "rlhf", "job_id": job}).raise_for_status()
    spec = httpx.get(f"{srv.url}/openapi.json").json()
    try:
        yield srv, token, schemathesis.openapi.from_dict(spec)
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_from_the_spec_gets_a_server_error(live, mode):
    srv, token, schema = live
    seen: dict[int, int] = {}
    failures: list[str] = []

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=schema.as_strategy(generation_mode=mode))
    def run(case) -> None:
        # Most cases with the tenant's token; one in five keeps whatever the generator made (a random token: 401).
        headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        if len(repr(case.body)) % 5:
            headers["Authorization"] = f"Bearer {token}"
        elif case.headers:
            headers.update(case.headers)
        resp = case.call(base_url=srv.url, headers=headers, timeout=10)
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        if resp.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} body={case.body!r:.300} -> {resp.status_code} {resp.text[:300]}"
            )
        elif resp.status_code >= 400 and resp.status_code != 405:
            body = resp.json()  # every error is JSON with a message
            assert "message" in body and body["message"], body

    run()
    assert not failures, "\n".join(failures[:5])
    assert sum(seen.values()) >= EXAMPLES // 2
    assert httpx.get(f"{srv.url}/readyz").status_code == 200
    if mode is GenerationMode.POSITIVE:
        assert any(200 <= s < 300 for s in seen), seen  # the fuzzer got past validation into the core
    else:
        assert 422 in seen, seen
