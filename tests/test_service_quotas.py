"""Per-tenant job quotas (429), and token rotation and restore through the CLI (issue 33 finding 8). Real server
process on loopback with a real SQLite file; the CLI runs as its own process on the same file."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port, postgres_database


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    db = tmp_path / "service.db"
    add_tenant(db, "warm")
    srv = Server(db, free_port(), extra_args=("--max-jobs-per-tenant", "3", "--max-running-jobs-per-tenant", "2"))
    srv.start()
    try:
        yield srv, db
    finally:
        srv.stop()


def _register(c: httpx.Client, job: str) -> httpx.Response:
    return c.post("/v1/jobs", json={"job_id": job, "job_type": "rlhf"})


def test_registrations_beyond_a_quota_are_429_with_the_reason(served: tuple[Server, Path]) -> None:
    srv, db = served
    alice, bob = add_tenant(db, "alice"), add_tenant(db, "bob")
    with httpx.Client(base_url=srv.url, headers=auth(alice), timeout=20) as c:
        assert [_register(c, j).status_code for j in ("a1", "a2")] == [201, 201]
        refused = _register(c, "a3")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"] == "quota_exceeded"
        assert "2 running jobs" in refused.json()["message"] and "--max-running-jobs-per-tenant" in refused.text
        assert _register(c, "a1").status_code == 200  # an idempotent re-registration is never refused
        assert c.post("/v1/jobs/a1/finish", json={"reason": "completed"}).status_code == 200
        assert _register(c, "a3").status_code == 201
        assert c.post("/v1/jobs/a2/finish", json={}).status_code == 200
        refused = _register(c, "a4")  # 1 running, but 3 jobs in all
        assert refused.status_code == 429 and "--max-jobs-per-tenant" in refused.json()["message"]
        assert c.get("/v1/jobs/a4").status_code == 404
        assert len(c.get("/v1/jobs").json()["jobs"]) == 3
    with httpx.Client(base_url=srv.url, headers=auth(bob), timeout=20) as c:  # another tenant has its own quota
        assert _register(c, "b1").status_code == 201


def _status_soon(c: httpx.Client, token: str, want: int) -> int:
    """The status of GET /v1/jobs with ``token`` once it is ``want``, or the last one after 10 s (a server remembers
    a valid token for its token cache's TTL, 1 s)."""
    deadline = time.monotonic() + 10
    while True:
        got = c.get("/v1/jobs", headers=auth(token)).status_code
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_rotate_gives_a_new_token_and_the_old_one_stops_working(served: tuple[Server, Path]) -> None:
    srv, db = served
    old = add_tenant(db, "carol")
    with httpx.Client(base_url=srv.url, timeout=20) as c:
        assert c.post("/v1/jobs", json={"job_id": "c1", "job_type": "rlhf"}, headers=auth(old)).status_code == 201
        new = cli("tenant", "rotate", "carol", "--db", str(db)).stdout.strip().splitlines()[-1]
        assert new != old
        assert c.get("/v1/jobs/c1", headers=auth(new)).status_code == 200  # the same tenant: its jobs
        assert _status_soon(c, old, 401) == 401
        assert c.get("/v1/jobs/c1", headers=auth(new)).status_code == 200
        unknown = cli("tenant", "rotate", "nobody", "--db", str(db), check=False)
        assert unknown.returncode == 2 and "no tenant named 'nobody'" in unknown.stderr


def test_a_revoked_tenant_is_restored_with_a_new_token_and_its_jobs(served: tuple[Server, Path]) -> None:
    srv, db = served
    old = add_tenant(db, "dave")
    with httpx.Client(base_url=srv.url, timeout=20) as c:
        assert c.post("/v1/jobs", json={"job_id": "d1", "job_type": "rlhf"}, headers=auth(old)).status_code == 201
        cli("tenant", "revoke", "dave", "--db", str(db))
        assert _status_soon(c, old, 401) == 401
        rotate = cli("tenant", "rotate", "dave", "--db", str(db), check=False)
        assert rotate.returncode == 2 and "tenant restore dave" in rotate.stderr
        new = cli("tenant", "restore", "dave", "--db", str(db)).stdout.strip().splitlines()[-1]
        job = c.get("/v1/jobs/d1", headers=auth(new))
        assert job.status_code == 200 and job.json()["job_id"] == "d1"
        assert c.get("/v1/jobs", headers=auth(old)).status_code == 401  # the revoked token stays dead
        listed = cli("tenant", "list", "--db", str(db), "--json").stdout
        assert '"name": "dave"' in listed and '"revoked_at": null' in listed.split('"dave"')[1].split("}")[0]


def _rotate_and_restore_through_the_cli(db: str) -> None:
    """``tenant add``, ``rotate``, ``revoke``, ``restore`` on ``db`` (a file or a URL), checked through the store."""
    from platform_sim.service.cli import _open_store

    first = cli("tenant", "add", "erin", "--db", db).stdout.strip().splitlines()[-1]
    second = cli("tenant", "rotate", "erin", "--db", db).stdout.strip().splitlines()[-1]
    cli("tenant", "revoke", "erin", "--db", db)
    refused = cli("tenant", "rotate", "erin", "--db", db, check=False)
    assert refused.returncode == 2 and "tenant restore erin" in refused.stderr
    third = cli("tenant", "restore", "erin", "--db", db, "--json").stdout.strip().splitlines()[-1]
    store = _open_store(db)
    try:
        assert store.tenant_for_token(first) is None and store.tenant_for_token(second) is None
        found = store.tenant_for_token(third)
        assert found is not None and found.name == "erin" and found.revoked_at is None
    finally:
        store.close()


def test_rotate_and_restore_on_sqlite(tmp_path: Path) -> None:
    _rotate_and_restore_through_the_cli(str(tmp_path / "service.db"))


@pytest.mark.postgres
def test_rotate_and_restore_on_postgresql() -> None:
    with postgres_database("evalstop_rotate") as url:
        _rotate_and_restore_through_the_cli(url)
