"""Dashboard sign-in cannot be used to sign another tenant out or to flood the server (issue 45): sessions are capped
per tenant (a new one ends that tenant's oldest), and sign-ins are rate-limited per client address and per tenant.
A real server process on loopback; browsers connect from several loopback addresses (127.0.0.x)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_support import browser, sign_in, sign_in_form
from service_support import Server, add_tenant, free_port

from platform_sim.service.dashboard.sessions import TENANT_SIGN_IN_FACTOR, SessionStore

PER_MINUTE = 3
SESSIONS_PER_TENANT = 3


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    db = tmp_path_factory.mktemp("sign-in") / "service.db"
    tokens = {name: add_tenant(db, name) for name in ("alice", "bob", "carol", "dave")}
    flags = ("--sign-ins-per-minute", str(PER_MINUTE), "--max-sessions-per-tenant", str(SESSIONS_PER_TENANT))
    srv = Server(db, free_port(), extra_args=flags).start()
    try:
        yield srv, tokens
    finally:
        srv.stop()


def _live(client: httpx.Client) -> bool:
    r = client.get("/")
    assert r.status_code in (200, 303), r.text
    return r.status_code == 200


def test_a_tenants_sign_in_flood_ends_only_its_own_oldest_sessions(env: tuple[Server, dict[str, str]]) -> None:
    """bob signs in; alice signs in 6 times (each from its own address, within every rate): alice keeps her newest 3
    sessions, her 3 oldest are signed out, and bob is still signed in."""
    srv, tokens = env
    with sign_in(srv.url, tokens["bob"], "127.0.0.9") as bob:
        alices = []
        try:
            for i in range(2 * SESSIONS_PER_TENANT):
                client = browser(srv.url, f"127.0.0.{10 + i}")
                alices.append(client)
                assert sign_in_form(client, tokens["alice"]).status_code == 303
            assert [_live(c) for c in alices] == [False] * SESSIONS_PER_TENANT + [True] * SESSIONS_PER_TENANT
            assert _live(bob)
        finally:
            for client in alices:
                client.close()


def test_sign_ins_are_limited_per_address(env: tuple[Server, dict[str, str]]) -> None:
    """3 a minute from one address: the 4th is 429 with Retry-After (a wrong token counts too); another address
    signs in."""
    srv, tokens = env
    with browser(srv.url, "127.0.0.30") as client:
        assert sign_in_form(client, "not-a-token").status_code == 401
        answers = [sign_in_form(client, tokens["carol"]).status_code for _ in range(PER_MINUTE)]
        assert answers == [303] * (PER_MINUTE - 1) + [429]
        r = sign_in_form(client, tokens["carol"])
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 and "from this address" in r.text
    with browser(srv.url, "127.0.0.31") as other:
        assert sign_in_form(other, tokens["carol"]).status_code == 303


def test_sign_ins_are_limited_per_tenant(env: tuple[Server, dict[str, str]]) -> None:
    """One tenant from many addresses (each within its own rate) reaches the tenant's allowance (6 times an
    address's) and gets 429; another tenant still signs in."""
    srv, tokens = env
    allowance = PER_MINUTE * TENANT_SIGN_IN_FACTOR
    statuses: list[int] = []
    for i in range(allowance + 5):
        with browser(srv.url, f"127.0.1.{i + 1}") as client:
            r = sign_in_form(client, tokens["dave"])
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert "for this tenant" in r.text and "Retry-After" in r.headers
                break
    # The allowance refills by a token every 60 / allowance s meanwhile: one or two more may pass on a slow machine.
    assert statuses[-1] == 429 and allowance <= len(statuses) - 1 <= allowance + 3, statuses
    with browser(srv.url, "127.0.2.1") as other:
        assert sign_in_form(other, tokens["bob"]).status_code == 303


def test_the_session_table_caps_each_tenant_and_takes_from_the_largest() -> None:
    store = SessionStore(max_sessions=4, max_per_tenant=2)
    a = [store.create(f"a{i}", 1)[0] for i in range(3)]
    b = store.create("b", 2)[0]
    assert [store.get(i) is not None for i in a] == [False, True, True] and store.get(b) is not None
    c = [store.create(f"c{i}", 3)[0] for i in range(2)]  # the table is full: the largest tenant (1) gives way
    assert len(store) == 4 and store.get(b) is not None and all(store.get(i) is not None for i in c)
    assert sum(store.get(i) is not None for i in a) == 1
    with pytest.raises(ValueError):
        SessionStore(max_per_tenant=0)


def test_bad_sign_in_flags_are_one_line_errors(tmp_path: Path) -> None:
    from service_support import cli

    for flag, value in (("--sign-ins-per-minute", "0"), ("--max-sessions-per-tenant", "0")):
        r = cli("serve", "--db", str(tmp_path / "x.db"), "--port", str(free_port()), flag, value, check=False)
        assert r.returncode == 2 and flag in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
