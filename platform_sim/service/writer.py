"""The batch writer shared by the SQLite and PostgreSQL stores: group commit with per-operation isolation.

Every write of a store (register, report, finish, tenant changes) is an :class:`Op` queued on one of the writer's
shards. Each shard has one thread that takes up to ``max_batch`` queued operations and hands them to the store's
``transact`` function, which applies them in one database transaction and commits once (group commit).

Isolation holds by construction, whatever an operation raises:

- A *domain error* (:data:`DOMAIN_ERRORS`: the input is at fault, or the job's state refuses it) is that operation's
  answer; it wrote nothing, so the rest of the batch commits.
- Any other exception (a bug, an arithmetic error deep in a detector, a broken state) may have left the shared
  transaction or an in-memory monitor half-changed. The batch is then rolled back and every operation of it is run
  again alone, in a transaction of its own: the faulty one fails alone with :class:`OperationFailed` (a 500 for
  that request only), the others commit.
- A database failure (a constraint, a full disk) also re-runs the operations one by one, so that an operation
  whose own row cannot be written does not take the others down; when the database cannot commit at all, each
  operation gets :class:`~platform_sim.service.store.StoreUnavailable` (503). A ``StoreUnavailable`` raised by
  ``transact`` itself (the database cannot be reached) answers the whole batch at once.
- Every queued operation is answered: a ``finally`` sets an error on any future still open, and the stop sentinel
  is only honoured after the operations queued before it are done.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from platform_sim.core import BoundaryError

from .store import (
    HandleConflict,
    JobExists,
    JobFinished,
    JobNotFound,
    StoreError,
    StoreUnavailable,
    TenantExists,
    TenantNotFound,
    TenantRevoked,
    WebhookNotFound,
)

logger = logging.getLogger(__name__)

DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    BoundaryError,
    JobNotFound,
    JobFinished,
    JobExists,
    TenantExists,
    TenantNotFound,
    TenantRevoked,
    WebhookNotFound,
    HandleConflict,
)
"""Errors an operation raises before writing anything, because of its input or the job's state: answered as they
are (a 4xx), the rest of its batch commits. The one definition both stores use."""

_ANSWERED_AS_IS = (*DOMAIN_ERRORS, StoreUnavailable)
"""What an operation may raise and still leave its transaction usable: the domain errors, and the store's own
"unavailable" (raised before writing, e.g. a job whose rows are inconsistent)."""


class OperationFailed(StoreError):
    """One operation failed for a reason other than its input (a server-side bug): a 500 for that request only."""


@dataclass(slots=True)
class Op:
    """One queued write.

    Args:
        key: The job (``(tenant_id, job_id)``) or other row the operation writes; operations on one key are applied
            in submission order.
        payload: What the store's ``transact`` applies: a :class:`~platform_sim.core.Report`, or a function of the
            store's transaction handle.
        future: Resolved with the operation's result or error after its transaction ended.
    """

    key: Any
    payload: Any
    future: Future[Any] = field(default_factory=Future)


Result = tuple[Any, BaseException | None]
"""An operation's outcome inside a transaction: ``(value, None)`` or ``(None, error)``."""

Transact = Callable[[int, Sequence[Op], Callable[[Sequence[Result]], bool]], list[Result]]
"""``transact(shard, ops, commit_if)``: apply ``ops`` in one transaction on ``shard``'s connection and return one
:data:`Result` per op. Before committing it calls ``commit_if(results)``; when that is False it rolls back instead.
A database failure is raised (after rolling back)."""


def _isolated(results: Sequence[Result], ops: Sequence[Op]) -> bool:
    """True if committing ``results`` together is safe: no operation raised anything but a domain error, and no
    operation follows a failed one on the same key (a failed operation may have left that job's in-memory state
    half-changed, so the next one must start from the database)."""
    failed: set[Any] = set()
    for op, (_, error) in zip(ops, results):
        if op.key in failed:
            return False
        if error is not None:
            if not isinstance(error, _ANSWERED_AS_IS):
                return False
            failed.add(op.key)
    return True


class BatchWriter:
    """Writer threads with group commit; see the module docstring for the isolation rules.

    Args:
        name: Thread name prefix (for logs and debuggers).
        shards: Number of writer threads; an operation goes to the shard its store picks (by job).
        max_batch: Most operations applied in one transaction.
        transact: The store's transaction function (:data:`Transact`).
        forget: Called with the keys of operations that failed or were rolled back (``None``: all keys), so that the
            store drops in-memory state that may be ahead of the database.
    """

    _STOP = object()

    def __init__(
        self,
        name: str,
        shards: int,
        max_batch: int,
        transact: Transact,
        forget: Callable[[Sequence[Any] | None], None] = lambda keys: None,
    ) -> None:
        if shards < 1 or max_batch < 1:
            raise ValueError(f"shards and max_batch must be >= 1, got {shards} and {max_batch}")
        self.name = name
        self.max_batch = max_batch
        self._transact = transact
        self._forget = forget
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(shards)]
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def alive(self) -> bool:
        """False once a started writer thread is gone (never started counts as alive)."""
        return not self._closed and all(t.is_alive() for t in self._threads)

    def submit(self, shard: int, key: Any, payload: Any) -> Future[Any]:
        """Queue an operation on ``shard``; the future resolves after its transaction ended."""
        op = Op(key, payload)
        with self._lock:
            if self._closed:
                op.future.set_exception(StoreUnavailable("the store is shutting down"))
                return op.future
            if not self._threads:
                for i in range(len(self._queues)):
                    t = threading.Thread(target=self._loop, args=(i,), name=f"{self.name}-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
            self._queues[shard].put(op)
        return op.future

    def close(self) -> None:
        """Answer everything queued so far, then stop the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for q in self._queues:
                q.put(self._STOP)
        for t in self._threads:
            t.join()

    def _loop(self, shard: int) -> None:
        q = self._queues[shard]
        while True:
            item = q.get()
            stop = item is self._STOP
            batch: list[Op] = [] if stop else [item]
            while not stop and len(batch) < self.max_batch:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is self._STOP:
                    stop = True
                else:
                    batch.append(nxt)
            # A caller that gave up before its operation started: never applied, never acknowledged.
            batch = [op for op in batch if op.future.set_running_or_notify_cancel()]
            if batch:
                try:
                    self.run_batch(shard, batch)
                except BaseException:  # never lose the thread: the finally in run_batch answered the batch
                    logger.exception("%s: unexpected error in the writer loop", self.name)
            if stop:
                return

    def run_batch(self, shard: int, batch: Sequence[Op]) -> None:
        """Apply ``batch`` and resolve every future in it (see the module docstring)."""
        try:
            if self._run(shard, batch) or len(batch) == 1:
                return
            # Not isolated, or the database refused the batch: one transaction per operation.
            for op in batch:
                self._run(shard, [op])
        finally:
            for op in batch:
                if not op.future.done():
                    op.future.set_exception(StoreUnavailable("the operation was not answered (writer error)"))

    def _run(self, shard: int, ops: Sequence[Op]) -> bool:
        """One transaction over ``ops``. Returns True if it resolved their futures; False if it rolled back for the
        caller to run them one by one (only when ``ops`` has several)."""
        single = len(ops) == 1
        try:
            results = self._transact(shard, ops, lambda res: _isolated(res, ops))
        except Exception as exc:  # the database failed: nothing of this transaction was committed
            self._forget(None)
            if not single and not isinstance(exc, StoreUnavailable):
                # StoreUnavailable means the database as a whole cannot be reached: one by one would fail the same.
                logger.warning(
                    "%s: batch of %d failed (%s); applying its operations one by one", self.name, len(ops), exc
                )
                return False
            refusal = (
                exc
                if isinstance(exc, StoreUnavailable)
                else StoreUnavailable(f"the database could not commit: {' '.join(str(exc).split())}")
            )
            logger.error("%s: commit failed, %d operation(s) refused: %s", self.name, len(ops), exc)
            for op in ops:
                op.future.set_exception(refusal)
            return True
        if not _isolated(results, ops):  # transact rolled back
            self._forget(None)
            if not single:
                return False
            _, cause = results[0]
            assert cause is not None
            logger.error("%s: operation on %r failed", self.name, ops[0].key, exc_info=cause)
            failed = OperationFailed(
                f"internal error while applying the operation ({type(cause).__name__}); nothing of it was stored"
            )
            failed.__cause__ = cause
            ops[0].future.set_exception(failed)
            return True
        failed_keys = [op.key for op, (_, error) in zip(ops, results) if error is not None]
        if failed_keys:
            self._forget(failed_keys)
        for op, (value, error) in zip(ops, results):
            if error is None:
                op.future.set_result(value)
            else:
                op.future.set_exception(error)
        return True
