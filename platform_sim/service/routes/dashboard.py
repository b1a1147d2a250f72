"""The dashboard's pages (HTML, for a person in a browser): sign-in, the job list, a job's page, sign-out.

``GET /login`` and ``POST /login`` (form field ``token``) sign a browser in: the answer sets an HttpOnly,
SameSite=Strict session cookie holding a random session id (the token stays on the server, see
:mod:`~platform_sim.service.dashboard.sessions`). ``GET /`` lists the tenant's jobs, ``GET /jobs/{job_id}`` shows one,
``POST /logout`` ends the session. A page without a live session redirects (303) to ``/login``; every page
authenticates its session's token like an API request (a revoked token signs the browser out, the rate limit
counts pages too). Another tenant's job is a 404, as in the API.

Forms are parsed here (``application/x-www-form-urlencoded`` with :func:`urllib.parse.parse_qs`): the service needs
no form library. CSRF: the cookies are SameSite=Strict, the sign-out form carries the session's form token, and the
sign-in form a nonce that must match a SameSite=Strict cookie set with the form (so that another site cannot sign a
browser in under its own token). Every page is sent with a Content-Security-Policy allowing only its own inline style
and script (by a per-response nonce), and may not be framed.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import hmac
import math
import re
import secrets
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..dashboard import pages
from ..dashboard.data import SORTS, DashboardData
from ..dashboard.sessions import Session, SessionStore, SignInLimit, SignInSettings
from ..deps import ServiceContext
from ..edge import address_key
from ..errors import ApiError
from ..fairness import Pacer
from ..store import JobNotFound, Tenant
from ..wire import JOB_ID_PATTERN

SESSION_COOKIE = "evalstop_session"
LOGIN_COOKIE = "evalstop_login"
"""The sign-in form's nonce cookie (lives while the form may be sent)."""
LOGIN_FORM_TTL_S = 1800
PER_PAGE = 50
"""Jobs per page of the list."""
REPORTS_PER_PAGE = 500
"""Reports per page of a job's page (its table and its curve): the page is read, and charged, like
``GET /v1/jobs/{id}/evals`` (:mod:`~platform_sim.service.fairness`)."""
MAX_FORM_BYTES = 8192
"""Largest sign-in or sign-out form body (a token is 46 characters)."""
_JOB_ID = re.compile(JOB_ID_PATTERN)


def security_headers(nonce: str) -> dict[str, str]:
    """The headers of every dashboard response: the CSP (only this response's inline style and script), no framing,
    no sniffing, no referrer, no caching (the pages hold a tenant's data)."""
    csp = (
        f"default-src 'self'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _html(
    chrome: pages.Chrome, body: str | bytes, status: int = 200, headers: dict[str, str] | None = None
) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**security_headers(chrome.nonce), **(headers or {})})


def _redirect(to: str, nonce: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303, headers=security_headers(nonce))


def _nonce() -> str:
    return secrets.token_urlsafe(16)


async def read_form(request: Request) -> dict[str, str] | None:
    """The first value of each field of an ``application/x-www-form-urlencoded`` body, or None when the body is not
    one (another content type, too large, not UTF-8, too many fields)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return None
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        return None
    try:
        fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[0] for name, values in fields.items()}


def add_routes(app: FastAPI, ctx: ServiceContext, settings: SignInSettings | None = None) -> None:
    """Add the dashboard's pages, around ``ctx``, to ``app``.

    Args:
        app: The app.
        ctx: The app's shared dependencies.
        settings: The sign-in bounds (default: :class:`SignInSettings`'s).
    """
    settings = settings or SignInSettings()
    live = SessionStore(max_per_tenant=settings.max_sessions_per_tenant)
    _add_sign_in_routes(app, ctx, live, SignInLimit(settings.sign_ins_per_minute))
    _add_job_pages(app, ctx, live, DashboardData(ctx.store))


def _login_form(nonce: str, error: str | None = None, status: int = 200) -> HTMLResponse:
    """The sign-in page, with a fresh form nonce in its cookie (checked when the form comes back)."""
    form_nonce = secrets.token_urlsafe(24)
    response = _html(pages.Chrome(nonce), pages.login_page(pages.Chrome(nonce), form_nonce, error), status)
    response.set_cookie(
        LOGIN_COOKIE, form_nonce, max_age=LOGIN_FORM_TTL_S, path="/login", httponly=True, samesite="strict"
    )
    return response


async def _signed_in(
    ctx: ServiceContext, live: SessionStore, request: Request, nonce: str
) -> tuple[Tenant, Session] | Response:
    """The request's tenant and session, or the response to send instead (to /login, or the error page)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    session = live.get(session_id)
    if session is None:
        response = _redirect("/login", nonce)
        if session_id:
            response.delete_cookie(SESSION_COOKIE, path="/")
        return response
    try:
        tenant = await ctx.call(ctx.authenticate, session.token)
    except ApiError as exc:
        if exc.status == 401:  # revoked since sign-in
            live.end(session_id)
            response = _redirect("/login", nonce)
            response.delete_cookie(SESSION_COOKIE, path="/")
            return response
        return _html(
            pages.Chrome(nonce),
            pages.error_page(pages.Chrome(nonce), exc.status, exc.message),
            exc.status,
            exc.headers,
        )
    return tenant, session


def _too_many_sign_ins(nonce: str, whose: str, wait: float) -> HTMLResponse:
    """The sign-in form again, 429 with ``Retry-After``: too many sign-ins from this address or for this tenant."""
    seconds = max(1, math.ceil(wait))
    response = _login_form(nonce, f"Too many sign-ins {whose}: try again in {seconds} s.", 429)
    response.headers["Retry-After"] = str(seconds)
    return response


def _add_sign_in_routes(app: FastAPI, ctx: ServiceContext, live: SessionStore, limit: SignInLimit) -> None:
    """``GET /login``, ``POST /login`` and ``POST /logout``."""

    @app.get("/login", include_in_schema=False)
    async def login_page(request: Request) -> Response:
        nonce = _nonce()
        if live.get(request.cookies.get(SESSION_COOKIE)) is not None:
            return _redirect("/", nonce)
        return _login_form(nonce)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        nonce = _nonce()
        # Every attempt counts against its address, before any work (a wrong token too).
        wait = limit.address_wait(address_key(request.client.host) if request.client else "")
        if wait > 0:
            return _too_many_sign_ins(nonce, "from this address", wait)
        form = await read_form(request)
        if form is None:
            return _login_form(nonce, "Send the sign-in form (a form with the field token).", 400)
        sent, expected = form.get("login_nonce", ""), request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            return _login_form(nonce, "The sign-in form expired or came from another site: sign in again.", 400)
        token = form.get("token", "").strip()
        try:
            tenant = await ctx.call(ctx.authenticate, token)
        except ApiError as exc:
            if exc.status == 401:
                return _login_form(nonce, "Unknown or revoked token.", 401)
            chrome = pages.Chrome(nonce)
            return _html(chrome, pages.error_page(chrome, exc.status, exc.message), exc.status, exc.headers)
        wait = limit.tenant_wait(tenant.tenant_id)
        if wait > 0:
            return _too_many_sign_ins(nonce, "for this tenant", wait)
        live.end(request.cookies.get(SESSION_COOKIE))  # a new id at each sign-in (no session fixation)
        session_id, _ = live.create(token, tenant.tenant_id)
        response = _redirect("/", nonce)
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            max_age=int(live.ttl_s),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        response.delete_cookie(LOGIN_COOKIE, path="/login")
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        nonce = _nonce()
        session_id = request.cookies.get(SESSION_COOKIE)
        session = live.get(session_id)
        form = await read_form(request)
        if session is not None:
            if form is None or not session.form_token_ok(form.get("csrf")):
                chrome = pages.Chrome(nonce)
                return _html(chrome, pages.error_page(chrome, 403, "Sign out from the dashboard's own button."), 403)
            live.end(session_id)
        response = _redirect("/login", nonce)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def _add_job_pages(app: FastAPI, ctx: ServiceContext, live: SessionStore, data: DashboardData) -> None:
    """``GET /`` (the tenant's jobs) and ``GET /jobs/{job_id}``."""

    @app.get("/", include_in_schema=False)
    async def jobs_page(
        request: Request,
        status: Annotated[str | None, Query(max_length=16)] = None,
        sort: Annotated[str, Query(max_length=16)] = "job",
        order: Annotated[str, Query(max_length=4)] = "asc",
        page: Annotated[str, Query(max_length=9)] = "1",
    ) -> Response:
        nonce = _nonce()
        who = await _signed_in(ctx, live, request, nonce)
        if isinstance(who, Response):
            return who
        tenant, session = who
        chrome = pages.Chrome(nonce, tenant.name, session.csrf)
        status = status or None
        problem = None
        if status is not None and status not in pages.STATUSES:
            problem = f"status must be one of {', '.join(pages.STATUSES)}"
        elif sort not in SORTS:
            problem = f"sort must be one of {', '.join(SORTS)}"
        elif order not in ("asc", "desc"):
            problem = "order must be asc or desc"
        elif not page.isdigit() or int(page) < 1:
            problem = "page must be a positive integer"
        if problem is not None:
            return _html(chrome, pages.error_page(chrome, 422, problem), 422)

        def render(pace: Pacer) -> tuple[int, bytes]:
            # Sorted and cut by the store; read, charged and paced like an API listing (fairness.py).
            found = data.list_page(tenant.tenant_id, status, sort, order == "desc", int(page), PER_PAGE, pace)
            listing = pages.Listing(status, sort, order, found.page, found.pages, found.total)
            totals, events = data.totals(tenant.tenant_id), data.events(tenant.tenant_id)
            return len(found.rows), pages.jobs_page(chrome, found.rows, listing, totals, events).encode()

        return _html(chrome, await ctx.bulk_read(tenant, render))

    @app.get("/jobs/{job_id:path}", include_in_schema=False)
    async def job_page(
        request: Request,
        job_id: str,
        before: Annotated[str | None, Query(max_length=19, description="show reports below this step")] = None,
    ) -> Response:
        # ``:path``: an id with an encoded "/" reaches this page (and its 404) rather than the API's JSON 404.
        nonce = _nonce()
        who = await _signed_in(ctx, live, request, nonce)
        if isinstance(who, Response):
            return who
        tenant, session = who
        chrome = pages.Chrome(nonce, tenant.name, session.csrf)
        missing = _html(chrome, pages.error_page(chrome, 404, f"No job {job_id!r} for this tenant."), 404)
        if _JOB_ID.fullmatch(job_id) is None:
            return missing
        if before is not None and not before.isdigit():
            return _html(chrome, pages.error_page(chrome, 422, "before must be a step (a whole number >= 0)"), 422)
        cursor = None if before is None else int(before)

        def render(pace: Pacer) -> tuple[int, bytes]:
            # One page of the history, newest first: read, charged and paced like GET /v1/jobs/{id}/evals.
            job = data.job(tenant.tenant_id, job_id)
            points, more = data.history_page(tenant.tenant_id, job_id, cursor, REPORTS_PER_PAGE, pace)
            last = points[0].score if points and cursor is None else data.last_score(tenant.tenant_id, job)
            window = pages.HistoryWindow(cursor, points[-1].step if more and points else None, job.n_reports)
            totals, events = data.totals(tenant.tenant_id), data.events(tenant.tenant_id)
            html = pages.job_page(chrome, data.row(job, last), points[::-1], totals, events, window)
            return len(points), html.encode()

        try:
            return _html(chrome, await ctx.bulk_read(tenant, render))
        except JobNotFound:
            return missing
