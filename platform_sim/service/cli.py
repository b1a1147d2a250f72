"""``evalstop-server``: run the scheduler service and administer its tenants.

evalstop-server serve [--host 127.0.0.1] [--port 8080] [--db evalstop.db]
evalstop-server tenant add NAME [--db ...]      # prints the new token alone on the last line
evalstop-server tenant list [--db ...] [--json]
evalstop-server tenant revoke NAME [--db ...]
evalstop-server tenant rotate NAME | restore NAME [--db ...]   # prints the new token alone on the last line
evalstop-server events [--tenant NAME] [--after ID] [--json]     # the audit trail (cli_events.py)
evalstop-server webhook add URL --tenant NAME [--events stop,finish] | list | remove ID
evalstop-server tenant scope NAME [--slurm-account A] [--k8s-namespace NS] [--ray-prefix P] [--remove]  # cli_actuate.py
evalstop-server actuate --actuator ray --actuator-option address=URL [--db ...]   # the stop actions' worker
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from platform_sim.core.boundary import JOB_TYPES

from . import cli_actuate, cli_events

DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 100  # edge.DEFAULT_MAX_CONNECTIONS_PER_ADDRESS (not imported: it needs the extra)

MAX_EVAL_SCORES = 10_000  # the service's default (wire.MAX_EVAL_SCORES; not imported: it needs the extra)

DEFAULT_DB = "evalstop.db"
SWITCH_INTERVAL_S = 0.001  # the server's sys.setswitchinterval (see _serve)
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # always used with fullmatch (no trailing newline)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line reason (the default prints the whole usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fail(message: str) -> int:
    print(f"evalstop-server: error: {message}", file=sys.stderr)
    return 2


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        default=os.environ.get("EVALSTOP_DB", DEFAULT_DB),
        help=f"SQLite database file (default: $EVALSTOP_DB or ./{DEFAULT_DB}); created if missing; or a "
        "postgresql://user@host:port/dbname URL for several replicas on one database",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="evalstop-server", description="The evalstop scheduler service (HTTP) and its tenants.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_serve_parser(sub)
    tsub = _add_tenant_parsers(sub)
    cli_events.add_parsers(sub, _db_arg, _Parser)
    cli_actuate.add_parsers(sub, tsub, _db_arg)
    return parser


def _add_serve_parser(sub: Any) -> None:
    """``serve``: the HTTP service's flags."""
    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=int, default=8080, help="TCP port (default: 8080)")
    _db_arg(serve)
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


def _add_tenant_parsers(sub: Any) -> Any:
    """``tenant add|list|revoke|rotate|restore|detector``."""
    tenant = sub.add_parser("tenant", help="add, list or revoke tenants")
    tsub = tenant.add_subparsers(dest="tenant_command", required=True, parser_class=_Parser)
    add = tsub.add_parser("add", help="create a tenant; prints its token alone on the last line (shown once)")
    add.add_argument("name", help="tenant name: letters, digits, '._-', up to 64 characters")
    _db_arg(add)
    add.add_argument("--json", action="store_true", help="machine-readable output (the token is still the last line)")
    lst = tsub.add_parser("list", help="list tenants (tokens are stored hashed and never shown again)")
    _db_arg(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    rev = tsub.add_parser("revoke", help="revoke a tenant's token; its requests get 401 from then on")
    rev.add_argument("name")
    _db_arg(rev)
    rev.add_argument("--json", action="store_true", help="machine-readable output")
    for verb, what in (
        ("rotate", "give an active tenant a new token and make the old one invalid (within 1 s on a running server)"),
        ("restore", "make a revoked tenant active again with a new token, so that its jobs are reachable again"),
    ):
        new = tsub.add_parser(verb, help=f"{what}; prints the new token alone on the last line (shown once)")
        new.add_argument("name")
        _db_arg(new)
        new.add_argument(
            "--json", action="store_true", help="machine-readable output (the token is still the last line)"
        )
    det = tsub.add_parser(
        "detector",
        help="the stop detector this tenant's new jobs should use, from its finished jobs",
        description="Applies evalstop-fleet's rule (platform_sim/sim/policies/fleet.py, docs/results/detectors-synthetic.md) to the tenant's "
        "jobs of one type that finished without being stopped: the median late gain (the share of a "
        "run's rise made in its last third) of the last --window of them decides between the "
        "conservative detector (shape) and the aggressive one (shape-sens). Prints the spec to pass as "
        "the job's detector.",
    )
    det.add_argument("name")
    det.add_argument("--job-type", default="rlhf", choices=list(JOB_TYPES), help="jobs to learn from (default rlhf)")
    det.add_argument(
        "--min-runs",
        type=int,
        default=8,
        help="finished runs needed before leaving the conservative detector (default 8)",
    )
    det.add_argument("--window", type=int, default=50, help="most recent finished runs that count (default 50)")
    _db_arg(det)
    det.add_argument("--json", action="store_true", help="machine-readable output")
    return tsub


def _iso(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_db(db: str) -> None:
    """Refuse a ``--db`` value no store can use, with a reason (``ValueError``)."""
    if not db.strip():
        raise ValueError("is empty (give a SQLite file path or a postgresql:// URL; check $EVALSTOP_DB)")
    if db == ":memory:" or db.startswith("file::memory:"):
        raise ValueError("an in-memory SQLite database is not supported: the service's connections must share one file")
    if "://" in db and not db.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            f"unsupported database URL scheme {db.split('://', 1)[0]!r}: give a SQLite file path or a postgresql:// URL"
        )


def _open_store(db: str, synchronous: str = "FULL"):  # noqa: ANN202 - the store type needs the service extra
    # Checked by prefix here so that SQLite users never import the PostgreSQL module (or need its extra).
    # Several replicas on one database (docs/service-postgres.md); --synchronous is SQLite's.
    check_db(db)
    if db.startswith(("postgresql://", "postgres://")):
        try:
            from .store_postgres import PostgresStore

            return PostgresStore(db)
        except ImportError as exc:
            raise ValueError(f"PostgreSQL needs its extra: pip install 'evalstop[postgres]' ({exc})") from exc
    from .store_sqlite import SQLiteStore

    return SQLiteStore(db, synchronous=synchronous)


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


def _serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be in 0..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        return _fail(f"--max-body-bytes must be >= 1024, got {args.max_body_bytes}")
    if args.max_eval_scores < 1:
        return _fail(f"--max-eval-scores must be >= 1, got {args.max_eval_scores}")
    if not args.rate_limit >= 0 or args.rate_limit == float("inf"):
        return _fail(f"--rate-limit must be a number >= 0, got {args.rate_limit}")
    burst = args.rate_burst if args.rate_burst is not None else max(10.0, 2 * args.rate_limit)
    if not burst >= 1 or burst == float("inf"):
        return _fail(f"--rate-burst must be >= 1, got {args.rate_burst}")
    for flag in ("max_jobs_per_tenant", "max_running_jobs_per_tenant"):
        if getattr(args, flag) < 0:
            return _fail(f"--{flag.replace('_', '-')} must be >= 0 (0: no limit), got {getattr(args, flag)}")
    try:
        event_options = cli_events.serve_options(args)
        actuator_options = cli_actuate.serve_options(args)
    except ValueError as exc:
        return _fail(str(exc))
    for flag in ("header_timeout", "body_timeout", "keep_alive_timeout"):
        value = getattr(args, flag)
        if not 0 < value < float("inf"):
            return _fail(f"--{flag.replace('_', '-')} must be a number of seconds > 0, got {value}")
    if args.max_connections < 1:
        return _fail(f"--max-connections must be >= 1, got {args.max_connections}")
    if args.max_connections_per_address < 0:
        return _fail(f"--max-connections-per-address must be >= 0 (0: no cap), got {args.max_connections_per_address}")
    if args.max_sessions_per_tenant < 1:
        return _fail(f"--max-sessions-per-tenant must be >= 1, got {args.max_sessions_per_tenant}")
    if not 0 < args.sign_ins_per_minute < float("inf"):
        return _fail(f"--sign-ins-per-minute must be a number > 0, got {args.sign_ins_per_minute}")
    why = _check_listen(args.host, args.port)
    if why is not None:
        return _fail(why)
    try:
        import uvicorn

        from .app import JobQuotas, TenantRateLimit, create_app
        from .dashboard.sessions import SignInSettings
        from .edge import QueryRedactingFilter, edge_protocol
    except ImportError as exc:
        return _fail(f"the service needs its extra: pip install 'evalstop[service]' ({exc})")
    try:
        store = _open_store(args.db, args.synchronous)
        problem = store.write_problem()
    except (ValueError, OSError) as exc:
        return _fail(f"--db {args.db}: {exc}")
    except Exception as exc:  # sqlite3.DatabaseError: not a database, locked, unreadable
        return _fail(f"--db {args.db}: cannot open the database: {' '.join(str(exc).split())}")
    if problem is not None:
        store.close()
        return _fail(f"--db {args.db}: {problem}")
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


def _tenant(args: argparse.Namespace) -> int:
    # The store logs database failures; a command answers them itself, in one line (no log records on stderr).
    logging.getLogger("platform_sim").addHandler(logging.NullHandler())
    try:
        return _tenant_command(args)
    except Exception as exc:  # a database error in the middle of a command: one line, never a traceback
        return _fail(f"--db {args.db}: {type(exc).__name__}: {' '.join(str(exc).split())}")


def _tenant_command(args: argparse.Namespace) -> int:
    from .store import TenantExists, TenantNotFound

    try:
        store = _open_store(args.db)
    except (ValueError, OSError) as exc:
        return _fail(f"--db {args.db}: {exc}")
    except Exception as exc:
        return _fail(f"--db {args.db}: cannot open the database: {' '.join(str(exc).split())}")
    try:
        if args.command in ("events", "webhook"):
            return cli_events.run(store, args, _fail)
        if args.tenant_command == "add":
            if not TENANT_NAME.fullmatch(args.name):
                return _fail(f"NAME {args.name!r} is not a valid tenant name (letters, digits, '._-', up to 64)")
            try:
                tenant, token = store.add_tenant(args.name)
            except TenantExists as exc:
                return _fail(str(exc))
            if args.json:
                print(json.dumps({"name": tenant.name, "tenant_id": tenant.tenant_id, "created_at": tenant.created_at}))
            else:
                print(f"tenant {tenant.name!r} created; its token (shown only now, stored hashed):", file=sys.stderr)
            print(token)
            return 0
        if args.tenant_command == "list":
            tenants = store.list_tenants()
            if args.json:
                print(
                    json.dumps(
                        [
                            {
                                "name": t.name,
                                "tenant_id": t.tenant_id,
                                "created_at": t.created_at,
                                "revoked_at": t.revoked_at,
                            }
                            for t in tenants
                        ]
                    )
                )
            else:
                print(f"{'name':<24} {'status':<8} {'created':<20} revoked")
                for t in tenants:
                    status = "revoked" if t.revoked_at is not None else "active"
                    print(f"{t.name:<24} {status:<8} {_iso(t.created_at):<20} {_iso(t.revoked_at)}")
            return 0
        if args.tenant_command == "scope":
            return cli_actuate.scope_command(store, args, _fail)
        if args.tenant_command == "detector":
            return _fleet_detector(store, args)
        if args.tenant_command in ("rotate", "restore"):
            return _new_token(store, args)
        try:
            tenant = store.revoke_tenant(args.name)
        except TenantNotFound as exc:
            return _fail(str(exc))
        if args.json:
            print(json.dumps({"name": tenant.name, "revoked_at": tenant.revoked_at}))
        else:
            print(f"tenant {tenant.name!r} revoked at {_iso(tenant.revoked_at)}")
        return 0
    finally:
        store.close()


def _new_token(store, args: argparse.Namespace) -> int:  # noqa: ANN001 - the store type needs the extra
    from .store import TenantNotFound, TenantRevoked

    replace = store.rotate_tenant if args.tenant_command == "rotate" else store.restore_tenant
    try:
        tenant, token = replace(args.name)
    except (TenantNotFound, TenantRevoked) as exc:
        return _fail(str(exc))
    done = "rotated" if args.tenant_command == "rotate" else "restored"
    if args.json:
        print(json.dumps({"name": tenant.name, "tenant_id": tenant.tenant_id, "done": done}))
    else:
        print(
            f"tenant {tenant.name!r} {done}; the old token no longer works; the new one (shown only now):",
            file=sys.stderr,
        )
    print(token)
    return 0


def _fleet_detector(store, args: argparse.Namespace) -> int:  # noqa: ANN001 - the store type needs the extra
    from platform_sim.sim.policies.fleet import FleetDetectorChoice
    from platform_sim.sim.policies.stop_policies import FleetEvalStopPolicy

    tenant = next((t for t in store.list_tenants() if t.name == args.name), None)
    if tenant is None:
        return _fail(f"no tenant {args.name!r}")
    defaults = FleetEvalStopPolicy().choice
    try:
        choice = FleetDetectorChoice(
            defaults.conservative, defaults.aggressive, defaults.min_late_gain, args.min_runs, args.window
        )
    except ValueError as exc:
        return _fail(f"--min-runs/--window: {exc}")
    finished, after = [], None
    while True:  # every finished job of the tenant, a page at a time
        page = store.list_jobs(tenant.tenant_id, status="finished", limit=1000, after=after)
        finished += [j for j in page if j.job_type == args.job_type and j.stopped_at is None]
        if len(page) < 1000:
            break
        after = page[-1].job_id
    finished.sort(key=lambda j: j.finished_at or 0.0)
    counted = 0
    for job in finished[-args.window :]:  # oldest first, as the fleet saw them finish
        scores = [r.eval_score for r in store.reports(tenant.tenant_id, job.job_id)]
        counted += choice.record(scores) is not None
    spec, median = choice.spec(), choice.median_late_gain()
    regime = "aggressive" if spec == choice.aggressive else "conservative"
    if args.json:
        print(
            json.dumps(
                {
                    "tenant": tenant.name,
                    "job_type": args.job_type,
                    "finished_unstopped": len(finished),
                    "counted": counted,
                    "median_late_gain": median,
                    "regime": regime,
                    "detector": spec,
                }
            )
        )
    else:
        why = (
            f"median late gain {median:.2f} of the last {len(choice.gains)} finished runs "
            f"({'>=' if regime == 'aggressive' else '<'} {choice.min_late_gain:g})"
            if median is not None
            else f"only {counted} finished runs with enough evals (needs {choice.min_runs})"
        )
        print(f"tenant {tenant.name!r}, {args.job_type} jobs: {regime} ({why})")
        print(json.dumps(spec))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "actuate":
        return cli_actuate.actuate(args, _open_store, _fail)
    return _tenant(args)


if __name__ == "__main__":
    sys.exit(main())
