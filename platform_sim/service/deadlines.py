"""Header and body deadlines for uvicorn's HTTP protocol: a slow or stalled client cannot hold a connection open.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) but has no deadline for reading a request: a
client that opens a connection and sends nothing, sends its headers a byte at a time, or announces
``Content-Length: 100`` and sends 2 bytes, kept its connection (and its slot under ``limit_concurrency``) forever.
:func:`deadline_protocol` subclasses uvicorn's httptools protocol with two timers, as the Kubernetes API server reads
headers within 30 s:

- the idle deadline, armed when the connection opens: a connection that sends nothing is closed as soon as an idle
  kept-alive one would be (the keep-alive timeout), so that a flood of silent sockets holds its slots for seconds,
  not for the whole header deadline;
- the header deadline, armed when a connection's first byte arrives and when a later request's first byte arrives,
  cancelled when its headers are complete;
- the body deadline, armed when the headers are complete, cancelled when the whole body has arrived.

When one expires the server answers ``408 Request Timeout`` (if no response has started) and closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT = 30.0
"""Seconds a client has to send a request's headers, from the connection's opening or the request's first byte."""
DEFAULT_IDLE_TIMEOUT = 5.0
"""Seconds a new connection may stay silent before its first byte (uvicorn's default keep-alive timeout)."""
DEFAULT_BODY_TIMEOUT = 60.0
"""Seconds a client has to send a request's whole body once its headers are complete (a 1 MiB body at 17 kB/s)."""


def _timeout_response(what: str) -> bytes:
    body = ('{"error":"request_timeout","message":"the request ' + what + ' did not arrive in time"}').encode()
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header and a body deadline (seconds; set by :func:`deadline_protocol`)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._silent = True  # no byte received yet on this connection

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        logger.info("closing a connection from %s: the request %s did not arrive in time", self.client, what)
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(_timeout_response(what))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(min(self.idle_timeout, self.header_timeout), "headers")

    def data_received(self, data: bytes) -> None:
        if self._silent and data:  # the first byte: the idle deadline gives way to the header deadline
            self._silent = False
            self._arm(self.header_timeout, "headers")
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a new request on a kept-alive connection
            self._arm(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def deadline_protocol(
    header_timeout: float, body_timeout: float, idle_timeout: float = DEFAULT_IDLE_TIMEOUT
) -> type[DeadlineProtocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``, with these deadlines (seconds, > 0)."""
    if not header_timeout > 0 or not body_timeout > 0 or not idle_timeout > 0:
        raise ValueError(f"timeouts must be > 0, got {header_timeout}, {body_timeout} and {idle_timeout}")
    return type(
        "DeadlineProtocol",
        (DeadlineProtocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout, "idle_timeout": idle_timeout},
    )
