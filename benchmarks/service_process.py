"""What the service benchmarks share: a real ``evalstop-server serve`` process on loopback, tenants made through the
CLI, a free port and a percentile. One copy here, so that every benchmark starts and stops its server the same way.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVER_CLI = ["-m", "platform_sim.service.cli"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation); NaN when there are none."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def server_env(root: Path = ROOT) -> dict[str, str]:
    """The environment in which ``root``'s code (this checkout, or an older one to compare with) runs."""
    return {**os.environ, "PYTHONPATH": str(root)}


def server_cli(*args: str, db: Path, root: Path = ROOT) -> str:
    """Run ``evalstop-server ARGS --db DB`` of ``root``'s code; its stdout (raises if it fails)."""
    out = subprocess.run(
        [sys.executable, *SERVER_CLI, *args, "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
        env=server_env(root),
        cwd=root,
    )
    return out.stdout


def add_tenants(db: Path, names: tuple[str, ...], root: Path = ROOT) -> dict[str, str]:
    """Create the tenants in ``db`` through the CLI; their tokens (the last line of each ``tenant add``)."""
    return {name: server_cli("tenant", "add", name, db=db, root=root).strip().splitlines()[-1] for name in names}


class ServerProcess:
    """``evalstop-server serve`` of ``root``'s code on ``db`` with ``extra`` flags, ready once constructed.

    Args:
        db: The database (a SQLite file path or a postgresql:// URL).
        extra: More ``serve`` flags.
        root: The checkout whose code runs (this one by default).
        ready_s: Seconds to wait for ``/readyz`` to answer 200 before giving up (the process is then killed).
    """

    def __init__(self, db: Path | str, extra: list[str] | None = None, root: Path = ROOT, ready_s: float = 30.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            *SERVER_CLI,
            "serve",
            "--db",
            str(db),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            [*cmd, *(extra or [])],
            cwd=root,
            env=server_env(root),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(
            f"the server of {root} did not become ready on {self.url} (exit status {self.proc.returncode})"
        )

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), and wait for the process to end."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
