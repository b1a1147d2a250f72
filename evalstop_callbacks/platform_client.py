"""``PlatformClient``: the HTTP transport of the information-boundary client.

It sends the same whitelisted :class:`~platform_sim.core.boundary.Report` objects as
:class:`~evalstop_callbacks.client.EmbeddedClient` to an ``evalstop-server`` and returns its decisions, so moving a job
from embedded to platform mode is one argument::

    EvalStopCallback(evaluator, eval_steps=50, client=PlatformClient("http://scheduler:8080", token))

Fail-open by design: a network fault never stops a job and never crashes training. Every report is also applied to an
in-process copy of the scheduler core (a "shadow" :class:`EmbeddedClient`), so when the service stays unreachable past
the retry budget a warning is logged and, with ``fallback=True`` (the default), the embedded core decides with the
job's full history: the job stays protected. Reports the service has not acknowledged are kept in order and re-sent
(idempotently) before the next one once it is reachable again, so the service ends up with the same history.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from platform_sim.core import (
    Action,
    BoundaryError,
    Decision,
    JobMonitor,
    Report,
    cadence_from_spec,
    default_spec,
    detector_from_spec,
)
from platform_sim.core.boundary import check_job_type

from .client import EmbeddedClient
from .scheduler_handle import detect_handle

logger = logging.getLogger(__name__)


class PlatformError(RuntimeError):
    """The service refused a request for a reason that is not a network fault (bad token, unknown job)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass
class _Link:
    """The client's view of one job's connection to the service."""

    job_type: str
    detector: dict[str, Any] | None
    gpus: int | None
    planned_steps: int | None
    cadence: dict[str, Any] | None = None  # normalized spec; None: the fixed cadence (not sent)
    registered: bool = False
    handle_sent: bool = False  # the scheduler handle was registered, or refused (it is sent once either way)
    backlog: list[Report] = field(default_factory=list)  # reports the service has not acknowledged, in order


class PlatformClient:
    """A :class:`~evalstop_callbacks.client.BoundaryClient` that talks to an ``evalstop-server`` over HTTP.

    Args:
        url: Base URL of the service, e.g. ``"http://127.0.0.1:8080"``.
        token: The tenant's bearer token (from ``evalstop-server tenant add NAME``).
        timeout: Seconds to wait for a reply (read/write) per attempt.
        connect_timeout: Seconds to wait for a connection per attempt.
        max_retries: Retries after a failed attempt (connection error, timeout or 5xx) before failing open. While the
            service is known to be down, each call makes a single attempt so training is not slowed by backoff.
        backoff: First retry delay in seconds; doubles per retry (with jitter) up to ``max_backoff``.
        max_backoff: Longest delay between two attempts.
        fallback: If True (default), when the service is unreachable the embedded core decides, with the job's full
            history, so the job is still protected. If False the decision is CONTINUE (fail-open, unprotected).
        gpus: GPUs the job holds, declared at registration when ``register`` is not given them (the trainer
            callback does not know them); the service then counts the GPUs its stops free.
        planned_steps: Planned training steps, declared likewise: the service's default detector bounds its false
            stops per run with them (the job view's ``per_run_bound``); with ``gpus`` the service estimates the
            GPU-hours a stop gives back.
        transport: An ``httpx`` transport, for tests (default: a real HTTP connection pool).
        scheduler_handle: The cluster scheduler's job this process runs as, registered once with each job right
            after the job's registration (``PUT /v1/jobs/{id}/scheduler-handle``), so that the service can end it
            there at a stop: ``(kind, ref)`` such as ``("slurm", "1234")`` or ``("ray", "raysubmit_...")``;
            ``"auto"`` to read it from the environment (``SLURM_JOB_ID``, the pod's downward API, Ray's job id;
            :func:`evalstop_callbacks.scheduler_handle.detect_handle`); None (default) to register none. Opt-in,
            and never part of a report. A refused handle (400/403/404/422) is logged and not sent again; the job
            still reports.
        warn_without_plan: Log a warning once for a job registered without ``planned_steps`` when its detector
            would use them (the service then decides it per look); off for a caller that says so itself.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 5.0,
        connect_timeout: float = 2.0,
        max_retries: int = 3,
        backoff: float = 0.2,
        max_backoff: float = 2.0,
        fallback: bool = True,
        gpus: int | None = None,
        planned_steps: int | None = None,
        transport: httpx.BaseTransport | None = None,
        scheduler_handle: str | tuple[str, str] | None = None,
        warn_without_plan: bool = True,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not token:
            raise ValueError("token must be a non-empty string (evalstop-server tenant add NAME prints one)")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be > 0")
        for name, value in (("gpus", gpus), ("planned_steps", planned_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
        self.gpus = gpus
        self.planned_steps = planned_steps
        self.scheduler_handle = _resolve_handle(scheduler_handle)
        self.url = url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.fallback = fallback
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "evalstop-platform-client/1"},
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            transport=transport,
        )
        self._shadow = EmbeddedClient(warn_without_plan=warn_without_plan)  # it warns for a job without a plan
        self._links: dict[str, _Link] = {}
        self._degraded = False  # the last attempt failed: single attempts until the service answers again
        self._rng = random.Random()
        self._lock = threading.Lock()
        #: How many decisions were made by the embedded fallback (or fail-open CONTINUE) instead of the service.
        self.fallback_decisions = 0
        #: Who made the last decision: ``"service"`` (acknowledged: durably committed there) or ``"fallback"``.
        self.last_source: str | None = None

    # -- transport -----------------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """Send one request with retries; the parsed JSON of a 2xx, None if the service is unreachable.

        Raises :class:`PlatformError` for a 4xx (the request itself is wrong; retrying cannot help).
        """
        attempts = 1 if self._degraded else 1 + self.max_retries
        last_problem = ""
        for attempt in range(attempts):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + 0.5 * self._rng.random()))
            try:
                resp = self._http.request(method, path, json=body)
            except httpx.HTTPError as exc:  # connect refused/reset, timeouts, protocol and decoding errors
                last_problem = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                last_problem = f"HTTP {resp.status_code}"
                continue
            if resp.status_code >= 400:
                try:
                    message = resp.json().get("message", resp.text)
                except (ValueError, AttributeError):
                    message = resp.text[:200]
                raise PlatformError(resp.status_code, message)
            try:
                reply = resp.json()
            except ValueError:  # e.g. a proxy's HTML page: not the service
                last_problem = f"HTTP {resp.status_code} with a body that is not JSON"
                continue
            if self._degraded:
                logger.warning("evalstop: scheduler service at %s is reachable again", self.url)
            self._degraded = False
            return reply
        if not self._degraded:
            logger.warning(
                "evalstop: scheduler service at %s unreachable after %d attempt(s) (%s); failing open",
                self.url,
                attempts,
                last_problem,
            )
        self._degraded = True
        return None

    def _ensure_registered(self, job_id: str, link: _Link) -> bool:
        if link.registered:
            return True
        body: dict[str, Any] = {"job_type": link.job_type, "job_id": job_id}
        if link.detector is not None:
            body["detector"] = link.detector
        if link.gpus is not None:
            body["gpus"] = link.gpus
        if link.planned_steps is not None:
            body["planned_steps"] = link.planned_steps
        if link.cadence is not None:
            body["cadence"] = link.cadence
        try:
            reply = self._request("POST", "/v1/jobs", body)
        except PlatformError as exc:
            if exc.status in (409, 422):
                raise ValueError(f"the scheduler refused job {job_id!r}: {exc.message}") from None
            logger.error("evalstop: the scheduler refused to register job %r (%s); failing open", job_id, exc)
            return False
        link.registered = reply is not None
        if isinstance(reply, Mapping):
            self._adopt_detector(job_id, reply.get("detector"))
        if link.registered:
            self._send_handle(job_id, link)
        return link.registered

    def _send_handle(self, job_id: str, link: _Link) -> None:
        """Register the scheduler handle of ``job_id`` once (again at the next report while the service is down)."""
        if self.scheduler_handle is None or link.handle_sent:
            return
        kind, ref = self.scheduler_handle
        try:
            reply = self._request("PUT", f"/v1/jobs/{job_id}/scheduler-handle", {"kind": kind, "ref": ref})
        except PlatformError as exc:
            link.handle_sent = True  # refused: sending it again would be refused again
            logger.error(
                "evalstop: the scheduler refused the %s handle %r of job %r (%s); the service will not end the "
                "job on its scheduler",
                kind,
                ref,
                job_id,
                exc,
            )
            return
        link.handle_sent = reply is not None

    def _local_spec(self, job_id: str) -> dict[str, Any]:
        """The local core's detector for a job registered with none: the one it runs already (a resume, maybe the
        service's), else the default the service registers too."""
        try:
            return self._shadow.monitor(job_id).detector.spec()
        except KeyError:
            return default_spec()

    def _adopt_detector(self, job_id: str, spec: Any) -> None:
        """Let the local fallback core run the detector the service registered (its reply names it)."""
        try:
            spec = detector_from_spec(spec).spec() if isinstance(spec, Mapping) else None
        except (TypeError, ValueError, KeyError):  # a detector this version does not know: keep the local one
            spec = None
        monitor = self._shadow.monitor(job_id)
        if spec is None or spec == monitor.detector.spec():
            return
        if monitor.steps:
            logger.warning(
                "evalstop: job %r runs %s at the service but %s locally", job_id, spec, monitor.detector.spec()
            )
            return
        self._shadow.replace_detector(job_id, spec)

    def _flush(self, job_id: str, link: _Link) -> Decision | None:
        """Send the job's unacknowledged reports in order; the decision for the last one, or None (unreachable)."""
        if not self._ensure_registered(job_id, link):
            return None
        decision = None
        while link.backlog:
            report = link.backlog[0]
            try:
                body = report.to_dict()
                body.pop("planned_steps", None)  # registered with the job, not sent per report (see report())
                reply = self._request("POST", f"/v1/jobs/{job_id}/evals", body)
            except PlatformError as exc:
                if exc.status in (409, 422):
                    # The local core accepted this report but the service's history contradicts it: typically a run
                    # resumed from a checkpoint older than the last step the service saw, whose re-evaluation gives
                    # another score. Not a reason to crash training: the report is dropped for the service and the
                    # local core (which holds this run's own history) decides.
                    link.backlog.pop(0)
                    logger.error(
                        "evalstop: the scheduler refused step %d of job %r (%s); the embedded core decides",
                        report.step,
                        job_id,
                        exc.message,
                    )
                    return None
                logger.error("evalstop: the scheduler refused a report of job %r (%s); failing open", job_id, exc)
                return None
            if reply is None:
                return None
            try:
                decision = Decision.from_dict(reply)
            except (BoundaryError, TypeError, ValueError) as exc:  # not a decision: treat like an unreachable service
                logger.warning(
                    "evalstop: the scheduler answered step %d of job %r with something that is not a "
                    "decision (%s); failing open",
                    report.step,
                    job_id,
                    exc,
                )
                return None
            link.backlog.pop(0)
        return decision

    # -- BoundaryClient --------------------------------------------------------------------------------------------
    def register(
        self,
        job_type: str,
        detector: Mapping[str, Any] | None = None,
        job_id: str | None = None,
        gpus: int | None = None,
        planned_steps: int | None = None,
        cadence: str | Mapping[str, Any] | None = None,
    ) -> str:
        """Register a job with the service (and the local fallback core) and return its id.

        Args:
            job_type: One of the core's job types.
            detector: Detector spec ``{"name": ..., "params": {...}}``; None: the service's default. The local
                fallback core runs the spec the service's reply names (else ``platform_sim.core.default_spec()``).
            job_id: The job's id; made up if not given (always chosen here, so a retried registration is
                idempotent on the service).
            gpus: GPUs the job holds (the service counts GPU-hours reclaimed by stops).
            planned_steps: Planned training steps (the trainer's ``max_steps``): the service's default detector
                bounds its false stops per run with them (without them, per report), and the GPU-hours-reclaimed
                estimate uses them.
            cadence: Cadence spec (``"fixed"``, ``"adaptive"`` or ``{"name": "adaptive", "params": {...}}``; None:
                fixed). With ``"adaptive"`` the service's decisions carry ``next_eval_step`` hints, and so do the
                local fallback core's, from the same history.

        Raises:
            ValueError: Bad job type, detector or cadence, or the service holds this id with another type,
                detector, GPU count or cadence.
        """
        check_job_type(job_type)
        job_id = job_id or f"job-{uuid.uuid4().hex[:16]}"
        gpus = self.gpus if gpus is None else gpus
        planned_steps = self.planned_steps if planned_steps is None else planned_steps
        # Normalized (defaults filled in) and validated here, so a bad spec fails before any network call.
        spec = None if detector is None else detector_from_spec(detector).spec()
        policy = cadence_from_spec(cadence)
        cadence_spec = None if policy is None else policy.spec()
        with self._lock:
            # Validates the specs locally; the shadow core gives the same hints as the service when it decides.
            local = spec if spec is not None else self._local_spec(job_id)
            self._shadow.register(job_type, detector=local, job_id=job_id, gpus=gpus, cadence=cadence_spec)
            link = self._links.get(job_id)
            if link is None:
                link = self._links[job_id] = _Link(job_type, spec, gpus, planned_steps, cadence_spec)
            self._ensure_registered(job_id, link)
        return job_id

    def report(self, report: Report) -> Decision:
        """Send one evaluation; the service's decision, or the fallback's if the service is unreachable.

        Raises:
            KeyError: The job was not registered with this client.
            InvalidReportError, ConflictError: The report breaks the contract, checked by the local core exactly as
                the embedded client does. If only the service refuses it (its history differs from this run's, e.g.
                after resuming from an older checkpoint), an error is logged and the local core decides.
        """
        with self._lock:
            link = self._links.get(report.job_id)
            if link is None:
                raise KeyError(f"job {report.job_id!r} is not registered; call register() first")
            # The plan the service decides with is the one the job registered (a report's planned_steps is not a
            # wire field: the service refuses unknown fields); the local core decides with the same one, so that
            # both apply the same rule.
            report = replace(report, planned_steps=link.planned_steps)
            local = self._shadow.report(report)  # same validation and rule as embedded mode
            if not any(r.step == report.step for r in link.backlog):
                link.backlog.append(report)
            remote = self._flush(report.job_id, link)
            if remote is not None:
                if remote.action is not local.action:
                    logger.warning(
                        "evalstop: service and local core disagree on job %r step %d (%s vs %s); following the service",
                        report.job_id,
                        report.step,
                        remote.action.value,
                        local.action.value,
                    )
                self.last_source = "service"
                return remote
            self.fallback_decisions += 1
            self.last_source = "fallback"
            if self.fallback:
                logger.warning(
                    "evalstop: job %r step %d decided by the embedded core (service unreachable): %s",
                    report.job_id,
                    report.step,
                    local.action.value,
                )
                return local
            return Decision(
                Action.CONTINUE, "scheduler unreachable: continuing (fail-open, no fallback)", 0, None, None
            )

    def finish(self, job_id: str, reason: str = "completed") -> None:
        """Tell the service the job ended (best effort: a network fault is logged, never raised)."""
        with self._lock:
            link = self._links.get(job_id)
            if link is None:
                raise KeyError(f"job {job_id!r} is not registered")
            self._shadow.finish(job_id, reason)
            try:
                if self._flush(job_id, link) is None and link.backlog:
                    logger.warning(
                        "evalstop: %d report(s) of job %r never reached the scheduler", len(link.backlog), job_id
                    )
                    return
                if (
                    link.registered
                    and self._request("POST", f"/v1/jobs/{job_id}/finish", {"reason": reason[:200] or "completed"})
                    is None
                ):
                    logger.warning("evalstop: could not tell the scheduler that job %r finished", job_id)
            except PlatformError as exc:
                logger.warning("evalstop: finishing job %r on the scheduler failed: %s", job_id, exc)

    # -- extras ------------------------------------------------------------------------------------------------------
    def monitor(self, job_id: str) -> JobMonitor:
        """The local (fallback) core's state of one job: the same history the service holds."""
        return self._shadow.monitor(job_id)

    def pending(self, job_id: str) -> int:
        """Number of the job's reports the service has not acknowledged yet."""
        return len(self._links[job_id].backlog)

    def state_dict(self) -> dict[str, Any]:
        """The local core's state and the unacknowledged reports (for a trainer checkpoint)."""
        return {
            "shadow": self._shadow.state_dict(),
            "links": {
                job_id: {
                    "job_type": link.job_type,
                    "detector": link.detector,
                    "gpus": link.gpus,
                    "planned_steps": link.planned_steps,
                    "cadence": link.cadence,
                    "backlog": [r.to_dict() for r in link.backlog],
                }
                for job_id, link in self._links.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._shadow.load_state_dict(state["shadow"])
        self._links = {
            job_id: _Link(
                link["job_type"],
                link["detector"],
                link["gpus"],
                link["planned_steps"],
                link.get("cadence"),  # absent in states saved before cadences: fixed
                backlog=[Report.from_dict(r) for r in link["backlog"]],
            )
            for job_id, link in state["links"].items()
        }

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve_handle(given: str | tuple[str, str] | None) -> tuple[str, str] | None:
    """The ``(kind, ref)`` of the ``scheduler_handle`` argument (``"auto"``: detected from the environment)."""
    if given is None:
        return None
    if given == "auto":
        found = detect_handle(os.environ)
        if found is None:
            logger.info("evalstop: no scheduler job found in the environment; no scheduler handle registered")
        return found
    if isinstance(given, str) or len(given) != 2 or not all(isinstance(x, str) and x for x in given):
        raise ValueError(f"scheduler_handle must be 'auto', (kind, ref) or None, got {given!r}")
    return given[0], given[1]
