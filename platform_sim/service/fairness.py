"""How one tenant's big reads share the server with everyone else's requests.

The paged listings (``GET /v1/jobs``, ``GET /v1/jobs/{id}/evals``, ``GET /v1/events``, up to 1,000 rows a page) are
the only requests whose work grows with their size: a 1,000-job page costs about 12 ms of Python, a small read about
1 ms. In one process, on one interpreter lock, a tenant paging as fast as it can would otherwise take half the server
from every other tenant. :meth:`~platform_sim.service.deps.ServiceContext.bulk_read` runs every such page under these
rules (the Kubernetes API server's priority and fairness, at its simplest):

- **In turn per caller.** A tenant's pages run one at a time, so that any number of concurrent listings by one
  tenant take one worker thread's share, not all of them; and at most :data:`BULK_READ_THREADS` pages run at once over
  all tenants, counted apart from the other requests' worker threads, so that listings never use those up.
- **Foreground first.** Every other request counts as foreground while it is served (:class:`CountForeground`). A page
  renders its rows on its worker thread and, between rows, gives way to them (:class:`Pacer`): while one is in
  progress, it stops after each :data:`SLICE_S` of work until none is left, or for :data:`MAX_PAUSE_S` at most, so that
  a page still progresses under a steady stream of small requests.
- **Charged by rows.** With a rate limit, a page costs one more token per 100 rows it returns
  (:mod:`~platform_sim.service.ratelimit`).

The stores read such pages as they are rendered (:meth:`~platform_sim.service.store.Store.iter_jobs`), in batches of
rows, not row by row: why in ``SQLiteStore._rows``. Measured in ``docs/benchmarks-service.md`` (fairness).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

SLICE_S = 0.0005
"""Seconds of work a page does between two looks at the foreground (about 40 jobs of a listing)."""

MAX_PAUSE_S = 0.005
"""Longest a page waits for the foreground at one time: under a steady stream of small requests a page still gets
about a tenth of the time (a 1,000-job page then takes about ten times as long as alone, near 0.1 s)."""

BULK_READ_THREADS = 4
"""Pages rendered at once over all tenants (each tenant one at a time), under a limit of their own: the other requests'
store calls keep the whole of anyio's default thread limit (40)."""


class ForegroundGate:
    """The number of foreground requests in progress, and a way for pages to wait until it is zero.

    :meth:`enter` and :meth:`leave` are called on the event loop (by :class:`CountForeground`, and by a page that
    takes itself out of the count with :meth:`background`); :meth:`pacer` gives each page, on its worker thread, a
    :class:`Pacer` that reads the gate.

    Args:
        slice_s: Seconds of work a page does between two looks at the foreground.
        max_pause_s: Longest a page waits at one time.
    """

    def __init__(self, slice_s: float = SLICE_S, max_pause_s: float = MAX_PAUSE_S) -> None:
        if not slice_s >= 0 or not max_pause_s >= 0:
            raise ValueError(f"slice_s and max_pause_s must be >= 0, got {slice_s} and {max_pause_s}")
        self.slice_s, self.max_pause_s = slice_s, max_pause_s
        self._in_progress = 0
        self._idle = threading.Event()  # set while no foreground request is in progress
        self._idle.set()

    @property
    def in_progress(self) -> int:
        """Foreground requests in progress."""
        return self._in_progress

    @property
    def idle(self) -> bool:
        """No foreground request is in progress (read from any thread)."""
        return self._idle.is_set()

    def wait_idle(self, timeout: float) -> None:
        """Wait until no foreground request is in progress, ``timeout`` seconds at most (the interpreter lock is let
        go meanwhile)."""
        self._idle.wait(timeout)

    def enter(self) -> None:
        """A foreground request starts (event loop only)."""
        self._in_progress += 1
        if self._in_progress == 1:
            self._idle.clear()

    def leave(self) -> None:
        """A foreground request ends (event loop only)."""
        self._in_progress -= 1
        if self._in_progress == 0:
            self._idle.set()

    @contextmanager
    def background(self) -> Iterator[None]:
        """Inside, the current request (counted by :class:`CountForeground`) is not foreground: a page waiting for
        its turn or rendering must not make the other pages give way to it."""
        self.leave()
        try:
            yield
        finally:
            self.enter()

    def pacer(self, clock: Callable[[], float] = time.perf_counter) -> Pacer:
        """A new :class:`Pacer` for one page on this gate."""
        return Pacer(self, clock)


class Pacer:
    """Called by a page between rows, on its worker thread: returns at once, unless a foreground request is in
    progress and the page has worked for at least the gate's ``slice_s`` since it last gave way; then it waits until
    no foreground request is left, or the gate's ``max_pause_s`` has passed.

    Args:
        gate: The gate it reads.
        clock: Seconds, monotone (tests pass their own).
    """

    __slots__ = ("_clock", "_gate", "_resumed")

    def __init__(self, gate: ForegroundGate, clock: Callable[[], float] = time.perf_counter) -> None:
        self._gate, self._clock = gate, clock
        self._resumed = clock()

    def __call__(self) -> None:
        gate = self._gate
        if gate.idle or self._clock() - self._resumed < gate.slice_s:
            return
        gate.wait_idle(gate.max_pause_s)
        self._resumed = self._clock()


class CountForeground:
    """ASGI middleware: every HTTP request counts as foreground on ``gate`` while the app serves it (a page takes
    itself out with :meth:`ForegroundGate.background`). Outermost, so that the report fast path counts too.

    Args:
        app: The ASGI app it wraps.
        gate: The app's gate.
    """

    def __init__(self, app: Callable[..., Any], gate: ForegroundGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gate.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave()


@dataclass(frozen=True, slots=True)
class RenderedRows(Generic[T]):
    """A page's rows rendered by :func:`render_rows`.

    Args:
        parts: Each row's JSON, in order.
        last: The last row (for the next page's cursor), or None if there was none.
    """

    parts: list[bytes]
    last: T | None


def render_rows(items: Iterable[T], to_json: Callable[[T], Any], pace: Callable[[], None]) -> RenderedRows[T]:
    """Each item's JSON (as Starlette's ``JSONResponse`` writes it), with ``pace()`` before each.

    One item at a time, from an iterator that reads rows as it goes: a page never holds all its rows as objects (no
    garbage collection triggered by a big page), and the interpreter can switch between two items, never inside one
    long ``json.dumps`` of the whole page (C code that holds the interpreter lock throughout).
    """
    parts: list[bytes] = []
    last: T | None = None
    for item in items:
        pace()
        parts.append(_dumps(to_json(item)))
        last = item
    return RenderedRows(parts, last)


def json_page(head: dict[str, Any], key: str, parts: list[bytes], tail: dict[str, Any]) -> bytes:
    """The JSON object ``{**head, key: [parts...], **tail}`` from the items' rendered JSON, in that field order."""
    inner = [_dumps(head)[1:-1]] if head else []
    inner.append(_dumps(key) + b":[" + b",".join(parts) + b"]")
    if tail:
        inner.append(_dumps(tail)[1:-1])
    return b"{" + b",".join(inner) + b"}"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
