"""Webhooks end to end: a real ``evalstop-server`` process on loopback, a real SQLite file, and a receiver (a small
``http.server`` on 127.0.0.1 in a thread) that checks every signature the way ``docs/service.md`` tells receivers to.

What is pinned: the signed stop event arrives; it still arrives when the server is killed with ``kill -9`` between
the stop decision and the delivery (receiver down at the stop, or the POST in flight); a receiver that is down for a
while gets every event once the retries run; a hanging endpoint never holds up reports; a delivery is given up
after ``--webhook-max-attempts``; the CLI adds, lists and removes webhooks.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import socket
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import Server, add_tenant, auth, cli, free_port, postgres_database

FAST = ("--webhook-backoff-s", "0.2", "--webhook-backoff-max-s", "0.4", "--webhook-poll-s", "0.05")
"""Serve flags for the tests: retries every 0.2-0.4 s, the outbox looked at every 50 ms."""


class Receiver:
    """A webhook receiver on 127.0.0.1: verifies each request's signature and timestamp, and records the events.

    Args:
        secret: The webhook's secret (from ``webhook add``).
        port: The port to listen on (0: any).
        mode: ``ok`` (answer 204), ``fail`` (answer 500) or ``hang`` (never answer until closed).
    """

    def __init__(self, secret: str, port: int = 0, mode: str = "ok") -> None:
        self.secret, self.mode = secret, mode
        self.events: list[dict[str, Any]] = []
        self.bad: list[str] = []
        self.requests = 0
        self._release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests += 1
                if receiver.mode == "hang":
                    receiver._release.wait(30)
                    return
                receiver.check(dict(self.headers), body)
                self.send_response(204 if receiver.mode == "ok" else 500)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def check(self, headers: dict[str, str], body: bytes) -> None:
        """The receiver's side of the contract (as in docs/service.md): signature, then timestamp, then the event."""
        expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("X-EvalStop-Signature", ""), expected):
            self.bad.append("signature")
            return
        payload = json.loads(body)
        stamp = int(headers["X-EvalStop-Timestamp"])
        if stamp != payload["delivery"]["timestamp"] or abs(time.time() - stamp) > 300:
            self.bad.append("timestamp")
            return
        if headers.get("X-EvalStop-Event") != payload["event"]["type"]:
            self.bad.append("event header")
        if self.mode == "ok":
            self.events.append(payload["event"])

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def _wait(what: str, cond: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _add_webhook(db: Path, url: str, *extra: str) -> str:
    return cli("webhook", "add", url, "--tenant", "acme", "--db", str(db), *extra).stdout.strip().splitlines()[-1]


def _stop_job(c: httpx.Client, job: str, gpus: int | None = 4) -> dict[str, Any]:
    """Register ``job`` (k-decline, k=2) and report until the core stops it; the stopping decision."""
    body: dict[str, Any] = {"job_type": "rlhf", "job_id": job, "detector": {"name": "k-decline", "params": {"k": 2}}}
    if gpus:
        body |= {"gpus": gpus, "planned_steps": 1000}
    assert c.post("/v1/jobs", json=body).status_code == 201
    for step, score in ((10, 0.5), (20, 0.6), (30, 0.55), (40, 0.5)):
        d = c.post(f"/v1/jobs/{job}/evals", json={"job_id": job, "job_type": "rlhf", "step": step, "eval_score": score})
        assert d.status_code == 200, d.text
    assert d.json()["action"] == "stop"
    return d.json()


def _events(c: httpx.Client, kind: str | None = None) -> list[dict[str, Any]]:
    out, after = [], 0
    while True:
        page = c.get("/v1/events", params={"after": after, "limit": 1000}).json()
        out += page["events"]
        if not page["events"]:
            return [e for e in out if kind is None or e["type"] == kind]
        after = page["next_after"]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    db = tmp_path / "service.db"
    token = add_tenant(db, "acme")
    state: dict[str, Any] = {"db": db, "token": token, "servers": [], "receivers": []}
    yield state
    for srv in state["servers"]:
        srv.stop()
    for r in state["receivers"]:
        r.close()


def _serve(env: dict[str, Any], *extra: str) -> tuple[Server, httpx.Client]:
    srv = Server(env["db"], free_port(), extra_args=(*FAST, *extra)).start()
    env["servers"].append(srv)
    return srv, httpx.Client(base_url=srv.url, headers=auth(env["token"]), timeout=10)


def test_the_signed_stop_event_arrives(env: dict[str, Any]) -> None:
    port = free_port()
    secret = _add_webhook(env["db"], f"http://127.0.0.1:{port}/hook")
    assert secret.startswith("whsec_")
    rec = Receiver(secret, port)
    env["receivers"].append(rec)
    _, c = _serve(env)
    decision = _stop_job(c, "j1")
    got = _wait("the stop event", lambda: rec.events)
    assert rec.bad == []
    (event,) = got
    assert event["type"] == "job.stopped" and event["job_id"] == "j1"
    details = event["details"]
    assert details["stop_step"] == 40 and details["best_step"] == decision["best_step"] == 20
    assert details["best_score"] == 0.6 and details["reason"] == decision["reason"]
    assert details["detector"] == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
    assert details["gpu_hours_freed"] > 0
    # The event is the audit trail's own (same id), and the delivery is recorded there too.
    (stopped,) = _events(c, "job.stopped")
    assert stopped["id"] == event["id"]
    delivered = _wait("webhook.delivered", lambda: _events(c, "webhook.delivered"))
    assert delivered[0]["details"]["event_id"] == event["id"] and delivered[0]["details"]["status"] == 204
    # A receiver with the wrong secret would refuse it: the signature is over the exact body.
    other = Receiver("whsec_wrong")
    env["receivers"].append(other)
    other.check({"X-EvalStop-Signature": "sha256=" + "0" * 64}, b"{}")
    assert other.bad == ["signature"]


def _outbox(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT webhook_id, event_id, attempts FROM webhook_outbox").fetchall()


def test_kill_9_with_the_receiver_down_at_the_stop(env: dict[str, Any]) -> None:
    port = free_port()  # nothing listens there yet: every attempt is refused
    secret = _add_webhook(env["db"], f"http://127.0.0.1:{port}/hook")
    srv, c = _serve(env)
    _stop_job(c, "j1")
    failed = _wait("a failed attempt", lambda: _events(c, "webhook.failed"))
    assert failed[0]["details"]["next_attempt_at"] is not None and "error" in failed[0]["details"]
    srv.kill9()  # the decision is committed, the delivery is not done
    pending = _outbox(env["db"])
    assert len(pending) == 1 and pending[0][2] >= 1
    rec = Receiver(secret, port)
    env["receivers"].append(rec)
    _, c = _serve(env)
    got = _wait("the stop event after the restart", lambda: rec.events)
    assert rec.bad == [] and got[0]["type"] == "job.stopped" and got[0]["job_id"] == "j1"
    assert got[0]["id"] == pending[0][1]
    _wait("the outbox drained", lambda: _outbox(env["db"]) == [])


def test_kill_9_while_the_post_is_in_flight(env: dict[str, Any]) -> None:
    # The receiver takes the request and never answers: the server is killed with the delivery claimed but not
    # recorded. The next server process sends it again once the claim's lease (2 x timeout + 5 s) ran out.
    hang = Receiver("unused", mode="hang")
    env["receivers"].append(hang)
    port = hang.port
    secret = _add_webhook(env["db"], f"http://127.0.0.1:{port}/hook")
    srv, c = _serve(env, "--webhook-timeout-s", "0.5")
    _stop_job(c, "j1")
    _wait("the POST in flight", lambda: hang.requests >= 1)
    srv.kill9()
    assert len(_outbox(env["db"])) == 1
    hang.close()
    env["receivers"].remove(hang)
    rec = Receiver(secret, port)
    env["receivers"].append(rec)
    _, c = _serve(env, "--webhook-timeout-s", "0.5")
    got = _wait("the stop event after the lease", lambda: rec.events, timeout=30)
    assert rec.bad == [] and got[0]["type"] == "job.stopped"


def test_a_receiver_down_for_a_while_gets_every_event(env: dict[str, Any]) -> None:
    port = free_port()
    secret = _add_webhook(env["db"], f"http://127.0.0.1:{port}/hook", "--events", "register,stop,finish")
    _, c = _serve(env)
    for job in ("a", "b", "c"):
        _stop_job(c, job)
        assert c.post(f"/v1/jobs/{job}/finish", json={"reason": "stopped"}).status_code == 200
    _stop_job(c, "d", gpus=None)  # no finish: 3 x 3 + 2 events
    wanted = {e["id"] for kind in ("job.registered", "job.stopped", "job.finished") for e in _events(c, kind)}
    assert len(wanted) == 11
    # Down: every event has failed at least twice (retries with backoff) before the receiver comes up.

    def failed_twice() -> bool:
        counts = Counter(e["details"]["event_id"] for e in _events(c, "webhook.failed"))
        return set(counts) == wanted and min(counts.values()) >= 2

    _wait("two failed attempts of every event", failed_twice)
    rec = Receiver(secret, port)
    env["receivers"].append(rec)
    _wait("every event", lambda: {e["id"] for e in rec.events} == wanted)
    assert rec.bad == []
    _wait("every delivery recorded", lambda: len(_events(c, "webhook.delivered")) >= 11)
    assert sorted(e["details"]["event_id"] for e in _events(c, "webhook.delivered")) == sorted(wanted)
    assert len(rec.events) == 11  # no crash here, so no event twice


def test_a_hanging_endpoint_never_holds_up_reports(env: dict[str, Any]) -> None:
    hang = Receiver("unused", mode="hang")
    env["receivers"].append(hang)
    _add_webhook(env["db"], f"http://127.0.0.1:{hang.port}/hook", "--events", "stop,report")
    _, c = _serve(env, "--webhook-timeout-s", "20")
    _stop_job(c, "first")
    _wait("a POST in flight", lambda: hang.requests >= 1)
    # Every delivery now waits up to 20 s on the endpoint; reports are answered all the same (client timeout 3 s).
    fast = httpx.Client(base_url=c.base_url, headers=c.headers, timeout=3)
    for i in range(5):
        _stop_job(fast, f"next{i}")
    assert hang.requests >= 1


class Dripper:
    """A receiver on 127.0.0.1 that takes each request, then sends its answer's status line one byte every 0.5 s and
    never finishes it: each read gets a byte well within any per-read timeout. Records how long each connection
    stayed open (until the client closed it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[float] = []  # seconds each closed connection was held
        self.open = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        start = time.monotonic()
        self.open += 1
        try:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
                if self._closed.wait(0.5):
                    break
                conn.sendall(bytes([byte]))
        except OSError:  # the client gave up on it: what the deadline must do
            pass
        finally:
            self.open -= 1
            self.held.append(time.monotonic() - start)
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self.sock.close()


def test_a_dripping_receiver_holds_back_no_other_tenant(env: dict[str, Any]) -> None:
    drip = Dripper()
    env["receivers"].append(drip)
    _add_webhook(env["db"], f"http://127.0.0.1:{drip.port}/hook")
    beta_token = add_tenant(env["db"], "beta")
    port = free_port()
    secret = cli("webhook", "add", f"http://127.0.0.1:{port}/h", "--tenant", "beta", "--db", str(env["db"]))
    rec = Receiver(secret.stdout.strip().splitlines()[-1], port)
    env["receivers"].append(rec)
    timeout_s = 4.0
    _, c = _serve(env, "--webhook-timeout-s", str(timeout_s))
    for i in range(12):  # three times acme's lanes: its deliveries queue behind its own dripping ones
        _stop_job(c, f"acme{i}")
    _wait("acme's lanes all held by the dripper", lambda: drip.open >= 4)
    beta = httpx.Client(base_url=c.base_url, headers=auth(beta_token), timeout=10)
    _stop_job(beta, "b1")
    stopped = time.monotonic()
    _wait("beta's stop event", lambda: rec.events, timeout=30)
    assert time.monotonic() - stopped < timeout_s  # within its own timeout, whatever acme's receiver does
    assert rec.bad == [] and rec.events[0]["job_id"] == "b1"
    # acme's attempts end at the total deadline (a per-read timeout would hold each for minutes: 1 byte / 0.5 s).
    failed = _wait("acme's attempts cut off", lambda: _events(c, "webhook.failed"), timeout=30)
    assert failed[0]["details"]["error"] == f"no answer within {timeout_s:g} s"
    _wait("the dripper's connections closed", lambda: len(drip.held) >= 4, timeout=30)
    assert max(drip.held) < timeout_s + 3.0


def test_a_delivery_is_given_up_after_max_attempts(env: dict[str, Any]) -> None:
    secret = "unused"
    failing = Receiver(secret, mode="fail")
    env["receivers"].append(failing)
    _add_webhook(env["db"], f"http://127.0.0.1:{failing.port}/hook")
    _, c = _serve(env, "--webhook-max-attempts", "3")
    _stop_job(c, "j1")
    last = _wait("the last attempt", lambda: [e for e in _events(c, "webhook.failed") if e["details"]["attempt"] == 3])
    assert last[0]["details"]["next_attempt_at"] is None and last[0]["details"]["status"] == 500
    assert [e["details"]["attempt"] for e in _events(c, "webhook.failed")] == [1, 2, 3]
    assert _outbox(env["db"]) == []
    assert failing.requests == 3


def test_the_webhook_cli(env: dict[str, Any]) -> None:
    db = str(env["db"])
    bad = cli("webhook", "add", "ftp://x/y", "--tenant", "acme", "--db", db, check=False)
    assert bad.returncode == 2 and "http:// or https://" in bad.stderr
    bad = cli(
        "webhook", "add", "http://127.0.0.1:1/", "--tenant", "acme", "--events", "stop,oops", "--db", db, check=False
    )
    assert bad.returncode == 2 and "unknown webhook event 'oops'" in bad.stderr
    bad = cli("webhook", "add", "http://127.0.0.1:1/", "--tenant", "nobody", "--db", db, check=False)
    assert bad.returncode == 2 and "no tenant 'nobody'" in bad.stderr
    out = cli("webhook", "add", "http://127.0.0.1:1/h", "--tenant", "acme", "--json", "--db", db).stdout.splitlines()
    info, secret = json.loads(out[0]), out[1]
    assert info["events"] == ["job.stopped", "job.finished"] and secret.startswith("whsec_")
    listed = json.loads(cli("webhook", "list", "--json", "--db", db).stdout)
    assert [(h["webhook_id"], h["tenant"], h["url"]) for h in listed] == [
        (info["webhook_id"], "acme", "http://127.0.0.1:1/…")  # its path may hold a secret: never listed
    ]
    assert secret not in cli("webhook", "list", "--db", db).stdout + json.dumps(listed)
    assert cli("webhook", "remove", str(info["webhook_id"]), "--db", db).returncode == 0
    assert json.loads(cli("webhook", "list", "--json", "--db", db).stdout) == []
    gone = cli("webhook", "remove", str(info["webhook_id"]), "--db", db, check=False)
    assert gone.returncode == 2 and f"no webhook {info['webhook_id']}" in gone.stderr


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata endpoint"),
        ("http://[fd00:ec2::254]/latest", "cloud metadata endpoint"),
        ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata endpoint"),
        ("http://[::ffff:169.254.169.254]/", "cloud metadata endpoint"),
        ("http://169.254.10.1/hook", "link-local address"),
        ("http://[fe80::1]/hook", "link-local address"),
        ("http://hooks.example.com/a\r\nX-Injected: 1", "control characters"),
        ("http://hooks.example.com/a\nb", "control characters"),
    ],
)
def test_webhook_add_refuses_metadata_link_local_and_crlf_urls(tmp_path: Path, url: str, why: str) -> None:
    db = tmp_path / "service.db"
    add_tenant(db, "acme")
    bad = cli("webhook", "add", url, "--tenant", "acme", "--db", str(db), check=False)
    assert bad.returncode == 2 and why in bad.stderr
    assert json.loads(cli("webhook", "list", "--json", "--db", str(db)).stdout) == []


def test_webhook_urls_are_redacted_in_listings_and_logs_and_private_ones_warned(env: dict[str, Any]) -> None:
    db = str(env["db"])
    private = cli("webhook", "add", "https://10.1.2.3/h", "--tenant", "acme", "--db", db)
    assert "warning: 10.1.2.3 is a private address" in private.stderr
    port = free_port()
    url = f"http://user:hunter2@127.0.0.1:{port}/s3cr3t-path?sig=abc123"
    added = cli("webhook", "add", url, "--tenant", "acme", "--db", db)
    assert "warning: 127.0.0.1 is a loopback address" in added.stderr
    listing = cli("webhook", "list", "--db", db).stdout + cli("webhook", "list", "--json", "--db", db).stdout
    assert f"http://127.0.0.1:{port}/…" in listing and "https://10.1.2.3/…" in listing
    for secret in ("hunter2", "user:", "s3cr3t-path", "abc123"):
        assert secret not in listing + added.stderr
    cli("webhook", "remove", str(json.loads(listing.splitlines()[-1])[0]["webhook_id"]), "--db", db)  # not dialled
    rec = Receiver(added.stdout.strip().splitlines()[-1], port)
    env["receivers"].append(rec)
    srv, c = _serve(env, "--log-level", "info")  # httpx logs each request's URL at INFO
    _stop_job(c, "j1")
    _wait("the stop event", lambda: rec.events)
    _wait("the delivery recorded", lambda: _events(c, "webhook.delivered"))
    assert srv.log is not None
    log = srv.log.read_text()
    assert f'HTTP Request: POST http://127.0.0.1:{port}/… "HTTP/1.0 204' in log  # logged, redacted
    assert "hunter2" not in log and "s3cr3t-path" not in log and "abc123" not in log


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        from platform_sim.service.store_sqlite import SQLiteStore

        s: Any = SQLiteStore(tmp_path / "service.db")
        try:
            yield s
        finally:
            s.close()
        return
    from platform_sim.service.store_postgres import PostgresStore

    with postgres_database("evalstop_lanes") as url:
        s = PostgresStore(url, workers=2)
        try:
            yield s
        finally:
            s.close()


def test_the_claim_gives_each_tenant_its_lanes_the_longest_waiting_first(any_store: Any) -> None:
    # The worker's claim (both stores): acme has a backlog of 6 due deliveries, older than beta's one.
    from platform_sim.service.store import JobRecord

    store = any_store
    ids = {}
    for name, jobs in (("acme", 6), ("beta", 1)):
        tenant, _ = store.add_tenant(name)
        ids[name] = tenant.tenant_id
        store.add_webhook(tenant.tenant_id, "http://127.0.0.1:9/h", ("job.registered",))
        for i in range(jobs):
            store.register_job(tenant.tenant_id, JobRecord(f"{name}{i}", "rlhf", {"name": "k-decline", "params": {}}))
    now = time.time() + 1
    tenant_of = lambda batch: [d.webhook.tenant_id for d in batch]  # noqa: E731
    # Two lanes each: acme (waiting longest) gets two, beta its one, within the limit of 3.
    first = store.claim_deliveries(now, 60, limit=3, per_tenant=2, in_flight={})
    assert tenant_of(first) == [ids["acme"], ids["acme"], ids["beta"]]
    # acme's lanes are full: nothing of its backlog is claimed, however much room is left.
    assert store.claim_deliveries(now, 60, limit=10, per_tenant=2, in_flight={ids["acme"]: 2}) == []
    # One lane of acme's free again: one more of its deliveries, the oldest left.
    (more,) = store.claim_deliveries(now, 60, limit=10, per_tenant=2, in_flight={ids["acme"]: 1})
    assert more.webhook.tenant_id == ids["acme"] and more.event.id > max(d.event.id for d in first[:2])
