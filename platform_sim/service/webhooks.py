"""Webhook delivery: the signed request, the retry schedule, and the background worker that drains the outbox.

Every event a webhook subscribes to is copied into the ``webhook_outbox`` table in the transaction that wrote the
event (:func:`~platform_sim.service.events.fanout_sql`), so a committed stop always has its pending delivery, and a
crash (``kill -9``) loses none: the worker of the next server process finds the row and sends it. The worker runs
in the server process (a thread started by the app's lifespan, running its own event loop), never on the report
path: a dead or slow endpoint costs one delivery its timeout and nothing else. The timeout is a *total* deadline on
the attempt (connect, send, status line and headers): a receiver that drips one byte at a time is cut off at it, where
a per-read timeout would wait for minutes. Each tenant has its own lanes (:attr:`WebhookSettings.concurrency`
deliveries in flight at most) and the claim loop never waits for a delivery to end, so a tenant's hanging or slow
receivers hold back only that tenant's own deliveries.

Delivery is *at least once*: the worker claims due rows for a lease (:attr:`WebhookSettings.lease_s`), POSTs each,
then records the attempt (``webhook.delivered`` or ``webhook.failed`` in the audit trail) and deletes or reschedules
the row in one transaction. A process killed between the POST and that transaction sends the event again after the
lease: receivers de-duplicate by the event's ``id``. A failed attempt is retried after ``backoff_s * 2**(n-1)``
seconds, at most ``backoff_max_s``, until ``max_attempts`` (then the row is dropped and the last ``webhook.failed``
event says ``next_attempt_at: null``).

The request (documented in ``docs/service.md``)::

    POST <url>
    Content-Type: application/json
    X-EvalStop-Event: job.stopped
    X-EvalStop-Timestamp: 1796419415
    X-EvalStop-Signature: sha256=<hex HMAC-SHA256 of the raw body, keyed with the webhook's secret>

    {"webhook_id": 1, "delivery": {"id": 5, "attempt": 1, "timestamp": 1796419415},
     "event": {"id": 7, "type": "job.stopped", "job_id": "...", "time": ..., "details": {...}}}

The timestamp is inside the signed body too (``delivery.timestamp``, equal to the header): a receiver that checks the
signature, then that the timestamp is recent, refuses a captured request replayed later.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .events import event_json
from .store import Delivery, Store

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-EvalStop-Signature"
TIMESTAMP_HEADER = "X-EvalStop-Timestamp"
EVENT_HEADER = "X-EvalStop-Event"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """How the background worker delivers webhooks and prunes the audit trail (``evalstop-server serve`` flags).

    Args:
        timeout_s: Longest one attempt may take, all of it (connect, send, the answer's status and headers).
        backoff_s: Delay before the first retry; doubled at each further failure.
        backoff_max_s: The longest delay between two attempts (the cap of the doubling).
        max_attempts: Attempts before a delivery is given up.
        poll_s: How often the worker looks for due deliveries.
        concurrency: Deliveries of one tenant in flight at once (its lanes).
        max_in_flight: Deliveries in flight at once, all tenants together.
        event_retention_days: Events older than this are pruned (0: kept forever).
        prune_every_s: How often pruning runs.
    """

    timeout_s: float = 5.0
    backoff_s: float = 1.0
    backoff_max_s: float = 300.0
    max_attempts: int = 20
    poll_s: float = 0.5
    concurrency: int = 4
    max_in_flight: int = 64
    event_retention_days: float = 90.0
    prune_every_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "backoff_s", "backoff_max_s", "poll_s", "prune_every_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if min(self.max_attempts, self.concurrency, self.max_in_flight) < 1:
            raise ValueError(
                "max_attempts, concurrency and max_in_flight must be >= 1, "
                f"got {self.max_attempts}, {self.concurrency}, {self.max_in_flight}"
            )
        if not 0 <= self.event_retention_days < float("inf"):
            raise ValueError(f"event_retention_days must be >= 0, got {self.event_retention_days}")

    @property
    def lease_s(self) -> float:
        """How long a claimed delivery is not claimed again: longer than one attempt can take."""
        return 2 * self.timeout_s + 5.0

    def retry_at(self, attempt: int, now: float) -> float | None:
        """When to try again after failed attempt number ``attempt`` (1-based), or None to give up."""
        if attempt >= self.max_attempts:
            return None
        return now + min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))


METADATA_HOSTS = frozenset(
    {"169.254.169.254", "fd00:ec2::254", "100.100.100.200", "metadata.google.internal", "metadata.goog", "metadata"}
)
"""Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS over IPv6, Alibaba, GCP by name): a webhook there
would POST from the server's own network position to where its cloud credentials are served."""


def check_url(url: str) -> list[str]:
    """Check a webhook URL for ``webhook add``; returns warnings (the operator may mean them: a private or loopback
    receiver) and raises for what is never right.

    Only what the URL says is checked: a name that resolves to a refused address later is not caught here.

    Raises:
        ValueError: not http(s) with a host; a control character or space (CR/LF would split the request); a
            link-local address or a cloud metadata endpoint.
    """
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError(f"URL {url!r}: control characters and spaces (CR, LF, tab) are not allowed")
    parts = urlsplit(url)
    try:
        host = parts.hostname
        parts.port  # noqa: B018 - parsed for its error: a malformed port
    except ValueError as exc:
        raise ValueError(f"URL {redact_url(url)!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"URL {redact_url(url)!r}: give an http:// or https:// URL with a host")
    if host in METADATA_HOSTS:
        raise ValueError(f"URL {redact_url(url)!r}: {host} is a cloud metadata endpoint")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        mapped = getattr(ip, "ipv4_mapped", None)
        ip = mapped or ip
        if str(ip) in METADATA_HOSTS:
            raise ValueError(f"URL {redact_url(url)!r}: {host} is a cloud metadata endpoint")
        if ip.is_link_local:
            raise ValueError(f"URL {redact_url(url)!r}: {host} is a link-local address")
        if ip.is_loopback or ip.is_private or ip.is_unspecified:
            kind = "loopback" if ip.is_loopback else "private"
            return [f"{host} is a {kind} address: the server will POST there from its own network"]
    elif host == "localhost" or host.endswith(".localhost"):
        return [f"{host} is a loopback name: the server will POST there from its own network"]
    return []


def redact_url(url: str) -> str:
    """``url`` as logs and listings show it: scheme, host and port only, its path and query (secret tokens are
    often put there) as ``/…``, and never its credentials."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid URL>"
    if ":" in host:
        host = f"[{host}]"
    tail = "/…" if parts.path not in ("", "/") or parts.query or parts.fragment else parts.path
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}{tail}"


class _RedactUrls(logging.Filter):
    """Shows the URLs of httpx's request log lines (``HTTP Request: POST <url> ...``, at INFO) redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_url(str(a)) if type(a).__name__ == "URL" or str(a).startswith(("http://", "https://")) else a
                for a in record.args
            )
        return True


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of ``body`` keyed with ``secret``."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def request(delivery: Delivery, now: float) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt of ``delivery`` at Unix time ``now``."""
    stamp = int(now)
    payload: dict[str, Any] = {
        "webhook_id": delivery.webhook.webhook_id,
        "delivery": {"id": delivery.outbox_id, "attempt": delivery.attempts + 1, "timestamp": stamp},
        "event": event_json(delivery.event),
    }
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "evalstop-webhooks/1",
        EVENT_HEADER: delivery.event.type,
        TIMESTAMP_HEADER: str(stamp),
        SIGNATURE_HEADER: sign(delivery.webhook.secret, body),
    }
    return body, headers


class DeliveryWorker:
    """The server's background thread: delivers due webhook rows and prunes old events.

    The thread runs an event loop: each claimed delivery is a task of its own under a total deadline
    (``asyncio.timeout``, which closes the connection when it fires), and the loop claims again every ``poll_s``
    without waiting for the tasks in flight, each tenant up to its free lanes. The store calls run on the loop's
    worker threads.

    Args:
        store: The store the outbox and events live in.
        settings: Timeouts, lanes, retry schedule, retention.
    """

    def __init__(self, store: Store, settings: WebhookSettings) -> None:
        self.store = store
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0
        self._in_flight: Counter[int] = Counter()  # tenant id -> deliveries in flight (event-loop thread only)

    def start(self) -> None:
        """Start the thread (once)."""
        httpx_log = logging.getLogger("httpx")
        if not any(isinstance(f, _RedactUrls) for f in httpx_log.filters):
            httpx_log.addFilter(_RedactUrls())
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="evalstop-webhooks", daemon=True)
            self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        """Ask the thread to stop and wait at most ``wait_s`` for it: a shutdown never waits on a hanging endpoint.
        A delivery still in flight is not lost: its row stays claimed and the next server process sends it again
        after the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)

    def _main(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        import httpx  # the service extra

        # As many connections as deliveries may be in flight: a delivery never waits for another's connection.
        limits = httpx.Limits(max_connections=self.settings.max_in_flight, max_keepalive_connections=8)
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.settings.timeout_s), limits=limits, follow_redirects=False
        ) as client:
            while not self._stop.is_set():
                try:
                    for delivery in await asyncio.to_thread(self.claim_due, dict(self._in_flight)):
                        self._in_flight[delivery.webhook.tenant_id] += 1
                        task = asyncio.create_task(self._deliver(client, delivery))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                except Exception:  # the store is unavailable for a moment, or a bug: never lose the thread
                    logger.exception("webhook worker round failed; retrying")
                await asyncio.sleep(self.settings.poll_s)
            for task in tasks:
                task.cancel()

    def claim_due(self, in_flight: Mapping[int, int]) -> list[Delivery]:
        """Prune when due, then claim what the free lanes can send now, given the deliveries ``in_flight`` (tenant
        id -> count)."""
        now = time.time()
        days = self.settings.event_retention_days
        if days > 0 and now >= self._next_prune:
            self._next_prune = now + self.settings.prune_every_s
            pruned = self.store.prune_events(now - days * 86400.0)
            if pruned:
                logger.info("pruned %d events older than %g days", pruned, days)
        free = self.settings.max_in_flight - sum(in_flight.values())
        return self.store.claim_deliveries(
            now, self.settings.lease_s, limit=free, per_tenant=self.settings.concurrency, in_flight=in_flight
        )

    async def _deliver(self, client: Any, delivery: Delivery) -> None:
        tenant = delivery.webhook.tenant_id
        try:
            ok, detail = await self._post(client, delivery)
            now = time.time()
            retry_at = None if ok else self.settings.retry_at(delivery.attempts + 1, now)
            if not ok:
                logger.warning(
                    "webhook %d (%s): event %d not delivered (%s)",
                    delivery.webhook.webhook_id,
                    redact_url(delivery.webhook.url),
                    delivery.event.id,
                    detail,
                )
            await asyncio.to_thread(self.store.finish_delivery, delivery, ok, detail, retry_at, now)
        except Exception:  # the store failed: the row stays claimed and is sent again after its lease
            logger.exception("webhook %d: recording event %d failed", delivery.webhook.webhook_id, delivery.event.id)
        finally:
            self._in_flight[tenant] -= 1
            if self._in_flight[tenant] <= 0:
                del self._in_flight[tenant]

    async def _post(self, client: Any, delivery: Delivery) -> tuple[bool, dict[str, Any]]:
        """One attempt under the total deadline: whether the receiver answered 2xx, and what to record."""
        body, headers = request(delivery, time.time())
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                # Only the status counts: the body is never read, so a receiver cannot make it large or slow.
                async with client.stream("POST", delivery.webhook.url, content=body, headers=headers) as answer:
                    status = answer.status_code
        except TimeoutError:
            return False, {"error": f"no answer within {self.settings.timeout_s:g} s"}
        except Exception as exc:  # refused, bad URL, protocol error: one failed attempt
            return False, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        return 200 <= status < 300, {"status": status}
