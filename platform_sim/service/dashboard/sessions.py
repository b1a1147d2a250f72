"""The dashboard's sign-in sessions, held server-side.

A browser signs in once with its tenant token (``POST /login``); it then holds only a random session id in an
HttpOnly, SameSite=Strict cookie, never the token. The server keeps, per session, the token (so that every page is
authenticated exactly like an API request: a revoked token ends its sessions at the next page), its expiry, and a
per-session form token that the sign-out form must send back (CSRF, on top of SameSite=Strict).

Sessions live in the memory of the server process: a restart signs everyone out, and with several replicas a browser
must keep talking to the replica it signed in on (or sign in again).

One tenant cannot sign another out: each tenant holds at most ``max_per_tenant`` sessions (a new one ends that
tenant's oldest), so a flood of sign-ins with one token only churns that token's own sessions; the whole table's cap
(``max_sessions``) takes from the tenant holding the most. :class:`SignInLimit` bounds how fast sign-ins come, per
client address and per tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from ..ratelimit import TenantRateLimit

SESSION_TTL_S = 8 * 3600.0
"""How long a session lasts after sign-in (a working day); then the browser signs in again."""
MAX_SESSIONS = 10_000
"""Most live sessions; beyond it the tenant holding the most loses its oldest (a flood cannot grow memory)."""
MAX_SESSIONS_PER_TENANT = 100
"""Most live sessions of one tenant (its people's browsers); a new one ends the tenant's oldest."""
SIGN_INS_PER_MINUTE = 10.0
"""Sign-ins one client address may make a minute (and at once); a tenant may make :data:`TENANT_SIGN_IN_FACTOR`
times as many from all its addresses together."""
TENANT_SIGN_IN_FACTOR = 6
MAX_ADDRESSES = 10_000
"""Client addresses whose sign-ins are remembered; beyond it those with a full allowance again are forgotten."""


def _key(session_id: str) -> str:
    # Sessions are looked up by a hash of the cookie's value, so that a dump of this table holds no usable cookie.
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    """One signed-in browser.

    Args:
        token: The tenant token it signed in with (kept server-side only).
        csrf: The form token that state-changing forms of this session must send back.
        expires_at: ``time.monotonic()`` after which the session is over.
        tenant_id: The tenant the token belonged to at sign-in.
    """

    token: str
    csrf: str
    expires_at: float
    tenant_id: int = 0

    def form_token_ok(self, sent: str | None) -> bool:
        """Whether ``sent`` is this session's form token (compared in constant time)."""
        return sent is not None and hmac.compare_digest(sent.encode("utf-8"), self.csrf.encode("utf-8"))


class SessionStore:
    """The live sessions of one app (thread-safe: pages may run on worker threads).

    Args:
        ttl_s: Session lifetime in seconds.
        max_sessions: Most live sessions kept.
        max_per_tenant: Most live sessions of one tenant.
    """

    def __init__(
        self,
        ttl_s: float = SESSION_TTL_S,
        max_sessions: int = MAX_SESSIONS,
        max_per_tenant: int = MAX_SESSIONS_PER_TENANT,
    ) -> None:
        if ttl_s <= 0 or max_sessions < 1 or max_per_tenant < 1:
            raise ValueError(
                f"ttl_s must be > 0, max_sessions and max_per_tenant >= 1, got {ttl_s}, {max_sessions}, {max_per_tenant}"
            )
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_per_tenant = max_per_tenant
        self._sessions: dict[str, Session] = {}
        self._by_tenant: dict[int, dict[str, None]] = {}  # each tenant's session keys, oldest first
        self._lock = threading.Lock()

    def create(self, token: str, tenant_id: int = 0) -> tuple[str, Session]:
        """A new session for ``token`` of ``tenant_id``: its id (the cookie's value, 256 random bits) and the
        session. Ends the tenant's oldest session when it holds :attr:`max_per_tenant`."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), time.monotonic() + self.ttl_s, tenant_id)
        with self._lock:
            mine = self._by_tenant.setdefault(tenant_id, {})
            if len(mine) >= self.max_per_tenant:
                self._remove(next(iter(mine)))
            if len(self._sessions) >= self.max_sessions:
                self._drop_expired()
            if len(self._sessions) >= self.max_sessions:
                largest = max(self._by_tenant.values(), key=len)
                self._remove(next(iter(largest)))
            key = _key(session_id)
            self._sessions[key] = session
            self._by_tenant.setdefault(tenant_id, {})[key] = None
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value, or None (none, unknown or expired)."""
        if not session_id:
            return None
        key = _key(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.expires_at <= time.monotonic():
                self._remove(key)
                return None
            return session

    def end(self, session_id: str | None) -> None:
        """End the session of this cookie value (nothing if there is none)."""
        if session_id:
            with self._lock:
                self._remove(_key(session_id))

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _remove(self, key: str) -> None:
        session = self._sessions.pop(key, None)
        if session is None:
            return
        mine = self._by_tenant.get(session.tenant_id)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._by_tenant[session.tenant_id]

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            self._remove(key)


@dataclass(frozen=True, slots=True)
class SignInSettings:
    """The dashboard's sign-in bounds (``evalstop-server serve --max-sessions-per-tenant``, ``--sign-ins-per-minute``).

    Args:
        max_sessions_per_tenant: Most live sessions of one tenant.
        sign_ins_per_minute: Sign-ins a minute from one client address (see :class:`SignInLimit`).
    """

    max_sessions_per_tenant: int = MAX_SESSIONS_PER_TENANT
    sign_ins_per_minute: float = SIGN_INS_PER_MINUTE


class SignInLimit:
    """How fast sign-ins may come: ``per_minute`` from one client address (bursts of as many), and
    :data:`TENANT_SIGN_IN_FACTOR` times that for one tenant from all addresses together. Token buckets
    (:class:`~platform_sim.service.ratelimit.TenantRateLimit`); thread-safe.

    Args:
        per_minute: Sign-ins a minute from one address (> 0).
    """

    def __init__(self, per_minute: float = SIGN_INS_PER_MINUTE) -> None:
        if not 0 < per_minute < float("inf"):
            raise ValueError(f"per_minute must be a number > 0, got {per_minute}")
        self.per_minute = per_minute
        self._by_address = TenantRateLimit(per_minute / 60.0, max(1.0, per_minute))
        tenant_rate = per_minute * TENANT_SIGN_IN_FACTOR
        self._by_tenant = TenantRateLimit(tenant_rate / 60.0, max(1.0, tenant_rate))
        self._lock = threading.Lock()

    def address_wait(self, address: str) -> float:
        """Take one sign-in from ``address``'s allowance: 0.0, or the seconds until it has one (refused)."""
        with self._lock:
            if len(self._by_address) >= MAX_ADDRESSES:
                self._by_address.prune()
                if len(self._by_address) >= MAX_ADDRESSES:  # that many addresses at once: start over (the
                    self._by_address = TenantRateLimit(self._by_address.rate, self._by_address.burst)  # tenant's holds)
            return self._by_address.retry_after(address)

    def tenant_wait(self, tenant_id: int) -> float:
        """Take one sign-in from the tenant's allowance: 0.0, or the seconds until it has one (refused)."""
        with self._lock:
            return self._by_tenant.retry_after(tenant_id)
