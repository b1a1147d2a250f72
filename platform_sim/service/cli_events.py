"""``evalstop-server events`` and ``evalstop-server webhook add|list|remove``, and the ``serve`` flags of the audit
trail and the webhook worker (kept apart from :mod:`~platform_sim.service.cli`, which wires them in).

evalstop-server events [--tenant NAME] [--after ID] [--limit N] [--json] [--db ...]   # reads the database directly
evalstop-server webhook add URL --tenant NAME [--events stop,finish] [--db ...]    # prints the secret, once
evalstop-server webhook list [--tenant NAME] [--json] [--db ...]
evalstop-server webhook remove ID [--db ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_RETENTION_DAYS = 90.0


def add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of the admin token, the event retention and the webhook worker."""
    serve.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding the operator's admin token (one line, at least 32 characters): with it "
        "GET /v1/events reads every tenant's events and GET /metrics each tenant's totals (it opens no other route)",
    )
    serve.add_argument(
        "--event-retention-days",
        type=float,
        default=DEFAULT_RETENTION_DAYS,
        help=f"prune audit-trail events older than this (default {DEFAULT_RETENTION_DAYS:g}; 0 keeps them forever)",
    )
    serve.add_argument("--webhook-timeout-s", type=float, default=5.0, help="timeout of one webhook POST (default 5)")
    serve.add_argument(
        "--webhook-backoff-s", type=float, default=1.0, help="delay before the first webhook retry, doubled after each"
    )
    serve.add_argument(
        "--webhook-backoff-max-s", type=float, default=300.0, help="longest delay between webhook retries (default 300)"
    )
    serve.add_argument(
        "--webhook-max-attempts",
        type=int,
        default=20,
        help="attempts before a webhook delivery is given up (default 20)",
    )
    serve.add_argument(
        "--webhook-poll-s", type=float, default=0.5, help="how often the worker looks for due deliveries (default 0.5)"
    )


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app`` keyword arguments from the ``serve`` flags.

    Raises:
        ValueError: a flag's value is refused (the message names the flag).
    """
    from .webhooks import WebhookSettings

    admin = None
    if args.admin_token_file is not None:
        try:
            with open(args.admin_token_file, encoding="utf-8") as f:
                admin = f.read().strip()
        except OSError as exc:
            raise ValueError(f"--admin-token-file {args.admin_token_file}: {exc.strerror or exc}") from None
        if len(admin) < 32 or any(c.isspace() for c in admin):
            raise ValueError(
                f"--admin-token-file {args.admin_token_file}: the token must be one word of >= 32 characters"
            )
    try:
        settings = WebhookSettings(
            timeout_s=args.webhook_timeout_s,
            backoff_s=args.webhook_backoff_s,
            backoff_max_s=args.webhook_backoff_max_s,
            max_attempts=args.webhook_max_attempts,
            poll_s=args.webhook_poll_s,
            event_retention_days=args.event_retention_days,
        )
    except ValueError as exc:
        raise ValueError(f"--webhook-*/--event-retention-days: {exc}") from None
    return {"admin_token": admin, "webhooks": settings}


def add_parsers(sub: Any, db_arg: Callable[[argparse.ArgumentParser], None], parser_class: type) -> None:
    """Add the ``events`` and ``webhook`` subcommands to ``sub`` (``db_arg`` adds the usual ``--db``)."""
    ev = sub.add_parser(
        "events", help="print the audit trail (reads the database directly: every tenant's events, or one's)"
    )
    ev.add_argument("--tenant", default=None, help="only this tenant's events")
    ev.add_argument("--after", type=int, default=0, help="only events with a larger id (default 0: from the oldest)")
    ev.add_argument("--limit", type=int, default=1000, help="most events printed (default 1000)")
    db_arg(ev)
    ev.add_argument("--json", action="store_true", help="one JSON object per line")
    hook = sub.add_parser("webhook", help="add, list or remove a tenant's webhooks")
    hsub = hook.add_subparsers(dest="webhook_command", required=True, parser_class=parser_class)
    add = hsub.add_parser("add", help="POST the tenant's events to URL, signed; prints the signing secret (shown once)")
    add.add_argument("url", help="http:// or https:// URL of the receiver")
    add.add_argument("--tenant", required=True, help="whose events")
    add.add_argument(
        "--events", default="stop,finish", help="comma-separated: stop, finish, register, report (default stop,finish)"
    )
    db_arg(add)
    add.add_argument("--json", action="store_true", help="machine-readable output (the secret is still the last line)")
    lst = hsub.add_parser("list", help="list webhooks (secrets are never shown again)")
    lst.add_argument("--tenant", default=None, help="only this tenant's")
    db_arg(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    rem = hsub.add_parser("remove", help="delete a webhook and its pending deliveries")
    rem.add_argument("webhook_id", type=int)
    db_arg(rem)
    rem.add_argument("--json", action="store_true", help="machine-readable output")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(store: Any, args: argparse.Namespace, fail: Callable[[str], int]) -> int:
    """Run ``events`` or ``webhook ...`` on an open store; returns the exit status."""
    tenants = {t.name: t for t in store.list_tenants()}
    tenant = None
    if getattr(args, "tenant", None) is not None:
        tenant = tenants.get(args.tenant)
        if tenant is None:
            return fail(f"--tenant: no tenant {args.tenant!r}")
    if args.command == "events":
        return _events(store, args, tenant, {t.tenant_id: n for n, t in tenants.items()}, fail)
    return _webhook(store, args, tenant, {t.tenant_id: n for n, t in tenants.items()}, fail)


def _events(
    store: Any, args: argparse.Namespace, tenant: Any, names: dict[int, str], fail: Callable[[str], int]
) -> int:
    from .events import event_json

    if args.after < 0 or args.limit < 1:
        return fail("--after must be >= 0 and --limit >= 1")
    after, left = args.after, args.limit
    while left > 0:
        page = store.list_events(None if tenant is None else tenant.tenant_id, after, min(left, 1000))
        for e in page:
            if args.json:
                print(json.dumps({**event_json(e), "tenant": names.get(e.tenant_id)}))
            else:
                print(
                    f"{e.id:>8} {_iso(e.time)} {names.get(e.tenant_id, e.tenant_id)!s:<16} {e.type:<18} "
                    f"{e.job_id or '-':<24} {json.dumps(e.details, separators=(',', ':'))}"
                )
        if len(page) < min(left, 1000):
            break
        after, left = page[-1].id, left - len(page)
    return 0


def _webhook(
    store: Any, args: argparse.Namespace, tenant: Any, names: dict[int, str], fail: Callable[[str], int]
) -> int:
    from .events import webhook_types
    from .store import WebhookNotFound
    from .webhooks import check_url, redact_url

    if args.webhook_command == "add":
        try:
            warnings = check_url(args.url)
        except ValueError as exc:
            return fail(str(exc))
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        try:
            types = webhook_types(args.events.split(","))
        except ValueError as exc:
            return fail(f"--events: {exc}")
        hook = store.add_webhook(tenant.tenant_id, args.url, types)
        if args.json:
            print(
                json.dumps(
                    {
                        "webhook_id": hook.webhook_id,
                        "tenant": args.tenant,
                        "url": redact_url(hook.url),
                        "events": list(types),
                    }
                )
            )
        else:
            print(
                f"webhook {hook.webhook_id} of tenant {args.tenant!r} -> {redact_url(hook.url)} ({', '.join(types)}); its signing "
                "secret (shown only now; stored in the database, which signs with it):",
                file=sys.stderr,
            )
        print(hook.secret)
        return 0
    if args.webhook_command == "list":
        hooks = store.list_webhooks(None if tenant is None else tenant.tenant_id)
        rows = [
            {
                "webhook_id": h.webhook_id,
                "tenant": names.get(h.tenant_id),
                "url": redact_url(h.url),  # its credentials and path may be secrets
                "events": list(h.events),
                "created_at": h.created_at,
            }
            for h in hooks
        ]
        if args.json:
            print(json.dumps(rows))
        else:
            print(f"{'id':>4} {'tenant':<16} {'events':<28} url")
            for r in rows:
                print(f"{r['webhook_id']:>4} {r['tenant']!s:<16} {','.join(r['events']):<28} {r['url']}")
        return 0
    try:
        hook = store.remove_webhook(args.webhook_id)
    except WebhookNotFound as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps({"webhook_id": hook.webhook_id, "removed": True}))
    else:
        print(f"webhook {hook.webhook_id} ({redact_url(hook.url)}) removed")
    return 0
