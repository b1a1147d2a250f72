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
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from platform_sim.core.boundary import JOB_TYPES

from . import cli_actuate, cli_events, cli_serve

DEFAULT_DB = "evalstop.db"
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
    cli_serve.add_parser(sub, _db_arg)
    tsub = _add_tenant_parsers(sub)
    cli_events.add_parsers(sub, _db_arg, _Parser)
    cli_actuate.add_parsers(sub, tsub, _db_arg)
    return parser


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
        return cli_serve.serve(args, _open_store, _fail)
    if args.command == "actuate":
        return cli_actuate.actuate(args, _open_store, _fail)
    return _tenant(args)


if __name__ == "__main__":
    sys.exit(main())
