"""The extension in a schema that is not on the search_path (``CREATE EXTENSION idem SCHEMA ...``),
in a database of its own: every call of the package names it with ``schema``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from conftest import new_key, serve_asgi
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pg_idem

#: quoted as an identifier (an extension's schema may not hold a double quote)
SCHEMA = "Idem Api"


@pytest.fixture(scope="module")
def conninfo(db: Any) -> Iterator[str]:
    name = sql.Identifier(f"{db.info.dbname}_schema")
    db.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
    db.execute(sql.SQL("CREATE DATABASE {}").format(name))
    info = make_conninfo("", dbname=f"{db.info.dbname}_schema")
    with psycopg.connect(info, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {0}; CREATE EXTENSION idem SCHEMA {0}").format(
            sql.Identifier(SCHEMA)))
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, body bytea NOT NULL)")
    yield info
    db.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))


def test_claim_and_the_outbox(conninfo: str) -> None:
    key, topic = new_key(), f"py-{uuid.uuid4()}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction):  # what the schema option is for
            with pg_idem.claim(conn, "acme", "job", key):
                pass
        for outcome in ("claimed", "replay"):
            with pg_idem.claim(conn, "acme", "job", key, schema=SCHEMA) as c:
                assert c.outcome == outcome
                c.raise_for_outcome()
                if c.outcome == "claimed":
                    c.respond(201, b"made")
        assert c.body == b"made"
        assert pg_idem.enqueue(conn, "acme", topic, key, {"n": 1}, schema=SCHEMA).outcome == "enqueued"
        got: list[bytes] = []
        dispatcher = pg_idem.Dispatcher(conninfo, topic, handler=lambda m: got.append(m.payload),
                                        schema=SCHEMA)
        assert dispatcher.run_once() == 1 and json.loads(got[0]) == {"n": 1}
        (state,) = conn.execute(sql.SQL("SELECT state FROM {}.idem_message('acme', %s, %s)").format(
            sql.Identifier(SCHEMA)), (topic, key)).fetchone()
        assert state == "delivered"


def test_the_asgi_middleware(conninfo: str) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def create(request: Request) -> PlainTextResponse:
        await request.state.idem.conn.execute("INSERT INTO orders (body) VALUES ('a')")
        return PlainTextResponse(str(uuid.uuid4()), status_code=201)

    app = Starlette(routes=[Route("/orders", create, methods=["POST"])])
    app.add_middleware(pg_idem.asgi.IdempotencyMiddleware, conninfo=conninfo, tenant="acme", schema=SCHEMA)
    url, stop = serve_asgi(app)
    try:
        key = new_key()
        first, again = (httpx.post(url + "/orders", headers={"Idempotency-Key": key}) for _ in range(2))
    finally:
        stop()
    assert first.status_code == again.status_code == 201, first.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content


def test_the_django_middleware(conninfo: str) -> None:
    import django_app  # noqa: F401  (configures Django)
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory, override_settings

    def create(request: HttpRequest) -> HttpResponse:
        request.idem.conn.execute("INSERT INTO orders (body) VALUES ('a')")  # type: ignore[attr-defined]
        return HttpResponse(str(uuid.uuid4()), status=201)

    key = new_key()
    with override_settings(IDEM_CONNINFO=conninfo, IDEM_SCHEMA=SCHEMA):
        middleware = pg_idem.django.IdempotencyMiddleware(create)
        first, again = (middleware(RequestFactory().post("/orders", HTTP_IDEMPOTENCY_KEY=key))
                        for _ in range(2))
    assert first.status_code == again.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
