"""/readyz says whether writes can succeed, and writes are refused when the database file is damaged (issue 33
finding 7). Real server process on loopback with a real SQLite file; another real process holds the lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from service_support import auth, tenant_server

REPORT = {"job_id": "r1", "job_type": "rlhf", "step": 10, "eval_score": 0.5}
HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


def test_readyz_is_503_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    with tenant_server(tmp_path) as (srv, token), httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as c:
        assert c.post("/v1/jobs", json={"job_id": "r1", "job_type": "rlhf"}).status_code == 201
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(srv.db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            ready = c.get("/readyz")
            assert ready.status_code == 503, ready.text  # was 200: reads still worked
            assert "cannot be written now" in ready.json()["message"]
            assert c.post("/v1/jobs/r1/evals", json=REPORT).status_code == 503  # and writes agree
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=10)
        assert c.get("/readyz").status_code == 200
        assert c.post("/v1/jobs/r1/evals", json=REPORT).status_code == 200


def test_a_database_overwritten_with_garbage_refuses_writes_and_readiness(tmp_path: Path) -> None:
    with tenant_server(tmp_path) as (srv, token), httpx.Client(base_url=srv.url, headers=auth(token), timeout=30) as c:
        assert c.post("/v1/jobs", json={"job_id": "r1", "job_type": "rlhf"}).status_code == 201
        size = srv.db.stat().st_size
        with open(srv.db, "r+b") as f:  # overwritten in place under the running server
            f.write(os.urandom(size))
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "database" in ready.json()["message"]
        for path, body in (("/v1/jobs", {"job_id": "r2", "job_type": "rlhf"}), ("/v1/jobs/r1/evals", REPORT)):
            resp = c.post(path, json=body)
            assert resp.status_code == 503, resp.text  # registrations got 201 into the damaged file
            assert "damaged" in resp.json()["message"]
        assert c.post("/v1/jobs/r1/finish", json={}).status_code == 503
