"""``evalstop-server actuate``, ``evalstop-server tenant scope`` and the actuator flags of ``serve`` (kept apart from
:mod:`~platform_sim.service.cli`, which wires them in).

evalstop-server actuate --actuator ray --actuator-option address=http://127.0.0.1:8265 [--db ...] [--once]
evalstop-server tenant scope NAME [--slurm-account A] [--slurm-user U] [--k8s-namespace NS] [--ray-prefix P]
                                  [--remove] [--json] [--db ...]    # no owner flag: show; --remove alone: remove all
evalstop-server serve ... --actuator slurm --actuator-option grace_s=30 [--actuate]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

SCOPE_FLAGS = (
    # (flag, dest, scheduler kind, owner prefix): the owner string each actuator reads from TenantScope.owners(kind).
    ("--slurm-account", "slurm_account", "slurm", "account:"),
    ("--slurm-user", "slurm_user", "slurm", "user:"),
    ("--k8s-namespace", "k8s_namespace", "kubernetes", ""),
    ("--ray-prefix", "ray_prefix", "ray", ""),
)
"""The ``tenant scope`` flags. Slurm owners are stored as ``account:A`` or ``user:U`` (the Slurm actuator matches a
job's account or user against them), a namespace and a Ray submission-id prefix as given."""


def _actuator_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--actuator",
        action="append",
        default=[],
        choices=["slurm", "kubernetes", "ray"],
        help="a scheduler this server may act on (repeatable): jobs register handles of these kinds only",
    )
    p.add_argument(
        "--actuator-option",
        action="append",
        default=[],
        metavar="[KIND.]KEY=VALUE",
        help="an actuator's setting (repeatable), e.g. address=http://127.0.0.1:8265 for ray; KIND. is needed with "
        "several --actuator",
    )
    p.add_argument("--actuate-lease-s", type=float, default=120.0, help="lease of a claimed action (default 120)")
    p.add_argument(
        "--actuate-backoff-s", type=float, default=2.0, help="delay before the first retry of a failed action phase"
    )
    p.add_argument(
        "--actuate-backoff-max-s", type=float, default=300.0, help="longest delay between retries (default 300)"
    )
    p.add_argument(
        "--actuate-max-attempts", type=int, default=10, help="failed attempts of a phase before giving up (default 10)"
    )
    p.add_argument("--actuate-poll-s", type=float, default=0.5, help="how often due actions are looked for")


def add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` flags of the actuators and of the worker thread (``--actuate``)."""
    _actuator_flags(serve)
    serve.add_argument(
        "--actuate",
        action="store_true",
        help="also run the actuate worker in this process (else run `evalstop-server actuate` beside it)",
    )


def _settings(args: argparse.Namespace) -> Any:
    from .actuate import ActuateSettings

    try:
        return ActuateSettings(
            lease_s=args.actuate_lease_s,
            backoff_s=args.actuate_backoff_s,
            backoff_max_s=args.actuate_backoff_max_s,
            max_attempts=args.actuate_max_attempts,
            poll_s=args.actuate_poll_s,
        )
    except ValueError as exc:
        raise ValueError(f"--actuate-*: {exc}") from None


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """``create_app`` keyword arguments from the ``serve`` flags.

    Raises:
        ValueError: a refused flag (the message names it), or an actuator that cannot be built.
    """
    from .actuate import parse_actuators

    actuators = parse_actuators(args.actuator, args.actuator_option)
    if args.actuate and not actuators:
        raise ValueError("--actuate needs at least one --actuator")
    return {"actuators": actuators, "actuate": _settings(args) if args.actuate else None}


def add_parsers(sub: Any, tsub: Any, db_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``actuate`` to the commands ``sub`` and ``scope`` to the tenant commands ``tsub``."""
    act = sub.add_parser(
        "actuate",
        help="run the stop actions of stopped jobs on their schedulers (the durable outbox), until stopped",
    )
    db_arg(act)
    _actuator_flags(act)
    act.add_argument("--once", action="store_true", help="one round (claim, run, record), then exit")
    act.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    scope = tsub.add_parser(
        "scope",
        help="show, allow or remove what a tenant may name on each scheduler",
        description="Without owner flags: show the tenant's scope. With them: allow those owners (or, with "
        "--remove, remove them). --remove alone removes the whole scope. A tenant may register a scheduler "
        "handle only for a job its scope covers.",
    )
    scope.add_argument("name")
    for flag, dest, kind, _ in SCOPE_FLAGS:
        scope.add_argument(flag, dest=dest, action="append", default=[], help=f"an owner on {kind} (repeatable)")
    scope.add_argument("--remove", action="store_true", help="remove the given owners (all, when none is given)")
    db_arg(scope)
    scope.add_argument("--json", action="store_true", help="machine-readable output")


def scope_command(store: Any, args: argparse.Namespace, fail: Callable[[str], int]) -> int:
    """``tenant scope``: print the tenant's scope after the change (if any)."""
    tenant = next((t for t in store.list_tenants() if t.name == args.name), None)
    if tenant is None:
        return fail(f"no tenant named {args.name!r}")
    entries = []
    for flag, dest, kind, prefix in SCOPE_FLAGS:
        for owner in getattr(args, dest):
            if not owner.strip() or any(c.isspace() for c in owner) or len(owner) > 253:
                return fail(f"{flag} {owner!r}: give one word of at most 253 characters")
            entries.append((kind, prefix + owner))
    if args.remove:
        store.remove_tenant_scope(tenant.tenant_id, entries or None)
    elif entries:
        _warn_overlaps(store, tenant, [owner for kind, owner in entries if kind == "ray"])
        store.add_tenant_scope(tenant.tenant_id, entries)
    scope = store.tenant_scope(tenant.tenant_id, tenant.name)
    allowed = {kind: sorted(owners) for kind, owners in sorted(scope.allowed.items())}
    if args.json:
        print(json.dumps({"tenant": tenant.name, "allowed": allowed}))
    else:
        if not allowed:
            print(f"tenant {tenant.name!r} may name no scheduler job")
        for kind, owners in allowed.items():
            print(f"{kind:<12} {' '.join(owners)}")
    return 0


def _warn_overlaps(store: Any, tenant: Any, prefixes: list[str]) -> None:
    """Warn (stderr) about each new Ray prefix that overlaps another tenant's: both could name the same job."""
    from platform_sim.actuators.ray import overlaps

    if not prefixes:
        return
    for other in store.list_tenants():
        if other.tenant_id == tenant.tenant_id:
            continue
        for theirs in sorted(store.tenant_scope(other.tenant_id).owners("ray")):
            for mine in prefixes:
                if overlaps(mine, theirs):
                    print(
                        f"warning: --ray-prefix {mine!r} overlaps tenant {other.name!r}'s {theirs!r}: a job both "
                        "cover could be named by either",
                        file=sys.stderr,
                    )


def actuate(args: argparse.Namespace, open_store: Callable[[str], Any], fail: Callable[[str], int]) -> int:
    """``evalstop-server actuate``: run the worker on the database until SIGTERM or SIGINT (or one round)."""
    from .actuate import ActuationWorker, parse_actuators

    try:
        actuators = parse_actuators(args.actuator, args.actuator_option)
        settings = _settings(args)
    except ValueError as exc:
        return fail(str(exc))
    if not actuators:
        return fail("give at least one --actuator (slurm, kubernetes, ray)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        store = open_store(args.db)
    except Exception as exc:
        return fail(f"--db {args.db}: {' '.join(str(exc).split())}")
    worker = ActuationWorker(store, actuators, settings)
    try:
        if args.once:
            n = worker.run_once()
            print(json.dumps({"run": n}))
            return 0
        done = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            done.set()
            worker.stop(wait_s=0)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(f"evalstop-server actuate: acting on {', '.join(actuators)} from {args.db}", file=sys.stderr, flush=True)
        worker.run_forever()
        return 0
    finally:
        store.close()
