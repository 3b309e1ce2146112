"""Trace ids (idem.trace, transaction-local) and the decision logs of logger pg_idem."""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from conftest import new_key, serve_asgi

import pg_idem

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def record_trace(db: Any, endpoint: str, key: str) -> Any:
    """The record's trace column (0.4.0)."""
    return db.execute("SELECT trace FROM idem_record WHERE tenant = 'acme' AND endpoint = %s AND key = %s",
                      (endpoint, key)).fetchone()[0]


def setting(conn: psycopg.Connection[Any]) -> Any:
    return conn.execute("SELECT current_setting('idem.trace', true)").fetchone()[0]


@pytest.mark.parametrize("header,expected", [
    (TRACEPARENT, TRACE),
    (f" {TRACEPARENT} ", TRACE),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),  # an all-zero trace-id
    (f"00-{TRACE}-0000000000000000-01", None),  # an all-zero parent-id
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),  # upper-case hex
    (f"01-{TRACE}-00f067aa0ba902b7-01", None),  # another version
    (f"00-{TRACE}-00f067aa0ba902b7", None),
    ("", None),
    (None, None),
])
def test_trace_from_traceparent(header: Any, expected: Any) -> None:
    got = pg_idem.trace_id(header, "req-7")
    assert got == (expected or "req-7")
    fresh = pg_idem.trace_id(header)
    assert fresh == expected or re.fullmatch(r"[0-9a-f]{32}", fresh)
    assert pg_idem.trace_id(None, "bad id with spaces") != "bad id with spaces"
    assert pg_idem.trace_id(None, "x" * 256) != "x" * 256


def test_claim_sets_the_trace_for_its_transaction_only(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "pg_idem")
    key, other = new_key(), new_key()
    with psycopg.connect("", autocommit=True) as conn:
        with pg_idem.claim(conn, "acme", "job:trace", key, trace=TRACE) as c:
            assert c.outcome == "claimed" and c.trace == TRACE
            assert setting(conn) == TRACE
            c.respond(201, b"made")
        assert setting(conn) in ("", None), "the next transaction of the connection has no trace"
        with pg_idem.claim(conn, "acme", "job:trace", other) as c2:
            assert setting(conn) in ("", None)
            c2.respond(201, b"made")
        with pg_idem.claim(conn, "acme", "job:trace", key, trace="replayer") as again:
            assert again.outcome == "replay"
    assert record_trace(db, "job:trace", key) == TRACE
    assert record_trace(db, "job:trace", other) in ("", None)
    logs = [r for r in caplog.records if r.name == "pg_idem" and getattr(r, "idempotency_key", None) == key]
    assert [(r.outcome, r.attempt, r.trace_id, r.tenant, r.endpoint, r.levelname)  # type: ignore[attr-defined]
            for r in logs] == [("claimed", 1, TRACE, "acme", "job:trace", "INFO"),
                               ("replay", 1, "replayer", "acme", "job:trace", "INFO")]
    assert f"outcome=claimed attempt=1 trace='{TRACE}'" in logs[0].getMessage()


def test_a_conflict_is_logged_as_a_warning(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    key = new_key()
    with psycopg.connect("", autocommit=True) as conn:
        with pg_idem.claim(conn, "acme", "job:trace", key, "one") as c:
            c.respond(200)
        with pg_idem.claim(conn, "acme", "job:trace", key, "two", trace="t-2") as c:
            assert c.outcome == "mismatch"
    (log,) = [r for r in caplog.records if getattr(r, "outcome", None) == "mismatch"
              and getattr(r, "idempotency_key", None) == key]
    assert log.levelname == "WARNING" and log.trace_id == "t-2"  # type: ignore[attr-defined]


class KeptConnection(psycopg.AsyncConnection):  # type: ignore[type-arg]
    """A connection that outlives the request (as a pool's does): leaving ``async with`` keeps it open."""

    async def __aexit__(self, *exc: Any) -> None:
        pass


def test_the_asgi_middleware_sets_the_trace_per_request_and_it_never_leaks(db: Any) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    kept: list[KeptConnection] = []

    async def connect() -> psycopg.AsyncConnection[Any]:
        if not kept:
            kept.append(await KeptConnection.connect("", autocommit=True))
        return kept[0]

    async def seen(request: Request) -> JSONResponse:
        cur = await request.state.idem.conn.execute("SELECT current_setting('idem.trace', true), pg_backend_pid()")
        trace, pid = await cur.fetchone()
        return JSONResponse({"trace": trace, "pid": pid, "claim": request.state.idem.trace})

    async def after(request: Request) -> JSONResponse:  # not a method the middleware claims
        conn = await connect()
        cur = await conn.execute("SELECT current_setting('idem.trace', true)")
        return JSONResponse({"trace": (await cur.fetchone())[0]})

    app = Starlette(routes=[Route("/seen", seen, methods=["POST"]), Route("/after", after, methods=["GET"])])
    app.add_middleware(pg_idem.asgi.IdempotencyMiddleware, tenant="acme", connect=connect)
    url, stop = serve_asgi(app)
    key = new_key()
    try:
        first = httpx.post(url + "/seen", headers={"Idempotency-Key": key, "traceparent": TRACEPARENT}).json()
        clean = httpx.get(url + "/after").json()
        second = httpx.post(url + "/seen", headers={"Idempotency-Key": new_key(), "X-Request-Id": "req-42"}).json()
        unkeyed = httpx.post(url + "/seen").json()
        bad = httpx.post(url + "/seen", headers={"traceparent": "00-zz-00f067aa0ba902b7-01"}).json()
    finally:
        stop()
    assert first["trace"] == first["claim"] == TRACE
    assert clean["trace"] in ("", None), "the trace ended with the request's transaction"
    assert second["trace"] == "req-42" and second["pid"] == first["pid"], "the same connection"
    assert re.fullmatch(r"[0-9a-f]{32}", unkeyed["trace"]) and unkeyed["trace"] != TRACE
    assert re.fullmatch(r"[0-9a-f]{32}", bad["trace"]) and bad["trace"] != unkeyed["trace"]
    assert record_trace(db, "POST /seen", key) == TRACE


def test_the_django_middleware_sets_the_trace(db: Any) -> None:
    import django_app  # noqa: F401  (configures Django)
    from django.http import HttpRequest, JsonResponse
    from django.test import RequestFactory

    def view(request: HttpRequest) -> JsonResponse:
        conn = request.idem.conn  # type: ignore[attr-defined]
        return JsonResponse({"trace": conn.execute("SELECT current_setting('idem.trace', true)").fetchone()[0]})

    middleware = pg_idem.django.IdempotencyMiddleware(view)
    key = new_key()
    r = middleware(RequestFactory().post("/traced", HTTP_IDEMPOTENCY_KEY=key, HTTP_TRACEPARENT=TRACEPARENT))
    assert r.status_code == 200 and json.loads(r.content)["trace"] == TRACE
    r = middleware(RequestFactory().post("/traced", HTTP_X_REQUEST_ID="req-9"))
    assert json.loads(r.content)["trace"] == "req-9"
    assert record_trace(db, "POST /traced", key) == TRACE


def test_the_tool_sets_a_trace(db: Any) -> None:
    name, key = f"traced-{uuid.uuid4()}", new_key()

    @pg_idem.idempotent_tool("", tenant="acme", name=name, trace=lambda x: f"agent-run-{x}")
    def tool(x: int) -> Any:
        with psycopg.connect("", autocommit=True):
            return x

    tool(3, idempotency_key=key)
    assert record_trace(db, f"tool:{name}", key) == "agent-run-3"


def test_an_enqueue_in_the_claims_transaction_carries_its_trace(db: Any) -> None:
    key, topic = new_key(), f"py-{uuid.uuid4()}"
    with psycopg.connect("", autocommit=True) as conn:
        with pg_idem.claim(conn, "acme", "job:trace", key, trace=TRACE) as c:
            pg_idem.enqueue(conn, "acme", topic, key, {"n": 1})
            c.respond(202)
    (message_trace,) = db.execute("SELECT trace FROM idem_message('acme', %s, %s)", (topic, key)).fetchone()
    (listed,) = db.execute("SELECT trace FROM idem_list('acme', 'job:trace', true, 100000) WHERE key = %s",
                           (key,)).fetchone()
    assert message_trace == listed == TRACE
