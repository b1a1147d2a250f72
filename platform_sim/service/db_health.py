"""Whether a SQLite database file can take writes now: the checks behind ``/readyz`` and the writer's refusal of a
damaged file (issue 33 finding 7).

Two failures a read check misses: another process holding the write lock (WAL readers still read, every write
waits and then fails), and the file overwritten under the server (the pages the server's connections cached, or
found in the WAL, still read and write as if nothing happened, so writes were acknowledged into a damaged database).
"""

from __future__ import annotations

import os
import sqlite3

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""

LOCK_PROBE_TIMEOUT_S = 0.5
"""How long the readiness probe waits for the write lock: far longer than one of the writer's own transactions
(milliseconds, see docs/benchmarks-service.md), far shorter than a probe's timeout."""


class HeaderWatch:
    """Tells whether a SQLite file is still a database: its 16-byte header, read through a descriptor held open.

    One ``pread``, cheap enough for the writer to do at every transaction. It catches a file overwritten in place,
    truncated, removed or replaced; not damage inside a page (``PRAGMA integrity_check`` is for that, far too slow).
    The descriptor is opened once and closed only with the store, after its connections: closing any descriptor of
    the file would drop every POSIX lock this process's SQLite connections hold on it, and another process could
    then checkpoint and delete the WAL under them (SQLite's own connections defer such closes; a plain ``open`` and
    ``close`` per check would not).

    Args:
        path: The database file (it must exist: open the store's schema first).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY)

    def problem(self) -> str | None:
        """Why the file is not (or no longer) a SQLite database, or None if it still is."""
        if self._fd is None:
            return "the store is closed"
        try:
            head = os.pread(self._fd, len(SQLITE_HEADER), 0)
            replaced = os.stat(self.path).st_ino != os.fstat(self._fd).st_ino
        except OSError as exc:
            return f"the database file cannot be read: {exc.strerror or exc}"
        if replaced:
            return "the database file was replaced under the server: writes are refused until it is restarted"
        if head != SQLITE_HEADER:
            return "the database file is damaged (its header is not SQLite's): writes are refused until it is restored"
        return None

    def close(self) -> None:
        """Close the descriptor; call it after the store's SQLite connections are closed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
