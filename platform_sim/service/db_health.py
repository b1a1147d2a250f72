"""Whether a SQLite database file can take writes now: the checks behind ``/readyz`` and the writer's refusal of a
damaged file (issue 33 finding 7).

Two failures a read check misses: another process holding the write lock (WAL readers still read, every write
waits and then fails), and the file overwritten under the server (the pages the server's connections cached, or
found in the WAL, still read and write as if nothing happened, so writes were acknowledged into a damaged database).
"""

from __future__ import annotations

import sqlite3

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""

LOCK_PROBE_TIMEOUT_S = 0.5
"""How long the readiness probe waits for the write lock: far longer than one of the writer's own transactions
(milliseconds, see docs/benchmarks.md), far shorter than a probe's timeout."""


def header_problem(path: str) -> str | None:
    """Why the file at ``path`` is not a SQLite database any more (its header is gone), or None if it still is.

    One 16-byte read, cheap enough for the writer to do at every transaction. It catches a file overwritten,
    truncated or removed; not damage inside a page (``PRAGMA integrity_check`` is for that, and far too slow here).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        return f"the database file cannot be read: {exc.strerror or exc}"
    if head != SQLITE_HEADER:
        return "the database file is damaged (its header is not SQLite's): writes are refused until it is restored"
    return None


def lock_problem(path: str, timeout_s: float = LOCK_PROBE_TIMEOUT_S) -> str | None:
    """Why a write could not start now (another process holds the write lock, a read-only file), or None.

    Takes the write lock on a connection of its own (``BEGIN IMMEDIATE``, waiting at most ``timeout_s``) and
    releases it at once, writing nothing. Blocking: call it off the event loop.
    """
    try:
        conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        return f"the database cannot be opened: {exc}"
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        return f"the database cannot be written now: {exc} (another process may hold its lock)"
    finally:
        conn.close()
