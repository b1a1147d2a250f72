"""Helpers for the service tests: a real ``evalstop-server`` process on a free loopback port with a real SQLite file."""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from platform_sim.core import Report

SERVER_CMD = [sys.executable, "-m", "platform_sim.service.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``evalstop-server ARGS`` (through the module, so the test needs no installed script on PATH)."""
    proc = subprocess.run([*SERVER_CMD, *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"evalstop-server {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def add_tenant(db: Path, name: str, via_cli: bool = False) -> str:
    """A new tenant's token: through the store (fast), or through ``evalstop-server tenant add NAME``, whose last
    output line is the token."""
    if via_cli:
        return cli("tenant", "add", name, "--db", str(db)).stdout.strip().splitlines()[-1]
    from platform_sim.service.store_sqlite import SQLiteStore

    store = SQLiteStore(db)
    try:
        return store.add_tenant(name)[1]
    finally:
        store.close()


@dataclass
class Server:
    """A running ``evalstop-server serve`` subprocess."""

    db: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    cmd: tuple[str, ...] = tuple(SERVER_CMD)
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        self.log = self.db.with_suffix(f".{self.port}.log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.cmd,
                    "serve",
                    "--db",
                    str(self.db),
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"server did not become ready in {timeout} s: {self.log.read_text()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def raw_connect(srv: Server, source: str = "127.0.0.1") -> socket.socket:
    """A plain TCP connection to the server from the loopback address ``source``, for tests that speak raw HTTP."""
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", srv.port))
    return sock


def read_until_closed(sock: socket.socket, limit_s: float, trickle: bytes = b"") -> tuple[bytes, float]:
    """What the server sent until it closed the connection (a reset reads as closed) or ``limit_s`` passed, and the
    seconds that took; ``trickle`` is sent a byte every 0.2 s meanwhile (a slow client)."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    data = b""
    while time.monotonic() - t0 < limit_s:
        if trickle:
            try:
                sock.sendall(trickle[:1])
            except OSError:
                break
            trickle = trickle[1:]
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - t0


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def tenant_server(folder: Path, tenant: str = "acme") -> Iterator[tuple[Server, str]]:
    """A started server on a fresh SQLite file in ``folder`` with one tenant; yields it and the tenant's token."""
    db = folder / "service.db"
    token = add_tenant(db, tenant)
    srv = Server(db, free_port()).start()
    try:
        yield srv, token
    finally:
        srv.stop()


def overoptimization_reports(
    job_id: str, peak_eval: int, n_evals: int = 20, examples: int = 24, seed: int = 0
) -> list[Report]:
    """Reports of an RLHF job whose gold score follows Gao et al.'s form (peak at ``peak_eval``), every 10 steps, with
    ``examples`` noisy per-example scores each (spread 0.2) and their mean as the eval score."""
    rng = random.Random(seed)
    out = []
    for i in range(n_evals):
        x = ((i + 1) / peak_eval) ** 2
        mean = 0.1 + 0.6 * x * (1.0 - math.log(x))
        scores = [mean + rng.gauss(0.0, 0.2) for _ in range(examples)]
        out.append(Report(job_id, "rlhf", 10 * (i + 1), sum(scores) / examples, eval_scores=tuple(scores)))
    return out


@contextmanager
def postgres_database(prefix: str = "evalstop") -> Iterator[str]:
    """The URL of a fresh database on the test PostgreSQL server (``EVALSTOP_PG_URL``), dropped afterwards; skips the
    test when there is no server or no driver."""
    import pytest

    psycopg = pytest.importorskip("psycopg")
    base = os.environ.get("EVALSTOP_PG_URL")
    if not base:
        pytest.skip("no PostgreSQL server (set EVALSTOP_PG_URL or run tests/pg.sh)")
    name = f"{prefix}_{os.getpid()}_{random.randrange(1 << 30)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: ``evalstop-server`` with the report fast path off (``create_app(fast_path=False)``): every report through the FastAPI
#: route, to test the two ways in against each other on real servers.
SERVER_WITHOUT_FAST_PATH_CMD = (
    sys.executable,
    "-c",
    "import functools, sys; import platform_sim.service.app as app; "
    "app.create_app = functools.partial(app.create_app, fast_path=False); "
    "from platform_sim.service.cli import main; sys.exit(main(sys.argv[1:]))",
)
