"""The example Starlette app of the tests, behind pg_idem's ASGI middleware.

Three apps (plain, required, waiting) under one dispatcher by path prefix.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from conftest import Gates
from pg_idem.asgi import IdempotencyMiddleware

counts: Counter[str] = Counter()
gates = Gates()
errors: list[Exception] = []


async def item(request: Request) -> Response:
    idem = request.state.idem
    counts[f"item:{request.headers.get('x-test-id')}"] += 1
    gate = request.headers.get("x-gate")
    if gate:
        await asyncio.get_running_loop().run_in_executor(None, gates.arrive_and_wait, gate)
    nonce = str(uuid.uuid4())
    cur = await idem.conn.execute(
        "INSERT INTO items (app, idem_key, nonce) VALUES ('asgi', %s, %s) RETURNING id", (idem.key, nonce))
    (row_id,) = await cur.fetchone()
    return JSONResponse(
        {"id": row_id, "nonce": nonce, "idem": idem.key is not None, "attempt": idem.attempt},
        status_code=201, headers={"Location": f"/items/{request.path_params['id']}/{row_id}"})


async def boom(request: Request) -> Response:
    idem = request.state.idem
    counts[f"boom:{request.headers.get('x-test-id')}"] += 1
    await idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('asgi', %s, 'boom')", (idem.key,))
    if counts[f"boom:{request.headers.get('x-test-id')}"] == 1:
        raise RuntimeError("the database went away")
    return JSONResponse({"attempt": idem.attempt})


async def declined(request: Request) -> Response:
    counts[f"declined:{request.headers.get('x-test-id')}"] += 1
    raise HTTPException(402, "card declined")


async def big(request: Request) -> Response:
    idem = request.state.idem
    counts[f"big:{request.headers.get('x-test-id')}"] += 1
    await idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('asgi', %s, 'big')",
                            (idem.key,))
    await idem.conn.execute("SET LOCAL idem.max_body_size = '1kB'")
    return PlainTextResponse("x" * 2048)


async def slow_commit(request: Request) -> Response:
    await request.state.idem.conn.execute("INSERT INTO slow_commit DEFAULT VALUES")
    return PlainTextResponse(f"done {uuid.uuid4()}")


async def failing_commit(request: Request) -> Response:
    """The first run of a test (x-test-id) makes its commit fail with x-fail-code."""
    idem = request.state.idem
    tid = request.headers.get("x-test-id")
    counts[f"failing:{tid}"] += 1
    await idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('asgi', %s, %s)", (idem.key, tid))
    if counts[f"failing:{tid}"] == 1:
        await idem.conn.execute("INSERT INTO py_failing_commit (code) VALUES (%s)",
                                (request.headers["x-fail-code"],))
    return PlainTextResponse(f"run {counts[f'failing:{tid}']}")


def tenant(request: Request) -> str:
    return request.headers.get("x-tenant", "acme")


ROUTES = [
    Route("/items/{id}", item, methods=["POST"]),
    Route("/boom", boom, methods=["POST"]),
    Route("/declined", declined, methods=["POST"]),
    Route("/big", big, methods=["POST"]),
    Route("/slow-commit", slow_commit, methods=["POST"]),
    Route("/failing-commit", failing_commit, methods=["POST"]),
]


def make(**options: Any) -> Starlette:
    app = Starlette(routes=ROUTES)
    app.add_middleware(IdempotencyMiddleware, conninfo="", tenant=tenant,
                       on_error=lambda error, request: errors.append(error), **options)
    return app


plain = make()
required = make(required=True)
waiting = make(wait=60)


async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope.get("path", "")
    for prefix, app in (("/required", required), ("/wait", waiting)):
        if path.startswith(prefix + "/"):
            scope = {**scope, "path": path[len(prefix):], "raw_path": path[len(prefix):].encode()}
            await app(scope, receive, send)
            return
    await plain(scope, receive, send)
