"""Detector and cadence parameters have bounds (issue 33 finding 9), and a detector spec without a name is the
default detector (finding 2's second default). Real server process on loopback with a real SQLite file; the same
bounds are checked by the core for the callback and the simulator."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from service_support import auth, tenant_server

from platform_sim.core import cadence_from_spec, default_spec, detector_from_spec
from platform_sim.core.detectors import PARAM_BOUNDS

# Specs the service accepted before the bounds, and whose job could never stop (or not within any run).
OUT_OF_BOUNDS = [
    ({"name": "k-decline", "params": {"k": 10**18}}, "k"),
    ({"name": "trend", "params": {"window": 10**9}}, "window"),
    ({"name": "trend", "params": {"window": 6, "short_window": 10**6}}, "short_window"),
    ({"name": "shape", "params": {"min_evals": 10**7}}, "min_evals"),
    ({"name": "cusum", "params": {"threshold": 1e300}}, "threshold"),
    ({"name": "k-decline", "params": {"warmup": 10**12}}, "warmup"),
    ({"name": "paired-test", "params": {"k": 5000}}, "k"),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with tenant_server(tmp_path_factory.mktemp("bounds")) as (srv, token):
        with httpx.Client(base_url=srv.url, headers=auth(token), timeout=20) as c:
            yield c


@pytest.mark.parametrize("spec,param", OUT_OF_BOUNDS)
def test_a_detector_parameter_out_of_bounds_is_422_naming_it(client: httpx.Client, spec: dict, param: str) -> None:
    resp = client.post("/v1/jobs", json={"job_id": f"b-{spec['name']}-{param}", "job_type": "rlhf", "detector": spec})
    assert resp.status_code == 422, resp.text
    assert f"parameter {param} must be in [" in resp.json()["message"]
    assert client.get(f"/v1/jobs/b-{spec['name']}-{param}").status_code == 404
    with pytest.raises(ValueError, match=f"parameter {param} must be in"):  # the callback and simulator refuse alike
        detector_from_spec(spec)


def test_a_parameter_at_its_bound_is_taken(client: httpx.Client) -> None:
    high = PARAM_BOUNDS["k-decline"]["k"][1]
    resp = client.post(
        "/v1/jobs",
        json={"job_id": "b-edge", "job_type": "rlhf", "detector": {"name": "k-decline", "params": {"k": high}}},
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["detector"]["params"]["k"] == high


def test_a_cadence_parameter_out_of_bounds_is_422_naming_it(client: httpx.Client) -> None:
    body = {"job_type": "rlhf", "cadence": {"name": "adaptive", "params": {"min_drop": 1e12}}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert "parameter min_drop must be in [0, 1e+09]" in resp.json()["message"]
    with pytest.raises(ValueError, match="parameter min_drop"):
        cadence_from_spec(body["cadence"])


def test_the_schema_lists_the_cadence_names(client: httpx.Client) -> None:
    """A schema-valid request is not refused for its cadence: the schema's names are exactly those the core takes."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["CadenceSpec"]["properties"]["name"]["enum"] == ["fixed", "adaptive"]
    for name in ("fixed", "adaptive"):
        resp = client.post("/v1/jobs", json={"job_type": "rlhf", "cadence": name})
        assert resp.status_code == 201, resp.text
    resp = client.post("/v1/jobs", json={"job_type": "rlhf", "cadence": "sometimes"})
    assert resp.status_code == 422 and "cadence" in resp.text


def test_a_detector_without_a_name_is_the_default_with_its_params(client: httpx.Client) -> None:
    """{"detector": {"params": ...}} ran the paper's k-decline (the wire model's own default); it is the project's
    default detector, the params given merged over its own."""
    resp = client.post("/v1/jobs", json={"job_type": "rlhf", "detector": {"params": {"window": 9}}})
    assert resp.status_code == 201, resp.text
    want = default_spec()
    want["params"]["window"] = 9
    assert resp.json()["detector"] == detector_from_spec(want).spec()
    resp = client.post("/v1/jobs", json={"job_type": "rlhf", "detector": {}})
    assert resp.json()["detector"] == detector_from_spec(default_spec()).spec()
    resp = client.post("/v1/jobs", json={"job_type": "rlhf", "detector": {"params": {"k": 0}}})
    assert resp.status_code == 422 and "k must be" in resp.json()["message"]


def test_no_schema_valid_cadence_is_refused(client: httpx.Client) -> None:
    """Schemathesis's schema-valid registrations (positive mode), their detector and cadence params dropped (random
    params are rightly refused): none is refused for its cadence, as "sometimes" was when the schema said any string."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    op = schema["/v1/jobs"]["POST"]
    refused: list[str] = []
    names: set[str] = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
    def run(case) -> None:  # noqa: ANN001 - schemathesis's Case
        body = dict(case.body)
        body.pop("detector", None)
        if isinstance(body.get("cadence"), dict):
            body["cadence"] = {"name": body["cadence"]["name"]}
        body.pop("job_id", None)  # a fresh id each time: no 409 from an earlier case
        cadence = body.get("cadence")
        names.add(cadence if isinstance(cadence, str) or cadence is None else cadence["name"])
        resp = client.post("/v1/jobs", json=body)
        if resp.status_code != 201 and "cadence" in resp.text:
            refused.append(f"{body} -> {resp.status_code} {resp.text[:200]}")

    run()
    assert not refused, "\n".join(refused[:5])
    assert {"fixed", "adaptive"} <= names
