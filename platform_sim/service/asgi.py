"""The service's two plain ASGI middlewares: the request body limit and the report endpoint's fast path.

Plain ASGI (not ``BaseHTTPMiddleware``) because both run on every report and must stay cheap.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import unknown_query_error

Scope = dict[str, Any]
Receive = Callable[..., Awaitable[Any]]
Send = Callable[..., Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ReportHandler = Callable[[str | None, str, bytes], Awaitable[tuple[int, dict[str, Any], dict[str, str] | None]]]
"""``(authorization header, job id of the path, raw body) -> (status, JSON body, extra headers)``."""


class BodyTooLarge(Exception):
    """A streamed body grew past the limit."""


async def read_body(receive: Receive, max_bytes: int) -> bytes | None:
    """The whole request body, or None if the client went away before sending it.

    Raises:
        BodyTooLarge: it grew past ``max_bytes`` (the rest is not read).
    """
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > max_bytes:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return bytes(body)


async def send_json(send: Send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """Answer ``payload`` as JSON with ``status`` and the extra ``headers``."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _too_large(max_bytes: int, length: int | None = None) -> dict[str, str]:
    size = "request body" if length is None else f"request body of {length} bytes"
    return {"error": "body_too_large", "message": f"{size} exceeds the limit of {max_bytes} bytes"}


_CLOSE = {"connection": "close"}

_BODY_METHODS = ("POST", "PUT", "PATCH")
_TWO_AUTHORIZATIONS = (400, {"error": "bad_request", "message": "more than one Authorization header: send one"})
_NOT_JSON = (
    415,
    {
        "error": "unsupported_media_type",
        "message": "the request body must be JSON: send 'Content-Type: application/json' (charset utf-8 if any)",
    },
)


def json_media_type(value: bytes) -> bool:
    """Whether a Content-Type header names JSON: ``application/json`` or a ``+json`` type of ``application/``
    (RFC 6839, as FastAPI's own body parser accepts), with no charset or ``utf-8`` (JSON is UTF-8, RFC 8259)."""
    media, _, params = value.partition(b";")
    media = media.strip().lower()
    if media != b"application/json" and not (media.startswith(b"application/") and media.endswith(b"+json")):
        return False
    for param in params.split(b";"):
        name, _, val = param.partition(b"=")
        if name.strip().lower() == b"charset" and val.strip().strip(b'"').lower() not in (b"utf-8", b"utf8"):
            return False
    return True


def scan_headers(scope: Scope) -> tuple[str | None, tuple[int, dict[str, str]] | None]:
    """The request's Authorization header, and the error its headers earn, if any (one pass over them).

    Refused: two Authorization headers (400: which one counts would depend on the route), and a body on an API route
    (``/v1/``, POST/PUT/PATCH) whose Content-Type is missing or not JSON (415).
    """
    authorization: str | None = None
    n_auth = 0
    content_type: bytes | None = None
    has_body = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            n_auth += 1
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length":
            has_body = has_body or value.strip() not in (b"0", b"")
        elif name == b"transfer-encoding":
            has_body = True
    if n_auth > 1:
        return None, _TWO_AUTHORIZATIONS
    if (
        has_body
        and scope.get("method") in _BODY_METHODS
        and scope["path"].startswith("/v1/")
        and (content_type is None or not json_media_type(content_type))
    ):
        return authorization, _NOT_JSON
    return authorization, None


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, by Content-Length or by counting a streamed body, and
    requests whose headers :func:`scan_headers` refuses (400, 415).

    Args:
        app: The ASGI app it wraps.
        max_bytes: Largest body accepted.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        _, refused = scan_headers(scope)
        if refused is not None:
            await send_json(send, *refused, _CLOSE)
            return
        has_length = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                has_length = True
                try:
                    length = int(value)
                except ValueError:
                    error = {"error": "bad_request", "message": "Content-Length is not an integer"}
                    await send_json(send, 400, error, _CLOSE)
                    return
                if length > self.max_bytes:
                    await send_json(send, 413, _too_large(self.max_bytes, length), _CLOSE)
                    return
        if has_length or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        # A streamed (chunked) body: read it here, counting, and refuse it before the app sees any of it. The app
        # cannot raise the 413 itself: FastAPI turns any error while reading a body into a 400.
        try:
            body = await read_body(receive, self.max_bytes)
        except BodyTooLarge:
            await send_json(send, 413, _too_large(self.max_bytes), _CLOSE)
            return
        if body is None:
            return  # the client went away
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ReportFastPath:
    """Serve ``POST /v1/jobs/{job_id}/evals`` without FastAPI's routing, dependency and response machinery.

    The report endpoint is the only hot one (every evaluation of every job); going through FastAPI cost about 40% of
    the server's CPU per report (profiled with py-spy). This middleware only parses the request (the headers, checked
    by :func:`scan_headers` as for every route, the path's job id, the raw body within the size limit, no query string) and hands it to ``handler``,
    which runs the same checks and the same report work as the FastAPI route of the same path
    (:mod:`~platform_sim.service.routes.reports`; that route stays for the OpenAPI spec and answers identically).

    Args:
        app: The ASGI app it wraps (every other request goes there).
        handler: The report handler.
        max_bytes: Largest body accepted.
        path: The pattern of the report path; its first group is the job id.
    """

    def __init__(self, app: ASGIApp, handler: ReportHandler, max_bytes: int, path: re.Pattern[str]) -> None:
        self.app = app
        self.handler = handler
        self.max_bytes = max_bytes
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.path.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        authorization, refused = scan_headers(scope)
        if refused is not None:
            await send_json(send, *refused, _CLOSE)
            return
        try:
            body = await read_body(receive, self.max_bytes)
        except BodyTooLarge:
            await send_json(send, 413, _too_large(self.max_bytes), _CLOSE)
            return
        if body is None:
            return  # the client went away before sending its body
        if scope.get("query_string"):  # the route declares no query parameter
            names = [part.split(b"=", 1)[0].decode("latin-1") for part in scope["query_string"].split(b"&") if part]
            error = unknown_query_error(names or ["?"])
            await send_json(send, error.status, error.body())
            return
        status, payload, headers = await self.handler(authorization, match.group(1), body)
        await send_json(send, status, payload, headers)
