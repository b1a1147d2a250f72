"""The dashboard's sign-in sessions, held server-side.

A browser signs in once with its tenant token (``POST /login``); it then holds only a random session id in an
HttpOnly, SameSite=Strict cookie, never the token. The server keeps, per session, the token (so that every page is
authenticated exactly like an API request: a revoked token ends its sessions at the next page), its expiry, and a
per-session form token that the sign-out form must send back (CSRF, on top of SameSite=Strict).

Sessions live in the memory of the server process: a restart signs everyone out, and with several replicas a browser
must keep talking to the replica it signed in on (or sign in again).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

SESSION_TTL_S = 8 * 3600.0
"""How long a session lasts after sign-in (a working day); then the browser signs in again."""
MAX_SESSIONS = 10_000
"""Most live sessions; beyond it the one closest to expiry is dropped (a flood of sign-ins cannot grow memory)."""


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
    """

    token: str
    csrf: str
    expires_at: float

    def form_token_ok(self, sent: str | None) -> bool:
        """Whether ``sent`` is this session's form token (compared in constant time)."""
        return sent is not None and hmac.compare_digest(sent.encode("utf-8"), self.csrf.encode("utf-8"))


class SessionStore:
    """The live sessions of one app (thread-safe: pages may run on worker threads).

    Args:
        ttl_s: Session lifetime in seconds.
        max_sessions: Most live sessions kept.
    """

    def __init__(self, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS) -> None:
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError(f"ttl_s must be > 0 and max_sessions >= 1, got {ttl_s} and {max_sessions}")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, token: str) -> tuple[str, Session]:
        """A new session for ``token``: its id (the cookie's value, 256 random bits) and the session."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), time.monotonic() + self.ttl_s)
        with self._lock:
            self._drop_expired()
            if len(self._sessions) >= self.max_sessions:
                del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].expires_at)]
            self._sessions[_key(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this cookie value, or None (none, unknown or expired)."""
        if not session_id:
            return None
        key = _key(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.expires_at <= time.monotonic():
                del self._sessions[key]
                return None
            return session

    def end(self, session_id: str | None) -> None:
        """End the session of this cookie value (nothing if there is none)."""
        if session_id:
            with self._lock:
                self._sessions.pop(_key(session_id), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]
