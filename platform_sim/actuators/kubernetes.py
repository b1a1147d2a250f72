"""The Kubernetes actuator: suspend a stopped job through the API server, with the official ``kubernetes`` client.

What "stop" means here is what Kubernetes itself offers for batch work, so the job's pods go away and its quota
goes back to the queue while the object (and its logs, its checkpoints on volumes) stays for inspection:

- a job that Kueue manages (the ``kueue.x-k8s.io/queue-name`` label, a prebuilt Workload, or a Workload owner):
  its Kueue ``Workload`` gets ``spec.active=false``. Kueue then evicts it and suspends the job itself; suspending
  the job directly would race Kueue, which un-suspends jobs whose Workload is still admitted;
- otherwise a ``batch/v1`` Job or a JobSet (``jobset.x-k8s.io/v1alpha2``) gets ``spec.suspend=true``;
- a handle that names a Workload directly gets ``spec.active=false``.

Every change is a JSON merge patch (``application/merge-patch+json``), the one patch type custom resources accept,
and one request per try: retries and backoff are the caller's (the service's outbox worker). A job already gone
(404) counts as stopped. The handle syntax is ``namespace/kind/name`` with kind one of ``job``, ``jobset``,
``workload``, or ``namespace/name`` for a ``batch/v1`` Job; a pod finds its own namespace and name through the
downward API (docs/service.md, "Kubernetes").

The ``kubernetes`` package is an optional extra (``pip install 'evalstop[kubernetes]'``); it is imported only when
an actuator is built, so :func:`parse_ref` works without it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .base import ActionResult, HandleError, HandleRefused, SchedulerHandle, TenantScope

logger = logging.getLogger(__name__)

KIND = "kubernetes"
# The queue a job is submitted to; Kueue reads it as a label, and as an annotation of the same key (deprecated).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
# Set by Kueue on each Workload it creates for a job: the owning job's UID. A Workload's name is a hash whose
# recipe changed between Kueue releases, so the label is the reliable way from a job to its Workload.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class _CustomResource:
    group: str
    version: str
    plural: str
    kind: str


JOBSET = _CustomResource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
WORKLOAD = _CustomResource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
HANDLE_KINDS = ("job", "jobset", "workload")

# DNS-1123 label (namespaces) and subdomain (object names), as the API server validates them.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_name(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 subdomain, as the API server requires of an object's name."""
    return len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name) is not None


# HTTP statuses after which the same request can succeed later: timeouts, throttling, conflicts, server faults.
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

_OPTIONS = ("kubeconfig", "in_cluster", "context", "timeout_s")


@dataclass(frozen=True)
class KubernetesRef:
    """A parsed Kubernetes handle.

    Args:
        namespace: The object's namespace (a DNS-1123 label).
        kind: ``"job"`` (``batch/v1`` Job), ``"jobset"`` (``jobset.x-k8s.io/v1alpha2``) or ``"workload"``
            (``kueue.x-k8s.io/v1beta1``).
        name: The object's name (a DNS-1123 subdomain).
    """

    namespace: str
    kind: str
    name: str

    @property
    def ref(self) -> str:
        """The canonical handle, ``namespace/kind/name``."""
        return f"{self.namespace}/{self.kind}/{self.name}"


def parse_ref(ref: str) -> KubernetesRef:
    """Parse a handle ``namespace/kind/name`` or ``namespace/name`` (a ``batch/v1`` Job); syntax only.

    Args:
        ref: The handle as the job or the user gave it.

    Raises:
        HandleError: naming what is wrong with ``ref``.
    """
    parts = ref.split("/")
    if len(parts) == 2:
        namespace, kind, name = parts[0], "job", parts[1]
    elif len(parts) == 3:
        namespace, kind, name = parts
    else:
        raise HandleError(f"kubernetes handle {ref!r}: expected namespace/kind/name or namespace/name")
    if kind not in HANDLE_KINDS:
        raise HandleError(f"kubernetes handle {ref!r}: kind {kind!r} is not one of {', '.join(HANDLE_KINDS)}")
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise HandleError(f"kubernetes handle {ref!r}: namespace {namespace!r} is not a DNS-1123 label")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise HandleError(f"kubernetes handle {ref!r}: name {name!r} is not a DNS-1123 subdomain")
    return KubernetesRef(namespace, kind, name)


def ref_from_env(environ: Mapping[str, str]) -> str | None:
    """The handle of the job this process runs in, from the downward API's environment, or None outside one.

    A pod knows its namespace and its own name (``POD_NAMESPACE``, ``POD_NAME``), but the object to suspend is the
    Job or JobSet that made the pod, whose name is a label of the pod; the pod spec in docs/service.md passes the
    labels as ``JOBSET_NAME`` (``jobset.sigs.k8s.io/jobset-name``) and ``JOB_NAME``
    (``batch.kubernetes.io/job-name``). A JobSet wins over its child Job: the JobSet controller would undo a
    suspended child.

    Args:
        environ: The process environment (``os.environ``).

    Raises:
        HandleError: the variables are set but do not make a valid handle.
    """
    namespace = environ.get("POD_NAMESPACE", "").strip()
    jobset, job = environ.get("JOBSET_NAME", "").strip(), environ.get("JOB_NAME", "").strip()
    if not namespace or not (jobset or job):
        return None
    return parse_ref(f"{namespace}/jobset/{jobset}" if jobset else f"{namespace}/job/{job}").ref


def _queued(meta: Mapping[str, Any]) -> bool:
    """Whether the object's metadata submits it to a Kueue queue."""
    return QUEUE_LABEL in (meta.get("labels") or {}) or QUEUE_LABEL in (meta.get("annotations") or {})


def _retryable(status: int | None) -> bool:
    """Whether a failed request with HTTP ``status`` (``None``/0: no answer at all) can succeed if tried again."""
    return not status or status >= 500 or status in _RETRYABLE_STATUSES


def _api_reason(exc: Any) -> str:
    """One line from an ``ApiException``: the status, the reason and the server's message when it sent a Status."""
    message = ""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = str(body)[:200]
    text = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
    return f"{text}: {message}" if message else text


class KubernetesActuator:
    """Suspends Kubernetes batch jobs (Kueue Workload deactivation, or ``spec.suspend`` on a Job or JobSet).

    Args:
        api_client: A configured ``kubernetes.client.ApiClient`` (see :func:`build`).
        timeout_s: Seconds one API request may take before it counts as a retryable failure.
    """

    kind = KIND

    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        from kubernetes import client

        if not timeout_s > 0:
            raise ValueError(f"kubernetes actuator: timeout_s must be > 0, got {timeout_s!r}")
        self._api_client = api_client
        # Typed as Any: the client's annotations give the typed model as the result even with
        # _preload_content=False, which returns the raw HTTP response (read here, see _read and _patch).
        self._batch: Any = client.BatchV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self.timeout_s = float(timeout_s)

    # -- the Actuator interface ----------------------------------------------------------------------------------

    def parse(self, ref: str) -> SchedulerHandle:
        """The handle ``ref`` names, in its canonical form ``namespace/kind/name``; raises :class:`HandleError`."""
        return SchedulerHandle(KIND, parse_ref(ref).ref)

    def authorize(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """Check the handle's namespace is one of the tenant's and the object exists.

        Args:
            handle: A handle from :meth:`parse`.
            scope: The tenant's scope; its ``"kubernetes"`` owners are the namespaces it may name.

        Raises:
            HandleRefused: the namespace is not the tenant's, or the object does not exist (or the service
                account may not read it).
            HandleError: the handle is malformed, or the API server could not be asked (unreachable, a server
                error): the registration can be tried again later.
        """
        r = parse_ref(handle.ref)
        if r.namespace not in scope.owners(KIND):
            raise HandleRefused(f"kubernetes namespace {r.namespace!r} is not one of tenant {scope.tenant!r}'s")
        from kubernetes.client.exceptions import ApiException

        try:
            self._read(r)
        except ApiException as exc:
            if exc.status in (403, 404):
                # 403 as well: the service account may only read the tenants' namespaces (docs/service.md).
                raise HandleRefused(f"kubernetes {r.ref}: no such object ({_api_reason(exc)})") from None
            raise HandleError(f"kubernetes {r.ref}: could not check the object: {_api_reason(exc)}") from None
        except Exception as exc:  # unreachable server, timeout, TLS: not the tenant's fault, and not a refusal
            raise HandleError(f"kubernetes {r.ref}: could not ask the API server: {exc!r}"[:300]) from None

    def check_owner(self, handle: SchedulerHandle, scope: TenantScope) -> None:
        """The handle's namespace (its owner, fixed in the handle) must still be one of the tenant's."""
        if parse_ref(handle.ref).namespace not in scope.owners(KIND):
            raise HandleRefused("its namespace is no longer in this tenant's kubernetes scope")

    def act(self, handle: SchedulerHandle, phase: int) -> ActionResult:
        """Suspend the job (one phase, one patch); never raises for API faults.

        Args:
            handle: A handle from :meth:`parse`.
            phase: Always 0: suspending is a single step (a suspended job's pods are deleted by its controller).

        Returns:
            ``ok=True`` when the object was patched or is already gone (404); otherwise ``ok=False`` with the
            reason, retryable for timeouts, throttling, server errors and an unreachable server, not for a
            refusal (401, 403, 400, 422).
        """
        r = parse_ref(handle.ref)
        action = f"suspend {r.ref}"
        if phase != 0:
            return ActionResult(ok=True, action=action, detail=f"no phase {phase}: suspending is one step")
        from kubernetes.client.exceptions import ApiException

        try:
            return self._suspend(r)
        except ApiException as exc:
            if exc.status == 404:
                return ActionResult(ok=True, action=action, detail="already gone (404)")
            return ActionResult(ok=False, action=action, detail=_api_reason(exc), retryable=_retryable(exc.status))
        except Exception as exc:  # connection refused, timeout, TLS, a malformed answer: try again later
            logger.warning("kubernetes actuator: %s failed: %r", action, exc)
            return ActionResult(ok=False, action=action, detail=f"API server: {exc!r}"[:300], retryable=True)

    # -- the requests ----------------------------------------------------------------------------------------------

    def _read(self, r: KubernetesRef) -> dict[str, Any]:
        """GET the object the handle names, as its JSON dict (camelCase keys)."""
        if r.kind == "job":
            # Read raw, not into the client's typed V1Job: only the metadata matters here, and the typed model
            # refuses objects that do not match the client's own schema version (a newer or older API server).
            response = self._batch.read_namespaced_job(
                r.name, r.namespace, _request_timeout=self.timeout_s, _preload_content=False
            )
            result: dict[str, Any] = json.loads(response.data)
            return result
        res = JOBSET if r.kind == "jobset" else WORKLOAD
        obj: dict[str, Any] = self._custom.get_namespaced_custom_object(
            res.group, res.version, r.namespace, res.plural, r.name, _request_timeout=self.timeout_s
        )
        return obj

    def _patch(self, res: _CustomResource | None, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Merge-patch one object (``res`` None: a ``batch/v1`` Job)."""
        if res is None:
            self._batch.patch_namespaced_job(
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout_s,
                _preload_content=False,  # the answer is not needed, and typing it can fail on version skew
            ).read()  # to the end, so the connection goes back to the pool
        else:
            # Custom resources take only JSON (merge) patches: strategic merge needs Go struct tags they lack.
            self._custom.patch_namespaced_custom_object(
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout_s,
            )

    def _suspend(self, r: KubernetesRef) -> ActionResult:
        action = f"suspend {r.ref}"
        deactivate = {"spec": {"active": False}}
        if r.kind == "workload":
            self._patch(WORKLOAD, r.namespace, r.name, deactivate)
            return ActionResult(ok=True, action=f"deactivate workload {r.namespace}/{r.name}")
        meta = self._read(r).get("metadata") or {}
        workload, kueue_managed = self._workload_of(r, meta)
        if workload is not None and not _is_name(workload):
            # Read from the job's own metadata, which its tenant writes: never put such a name into a request path.
            logger.warning("kubernetes actuator: %s names its Workload %r, not a DNS-1123 name", r.ref, workload)
            return ActionResult(
                ok=False, action=action, detail="its Workload's name is not a DNS-1123 name", retryable=False
            )
        if workload is not None:
            self._patch(WORKLOAD, r.namespace, workload, deactivate)
            return ActionResult(ok=True, action=f"deactivate workload {r.namespace}/{workload} of {r.ref}")
        if kueue_managed:
            # Queued with Kueue, which has not made its Workload yet: suspending the job now would be undone when
            # Kueue admits it, so wait until the Workload exists.
            return ActionResult(
                ok=False, action=action, detail="Kueue-managed but its Workload does not exist yet", retryable=True
            )
        self._patch(None if r.kind == "job" else JOBSET, r.namespace, r.name, {"spec": {"suspend": True}})
        return ActionResult(ok=True, action=action)

    def _workload_of(self, r: KubernetesRef, meta: Mapping[str, Any]) -> tuple[str | None, bool]:
        """The name of the Kueue Workload that manages the job (None: none found), and whether Kueue manages it."""
        for owner in meta.get("ownerReferences") or []:
            if owner.get("kind") == WORKLOAD.kind and str(owner.get("apiVersion", "")).startswith(WORKLOAD.group):
                return str(owner["name"]), True
        labels = meta.get("labels") or {}
        if PREBUILT_WORKLOAD_LABEL in labels:
            return str(labels[PREBUILT_WORKLOAD_LABEL]), True
        if not _queued(meta):
            return None, False
        from kubernetes.client.exceptions import ApiException

        try:
            found = self._custom.list_namespaced_custom_object(
                WORKLOAD.group,
                WORKLOAD.version,
                r.namespace,
                WORKLOAD.plural,
                label_selector=f"{JOB_UID_LABEL}={meta.get('uid', '')}",
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            # The cluster serves no Workload API: Kueue is not installed, and the queue label means nothing.
            logger.warning("kubernetes actuator: %s has a Kueue queue label but the cluster has no Kueue", r.ref)
            return None, False
        items = found.get("items") or []
        if len(items) > 1:
            logger.warning(
                "kubernetes actuator: %d Workloads carry %s=%s; deactivating the first",
                len(items),
                JOB_UID_LABEL,
                meta.get("uid"),
            )
        return (str(items[0]["metadata"]["name"]) if items else None), True


def build(options: Mapping[str, str]) -> KubernetesActuator:
    """Build the actuator from the operator's configuration (the service's actuator registry calls this).

    Args:
        options: String options, all optional:
            ``kubeconfig`` (a kubeconfig file; default ``$KUBECONFIG`` or ``~/.kube/config``),
            ``in_cluster`` (``"true"``: use the pod's service account instead of a kubeconfig),
            ``context`` (the kubeconfig context; default its current context),
            ``timeout_s`` (seconds per API request, default 10).

    Raises:
        ValueError: an unknown option, a bad value, ``in_cluster`` with ``kubeconfig``/``context``, or a
            configuration the ``kubernetes`` client cannot load (one line naming it).
        ImportError: the ``kubernetes`` package is not installed.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"kubernetes actuator: unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
    in_cluster_text = options.get("in_cluster", "false").strip().lower()
    if in_cluster_text not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"kubernetes actuator: in_cluster must be true or false, got {options['in_cluster']!r}")
    in_cluster = in_cluster_text in ("true", "1", "yes")
    if in_cluster and ("kubeconfig" in options or "context" in options):
        raise ValueError("kubernetes actuator: in_cluster=true excludes kubeconfig and context")
    try:
        timeout_s = float(options.get("timeout_s", "10"))
    except ValueError:
        raise ValueError(f"kubernetes actuator: timeout_s must be a number, got {options['timeout_s']!r}") from None
    if not timeout_s > 0 or timeout_s != timeout_s or timeout_s == float("inf"):
        raise ValueError(f"kubernetes actuator: timeout_s must be a positive finite number, got {timeout_s!r}")
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ImportError(
            "the kubernetes actuator needs the kubernetes package: pip install 'evalstop[kubernetes]'"
        ) from exc

    configuration = client.Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=options.get("kubeconfig"),
                context=options.get("context"),
                client_configuration=configuration,
                persist_config=False,
            )
    except (config.ConfigException, OSError, ValueError) as exc:
        raise ValueError(f"kubernetes actuator: cannot load the cluster configuration: {exc}") from None
    # One try per request: the caller retries with backoff and records each attempt, so urllib3's own retries
    # would only hide attempts and stretch a try past timeout_s.
    configuration.retries = 0
    return KubernetesActuator(client.ApiClient(configuration), timeout_s=timeout_s)
