"""The dashboard's HTML: the sign-in page, the job list, a job's page and the error page.

Every value that comes from a request or the store goes through :func:`html.escape` (job ids, reasons, detector
specs and tenant names are user input); the markup around them is fixed. Pages are plain HTML forms and links, so
that they work with JavaScript off; the only script refreshes the page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from urllib.parse import quote, urlencode

from .data import EvalPoint, EventRow, JobRow, Totals
from .style import CSS, REFRESH_JS, REFRESH_S
from .svg import eval_curve

DASH = "\u2014"
"""What a value that is not known (yet) shows."""
STATUSES = ("running", "stopped", "finished")


@dataclass(frozen=True, slots=True)
class Chrome:
    """What every page of a signed-in browser shows around its content.

    Args:
        nonce: The response's CSP nonce (for the inline style and script).
        tenant: The signed-in tenant's name, or None on the sign-in page.
        csrf: The session's form token (for the sign-out form), or None.
    """

    nonce: str
    tenant: str | None = None
    csrf: str | None = None


def score(value: float | None) -> str:
    """A score for display (4 decimals), or a dash."""
    return DASH if value is None else f"{value:.4f}"


def number(value: float | int | None, digits: int = 1) -> str:
    """A count or amount for display, or a dash."""
    if value is None:
        return DASH
    return str(value) if isinstance(value, int) else f"{value:,.{digits}f}"


def when(unix: float | None) -> str:
    """A Unix time as UTC, or a dash."""
    return DASH if unix is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def job_href(job_id: str) -> str:
    """The job page's path (the id percent-encoded)."""
    return "/jobs/" + quote(job_id, safe="")


def page(chrome: Chrome, title: str, body: str, refresh: bool = False) -> str:
    """A whole page around ``body`` (already HTML)."""
    nonce = escape(chrome.nonce)
    header = '<header><a class="brand" href="/">evalstop</a>'
    if chrome.tenant is not None:
        header += (
            f'<span class="tenant">tenant <strong>{escape(chrome.tenant)}</strong></span>'
            '<form method="post" action="/logout">'
            f'<input type="hidden" name="csrf" value="{escape(chrome.csrf or "")}">'
            '<button type="submit" id="sign-out">Sign out</button></form>'
        )
    header += "</header>"
    script = f'<script nonce="{nonce}">{REFRESH_JS}</script>' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{escape(title)} \u00b7 evalstop</title><style nonce="{nonce}">{CSS}</style></head>'
        f"<body>{header}<main>{body}</main>{script}</body></html>"
    )


def login_page(chrome: Chrome, nonce_field: str, error: str | None = None) -> str:
    """The sign-in form; ``nonce_field`` is the value its hidden ``login_nonce`` field sends back."""
    problem = f'<p class="error" id="login-error">{escape(error)}</p>' if error else ""
    body = (
        '<form class="login" method="post" action="/login"><h1>Sign in</h1>'
        '<p class="muted">Paste your tenant token (from <code>evalstop-server tenant add NAME</code>). '
        "It is sent once and kept on the server; your browser only holds a session cookie.</p>"
        f"{problem}"
        '<label for="token">Tenant token</label>'
        '<input type="password" id="token" name="token" autocomplete="off" required autofocus>'
        f'<input type="hidden" name="login_nonce" value="{escape(nonce_field)}">'
        '<div class="actions"><button class="primary" type="submit" id="sign-in">Sign in</button></div></form>'
    )
    return page(chrome, "Sign in", body)


def error_page(chrome: Chrome, status: int, message: str) -> str:
    """An error's page (404 of a job the tenant does not hold, a bad parameter)."""
    body = f'<h1 id="error">{status}</h1><p>{escape(message)}</p><p><a href="/">Back to the jobs</a></p>'
    return page(chrome, f"Error {status}", body)


def totals_cards(totals: Totals) -> str:
    """The tenant's totals as cards."""
    cards = [
        ("running", number(totals.running)),
        ("stopped", number(totals.stopped)),
        ("finished", number(totals.finished)),
        ("GPU-hours freed", number(totals.gpu_hours_freed, 2)),
    ]
    inner = "".join(
        f'<div class="card"><div class="value">{value}</div><div class="label">{escape(label)}</div></div>'
        for label, value in cards
    )
    return f'<section class="cards" id="totals">{inner}</section>'


def events_table(events: Sequence[EventRow], current_job: str | None = None) -> str:
    """The tenant's recent events as a table, newest first (``current_job``'s rows marked)."""
    if not events:
        return '<p class="muted">No events yet.</p>'
    rows = []
    for ev in events:
        job = f'<a href="{escape(job_href(ev.job_id))}">{escape(ev.job_id)}</a>' if ev.job_id else ""
        mark = ' class="this-job"' if current_job is not None and ev.job_id == current_job else ""
        rows.append(
            f'<tr{mark}><td class="num">{ev.event_id}</td><td>{when(ev.time)}</td><td><code>{escape(ev.type)}</code>'
            f'</td><td>{job}</td><td class="details">{escape(ev.details)}</td></tr>'
        )
    return (
        '<table id="events"><thead><tr><th class="num">#</th><th>Time</th><th>Type</th><th>Job</th><th>Details</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


COLUMNS: tuple[tuple[str, str | None, bool], ...] = (
    ("Job", "job", False),
    ("Type", "type", False),
    ("Status", "status", False),
    ("Reports", "reports", True),
    ("Last score", None, True),
    ("Declines", "declines", True),
    ("Best step", "best_step", True),
    ("Best score", "best_score", True),
    ("Stop step", "stop_step", True),
    ("Stop reason", None, False),
    ("GPU-h freed", "gpu_hours", True),
)
"""The list's columns: header, sort key (None: not sortable) and whether it is numeric."""


@dataclass(frozen=True, slots=True)
class Listing:
    """Where the job list is: its filter, order and page.

    Args:
        status: The status shown, or None for all.
        sort: The sort key.
        order: ``asc`` or ``desc``.
        page: The page number (from 1).
        pages: How many pages there are.
        total: Jobs matching the filter.
    """

    status: str | None
    sort: str
    order: str
    page: int
    pages: int
    total: int

    def href(self, **changes: str | int | None) -> str:
        """The list's URL with ``changes`` to its parameters (None drops one)."""
        params: dict[str, str | int | None] = {"status": self.status, "sort": self.sort, "order": self.order}
        params.update(changes)
        # Page 1 is the default: left out, so that the first page has one URL.
        query = urlencode([(k, v) for k, v in params.items() if v is not None and not (k == "page" and v == 1)])
        return "/?" + query if query else "/"


def _header(listing: Listing, label: str, key: str | None, numeric: bool) -> str:
    cls = ' class="num"' if numeric else ""
    if key is None:
        return f"<th{cls}>{escape(label)}</th>"
    on = key == listing.sort
    order = "asc" if on and listing.order == "desc" else "desc" if on else ("desc" if numeric else "asc")
    arrow = (" \u25b2" if listing.order == "asc" else " \u25bc") if on else ""
    link_cls = ' class="on"' if on else ""
    href = escape(listing.href(sort=key, order=order, page=None))
    return f'<th{cls}><a{link_cls} href="{href}" data-sort="{key}">{escape(label)}{arrow}</a></th>'


def job_cells(row: JobRow) -> str:
    """A job's cells in the list, in :data:`COLUMNS` order."""
    job = row.job
    return (
        f'<td class="job"><a class="job-link" href="{escape(job_href(job.job_id))}">{escape(job.job_id)}</a></td>'
        f"<td>{escape(job.job_type)}</td>"
        f'<td><span class="badge {job.status}">{job.status}</span></td>'
        f'<td class="num">{job.n_reports}</td>'
        f'<td class="num">{score(row.last_score)}</td>'
        f'<td class="num">{number(row.declines)}</td>'
        f'<td class="num">{number(job.best_step)}</td>'
        f'<td class="num">{score(job.best_score)}</td>'
        f'<td class="num">{number(row.stop_step)}</td>'
        f'<td class="reason">{escape(row.stop_reason or DASH)}</td>'
        f'<td class="num">{number(row.gpu_hours_freed, 2)}</td>'
    )


def jobs_page(
    chrome: Chrome, rows: Sequence[JobRow], listing: Listing, totals: Totals, events: Sequence[EventRow]
) -> str:
    """The job list: totals, status filter, the sortable table, pages, recent events."""
    tabs = "".join(
        f'<a class="{"on" if listing.status == s else ""}" href="{escape(listing.href(status=s, page=None))}">'
        f"{escape(s or 'all')}</a>"
        for s in (None, *STATUSES)
    )
    headers = "".join(_header(listing, *col) for col in COLUMNS)
    body_rows = "".join(f'<tr data-job="{escape(r.job.job_id)}">{job_cells(r)}</tr>' for r in rows)
    if not rows:
        body_rows = f'<tr><td colspan="{len(COLUMNS)}" class="muted">No jobs{" " + escape(listing.status) if listing.status else ""} yet.</td></tr>'
    pager = f'<span class="muted">{listing.total} job{"s" if listing.total != 1 else ""}'
    if listing.pages > 1:
        pager += f", page {listing.page} of {listing.pages}</span>"
        if listing.page > 1:
            pager += f'<a href="{escape(listing.href(page=listing.page - 1))}">\u2190 previous</a>'
        if listing.page < listing.pages:
            pager += f'<a href="{escape(listing.href(page=listing.page + 1))}">next \u2192</a>'
    else:
        pager += "</span>"
    body = (
        f"<h1>Jobs</h1>{totals_cards(totals)}"
        f'<nav class="tabs" id="status-filter">{tabs}</nav>'
        f'<table id="jobs"><thead><tr>{headers}</tr></thead><tbody>{body_rows}</tbody></table>'
        f'<div class="pager">{pager}</div>'
        f"<h2>Recent events</h2>{events_table(events)}"
        f'<p class="muted">This page refreshes every {REFRESH_S} s.</p>'
    )
    return page(chrome, "Jobs", body, refresh=True)


@dataclass(frozen=True, slots=True)
class HistoryWindow:
    """Which page of a job's reports its page shows (newest first, a page at a time).

    Args:
        before: The page shows reports below this step, or None for the newest.
        next_before: The ``before`` of the next (older) page, or None when this is the oldest.
        total: The job's reports in all.
    """

    before: int | None
    next_before: int | None
    total: int

    def href(self, job_id: str, before: int | None) -> str:
        """The job page's URL showing reports below ``before`` (None: the newest)."""
        return job_href(job_id) + ("" if before is None else "?" + urlencode({"before": before}))


def _history_pager(job_id: str, window: HistoryWindow) -> str:
    links = []
    if window.before is not None:
        links.append(f'<a id="newest-reports" href="{escape(window.href(job_id, None))}">\u2190 newest</a>')
    if window.next_before is not None:
        href = escape(window.href(job_id, window.next_before))
        links.append(f'<a id="older-reports" href="{href}">older \u2192</a>')
    return f'<div class="pager">{"".join(links)}</div>' if links else ""


def _spec(spec: object) -> str:
    if isinstance(spec, dict):
        params = spec.get("params") or {}
        args = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(params.items()))
        return f"{spec.get('name', '?')}({args})"
    return str(spec)


def _bound(per_run: bool | None) -> str:
    """How the job's false stops are bounded (:attr:`JobRecord.per_run_bound`), said for a person."""
    if per_run is None:
        return DASH
    return "per run" if per_run else "per look: no planned steps declared"


def _spread(point: EvalPoint) -> str:
    """A report's spread as the job page shows it: ``std (n)``, or a dash for a report without one."""
    return DASH if point.std is None else f"{score(point.std)} ({point.n})"


def job_page(
    chrome: Chrome,
    row: JobRow,
    history: Sequence[EvalPoint],
    totals: Totals,
    events: Sequence[EventRow],
    window: HistoryWindow | None = None,
) -> str:
    """A job: its facts, one page of its reports (``history``, in step order, as ``window`` says; None: all of them)
    as an eval curve with the best and stop steps marked and as a table, newest first, the tenant's totals and the
    job's recent events."""
    job = row.job
    facts = [
        ("Status", f'<span class="badge {job.status}">{job.status}</span>'),
        ("Type", escape(job.job_type)),
        ("Detector", f"<code>{escape(_spec(job.detector))}</code>"),
        ("Decided on", escape(DASH if job.mode is None else job.mode.value)),
        ("Cadence", f"<code>{escape(_spec(job.cadence or 'fixed'))}</code>"),
        ("GPUs", number(job.gpus)),
        ("Planned steps", number(job.planned_steps)),
        ("False stops bounded", _bound(job.per_run_bound)),
        ("Registered", when(job.created_at)),
        ("Reports", str(job.n_reports)),
        ("Last step", number(job.last_step)),
        ("Last score", score(row.last_score)),
        ("Best step", number(job.best_step)),
        ("Best score", score(job.best_score)),
        ("Declines", number(row.declines)),
        ("Stop step", number(job.stopped_at)),
        ("Stop reason", escape(row.stop_reason or DASH)),
        ("GPU-hours freed", number(row.gpu_hours_freed, 2)),
        ("Finished", when(job.finished_at)),
        ("Finish reason", escape(job.finish_reason or DASH)),
    ]
    dl = "".join(f"<div><dt>{label}</dt><dd>{value}</dd></div>" for label, value in facts)
    curve = eval_curve(
        [(p.step, p.score) for p in history], job.best_step, job.stopped_at, f"eval score of {job.job_id} by step"
    )
    marks = []
    if job.best_step is not None:
        marks.append(f"best step {job.best_step}")
    if job.stopped_at is not None:
        marks.append(f"stopped at step {job.stopped_at}")
    window = window or HistoryWindow(None, None, len(history))
    caption = f"Eval score by step, {len(history)} report{'s' if len(history) != 1 else ''}"
    if history and len(history) < window.total:
        caption += f" of {window.total} (steps {history[0].step} to {history[-1].step})"
    caption += f"; {', '.join(marks)}." if marks else "."
    report_rows = "".join(
        f'<tr><td class="num">{p.step}</td><td class="num">{score(p.score)}</td><td class="num">{_spread(p)}</td>'
        f"<td>{escape(p.action)}</td>"
        f'<td class="reason">{escape(p.reason)}</td><td>{when(p.received_at)}</td></tr>'
        for p in reversed(history)
    )
    more = _history_pager(job.job_id, window)
    body = (
        '<p><a href="/">\u2190 All jobs</a></p>'
        f'<h1 id="job-id">{escape(job.job_id)}</h1>'
        f'<dl class="facts">{dl}</dl>'
        f"<figure>{curve}<figcaption>{escape(caption)}</figcaption></figure>"
        "<h2>Reports</h2>"
        '<table id="reports"><thead><tr><th class="num">Step</th><th class="num">Score</th>'
        '<th class="num">Std (n)</th><th>Decision</th>'
        f"<th>Reason</th><th>Received</th></tr></thead><tbody>{report_rows}</tbody></table>{more}"
        f"<h2>Tenant totals</h2>{totals_cards(totals)}"
        f"<h2>Recent events of the tenant</h2>{events_table(events, job.job_id)}"
    )
    return page(chrome, job.job_id, body, refresh=True)
