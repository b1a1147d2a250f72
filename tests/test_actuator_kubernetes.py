"""The Kubernetes actuator against a loopback API server that validates what it is sent.

No real kube-apiserver can be installed from the package registries this project reaches (docs/service.md,
"Kubernetes", says what was tried), so the actuator talks, through the official ``kubernetes`` client configured
from a kubeconfig file, to an HTTP server on an OS-picked loopback port that answers the few API paths involved
the way the API server does (Status objects, 401/403/404/415/422/500, merge-patch semantics) and checks each
request body against a schema:

- ``batch/v1`` Job: the published OpenAPI schema as the installed ``kubernetes`` package carries it (each model's
  ``openapi_types`` and ``attribute_map``): a patch may name only real fields, each with its type;
- Kueue ``kueue.x-k8s.io/v1beta1`` Workload and ``jobset.x-k8s.io/v1alpha2`` JobSet: their schemas are not in that
  package (they are CRDs), so the fields of their ``spec`` are written out below from the projects' published API
  references (Workload ``spec.active`` bool, ``queueName`` string, ...; JobSet ``spec.suspend`` bool, ...); their
  ``metadata`` is the ObjectMeta of the package's schema.

A body that fails the check gets a 422 and the test fails; the server records each request's verb, path,
content type and body for the assertions.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
from kubernetes import client as k8s_client  # noqa: E402

from platform_sim.actuators.base import HandleError, HandleRefused, SchedulerHandle, TenantScope  # noqa: E402
from platform_sim.actuators.kubernetes import (  # noqa: E402
    JOB_UID_LABEL,
    QUEUE_LABEL,
    KubernetesActuator,
    build,
    ref_from_env,
)

TOKEN = "test-token-0123"
MERGE = "application/merge-patch+json"

# -- the schemas ------------------------------------------------------------------------------------------------------

# The published API references of Kueue v1beta1 Workload and JobSet v1alpha2: the fields of spec, typed; status is
# written by their controllers only and is left open here. A name that is a string is a model of the kubernetes
# package's OpenAPI schema.
WORKLOAD_SCHEMA: dict[str, Any] = {
    "apiVersion": str,
    "kind": str,
    "metadata": "V1ObjectMeta",
    "spec": {
        "active": bool,
        "queueName": str,
        "podSets": list,
        "priority": int,
        "priorityClassName": str,
        "priorityClassSource": str,
        "maximumExecutionTimeSeconds": int,
    },
    "status": dict,
}
JOBSET_SCHEMA: dict[str, Any] = {
    "apiVersion": str,
    "kind": str,
    "metadata": "V1ObjectMeta",
    "spec": {
        "suspend": bool,
        "replicatedJobs": list,
        "network": dict,
        "successPolicy": dict,
        "failurePolicy": dict,
        "startupPolicy": dict,
        "coordinator": dict,
        "managedBy": str,
        "ttlSecondsAfterFinished": int,
    },
    "status": dict,
}
# (group, version, plural) -> (schema, whether it is a custom resource)
RESOURCES: dict[tuple[str, str, str], tuple[Any, bool]] = {
    ("batch", "v1", "jobs"): ("V1Job", False),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets"): (JOBSET_SCHEMA, True),
    ("kueue.x-k8s.io", "v1beta1", "workloads"): (WORKLOAD_SCHEMA, True),
}
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
    "datetime": (str,),
    "date": (str,),
    "bytes": (str,),
    "object": (object,),
}


def schema_errors(value: Any, schema: Any, path: str) -> list[str]:
    """What in ``value`` (a merge-patch fragment: null deletes, so it is allowed anywhere) breaks ``schema``."""
    if value is None:
        return []
    if isinstance(schema, dict):  # a structural schema written above
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        errors = []
        for key, sub in value.items():
            if key not in schema:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors.extend(schema_errors(sub, schema[key], f"{path}.{key}"))
        return errors
    if isinstance(schema, type):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {schema.__name__}, got {type(value).__name__}"]
    return openapi_errors(value, schema, path)


def openapi_errors(value: Any, type_name: str, path: str) -> list[str]:
    """Check ``value`` against the OpenAPI type ``type_name`` as the kubernetes package's models declare it."""
    if value is None:
        return []
    if m := re.fullmatch(r"List\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in openapi_errors(v, m.group(1), f"{path}[{i}]")]
    if m := re.fullmatch(r"Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in openapi_errors(v, m.group(1), f"{path}.{k}")]
    if type_name in _PRIMITIVES:
        types = _PRIMITIVES[type_name]
        ok = isinstance(value, types) and not (bool not in types and isinstance(value, bool) and object not in types)
        return [] if ok else [f"{path}: expected {type_name}, got {type(value).__name__}"]
    model = getattr(k8s_client, type_name)  # a model of the schema: its JSON field names and their types
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({type_name}), got {type(value).__name__}"]
    json_to_attr = {json_name: attr for attr, json_name in model.attribute_map.items()}
    errors = []
    for key, sub in value.items():
        if key not in json_to_attr:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            errors.extend(openapi_errors(sub, model.openapi_types[json_to_attr[key]], f"{path}.{key}"))
    return errors


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- the server -------------------------------------------------------------------------------------------------------

_PATH = re.compile(
    r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?"
)


class FakeApiServer:
    """A loopback HTTP server answering the API paths of Jobs, JobSets and Workloads, validating each body.

    ``objects`` maps ``(plural, namespace, name)`` to the stored object; ``faults`` maps ``(verb, plural)`` to an
    HTTP status to answer instead, or to ``"hang"`` (answer nothing for ``hang_s``); ``requests`` records what
    came in, ``rejected`` every body the schema check refused.
    """

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.faults: dict[tuple[str, str], int | str] = {}
        self.unserved: set[str] = set()  # plurals whose API (CRD) this cluster lacks
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self.hang_s = 5.0
        self._stop = threading.Event()
        self._version = 100
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
                pass

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
                self._send(code, {**status, "message": message, "reason": reason, "code": code})

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_PATCH(self) -> None:
                server._handle(self, "PATCH")

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_DELETE(self) -> None:
                server._handle(self, "DELETE")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def add(self, plural: str, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
        """Store an object (its metadata filled in as the API server would)."""
        self._version += 1
        meta = {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{plural}-{name}",
            "resourceVersion": str(self._version),
        }
        meta.update(fields.pop("metadata", {}))
        obj = {"metadata": meta, **fields}
        self.objects[(plural, namespace, name)] = obj
        return obj

    def patches(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["verb"] == "PATCH"]

    def _handle(self, h: Any, verb: str) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        content_type = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        self.requests.append(
            {"verb": verb, "path": url.path, "query": parse_qs(url.query), "content_type": content_type, "body": body}
        )
        if h.headers.get("Authorization") != f"Bearer {TOKEN}":
            return h._status(401, "Unauthorized", "Unauthorized")
        m = _PATH.fullmatch(url.path)
        res = RESOURCES.get((m["group"], m["version"], m["plural"])) if m else None
        if m is None or res is None or m["plural"] in self.unserved:
            return h._status(404, "NotFound", f"the server could not find the requested resource ({url.path})")
        plural, ns, name = m["plural"], m["ns"], m["name"]
        fault = self.faults.get((verb, plural))
        if fault == "hang":
            self._stop.wait(self.hang_s)
            h.close_connection = True
            return None
        if isinstance(fault, int):
            reason = {403: "Forbidden", 500: "InternalError", 429: "TooManyRequests"}.get(fault, "Unknown")
            return h._status(fault, reason, f"{plural} {name!r} in {ns!r}: {reason} (injected)")
        schema, custom = res
        if verb == "GET" and name is None:
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            key, _, want = selector.partition("=")
            items = [
                o
                for (p, n, _), o in self.objects.items()
                if p == plural and n == ns and (not key or o["metadata"].get("labels", {}).get(key) == want)
            ]
            return h._send(200, {"kind": "List", "apiVersion": f"{m['group']}/{m['version']}", "items": items})
        obj = self.objects.get((plural, ns, name)) if name else None
        if obj is None:
            return h._status(404, "NotFound", f'{plural} "{name}" not found')
        if verb == "GET":
            return h._send(200, obj)
        if verb != "PATCH":
            return h._status(405, "MethodNotAllowed", f"{verb} is not served here")
        if content_type == "application/strategic-merge-patch+json" and custom:
            return h._status(415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources")
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                return h._status(
                    400, "BadRequest", "json: cannot unmarshal object into Go value of type []jsonpatch.Operation"
                )
            return h._status(415, "UnsupportedMediaType", "this test server applies merge patches only")
        if content_type not in (MERGE, "application/strategic-merge-patch+json"):
            return h._status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        if not isinstance(body, dict):
            return h._status(400, "BadRequest", "a merge patch must be a JSON object")
        errors = openapi_errors(body, schema, "") if isinstance(schema, str) else schema_errors(body, schema, "")
        if errors:
            self.rejected.extend(errors)
            return h._status(422, "Invalid", "; ".join(errors))
        merged = merge_patch(obj, body)
        self._version += 1
        merged["metadata"]["resourceVersion"] = str(self._version)
        self.objects[(plural, ns, name)] = merged
        return h._send(200, merged)


# What a batch/v1 Job's spec must hold (a pod template); the tests' Jobs carry it so typed reads of them work.
POD_TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "trainer:1"}], "restartPolicy": "Never"}}


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "evalstop", "user": {"token": TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "evalstop", "namespace": "team-a"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config))  # YAML is a superset of JSON
    return path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, KubernetesActuator]]:
    server = FakeApiServer().start()
    try:
        actuator = build({"kubeconfig": str(write_kubeconfig(tmp_path / "kubeconfig", server.url)), "timeout_s": "1"})
        yield server, actuator
    finally:
        server.stop()


SCOPE = TenantScope("a", {"kubernetes": frozenset({"team-a"})})


def _handle(actuator: KubernetesActuator, ref: str) -> SchedulerHandle:
    handle = actuator.parse(ref)
    actuator.authorize(handle, SCOPE)
    return handle


# -- the tests --------------------------------------------------------------------------------------------------------


def test_kueue_managed_job_gets_its_workload_deactivated(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    job_spec = {"suspend": False, "template": POD_TEMPLATE}
    server.add("jobs", "team-a", "train-1", metadata={"labels": {QUEUE_LABEL: "gpu"}}, spec=job_spec)
    server.add("workloads", "team-a", "job-train-1-7c2f1", metadata={"labels": {JOB_UID_LABEL: "uid-jobs-train-1"}})
    server.add("workloads", "team-a", "job-other-3b9a0", metadata={"labels": {JOB_UID_LABEL: "uid-jobs-other"}})
    result = actuator.act(_handle(actuator, "team-a/train-1"), 0)
    assert result.ok and result.next_phase_after_s is None, result
    assert "job-train-1-7c2f1" in result.action
    (patch,) = server.patches()
    assert patch["path"] == "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/workloads/job-train-1-7c2f1"
    assert patch["content_type"] == MERGE and patch["body"] == {"spec": {"active": False}}
    lists = [r for r in server.requests if r["path"].endswith("/workloads")]
    assert lists[0]["query"]["labelSelector"] == [f"{JOB_UID_LABEL}=uid-jobs-train-1"]
    assert server.objects[("workloads", "team-a", "job-train-1-7c2f1")]["spec"] == {"active": False}
    assert "spec" not in server.objects[("workloads", "team-a", "job-other-3b9a0")]
    assert server.objects[("jobs", "team-a", "train-1")]["spec"] == job_spec  # Kueue suspends it, not us
    assert server.rejected == []


def test_kueue_workload_found_by_prebuilt_label_or_owner(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("workloads", "team-a", "wl-pre")
    server.add("workloads", "team-a", "wl-owner")
    server.add("jobs", "team-a", "pre", metadata={"labels": {"kueue.x-k8s.io/prebuilt-workload-name": "wl-pre"}})
    owner = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "name": "wl-owner", "uid": "u1"}
    server.add("jobsets", "team-a", "owned", metadata={"ownerReferences": [owner]})
    assert actuator.act(_handle(actuator, "team-a/job/pre"), 0).ok
    assert actuator.act(_handle(actuator, "team-a/jobset/owned"), 0).ok
    assert [p["path"].rsplit("/", 1)[1] for p in server.patches()] == ["wl-pre", "wl-owner"]
    assert all(p["body"] == {"spec": {"active": False}} for p in server.patches())


@pytest.mark.parametrize("name", ["../../namespaces/team-b/workloads/x", "WL", "wl/other", "a" * 254, ""])
def test_a_workload_name_from_tenant_written_metadata_must_be_a_dns_name(
    api: tuple[FakeApiServer, KubernetesActuator], name: str
) -> None:
    # ownerReferences and the prebuilt-workload label are written by whoever wrote the job: a name that is not a
    # DNS-1123 subdomain never reaches a request path; the stop fails, not retried, and nothing is patched.
    server, actuator = api
    owner = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "name": name, "uid": "u1"}
    server.add("jobsets", "team-a", "owned", metadata={"ownerReferences": [owner]})
    server.add("jobs", "team-a", "pre", metadata={"labels": {"kueue.x-k8s.io/prebuilt-workload-name": name}})
    for ref in ("team-a/jobset/owned", "team-a/job/pre"):
        result = actuator.act(_handle(actuator, ref), 0)
        assert (result.ok, result.retryable) == (False, False)
        assert result.detail == "its Workload's name is not a DNS-1123 name"
    assert server.patches() == []


def test_queued_job_without_its_workload_yet_is_retried_not_suspended(
    api: tuple[FakeApiServer, KubernetesActuator],
) -> None:
    server, actuator = api
    server.add("jobs", "team-a", "train-2", metadata={"labels": {QUEUE_LABEL: "gpu"}})
    result = actuator.act(_handle(actuator, "team-a/train-2"), 0)
    assert not result.ok and result.retryable and "Workload" in result.detail
    assert server.patches() == []


def test_queue_label_without_kueue_installed_suspends_the_job(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.unserved.add("workloads")
    server.add("jobs", "team-a", "train-3", metadata={"labels": {QUEUE_LABEL: "gpu"}}, spec={"template": POD_TEMPLATE})
    result = actuator.act(_handle(actuator, "team-a/train-3"), 0)
    assert result.ok, result
    (patch,) = server.patches()
    assert patch["path"].endswith("/jobs/train-3") and patch["body"] == {"spec": {"suspend": True}}


def test_plain_job_and_jobset_get_spec_suspend(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("jobs", "team-a", "plain", spec={"parallelism": 2, "template": POD_TEMPLATE})
    server.add("jobsets", "team-a", "multi", spec={"replicatedJobs": []})
    assert actuator.act(_handle(actuator, "team-a/plain"), 0).ok
    assert actuator.act(_handle(actuator, "team-a/jobset/multi"), 0).ok
    job_patch, jobset_patch = server.patches()
    assert job_patch["path"] == "/apis/batch/v1/namespaces/team-a/jobs/plain"
    assert jobset_patch["path"] == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/multi"
    for patch in (job_patch, jobset_patch):
        assert patch["content_type"] == MERGE and patch["body"] == {"spec": {"suspend": True}}
    assert server.objects[("jobs", "team-a", "plain")]["spec"] == {
        "parallelism": 2,
        "template": POD_TEMPLATE,
        "suspend": True,
    }
    assert server.objects[("jobsets", "team-a", "multi")]["spec"]["suspend"] is True
    assert server.rejected == []


def test_workload_handle_is_deactivated_directly(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("workloads", "team-a", "wl-1", spec={"active": True, "queueName": "gpu"})
    assert actuator.act(_handle(actuator, "team-a/workload/wl-1"), 0).ok
    assert server.objects[("workloads", "team-a", "wl-1")]["spec"] == {"active": False, "queueName": "gpu"}


def test_foreign_namespace_and_unknown_object_are_refused(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("jobs", "team-b", "theirs")
    with pytest.raises(HandleRefused, match="team-b"):
        actuator.authorize(actuator.parse("team-b/theirs"), SCOPE)
    assert server.requests == []  # refused before asking the cluster
    with pytest.raises(HandleRefused, match="no such object"):
        actuator.authorize(actuator.parse("team-a/missing"), SCOPE)
    with pytest.raises(HandleRefused):
        actuator.authorize(actuator.parse("team-a/theirs"), TenantScope("c", {}))  # no kubernetes namespaces
    with pytest.raises(HandleError, match="kind 'pod'"):
        actuator.parse("team-a/pod/x")
    assert actuator.parse("team-a/train").ref == "team-a/job/train"


def test_authorize_when_the_server_fails_is_no_refusal(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("jobs", "team-a", "train")
    server.faults[("GET", "jobs")] = 500
    with pytest.raises(HandleError, match="could not check") as info:
        actuator.authorize(actuator.parse("team-a/train"), SCOPE)
    assert not isinstance(info.value, HandleRefused)


def test_gone_job_counts_as_stopped(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    server, actuator = api
    server.add("workloads", "team-a", "wl-2")
    handle = _handle(actuator, "team-a/workload/wl-2")
    server.objects.clear()  # deleted between registration and the stop
    result = actuator.act(handle, 0)
    assert result.ok and "404" in result.detail
    assert actuator.act(actuator.parse("team-a/never-was"), 0).ok


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (429, True), (403, False)])
def test_api_errors_fail_with_retryable_by_status(
    api: tuple[FakeApiServer, KubernetesActuator], status: int, retryable: bool
) -> None:
    server, actuator = api
    server.add("jobs", "team-a", "train")
    handle = _handle(actuator, "team-a/train")
    server.faults[("PATCH", "jobs")] = status
    result = actuator.act(handle, 0)
    assert not result.ok and result.retryable is retryable, result
    assert f"HTTP {status}" in result.detail and "injected" in result.detail
    assert server.objects[("jobs", "team-a", "train")].get("spec") is None


def test_unreachable_and_hanging_server_fail_retryable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = build({"kubeconfig": str(write_kubeconfig(tmp_path / "dead", f"http://127.0.0.1:{port}")), "timeout_s": "1"})
    result = dead.act(dead.parse("team-a/train"), 0)
    assert not result.ok and result.retryable and "API server" in result.detail
    with pytest.raises(HandleError, match="could not ask the API server"):
        dead.authorize(dead.parse("team-a/train"), SCOPE)

    server = FakeApiServer().start()
    try:
        server.add("jobs", "team-a", "train")
        slow = build({"kubeconfig": str(write_kubeconfig(tmp_path / "slow", server.url)), "timeout_s": "0.5"})
        server.faults[("GET", "jobs")] = "hang"
        t0 = time.monotonic()
        result = slow.act(slow.parse("team-a/train"), 0)
        assert not result.ok and result.retryable, result
        assert time.monotonic() - t0 < 3.0  # bounded by timeout_s, one try
    finally:
        server.stop()


def test_the_server_rejects_bodies_outside_the_schemas(api: tuple[FakeApiServer, KubernetesActuator]) -> None:
    """The check the other tests rely on can fail: wrong fields, wrong types and wrong patch types are refused."""
    server, actuator = api
    server.add("jobs", "team-a", "j", spec={"template": POD_TEMPLATE})
    server.add("workloads", "team-a", "w")
    batch = k8s_client.BatchV1Api(actuator._api_client)
    custom = k8s_client.CustomObjectsApi(actuator._api_client)
    bad_job_bodies = [{"spec": {"suspend": "yes"}}, {"spec": {"suspended": True}}, {"spec": {"parallelism": True}}]
    for body in bad_job_bodies:
        with pytest.raises(k8s_client.ApiException) as info:
            batch.patch_namespaced_job("j", "team-a", body, _content_type=MERGE)
        assert info.value.status == 422
    with pytest.raises(k8s_client.ApiException) as info:
        custom.patch_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta1", "team-a", "workloads", "w", {"spec": {"active": "false"}}, _content_type=MERGE
        )
    assert info.value.status == 422
    with pytest.raises(k8s_client.ApiException) as info:  # strategic merge does not apply to custom resources
        custom.patch_namespaced_custom_object(
            "kueue.x-k8s.io",
            "v1beta1",
            "team-a",
            "workloads",
            "w",
            {"spec": {"active": False}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert info.value.status == 415
    assert len(server.rejected) == 4
    assert server.objects[("jobs", "team-a", "j")]["spec"] == {"template": POD_TEMPLATE}


def test_build_refuses_bad_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        build({"kubecfg": "x"})
    with pytest.raises(ValueError, match="excludes"):
        build({"in_cluster": "true", "kubeconfig": "x"})
    with pytest.raises(ValueError, match="timeout_s"):
        build({"timeout_s": "-1"})
    with pytest.raises(ValueError, match="in_cluster"):
        build({"in_cluster": "maybe"})
    with pytest.raises(ValueError, match="cannot load"):
        build({"kubeconfig": str(tmp_path / "absent")})
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # as outside a pod, even where tests run in one
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ValueError, match="cannot load"):
        build({"in_cluster": "true"})


def test_handle_from_the_downward_api_environment() -> None:
    pod = {"POD_NAMESPACE": "team-a", "POD_NAME": "train-1-x7k2p", "JOB_NAME": "train-1"}
    assert ref_from_env(pod) == "team-a/job/train-1"
    assert ref_from_env({**pod, "JOBSET_NAME": "multi"}) == "team-a/jobset/multi"  # the JobSet, not its child Job
    assert ref_from_env({"POD_NAME": "train-1-x7k2p"}) is None  # not in a pod spec that passes the labels
    assert ref_from_env({"POD_NAMESPACE": "team-a", "POD_NAME": "p"}) is None
    with pytest.raises(HandleError, match="namespace"):
        ref_from_env({"POD_NAMESPACE": "Team_A", "JOB_NAME": "train-1"})
