"""Replacing a tenant's token: ``evalstop-server tenant rotate NAME`` and ``tenant restore NAME``.

A mixin of both stores (like :class:`~platform_sim.service.store_queries.SharedQueries`): the statements are the same
on SQLite and PostgreSQL, run inside one of the store's write transactions (:meth:`_on_writer`). The old token stops
working at the commit; a server that remembered it (``ServiceContext.token_cache_ttl``, 1 s by default) refuses it
once that time has passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .store import Tenant, TenantNotFound, TenantRevoked, hash_token, new_token


def _replace_token(conn: Any, p: str, name: str, digest: str, restore: bool) -> Tenant:
    """Set tenant ``name``'s token hash to ``digest`` (and, with ``restore``, clear its revocation) on ``conn``.

    Raises:
        TenantNotFound: No tenant of that name.
        TenantRevoked: Rotating (not restoring) a revoked tenant.
    """
    row = conn.execute(f"SELECT tenant_id, created_at, revoked_at FROM tenants WHERE name = {p}", (name,)).fetchone()
    if row is None:
        raise TenantNotFound(f"no tenant named {name!r}")
    if row[2] is not None and not restore:
        raise TenantRevoked(f"tenant {name!r} is revoked: 'evalstop-server tenant restore {name}' gives it a new token")
    conn.execute(f"UPDATE tenants SET token_hash = {p}, revoked_at = NULL WHERE tenant_id = {p}", (digest, row[0]))
    return Tenant(int(row[0]), name, float(row[1]), None)


class TenantTokens:
    """:meth:`rotate_tenant` and :meth:`restore_tenant` for a store providing :meth:`_on_writer` and :attr:`_ph`."""

    _ph: str = "?"

    def _on_writer(self, fn: Callable[[Any], Any], webhooks_changed: bool = False) -> Any:
        raise NotImplementedError

    def rotate_tenant(self, name: str) -> tuple[Tenant, str]:
        token = new_token()  # made before the transaction, so that a retried transaction stores the same hash
        return self._on_writer(lambda c: _replace_token(c, self._ph, name, hash_token(token), False)), token

    def restore_tenant(self, name: str) -> tuple[Tenant, str]:
        token = new_token()
        return self._on_writer(lambda c: _replace_token(c, self._ph, name, hash_token(token), True)), token
