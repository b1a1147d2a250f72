"""Slow and idle clients cannot hold the server's connections (issue 33, finding 3): header, body and keep-alive
deadlines and a cap on connections. Raw sockets against a real ``evalstop-server serve`` process on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, free_port, raw_connect, read_until_closed

DEADLINE = 1.0
MARGIN = 4.0  # generous: the machine may be loaded; without deadlines the connection stays open for good


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("timeouts") / "service.db"
    add_tenant(db, "alice")
    flags = ("--header-timeout", "1", "--body-timeout", "1", "--keep-alive-timeout", "1")
    server = Server(db, free_port(), extra_args=flags).start()
    try:
        yield server
    finally:
        server.stop()


def _until_closed(sock: socket.socket, trickle: bytes = b"") -> tuple[bytes, float]:
    return read_until_closed(sock, DEADLINE + MARGIN + 5, trickle)


def _closed_in_time(data: bytes, took: float, status: bytes | None) -> None:
    assert took < DEADLINE + MARGIN, f"connection still open after {took:.1f} s"
    if status is not None:
        assert data.startswith(b"HTTP/1.1 " + status), data[:200]


def test_a_connection_that_sends_nothing_is_closed(srv: Server) -> None:
    with raw_connect(srv) as sock:
        _closed_in_time(*_until_closed(sock), b"408")


def test_slow_headers_are_cut_off(srv: Server) -> None:
    with raw_connect(srv) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        _closed_in_time(*_until_closed(sock, trickle=b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 200), b"408")


@pytest.mark.parametrize("trickle", [b"", b"x" * 200], ids=["stalled", "slow"])
def test_a_body_shorter_than_its_length_is_cut_off(srv: Server, trickle: bytes) -> None:
    """``Content-Length: 100`` with 2 bytes (then nothing, or a byte at a time) waited forever."""
    with raw_connect(srv) as sock:
        head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 300\r\n\r\n"
        sock.sendall(head + b"{}")
        _closed_in_time(*_until_closed(sock, trickle=trickle), b"408")


def test_an_idle_keep_alive_connection_is_closed(srv: Server) -> None:
    with raw_connect(srv) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data, took = _until_closed(sock)
        assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1") == 1, data[:200]
        _closed_in_time(data, took, None)


def test_requests_in_time_are_served(srv: Server) -> None:
    """The deadlines do not touch a normal client: several requests on one kept-alive connection."""
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        assert [c.get("/healthz").status_code for _ in range(5)] == [200] * 5


def test_connections_beyond_the_cap_get_503(tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    add_tenant(db, "alice")
    server = Server(db, free_port(), extra_args=("--max-connections", "3")).start()
    held = []
    try:
        held = [raw_connect(server) for _ in range(3)]
        deadline = time.monotonic() + 10
        while httpx.get(f"{server.url}/healthz", timeout=10).status_code != 503:  # once it has accepted all three
            assert time.monotonic() < deadline, "a fourth connection was served"
            time.sleep(0.1)
        for sock in held:
            sock.close()
        held = []
        deadline = time.monotonic() + 10
        while httpx.get(f"{server.url}/healthz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the server did not serve again after the connections closed"
            time.sleep(0.1)
    finally:
        for sock in held:
            sock.close()
        server.stop()
