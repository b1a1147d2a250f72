"""Following a file while it is written: complete lines only, across rotation and truncation, without busy waiting.

:class:`LineTail` keeps the file open and remembers its inode and read offset. A half-written last line stays in a
buffer until its newline arrives. When the path names another file (the log rotated: renamed away and a new one
created) the rest of the old file is read first, then the new one from its start; when the file is shorter than what
was read (truncated in place, or rewritten by a restarted writer that opens it with ``"w"``) it is read again from
its start. :class:`Backoff` spaces the polls: short while data flows, doubling up to a ceiling while it does not, so an
idle watcher costs a ``stat`` call per second.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20  # bytes per read call: large enough that a burst of lines costs few system calls
_HEAD = 64  # bytes compared at each poll to notice a file rewritten from its start


@dataclass
class Backoff:
    """Poll interval: ``fast`` after a poll that found data, doubled per idle poll up to ``slow``.

    Args:
        fast: Seconds between polls while new data arrives.
        slow: The longest wait between two polls of an idle log (bounds the delay from a line to its decision).
    """

    fast: float = 0.05
    slow: float = 1.0
    current: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.fast <= self.slow:
            raise ValueError(f"need 0 < fast <= slow, got fast={self.fast} slow={self.slow}")
        self.current = self.fast

    def next(self, found: bool) -> float:
        """The wait before the next poll, given whether the last poll found data."""
        self.current = self.fast if found else min(self.slow, self.current * 2)
        return self.current


class LineTail:
    """Complete lines appended to one file, read as they arrive.

    Args:
        path: The file; it may not exist yet (then :meth:`read_lines` returns nothing until it does).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._head = b""  # the file's first bytes as read: a rewrite that outgrew the offset changes them
        #: How many times the file was found rotated or truncated (the watcher says so in its log).
        self.restarts = 0

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        self._fd, self._inode, self._offset, self._partial = fd, (st.st_dev, st.st_ino), 0, b""
        self._head = b""
        return True

    def _drain(self) -> list[bytes]:
        """Read what the open file holds past the offset; return its complete lines, keep the rest."""
        assert self._fd is not None
        chunks = []
        while True:
            data = os.pread(self._fd, _CHUNK, self._offset)
            if not data:
                break
            if len(self._head) < _HEAD and self._offset < _HEAD:
                self._head = (self._head + data)[:_HEAD]
            self._offset += len(data)
            chunks.append(data)
        if not chunks:
            return []
        data = self._partial + b"".join(chunks)
        *lines, self._partial = data.split(b"\n")
        return lines

    def read_lines(self) -> list[bytes]:
        """The complete lines written since the last call (without their newlines), in order."""
        if self._fd is None and not self._open():
            return []
        assert self._fd is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # renamed away, the new file not created yet: keep reading the old one
            return self._drain()
        if (st.st_dev, st.st_ino) != self._inode:
            logger.info("evalstop watch: %s was replaced (rotated); reading the new file from its start", self.path)
            lines = self._drain()  # the old file's last lines first
            self.close()
            self.restarts += 1
            return lines + (self._drain() if self._open() else [])
        if st.st_size < self._offset or os.pread(self._fd, len(self._head), 0) != self._head:
            logger.info("evalstop watch: %s was truncated or rewritten; reading it again from its start", self.path)
            self._offset, self._partial, self._head = 0, b"", b""
            self.restarts += 1
        return self._drain()

    def rest(self) -> bytes:
        """The unterminated last line, if any (read it only when the writer is known to be done)."""
        return self._partial

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
