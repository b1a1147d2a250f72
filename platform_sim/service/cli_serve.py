"""``evalstop-server serve``: the HTTP service's flags, their checks, and the server's start (kept apart from
:mod:`~platform_sim.service.cli`, which wires it in beside the tenant, event and actuation commands).

Nothing here imports the service's extra (FastAPI, uvicorn) before the flags are checked, so that ``--help`` and a
bad flag answer without it.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from collections.abc import Callable
from typing import Any

from . import cli_actuate, cli_events

DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 100  # edge.DEFAULT_MAX_CONNECTIONS_PER_ADDRESS (not imported: it needs the extra)

MAX_EVAL_SCORES = 10_000  # the service's default (wire.MAX_EVAL_SCORES; not imported: it needs the extra)

SWITCH_INTERVAL_S = 0.001  # the server's sys.setswitchinterval (see serve)


def add_parser(sub: Any, db_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """``serve``: the HTTP service's flags (``db_arg`` adds the ``--db`` flag every command shares)."""
    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=int, default=8080, help="TCP port (default: 8080)")
    db_arg(serve)
    serve.add_argument(
        "--synchronous",
        choices=["FULL", "NORMAL"],
        default="FULL",
        help="SQLite durability: FULL fsyncs every commit (default); NORMAL survives a killed "
        "process but not an OS crash",
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB); larger ones get 413"
    )
    serve.add_argument(
        "--max-eval-scores",
        type=int,
        default=MAX_EVAL_SCORES,
        help=f"most per-example scores in one report (default {MAX_EVAL_SCORES}); longer lists get 422",
    )
    serve.add_argument(
        "--rate-limit",
        type=float,
        default=0.0,
        help="tokens per second each tenant may spend: one per request plus one per 2 kB of body; "
        "beyond it 429 with Retry-After (default 0: no limit)",
    )
    serve.add_argument(
        "--rate-burst",
        type=float,
        default=None,
        help="tokens a tenant may spend at once (default: 2 s worth of --rate-limit, at least 10)",
    )
    serve.add_argument(
        "--max-jobs-per-tenant",
        type=int,
        default=0,
        help="most jobs one tenant may register, finished ones included; beyond it 429 (default 0: no limit)",
    )
    serve.add_argument(
        "--max-running-jobs-per-tenant",
        type=int,
        default=0,
        help="most jobs of one tenant neither stopped nor finished at once; beyond it 429 (default 0: no limit)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to send a request's headers, from the connection's opening or the request's "
        "first byte (default 30); then 408 and the connection is closed",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        help="seconds a client has to send a request's whole body once its headers are in (default 60); "
        "then 408 and the connection is closed",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=5.0,
        help="seconds an idle connection stays open: between requests, and before a new connection's first byte "
        "(default 5)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=1000,
        help="most connections (and requests in progress) at once; beyond it requests get 503 (default 1000)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        help="most connections at once from one client address (IPv6: one /64); the next gets 503 and is closed "
        f"(default {DEFAULT_MAX_CONNECTIONS_PER_ADDRESS}; 0: no cap; behind a reverse proxy every client has its "
        "address: raise it)",
    )
    serve.add_argument(
        "--max-sessions-per-tenant",
        type=int,
        default=100,
        help="most dashboard sessions one tenant holds at once; a new sign-in ends its oldest (default 100)",
    )
    serve.add_argument(
        "--sign-ins-per-minute",
        type=float,
        default=10.0,
        help="dashboard sign-ins one client address may make a minute, and at once; a tenant 6 times as many from "
        "all addresses; beyond it 429 (default 10)",
    )
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every request, its path without the query string (off by default: it costs throughput)",
    )
    serve.add_argument(
        "--api-docs",
        action="store_true",
        help="serve /docs and /redoc (off by default: those pages load their scripts from a CDN); "
        "/openapi.json is always served",
    )
    cli_events.add_serve_flags(serve)
    cli_actuate.add_serve_flags(serve)


def _check_listen(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host:port`` (one line naming the flag), or None if it can."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"--host {host}: not an address this machine can listen on ({exc})"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(addr)
        except OSError as exc:
            flag = f"--port {port}" if exc.errno == errno.EADDRINUSE else f"--host {host}"
            return f"{flag}: cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def serve(args: argparse.Namespace, open_store: Callable[[str, str], Any], fail: Callable[[str], int]) -> int:
    """Check the flags (one line naming the first bad one, exit 2), open the store, run the server until stopped."""
    if not 0 <= args.port <= 65535:
        return fail(f"--port must be in 0..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        return fail(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    if args.max_eval_scores < 1:
        return fail(f"--max-eval-scores must be >= 1, got {args.max_eval_scores}")
    if not args.rate_limit >= 0 or args.rate_limit == float("inf"):
        return fail(f"--rate-limit must be a number >= 0, got {args.rate_limit}")
    burst = args.rate_burst if args.rate_burst is not None else max(10.0, 2 * args.rate_limit)
    if not burst >= 1 or burst == float("inf"):
        return fail(f"--rate-burst must be >= 1, got {args.rate_burst}")
    for flag in ("max_jobs_per_tenant", "max_running_jobs_per_tenant"):
        if getattr(args, flag) < 0:
            return fail(f"--{flag.replace('_', '-')} must be >= 0 (0: no limit), got {getattr(args, flag)}")
    try:
        event_options = cli_events.serve_options(args)
        actuator_options = cli_actuate.serve_options(args)
    except ValueError as exc:
        return fail(str(exc))
    for flag in ("header_timeout", "body_timeout", "keep_alive_timeout"):
        value = getattr(args, flag)
        if not 0 < value < float("inf"):
            return fail(f"--{flag.replace('_', '-')} must be a number of seconds > 0, got {value}")
    if args.max_connections < 1:
        return fail(f"--max-connections must be >= 1, got {args.max_connections}")
    if args.max_connections_per_address < 0:
        return fail(f"--max-connections-per-address must be >= 0 (0: no cap), got {args.max_connections_per_address}")
    if args.max_sessions_per_tenant < 1:
        return fail(f"--max-sessions-per-tenant must be >= 1, got {args.max_sessions_per_tenant}")
    if not 0 < args.sign_ins_per_minute < float("inf"):
        return fail(f"--sign-ins-per-minute must be a number > 0, got {args.sign_ins_per_minute}")
    why = _check_listen(args.host, args.port)
    if why is not None:
        return fail(why)
    try:
        import uvicorn

        from .app import JobQuotas, TenantRateLimit, create_app
        from .dashboard.sessions import SignInSettings
        from .edge import QueryRedactingFilter, edge_protocol
    except ImportError as exc:
        return fail(f"the service needs its extra: pip install 'evalstop[service]' ({exc})")
    try:
        store = open_store(args.db, args.synchronous)
        problem = store.write_problem()
    except (ValueError, OSError) as exc:
        return fail(f"--db {args.db}: {exc}")
    except Exception as exc:  # sqlite3.DatabaseError: not a database, locked, unreadable
        return fail(f"--db {args.db}: cannot open the database: {' '.join(str(exc).split())}")
    if problem is not None:
        store.close()
        return fail(f"--db {args.db}: {problem}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(
        store,
        max_body_bytes=args.max_body_bytes,
        close_store=True,
        max_eval_scores=args.max_eval_scores,
        rate_limit=TenantRateLimit(args.rate_limit, burst) if args.rate_limit > 0 else None,
        **event_options,
        **actuator_options,
        quotas=JobQuotas(args.max_jobs_per_tenant or None, args.max_running_jobs_per_tenant or None),
        api_docs=args.api_docs,
        sign_in=SignInSettings(args.max_sessions_per_tenant, args.sign_ins_per_minute),
    )
    # A thread rendering a big page hands the interpreter over to the event loop within 1 ms instead of Python's 5 ms
    # when the loop asks for it: the wait of a request that arrives before the page gives way to it (fairness.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # One process, one event loop, one writer thread with group commit: on two cores more worker processes only
    # fight over SQLite's single write lock (measured in docs/benchmarks-service.md).
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=5,
        # Slow, stalled, silent or greedy clients cannot hold connections open (edge.py): idle, header and body
        # deadlines (uvicorn has only the keep-alive one), header-size limits, a cap per client address, and the
        # global cap on connections.
        http=edge_protocol(
            args.header_timeout, args.body_timeout, args.keep_alive_timeout, args.max_connections_per_address
        ),
        timeout_keep_alive=args.keep_alive_timeout,
        limit_concurrency=args.max_connections,
    )
    # After Config, which sets up uvicorn's loggers: no query string (a token put there by mistake) in the log.
    logging.getLogger("uvicorn.access").addFilter(QueryRedactingFilter())
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        return 3  # uvicorn's own exit status when the server did not start (it logged why)
    return 0
