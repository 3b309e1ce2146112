"""pg_idem.enqueue and pg_idem.Dispatcher against a real idem, and a real HTTP receiver."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

import psycopg
import pytest
from conftest import until

import pg_idem


def connect() -> psycopg.Connection[Any]:
    return psycopg.connect("", autocommit=True)


def new_topic() -> str:
    return f"py-{uuid.uuid4()}"


def message(db: Any, topic: str, key: str) -> Optional[dict[str, Any]]:
    cur = db.execute("SELECT * FROM idem_message('acme', %s, %s)", (topic, key))
    row = cur.fetchone()
    return None if row is None else dict(zip([c.name for c in cur.description], row))


def put(topic: str, key: str, payload: Any, **kw: Any) -> pg_idem.Enqueued:
    with connect() as conn:
        return pg_idem.enqueue(conn, "acme", topic, key, payload, **kw)


Answer = tuple[int, dict[str, str], bytes]


class Receiver:
    """An HTTP server in a thread: ``answer(request)`` gives (status, headers, body); requests are kept."""

    def __init__(self, answer: Callable[[dict[str, Any]], Answer]) -> None:
        self.requests: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
                           "at": time.time()}
                receiver.requests.append(request)
                status, headers, out = answer(request)
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:  # the dispatcher gave up waiting
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_enqueue_outcomes_and_payload_kinds(db: Any) -> None:
    topic = new_topic()
    first = put(topic, "bytes", b"\x00\x01\xff", headers={"x-a": "b", "x-list": ["1", "2"]})
    assert first.outcome == "enqueued" and first.state == "queued" and isinstance(first.id, int)
    assert isinstance(first.created_at, datetime)
    assert put(topic, "bytes", b"\x00\x01\xff") == dataclasses.replace(first, outcome="duplicate")
    assert put(topic, "bytes", b"\x00\x01\xfe").outcome == "mismatch"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.outcome = "x"  # type: ignore[misc]
    assert put(topic, "text", "héllo").outcome == "enqueued"
    assert put(topic, "text", "héllo").outcome == "duplicate"
    assert put(topic, "json", {"b": [1, 2], "a": "x"}).outcome == "enqueued"
    assert put(topic, "json", {"a": "x", "b": [1, 2]}).outcome == "duplicate"
    assert put(topic, "json", {"a": "y", "b": [1, 2]}).outcome == "mismatch"
    rows = db.execute("SELECT key, payload, headers FROM idem_take(%s, 10) ORDER BY key", (topic,)).fetchall()
    assert [r[0] for r in rows] == ["bytes", "json", "text"]
    assert bytes(rows[0][1]) == b"\x00\x01\xff" and rows[0][2] == {"x-a": "b", "x-list": ["1", "2"]}
    assert json.loads(bytes(rows[1][1])) == {"a": "x", "b": [1, 2]}
    assert bytes(rows[2][1]).decode() == "héllo"


def test_enqueue_in_the_callers_transaction_rolls_back(db: Any) -> None:
    topic = new_topic()
    with psycopg.connect("") as conn:  # not autocommit: enqueue opens the transaction
        assert pg_idem.enqueue(conn, "acme", topic, "k", {"n": 1}).outcome == "enqueued"
        assert message(db, topic, "k") is None, "not visible before the commit"
        conn.rollback()
        assert message(db, topic, "k") is None
        assert pg_idem.enqueue(conn, "acme", topic, "k", {"n": 2}).outcome == "enqueued"
        conn.commit()
    assert message(db, topic, "k")["state"] == "queued"  # type: ignore[index]


def test_enqueue_options_reach_idem(db: Any) -> None:
    topic = new_topic()
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    put(topic, "later", "x", not_before=later)
    assert message(db, topic, "later")["not_before"] == later  # type: ignore[index]
    put(topic, "o1", "x", ordering_key="customer-7")
    put(topic, "o2", "x", ordering_key="customer-7", max_attempts=1)
    taken = db.execute("SELECT id, key, attempt FROM idem_take(%s, 10)", (topic,)).fetchall()
    assert [r[1] for r in taken] == ["o1"], "o2 waits for o1; 'later' is not due"
    db.execute("SELECT idem_delivered(%s, %s)", (taken[0][0], taken[0][2]))
    taken = db.execute("SELECT id, key, attempt FROM idem_take(%s, 10)", (topic,)).fetchall()
    assert [r[1] for r in taken] == ["o2"]
    state = db.execute("SELECT idem_retry(%s, %s, 'failed')", (taken[0][0], taken[0][2])).fetchone()[0]
    assert state == "dead", "max_attempts 1: one failed attempt is the last"
    put(topic, "once", "x", redeliver=False)
    taken = db.execute("SELECT id FROM idem_take(%s, 10, lease => '200 milliseconds')", (topic,)).fetchall()
    assert len(taken) == 1
    time.sleep(0.4)
    assert db.execute("SELECT count(*) FROM idem_take(%s, 10)", (topic,)).fetchone()[0] == 0
    assert message(db, topic, "once")["state"] == "unknown"  # type: ignore[index]


def test_run_once_handler_mode_maps_results(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic()
    seen: dict[str, pg_idem.Message] = {}

    def handler(m: pg_idem.Message) -> Optional[pg_idem.Reply]:
        seen[m.key] = m
        if m.key == "ok":
            return pg_idem.Reply(201, b"created")
        if m.key == "nothing":
            return None
        if m.key == "bad":
            return pg_idem.Reply(400, "no")
        if m.key == "busy":
            return pg_idem.Reply(503, retry_after=30)
        raise RuntimeError("boom")

    enq = put(topic, "ok", b"\x07", headers={"h": "v"})
    for key in ("nothing", "bad", "busy", "throws"):
        put(topic, key, key)
    caplog.set_level(logging.INFO, "pg_idem.dispatcher")
    d = pg_idem.Dispatcher("", topic, handler=handler, batch_size=10, lease="5 seconds", timeout=1)
    started = time.monotonic()
    assert d.run_once() == 5
    ok = message(db, topic, "ok")
    assert ok and (ok["state"], ok["status"], bytes(ok["body"])) == ("delivered", 201, b"created")
    nothing = message(db, topic, "nothing")
    assert nothing and (nothing["state"], nothing["status"], nothing["body"]) == ("delivered", None, None)
    bad = message(db, topic, "bad")
    assert bad and bad["state"] == "dead" and bad["last_error"] == "HTTP 400: no"
    busy = message(db, topic, "busy")
    assert busy and busy["state"] == "queued" and busy["last_error"] == "HTTP 503"
    assert timedelta(seconds=28) < busy["not_before"] - datetime.now(timezone.utc) <= timedelta(seconds=30)
    throws = message(db, topic, "throws")
    assert throws and throws["state"] == "queued" and "RuntimeError: boom" in throws["last_error"]
    m = seen["ok"]
    assert (m.id, m.tenant, m.topic, m.key, m.payload, m.headers, m.attempt) == (
        enq.id, "acme", topic, "ok", b"\x07", {"h": "v"}, 1)
    assert m.idempotency_key == f"acme/{topic}/ok"
    assert m.lease_expires_at > datetime.now(timezone.utc)
    assert started + 1 <= m.deadline <= time.monotonic() + 1
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("INFO", f"pg_idem dispatcher: acme/{topic}/ok attempt 1: delivered (201)") in logged
    assert any(lvl == "WARNING" and f"acme/{topic}/throws attempt 1: to retry" in msg for lvl, msg in logged)
    assert any(lvl == "ERROR" and f"acme/{topic}/bad attempt 1: dead" in msg for lvl, msg in logged)
    assert d.run_once() == 0, "nothing is due: the retries wait for their backoff"


def test_url_mode(db: Any) -> None:
    topic = new_topic()
    retry_at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=20)

    def answer(r: dict[str, Any]) -> Answer:
        key = r["headers"]["idempotency-key"].rsplit("/", 1)[1]
        if key == "ok":
            return 201, {"Content-Type": "text/plain"}, b"thanks"
        if key == "busy":
            return 503, {"Retry-After": "20"}, b"later"
        if key == "limited":
            return 429, {"Retry-After": format_datetime(retry_at, usegmt=True)}, b""
        if key == "gone":
            return 404, {}, b"no such hook"
        if key == "moved":
            return 301, {"Location": "/elsewhere"}, b""
        time.sleep(1.0)  # slow: longer than the timeout
        return 200, {}, b"late"

    hook = Receiver(answer)
    try:
        put(topic, "ok", b'{"amount": 12}',
            headers={"Content-Type": "application/json", "X-Trace": ["a", "b"]})
        for key in ("busy", "limited", "gone", "moved", "slow"):
            put(topic, key, key)
        d = pg_idem.Dispatcher("", topic, url=hook.url, batch_size=10, concurrency=6, timeout=0.3)
        assert d.run_once() == 6
        ok = message(db, topic, "ok")
        assert ok and (ok["state"], ok["status"], bytes(ok["body"]), ok["attempt"]) == (
            "delivered", 201, b"thanks", 1)
        [r] = [r for r in hook.requests if r["headers"]["idempotency-key"].endswith("/ok")]
        assert r["body"] == b'{"amount": 12}'
        assert r["headers"]["idempotency-key"] == f"acme/{topic}/ok"
        assert r["headers"]["idem-attempt"] == "1"
        assert r["headers"]["content-type"] == "application/json"
        assert r["headers"]["x-trace"] == "a, b"
        others = [r for r in hook.requests if not r["headers"]["idempotency-key"].endswith("/ok")]
        assert {r["headers"]["content-type"] for r in others} == {"application/octet-stream"}
        now = datetime.now(timezone.utc)
        busy = message(db, topic, "busy")
        assert busy and busy["state"] == "queued" and busy["last_error"] == "HTTP 503: later"
        assert timedelta(seconds=18) < busy["not_before"] - now <= timedelta(seconds=20)
        limited = message(db, topic, "limited")
        assert limited and limited["state"] == "queued"
        assert abs(limited["not_before"] - retry_at) < timedelta(seconds=1)
        gone = message(db, topic, "gone")
        assert gone and gone["state"] == "dead" and gone["last_error"] == "HTTP 404: no such hook"
        moved = message(db, topic, "moved")
        assert moved and moved["state"] == "dead" and moved["last_error"] == "HTTP 301"
        slow = message(db, topic, "slow")
        assert slow and slow["state"] == "queued" and slow["last_error"] == "no answer within 0.3 s"
    finally:
        hook.close()
    # nothing listens there any more
    refused_topic = new_topic()
    put(refused_topic, "nobody", "x")
    d = pg_idem.Dispatcher("", refused_topic, url=hook.url)
    assert d.run_once() == 1
    nobody = message(db, refused_topic, "nobody")
    assert nobody and nobody["state"] == "queued" and "Connection refused" in nobody["last_error"], nobody


def test_run_wakes_on_notifications_and_stops_gracefully(db: Any) -> None:
    topic = new_topic()
    app = f"pg-idem-test-{uuid.uuid4()}"
    arrived: dict[str, float] = {}
    release = threading.Event()
    started = threading.Event()

    def handler(m: pg_idem.Message) -> pg_idem.Reply:
        arrived[m.key] = time.monotonic()
        if m.key == "held":
            started.set()
            assert release.wait(30)
        return pg_idem.Reply(200, f"done {m.key}")

    d = pg_idem.Dispatcher(f"application_name={app}", topic, handler=handler, poll_interval=60)
    runner = threading.Thread(target=d.run)
    runner.start()
    try:
        def listening() -> int:
            return db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                              "AND query = 'LISTEN idem_outbox'", (app,)).fetchone()[0]

        def latencies(prefix: str) -> list[float]:
            # each after the one before arrived: the dispatcher takes once on
            # its own after connecting; the later ones come by notification
            out = []
            for i in range(3):
                key = f"{prefix}{i}"
                with psycopg.connect("") as conn:
                    pg_idem.enqueue(conn, "acme", topic, key, "x")
                    committed = time.monotonic()
                    conn.commit()
                until(lambda: key in arrived, f"{key} delivered", 10)
                out.append(arrived[key] - committed)
            return out

        until(listening, "the dispatcher listening")
        # the poll is a minute away: each came by its notification
        assert max(latencies("k")) < 2

        # the LISTEN connection breaks: another one is made, and wakes the dispatcher again
        pid = db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                         "AND query = 'LISTEN idem_outbox'", (app,)).fetchone()[0]
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        until(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                 "AND query = 'LISTEN idem_outbox' AND pid <> %s", (app, pid)).fetchone()[0],
              "a new LISTEN connection")
        assert max(latencies("after")) < 2

        put(topic, "held", "x")
        assert started.wait(10)
        d.stop()
        d.stop()
        runner.join(0.5)
        assert runner.is_alive(), "run() waits for the delivery in flight"
        put(topic, "late", "x")
        release.set()
        runner.join(30)
        assert not runner.is_alive()
        held = message(db, topic, "held")
        assert held and (held["state"], bytes(held["body"])) == ("delivered", b"done held")
        late = message(db, topic, "late")
        assert late and late["state"] == "queued", "nothing is taken after stop()"
        # the LISTEN connection is closed; its backend leaves pg_stat_activity
        # a moment later
        until(lambda: listening() == 0, "the LISTEN connection closed")
        with pytest.raises(RuntimeError, match="stopped"):
            d.run()
    finally:
        release.set()
        d.stop()
        runner.join(30)


def test_a_stale_lease_is_logged_not_recorded(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic()
    retaken: list[tuple[int, int]] = []

    def handler(m: pg_idem.Message) -> pg_idem.Reply:
        # outlives its lease, until another take has the message
        def take() -> Any:
            return db.execute("SELECT id, attempt FROM idem_take(%s)", (topic,)).fetchone()

        retaken.append(until(take, "the message taken again after the lease"))
        return pg_idem.Reply(200, b"too late")

    put(topic, "k", "x")
    caplog.set_level(logging.INFO, "pg_idem.dispatcher")
    d = pg_idem.Dispatcher("", topic, handler=handler, lease=0.6, timeout=0.3)
    assert d.run_once() == 1
    [stale] = [r for r in caplog.records if "stale lease" in r.getMessage()]
    assert stale.levelname == "WARNING"
    assert f"acme/{topic}/k attempt 1" in stale.getMessage()
    [(id_, attempt)] = retaken
    assert attempt == 2
    m = message(db, topic, "k")
    assert m and (m["state"], m["attempt"], m["body"]) == ("leased", 2, None), "attempt 2 still holds it"
    db.execute("SELECT idem_delivered(%s, 2, 200)", (id_,))


def test_bad_options() -> None:
    with pytest.raises(TypeError, match="either handler or url"):
        pg_idem.Dispatcher("", "t")
    with pytest.raises(TypeError, match="either handler or url"):
        pg_idem.Dispatcher("", "t", handler=lambda m: None, url="http://x/")
    with pytest.raises(ValueError, match="http or https"):
        pg_idem.Dispatcher("", "t", url="ftp://x/")
    with pytest.raises(ValueError, match="concurrency"):
        pg_idem.Dispatcher("", "t", handler=lambda m: None, concurrency=0)
    with pytest.raises(ValueError, match="purge_interval"):
        pg_idem.Dispatcher("", "t", handler=lambda m: None, purge_interval=0)


def test_purge_interval_calls_idem_purge(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    key = f"purge-{uuid.uuid4()}"
    db.execute("SELECT idem_claim('acme', 'POST /purge', %s)", (key,))
    db.execute("SELECT idem_complete('acme', 'POST /purge', %s, 200, 'done'::text)", (key,))
    db.execute("UPDATE idem_record SET expires_at = now() - interval '1 second' WHERE key = %s", (key,))
    d = pg_idem.Dispatcher("", new_topic(), handler=lambda m: None, purge_interval=0.05)
    runner = threading.Thread(target=d.run)
    with caplog.at_level(logging.INFO, logger="pg_idem.dispatcher"):
        runner.start()
        try:
            until(lambda: db.execute("SELECT 1 FROM idem_record WHERE key = %s", (key,)).fetchone() is None,
                  "the expired record purged")
        finally:
            d.stop()
            runner.join()
    assert any(re.search(r"idem_purge\(\) deleted [1-9]", r.getMessage()) for r in caplog.records)


def test_a_timeout_not_shorter_than_the_lease_is_refused(db: Any) -> None:
    d = pg_idem.Dispatcher("", new_topic(), handler=lambda m: None, lease="2 seconds", timeout=2)
    with pytest.raises(ValueError, match=r"the timeout \(2.0 s\) must be shorter than the lease"):
        d.run_once()
    with pytest.raises(ValueError, match="shorter than the lease"):
        pg_idem.Dispatcher("", new_topic(), handler=lambda m: None, lease=timedelta(seconds=1)).run()


class Recording(psycopg.Connection):  # type: ignore[type-arg]
    """A connection that keeps the text of each statement it runs."""

    statements: list[str] = []

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        text = query.as_string(self) if isinstance(query, psycopg.sql.Composable) else str(query)
        Recording.statements.append(text)
        return super().execute(query, params, **kw)


def test_a_takes_successes_are_recorded_by_one_idem_delivered_many(
        db: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic()
    for key in ("a", "b", "c", "d", "with-body", "bad"):
        put(topic, key, key)

    def handler(m: pg_idem.Message) -> Optional[pg_idem.Reply]:
        if m.key == "with-body":
            return pg_idem.Reply(201, b"kept")
        if m.key == "bad":
            return pg_idem.Reply(404)
        return None if m.key == "a" else pg_idem.Reply(200 + ord(m.key) - ord("a"))

    Recording.statements = []
    monkeypatch.setattr(psycopg, "connect", Recording.connect)
    caplog.set_level(logging.INFO, "pg_idem.dispatcher")
    assert pg_idem.Dispatcher("", topic, handler=handler, batch_size=10, concurrency=6).run_once() == 6
    many = [s for s in Recording.statements if "idem_delivered_many" in s]
    single = [s for s in Recording.statements if re.search(r"\bidem_delivered\"?\(", s)]
    assert len(many) == 1, Recording.statements
    assert len(single) == 0, "every success goes with the batch, bodies included"
    for key, status in (("a", None), ("b", 201), ("c", 202), ("d", 203)):
        m = message(db, topic, key)
        assert m and (m["state"], m["status"], m["body"]) == ("delivered", status, None), (key, m)
    m = message(db, topic, "with-body")
    assert m and (m["state"], m["status"], bytes(m["body"])) == ("delivered", 201, b"kept")
    assert message(db, topic, "bad")["state"] == "dead"  # type: ignore[index]
    logged = [r.getMessage() for r in caplog.records]
    assert f"pg_idem dispatcher: acme/{topic}/c attempt 1: delivered (202)" in logged


def test_a_slow_delivery_does_not_hold_back_the_batch(db: Any) -> None:
    topic = new_topic()
    for key in ("fast", "slow"):
        put(topic, key, key)
    seen: dict[str, Any] = {}

    def handler(m: pg_idem.Message) -> None:
        if m.key == "slow":
            # the take's deadline (timeout) passed: the fast one is recorded already
            seen["fast"] = until(lambda: (message(db, topic, "fast") or {}).get("state") == "delivered",
                                 "the fast delivery recorded", 5)
        return None

    d = pg_idem.Dispatcher("", topic, handler=handler, batch_size=2, lease="10 seconds", timeout=0.3)
    assert d.run_once() == 2
    assert seen["fast"] and message(db, topic, "slow")["state"] == "delivered"  # type: ignore[index]


def test_a_stale_lease_in_a_batch_keeps_the_others(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    from pg_idem._outbox import _Verdict

    topic = new_topic()
    for key in ("a", "b", "c"):
        put(topic, key, key)
    d = pg_idem.Dispatcher("", topic, handler=lambda m: None)
    caplog.set_level(logging.INFO, "pg_idem.dispatcher")
    with connect() as conn:
        rows = conn.execute("SELECT id, tenant, topic, key, payload, headers, attempt, lease_expires_at "
                            "FROM idem_take(%s, 3) ORDER BY key", (topic,)).fetchall()
        items = [(d._message(r), _Verdict("delivered", status=200)) for r in rows]
        items[1] = (dataclasses.replace(items[1][0], attempt=7), items[1][1])  # not the live lease
        d._record_many(conn, items)
    assert [message(db, topic, k)["state"] for k in ("a", "b", "c")] == [  # type: ignore[index]
        "delivered", "leased", "delivered"]
    assert any("stale lease" in r.getMessage() and f"/{topic}/b attempt 7" in r.getMessage()
               for r in caplog.records)
