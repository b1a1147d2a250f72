"""The HTTP edge (issue 45): header-size limits, one client's connections cannot starve another, silent connections
are closed early, no query string in the access log, no CDN pages by default. Raw sockets against a real
``evalstop-server serve`` process on loopback; a second client connects from another loopback address (127.0.0.2)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, free_port, raw_connect, read_until_closed

from platform_sim.service.edge import MAX_HEADER_LINE, address_key

OTHER_CLIENT = "127.0.0.2"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("edge") / "service.db"
    add_tenant(db, "alice")
    server = Server(db, free_port()).start()
    try:
        yield server
    finally:
        server.stop()


def _answer(sock: socket.socket, limit_s: float = 10.0) -> bytes:
    """What the server sends until it closes the connection or ``limit_s`` passes."""
    return read_until_closed(sock, limit_s)[0]


def _request(srv: Server, headers: list[tuple[str, str]], path: str = "/healthz") -> bytes:
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    with raw_connect(srv) as sock:
        try:
            sock.sendall(head.encode())
        except (BrokenPipeError, ConnectionResetError):
            return b""  # closed while we sent: refused before the end
        return _answer(sock)


def _status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_a_64_kb_header_is_refused(srv: Server) -> None:
    answer = _request(srv, [("X-Big", "a" * 65536)])
    assert _status(answer) in (431, None), answer[:200]  # 431, or the connection closed without an answer
    assert b"200 OK" not in answer


@pytest.mark.parametrize(
    ("headers", "path", "status"),
    [
        ([("X-Line", "a" * (MAX_HEADER_LINE + 1))], "/healthz", 431),  # one line too long
        ([(f"X-{i}", "a" * 7000) for i in range(5)], "/healthz", 431),  # every line fits, all of them do not
        ([], "/healthz?" + "q" * MAX_HEADER_LINE, 414),  # the request line
        ([(f"X-{i}", "a" * 7000) for i in range(4)], "/healthz", 200),  # 28 kB in lines of 7 kB: within both
    ],
    ids=["line", "total", "request-line", "within"],
)
def test_header_limits_are_nginxs(srv: Server, headers: list[tuple[str, str]], path: str, status: int) -> None:
    answer = _request(srv, headers, path)
    assert _status(answer) == status, answer[:300]
    if status != 200:
        assert b"longer than" in answer or b"larger than" in answer


def test_a_header_that_never_ends_is_cut_off_before_it_is_read_whole(srv: Server) -> None:
    """Up to 4 MB of one header, sent in 16 kB pieces 10 ms apart without its end: the server answers 431 and closes
    once it has about the limit, and never reads the rest."""
    with raw_connect(srv) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent = 0
        try:
            while sent < 4 << 20 and not select.select([sock], [], [], 0)[0]:
                sock.sendall(b"a" * 16384)
                sent += 16384
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _answer(sock)
    assert sent < 4 << 20, "the server read 4 MB of one header"
    assert _status(answer) in (431, None), answer[:200]


def test_one_clients_connection_flood_does_not_starve_another(tmp_path: Path) -> None:
    """The issue's flood, scaled to a global cap of 200: one address opens 300 silent sockets at once. Beyond its
    share (100, the default) each is answered 503 and closed at once; another address is served throughout, and so
    is the first once it lets go. Without the per-address cap the 200 slots were all taken and everyone got 503."""
    db = tmp_path / "service.db"
    token = add_tenant(db, "alice")
    flags = ("--max-connections", "200", "--header-timeout", "30", "--keep-alive-timeout", "30")
    srv = Server(db, free_port(), extra_args=flags).start()
    flood: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for _ in range(300):
            flood.append(raw_connect(srv))
        opened_in = time.monotonic() - t0
        # Wait until the server has taken every one of them: the refused ones are answered and closed.
        refused: set[int] = set()
        deadline = time.monotonic() + 20
        while len(refused) < 200 and time.monotonic() < deadline:
            ready, _, _ = select.select([s for i, s in enumerate(flood) if i not in refused], [], [], 0.5)
            for sock in ready:
                refused.add(flood.index(sock))
                assert sock.recv(4096).startswith(b"HTTP/1.1 503"), "a refused connection got another answer"
        assert len(refused) == 200, f"{len(refused)} of the flood's connections refused (opened in {opened_in:.2f} s)"
        transport = httpx.HTTPTransport(local_address=OTHER_CLIENT)
        with httpx.Client(base_url=srv.url, transport=transport, timeout=10) as other:
            assert other.get("/healthz").status_code == 200
            assert other.get("/v1/jobs", headers=auth(token)).status_code == 200
        with httpx.Client(base_url=srv.url, timeout=10) as same:  # the flooding address: at its cap
            r = same.get("/healthz")
            assert r.status_code == 503 and r.json()["error"] == "too_many_connections", r.text
        for sock in flood:
            sock.close()
        flood = []
        deadline = time.monotonic() + 10
        while httpx.get(f"{srv.url}/healthz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the flooding address was not served again after it let go"
            time.sleep(0.1)
    finally:
        for sock in flood:
            sock.close()
        srv.stop()


def test_a_silent_connection_is_closed_at_the_idle_deadline_not_the_header_one(tmp_path: Path) -> None:
    """With a 30 s header deadline and a 1 s keep-alive timeout, a connection that sends nothing is closed within
    seconds; one that has begun its request keeps the header deadline."""
    db = tmp_path / "service.db"
    add_tenant(db, "alice")
    srv = Server(db, free_port(), extra_args=("--header-timeout", "30", "--keep-alive-timeout", "1")).start()
    try:
        with raw_connect(srv) as silent, raw_connect(srv) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\n")
            t0 = time.monotonic()
            _answer(silent, limit_s=15)
            assert time.monotonic() - t0 < 6, "a silent connection stayed open"
            time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))  # past the idle deadline
            slow.sendall(b"Host: x\r\n\r\n")
            slow.settimeout(10)
            assert slow.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()


def test_address_key_groups_ipv6_by_64() -> None:
    assert address_key("127.0.0.1") == "127.0.0.1"
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff") == "2001:db8::/64"
    assert address_key("2001:db8:0:1::1") != address_key("2001:db8::1")
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"


def test_the_access_log_keeps_no_query_string(tmp_path: Path) -> None:
    """A token put in a URL by mistake (``?token=...``) does not reach the log; the path does."""
    db = tmp_path / "service.db"
    token = add_tenant(db, "alice")
    srv = Server(db, free_port(), extra_args=("--access-log", "--log-level", "info")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            c.get("/v1/jobs", params={"token": token})
            c.get("/healthz", params={"probe": "visible-path-marker"})
    finally:
        srv.stop()
    assert srv.log is not None
    log = srv.log.read_text()
    assert '"GET /v1/jobs?... HTTP/1.1" 422' in log, log[-2000:]
    assert token not in log and "visible-path-marker" not in log


def test_the_cdn_docs_pages_are_off_unless_asked_for(tmp_path: Path) -> None:
    db = tmp_path / "service.db"
    add_tenant(db, "alice")
    for flags, status in (((), 404), (("--api-docs",), 200)):
        srv = Server(db, free_port(), extra_args=flags).start()
        try:
            with httpx.Client(base_url=srv.url, timeout=10) as c:
                assert [c.get(p).status_code for p in ("/docs", "/redoc")] == [status, status], flags
                assert c.get("/openapi.json").status_code == 200
        finally:
            srv.stop()
