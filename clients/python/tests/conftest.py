"""Fixtures: a database with idem (libpq's environment: PGHOST, PGPORT,
PGDATABASE, PGUSER as a superuser), and the example apps served by real
HTTP servers (uvicorn for ASGI, wsgiref for Django) in threads."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any, Callable

import httpx
import psycopg
import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)

SETUP = """
CREATE EXTENSION IF NOT EXISTS idem;
CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY, app text NOT NULL, idem_key text, nonce text NOT NULL);
CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS slow_commit (id serial PRIMARY KEY);
CREATE OR REPLACE FUNCTION slow_commit_trigger() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
DO $$ BEGIN
  CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_trigger();
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
-- a commit that fails with the row's SQLSTATE (40001, 40P01, 23514...), or
-- with a broken connection (code 'terminate': the backend ends itself)
CREATE TABLE IF NOT EXISTS py_failing_commit (id serial PRIMARY KEY, code text NOT NULL);
CREATE OR REPLACE FUNCTION py_failing_commit_trigger() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  IF NEW.code = 'terminate' THEN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); END IF;
  RAISE EXCEPTION 'the commit fails (%)', NEW.code USING ERRCODE = NEW.code;
END $$;
DO $$ BEGIN
  CREATE CONSTRAINT TRIGGER py_failing_commit AFTER INSERT ON py_failing_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION py_failing_commit_trigger();
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
"""


@pytest.fixture(scope="session")
def db() -> psycopg.Connection[Any]:
    conn = psycopg.connect("", autocommit=True)
    conn.execute(SETUP)
    yield conn
    conn.close()


class Gates:
    """Gates a handler waits at until the test opens them (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[str, tuple[threading.Event, threading.Event]] = {}

    def get(self, name: str) -> tuple[threading.Event, threading.Event]:
        with self.lock:
            return self.gates.setdefault(name, (threading.Event(), threading.Event()))

    def arrive_and_wait(self, name: str) -> None:
        reached, opened = self.get(name)
        reached.set()
        if not opened.wait(120):
            raise RuntimeError(f"gate {name} never opened")


class Server:
    def __init__(self, url: str, counts: Counter[str], gates: Gates, errors: list[Exception]) -> None:
        self.url = url
        self.counts = counts
        self.gates = gates
        self.errors = errors  # what the app's on_error hook was given


def free_socket() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def serve_asgi(app: Any) -> tuple[str, Callable[[], None]]:
    import uvicorn

    sock = free_socket()
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def serve_wsgi(app: Any) -> tuple[str, Callable[[], None]]:
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Threading(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = make_server("127.0.0.1", 0, app, server_class=Threading, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_port}", stop


@pytest.fixture(scope="session")
def asgi_server(db: Any) -> Server:
    import asgi_app

    url, stop = serve_asgi(asgi_app.dispatch)
    yield Server(url, asgi_app.counts, asgi_app.gates, asgi_app.errors)
    stop()


@pytest.fixture(scope="session")
def django_server(db: Any) -> Server:
    import django_app

    url, stop = serve_wsgi(django_app.application)
    yield Server(url, django_app.counts, django_app.gates, django_app.errors)
    stop()


@pytest.fixture(params=["asgi", "django"])
def server(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue(f"{request.param}_server")


def post(base: str, path: str, key: str | None = None, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 120) -> httpx.Response:
    h = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        h["idempotency-key"] = key
    import json

    content = body if isinstance(body, (bytes, str)) else json.dumps({"a": 1} if body is None else body)
    return httpx.post(base + path, content=content, headers=h, timeout=timeout)


def until(fn: Callable[[], Any], what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def new_key() -> str:
    return str(uuid.uuid4())
