"""The service's errors: one JSON shape for every error, the handlers that answer it, and their OpenAPI entries.

Every error is answered as ``{"error": code, "message": message}``. Route modules raise :class:`ApiError`, or let a
store error through :func:`store_error`, which maps it to its status in one place.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at runtime.
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .store import JobExists, JobFinished, JobNotFound, StoreUnavailable
from .store_actuation import HandleConflict
from .wire import ErrorOut
from .writer import OperationFailed

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as ``{"error": code, "message": message}`` with an HTTP status.

    Args:
        status: The HTTP status.
        code: A short machine-readable code (``not_found``, ``conflict``, ``invalid_request``, ...).
        message: What was wrong, for a human.
        headers: Extra response headers (``WWW-Authenticate``, ``Retry-After``), or None.
    """

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers

    def body(self) -> dict[str, str]:
        """The JSON body answered."""
        return {"error": self.code, "message": self.message}


def not_found(job_id: str) -> ApiError:
    """The 404 of a job the tenant does not hold: the same answer whether the job does not exist or belongs to
    another tenant, so that existence never leaks."""
    return ApiError(404, "not_found", f"no job {job_id!r} for this tenant")


def store_error(exc: Exception, job_id: str) -> ApiError | None:
    """The :class:`ApiError` of an error a store raised for job ``job_id``, or None when it is not a store error.

    Args:
        exc: What the store raised.
        job_id: The job the request named (for the 404's message).
    """
    if isinstance(exc, JobNotFound):
        return not_found(job_id)
    if isinstance(exc, JobExists):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, JobFinished):
        return ApiError(409, "job_finished", str(exc))
    if isinstance(exc, HandleConflict):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, StoreUnavailable):
        return ApiError(503, "unavailable", str(exc))
    if isinstance(exc, OperationFailed):  # this request alone failed server-side; nothing of it was stored
        return ApiError(500, "internal_error", str(exc))
    return None


def unknown_query_error(names: Sequence[str]) -> ApiError:
    """The 422 of query parameters a route does not declare."""
    return ApiError(
        422,
        "invalid_request",
        f"invalid request: unknown query parameter(s) {', '.join(sorted(names))} (unknown fields are rejected)",
    )


def _declared_query(dependant: Any) -> set[str]:
    """Query parameter names a route declares, its sub-dependencies included."""
    names = {getattr(f, "alias", None) or f.name for f in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared_query(sub)
    return names


async def no_unknown_query(request: Request) -> None:
    """Refuse query parameters the route does not declare: the boundary holds for the query string too (an app-wide
    dependency)."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    allowed = _declared_query(dependant) if dependant is not None else set()
    unknown = set(request.query_params) - allowed
    if unknown:
        raise unknown_query_error(list(unknown))


TOO_DEEP = "body: Invalid JSON: nested too deep (recursion limit exceeded)"
"""The one message of a body nested deeper than the JSON parser goes, whichever parser met it (pydantic's on the
report endpoint, Python's ``json`` on the others)."""


def validation_message(errors: Sequence[Any]) -> str:
    """One line naming every problem of a request pydantic refused (never echoing the input)."""
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        if err.get("type") == "json_invalid":
            # pydantic says "Invalid JSON: <why>"; FastAPI's parser says "JSON decode error" and puts why in ctx.
            msg = str(err.get("msg", ""))
            why = msg if msg.startswith("Invalid JSON") else f"Invalid JSON: {(err.get('ctx') or {}).get('error', msg)}"
            parts.append(TOO_DEEP if "recursion limit exceeded" in why else f"body: {why}")
        elif err.get("type") == "extra_forbidden":
            parts.append(
                f"{where}: unknown field (unknown fields are rejected: only the whitelisted fields may "
                "cross the information boundary)"
            )
        else:
            # Never echo the input back: it may hold a value that is not JSON (NaN) or that should not be logged.
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` in the one JSON shape (a bug: a 500 for that request alone)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {"error": "internal_error", "message": "internal error while answering this request"}, status_code=500
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "invalid_request", "message": validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's only 400 is a body it cannot decode (not UTF-8, or nested deeper than Python's json goes: a
            # RecursionError): the same 422 as any other unreadable body.
            why = (
                TOO_DEEP
                if isinstance(exc.__cause__, RecursionError)
                else "body: Invalid JSON: not UTF-8 (send one UTF-8 JSON object)"
            )
            return JSONResponse({"error": "invalid_request", "message": f"invalid request: {why}"}, status_code=422)
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route that matched the path; a path can have several.
            allowed: set[str] = set()
            for route in app.router.routes:
                match, _ = route.matches({**request.scope, "method": "OPTIONS"})
                if match is not Match.NONE:
                    allowed |= set(getattr(route, "methods", None) or ())
            headers["allow"] = ", ".join(sorted(allowed))
        codes = {404: "not_found", 405: "method_not_allowed"}
        return JSONResponse(
            {"error": codes.get(exc.status_code, "http_error"), "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=headers or None,
        )


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing, unknown or revoked bearer token."},
    413: {"model": ErrorOut, "description": "Request body too large."},
    422: {"model": ErrorOut, "description": "Invalid request (unknown field, bad value, non-finite score)."},
}
"""The OpenAPI ``responses`` every authenticated route declares."""
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "No such job for this tenant."}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorOut, "description": "Conflicts with the job's state."}}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: {"model": ErrorOut, "description": "Store cannot commit."}}
