"""ASGI middleware (Starlette, FastAPI): ``IdempotencyMiddleware``.

::

    app.add_middleware(IdempotencyMiddleware, conninfo="dbname=shop",
                       tenant=lambda request: request.headers["x-tenant"])

    @app.post("/orders")
    async def create(request: Request):
        conn = request.state.idem.conn          # the claim's transaction
        await conn.execute("INSERT INTO orders ...")
        return JSONResponse({"ok": True}, status_code=201)   # stored, committed, then sent

The response is held back until it is stored and committed, so a retry sent
the instant it arrives gets the replay.  A request without the key (or with
an empty one) is refused when ``required``; else nothing is claimed and the
handler runs the same way, in a transaction of ``request.state.idem.conn``
(``request.state.idem.key`` is None).

The request's transaction gets ``idem.trace`` (``request.state.idem.trace``):
the trace-id of a valid W3C ``traceparent`` header, else an
``X-Request-Id`` header, else a new ``uuid4().hex``.  A frozen endpoint
(``idem_freeze``) answers 503 with ``Retry-After`` and a problem+json body
naming the reason.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Callable, Optional, Union

import psycopg
from starlette.requests import Request
from starlette.routing import Match

from . import _http
from ._claim import Claim, ResponseNotStored, aclaim, aunkeyed
from ._trace import trace_id

logger = logging.getLogger("pg_idem")

Scope = dict[str, Any]
Message = dict[str, Any]


class IdempotencyMiddleware:
    """Idempotency keys for an ASGI app, on a psycopg ``AsyncConnection`` per request.

    ``tenant(request)`` (may be async) names the tenant from the credentials;
    ``required`` makes a missing key a 400; ``wait`` (True or seconds) makes a
    concurrent duplicate wait for the first instead of 409; ``connect`` (an
    async callable returning an autocommit ``AsyncConnection``) replaces
    ``psycopg.AsyncConnection.connect(conninfo, autocommit=True)``;
    ``fingerprint(method, path, body, content_type)`` replaces the default;
    ``schema`` is the schema of the extension (default: found on the
    search_path).  A request that fails is logged to logger ``pg_idem`` and
    answered problem+json: 503 with ``Retry-After`` (``retry_after``) when
    its response could not be stored or its transaction could not commit
    for a reason that may pass (40001, 40P01, a broken connection...),
    nothing recorded; else 500.  ``on_error(error, request)`` (may be
    async) is then called too, e.g. to report it.
    """

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        conninfo: str = "",
        *,
        tenant: Union[str, Callable[[Request], Any]],
        required: bool = False,
        header: str = "Idempotency-Key",
        wait: Union[bool, float] = False,
        lease: Optional[float] = None,
        retry_after: int = 1,
        methods: Iterable[str] = ("POST", "PATCH"),
        fingerprint: Optional[Callable[[str, str, bytes, Optional[str]], Optional[bytes]]] = None,
        connect: Optional[Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]] = None,
        schema: Optional[str] = None,
        on_error: Optional[Callable[[Exception, Request], Any]] = None,
    ) -> None:
        self.app = app
        self.conninfo = conninfo
        self.tenant = tenant
        self.required = required
        self.header = header
        self.wait = _http.wait_seconds(wait)
        self.lease = lease
        self.retry_after = retry_after
        self.methods = {m.upper() for m in methods}
        self.fingerprint = fingerprint or _http.request_fingerprint
        self.connect = connect or (lambda: psycopg.AsyncConnection.connect(self.conninfo, autocommit=True))
        self.schema = schema
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        name = self.header.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name]
        key, bad = _http.check_key(values, self.header)
        if bad is not None:
            await _send(send, bad)
            return
        if key is None and self.required:
            await _send(send, _http.missing_key(self.header))
            return

        request = Request(scope)
        endpoint = f"{scope['method']} {_route_template(scope)}"
        trace = trace_id(request.headers.get("traceparent"), request.headers.get("x-request-id"))
        app_receive = receive
        body = b""
        if key is not None:
            body = await _read_body(receive)
            request._body = body  # the tenant callback may read it
            delivered = False

            async def replay_receive() -> Message:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            app_receive = replay_receive

        start: Optional[Message] = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        @asynccontextmanager
        async def transaction(key: Optional[str]) -> AsyncIterator[Claim]:
            async with await self.connect() as conn:
                if key is None:
                    async with aunkeyed(conn, endpoint, trace) as c:
                        yield c
                else:
                    tenant = self.tenant(request) if callable(self.tenant) else self.tenant
                    if inspect.isawaitable(tenant):
                        tenant = await tenant
                    if not isinstance(tenant, str) or not tenant:
                        raise TypeError("pg_idem: tenant must give a non-empty string")
                    target = scope.get("root_path", "") + scope["path"]
                    if scope.get("query_string"):
                        target += "?" + scope["query_string"].decode("latin-1")
                    fp = self.fingerprint(scope["method"], target, body, request.headers.get("content-type"))
                    async with aclaim(conn, tenant, endpoint, key, fp, wait=self.wait, lease=self.lease,
                                      schema=self.schema, trace=trace) as c:
                        yield c

        answer: Optional[_http.Answer] = None
        try:
            async with transaction(key) as c:
                if c.outcome not in ("claimed", "unkeyed"):
                    answer = _http.outcome_answer(c.outcome, c.status, c.headers, c.body, self.retry_after,
                                                  c.frozen_reason, c.frozen_until)
                else:
                    scope.setdefault("state", {})["idem"] = c
                    await self.app(scope, app_receive, capture)
                    if start is None:
                        raise RuntimeError("pg_idem: the application sent no response")
                    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
                    c.respond(start["status"], b"".join(chunks), _http.storable_headers(pairs))
        except ResponseNotStored as e:  # logged as it was raised
            answer = _http.store_failed_answer(e, self.retry_after)
            await self._report(request, e)
        except Exception as e:
            logger.exception("pg_idem: %s failed (key %r); its writes are rolled back", endpoint, key,
                             extra={"idempotency_key": key, "endpoint": endpoint, "trace_id": trace,
                                    "sqlstate": getattr(e, "sqlstate", None)})
            answer = _http.problem(500, "the request failed; retry it", "internal-error")
            await self._report(request, e)
        if answer is not None:
            await _send(send, answer)
            return
        assert start is not None
        await send(start)
        await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": False})

    async def _report(self, request: Request, error: Exception) -> None:
        if self.on_error is None:
            return
        try:
            done = self.on_error(error, request)
            if inspect.isawaitable(done):
                await done
        except Exception:
            logger.exception("pg_idem: on_error raised")


def _route_template(scope: Scope) -> str:
    """The path template of the route that will serve the request, else the path."""
    app = scope.get("app")
    router = getattr(app, "router", None)
    for route in getattr(router, "routes", []):
        try:
            match, _ = route.matches(scope)
        except Exception:  # a route that cannot judge this scope
            continue
        path = getattr(route, "path", None)
        if match == Match.FULL and isinstance(path, str):
            return path
    return str(scope.get("root_path", "")) + str(scope["path"])


async def _read_body(receive: Callable[[], Awaitable[Message]]) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _send(send: Callable[[Message], Awaitable[None]], answer: _http.Answer) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers]
    headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
