"""Webhook delivery: the signed request, the retry schedule, and the background worker that drains the outbox.

Every event a webhook subscribes to is copied into the ``webhook_outbox`` table in the transaction that wrote the
event (:func:`~platform_sim.service.events.fanout_sql`), so a committed stop always has its pending delivery, and a
crash (``kill -9``) loses none: the worker of the next server process finds the row and sends it. The worker runs
in the server process (a thread started by the app's lifespan), never on the report path: a dead or slow endpoint
costs the worker's threads their request timeout and nothing else.

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

import hashlib
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

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
        timeout_s: Longest wait for one endpoint's answer (connect and read).
        backoff_s: Delay before the first retry; doubled at each further failure.
        backoff_max_s: The longest delay between two attempts (the cap of the doubling).
        max_attempts: Attempts before a delivery is given up.
        poll_s: How often the worker looks for due deliveries.
        concurrency: Deliveries sent at once.
        event_retention_days: Events older than this are pruned (0: kept forever).
        prune_every_s: How often pruning runs.
    """

    timeout_s: float = 5.0
    backoff_s: float = 1.0
    backoff_max_s: float = 300.0
    max_attempts: int = 20
    poll_s: float = 0.5
    concurrency: int = 4
    event_retention_days: float = 90.0
    prune_every_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "backoff_s", "backoff_max_s", "poll_s", "prune_every_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if self.max_attempts < 1 or self.concurrency < 1:
            raise ValueError(f"max_attempts and concurrency must be >= 1, got {self.max_attempts}, {self.concurrency}")
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

    Args:
        store: The store the outbox and events live in.
        settings: Timeouts, retry schedule, retention.
    """

    def __init__(self, store: Store, settings: WebhookSettings) -> None:
        self.store = store
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="evalstop-webhooks", daemon=True)
            self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        """Ask the thread to stop and wait at most ``wait_s`` for it: a shutdown never waits on a hanging endpoint.
        A delivery still in flight is not lost: its row stays claimed and the next server process sends it again
        after the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)

    def _loop(self) -> None:
        import httpx  # the service extra

        timeout = httpx.Timeout(self.settings.timeout_s)
        with (
            httpx.Client(timeout=timeout, follow_redirects=False) as client,
            ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="evalstop-webhook") as pool,
        ):
            while not self._stop.is_set():
                try:
                    self.run_once(client, pool)
                except Exception:  # the store is unavailable for a moment, or a bug: never lose the thread
                    logger.exception("webhook worker round failed; retrying")
                self._stop.wait(self.settings.poll_s)

    def run_once(self, client: Any, pool: ThreadPoolExecutor) -> int:
        """One round: prune when due, then claim and send the due deliveries; returns how many were sent."""
        now = time.time()
        days = self.settings.event_retention_days
        if days > 0 and now >= self._next_prune:
            self._next_prune = now + self.settings.prune_every_s
            pruned = self.store.prune_events(now - days * 86400.0)
            if pruned:
                logger.info("pruned %d events older than %g days", pruned, days)
        batch = self.store.claim_deliveries(now, self.settings.lease_s, limit=4 * self.settings.concurrency)
        list(pool.map(lambda d: self._deliver(client, d), batch))
        return len(batch)

    def _deliver(self, client: Any, delivery: Delivery) -> None:
        body, headers = request(delivery, time.time())
        try:
            answer = client.post(delivery.webhook.url, content=body, headers=headers)
            ok = 200 <= answer.status_code < 300
            detail: dict[str, Any] = {"status": answer.status_code}
        except Exception as exc:  # refused, timed out, bad URL: one failed attempt
            ok, detail = False, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        now = time.time()
        retry_at = None if ok else self.settings.retry_at(delivery.attempts + 1, now)
        if not ok:
            logger.warning(
                "webhook %d: event %d not delivered (%s)", delivery.webhook.webhook_id, delivery.event.id, detail
            )
        self.store.finish_delivery(delivery, ok, detail, retry_at, now)
