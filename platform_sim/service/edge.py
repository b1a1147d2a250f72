"""The HTTP edge: how much one request's headers and one client's connections may take, and what the access log keeps.

uvicorn (with httptools) accepts headers of any size (a 64 MB header was read whole and answered 200) and counts every
open connection, idle ones too, against one global ``limit_concurrency``: 1,000 silent sockets from one client made
every other client's requests answer 503 until they timed out. :func:`edge_protocol` builds the protocol class the
server runs (:class:`EdgeProtocol`, uvicorn's httptools protocol with the deadlines of
:mod:`~platform_sim.service.deadlines`) with three more rules:

- **Header size**, as nginx's ``large_client_header_buffers 4 8k``: one header line (or the request line) of at most
  :data:`MAX_HEADER_LINE` bytes, all of a request's headers :data:`MAX_HEADER_BYTES`. Beyond them the answer is
  ``431 Request Header Fields Too Large`` (``414 URI Too Long`` for the request line) and the connection is closed; a
  header that never ends is cut off once the bytes received for it pass the limit, never read whole.
- **Connections per client address**: at most ``max_per_address`` at once from one IPv4 address or IPv6 /64 (one
  host's usual share); the next one is answered 503 and closed at once, without taking a slot from anyone else.
  Behind a reverse proxy every client has the proxy's address: raise the cap, or turn it off (0).
- Silent connections are closed after the idle deadline (:class:`~platform_sim.service.deadlines.DeadlineProtocol`).

:class:`QueryRedactingFilter` keeps query strings out of the access log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from typing import Any, ClassVar

from .deadlines import DEFAULT_IDLE_TIMEOUT, DeadlineProtocol

logger = logging.getLogger(__name__)

MAX_HEADER_LINE = 8 * 1024
"""Largest request line or header line (name, ``": "`` and value), in bytes."""
MAX_HEADER_BYTES = 32 * 1024
"""Largest request head (request line and every header line), in bytes."""
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 100
"""Most connections one client address (IPv4) or /64 (IPv6) holds at once: a tenth of the default global cap."""


def _json_response(status: int, reason: str, error: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": error, "message": message}, separators=(",", ":")).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _too_large(what: str) -> tuple[int, str, str]:
    if what == "request line":
        return 414, "URI Too Long", f"the request line is longer than {MAX_HEADER_LINE} bytes"
    if what == "header line":
        return 431, "Request Header Fields Too Large", f"a header line is longer than {MAX_HEADER_LINE} bytes"
    return 431, "Request Header Fields Too Large", f"the request's headers are larger than {MAX_HEADER_BYTES} bytes"


def _refusal_app(status: int, message: str) -> Any:
    """An ASGI app that answers every request ``status`` with ``message`` and closes the connection (run by uvicorn's
    own request cycle in place of the service, so that the request's body is handled as usual)."""
    body = json.dumps({"error": "request_header_too_large", "message": message}, separators=(",", ":")).encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def address_key(host: str) -> str:
    """The address a connection counts against: an IPv4 address itself, an IPv6 address's /64 (one host or one
    site's usual share), anything else (a name, a Unix socket's path) as it is."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6 and ip.ipv4_mapped is None:  # type: ignore[union-attr]
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(getattr(ip, "ipv4_mapped", None) or ip)


class EdgeProtocol(DeadlineProtocol):
    """:class:`DeadlineProtocol` with the header-size limits and the per-address connection cap (see the module).
    Made per server by :func:`edge_protocol`: ``max_per_address`` and the count of connections by address
    (``per_address``, on the event loop only) belong to the class that function makes."""

    max_per_address: ClassVar[int] = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    per_address: ClassVar[dict[str, int]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted: str | None = None  # the address this connection counts against
        self._reading_head = False  # between a request's first byte and the end of its headers
        self._head_bytes = 0  # bytes received for this request's head so far (see data_received)
        self._head_total = 0  # bytes of its header lines parsed so far
        self._oversize: str | None = None  # which limit the request's head broke, if any
        self._head_done = self._message_done = False  # in the chunk being parsed

    # -- connections per address ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_per_address <= 0 or self.client is None:
            return
        key = address_key(self.client[0])
        held = self.per_address.get(key, 0)
        if held >= self.max_per_address:
            self._disarm()
            logger.debug("refusing a connection from %s: it holds %d already", key, held)
            message = f"more than {self.max_per_address} connections at once from this address: close some, then retry"
            transport.write(
                _json_response(503, "Service Unavailable", "too_many_connections", message, "retry-after: 1\r\n")
            )
            transport.close()
            return
        self.per_address[key] = held + 1
        self._counted = key

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted is not None:
            left = self.per_address.get(self._counted, 1) - 1
            if left > 0:
                self.per_address[self._counted] = left
            else:
                self.per_address.pop(self._counted, None)
            self._counted = None
        super().connection_lost(exc)

    # -- header size ---------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._head_done = self._message_done = False
        super().data_received(data)
        # Still inside a request's head after this chunk: every byte of it was head (unless a request ended in it:
        # then part of it was the last body, and it is left uncounted; the count is short by one chunk at most).
        if self._reading_head and not self._head_done and not self._message_done:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self._refuse_unfinished_head()

    def _refuse_unfinished_head(self) -> None:
        """431 and close, for a head that passed the limit before it ended (nothing of it goes to the app)."""
        self._disarm()
        self._reading_head = False
        logger.info("closing a connection from %s: request headers over %d bytes", self.client, MAX_HEADER_BYTES)
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            status, reason, message = _too_large("headers")
            self.transport.write(_json_response(status, reason, "request_header_too_large", message))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._head_bytes = self._head_total = 0
        self._oversize = None

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        line = len(name) + len(value) + 4  # ": " and CRLF
        self._head_total += line
        if line - 2 > MAX_HEADER_LINE and self._oversize is None:
            self._oversize = "header line"

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_done = True
        if len(self.url) + 16 > MAX_HEADER_LINE:  # the method, the URL and " HTTP/1.1"
            self._oversize = "request line"
        elif self._oversize is None and self._head_total + len(self.url) + 16 > MAX_HEADER_BYTES:
            self._oversize = "headers"
        if self._oversize is None:
            super().on_headers_complete()
            return
        status, _, message = _too_large(self._oversize)
        logger.info("refusing a request from %s: %s", self.client, message)
        service = self.app
        self.app = _refusal_app(status, message)  # uvicorn's cycle runs it in the service's place
        try:
            super().on_headers_complete()
        finally:
            self.app = service

    def on_message_complete(self) -> None:
        self._message_done = True
        super().on_message_complete()


def edge_protocol(
    header_timeout: float,
    body_timeout: float,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    max_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
) -> type[EdgeProtocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``: these deadlines (seconds, > 0) and at most
    ``max_per_address`` connections from one address at once (0: no cap), counted for this server alone."""
    if not header_timeout > 0 or not body_timeout > 0 or not idle_timeout > 0:
        raise ValueError(f"timeouts must be > 0, got {header_timeout}, {body_timeout} and {idle_timeout}")
    if max_per_address < 0:
        raise ValueError(f"max_per_address must be >= 0 (0: no cap), got {max_per_address}")
    attrs = {
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "idle_timeout": idle_timeout,
        "max_per_address": max_per_address,
        "per_address": {},
    }
    return type("EdgeProtocol", (EdgeProtocol,), attrs)


class QueryRedactingFilter(logging.Filter):
    """Drops the query string from uvicorn's access log lines (``GET /v1/jobs?<query>``): a token or another secret
    put in a URL by mistake must not land in the logs. The path stays, with ``?...`` where a query was."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access line: (client, method, path with query, HTTP version, status).
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (args[0], args[1], args[2].split("?", 1)[0] + "?...", args[3], args[4])
        return True
