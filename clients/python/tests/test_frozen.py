"""A frozen endpoint (idem_freeze, 0.4.0): 503 with Retry-After and the reason; Frozen from claim and tools."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

import httpx
import psycopg
import pytest
from conftest import new_key, serve_asgi

import pg_idem


@pytest.fixture
def freeze(db: Any) -> Iterator[Callable[[str, str, Optional[str], Optional[datetime]], None]]:
    frozen: list[tuple[str, str]] = []

    def do(tenant: str, endpoint: str, reason: Optional[str], until: Optional[datetime]) -> None:
        db.execute("SELECT idem_freeze(%s, %s, %s, %s)", (tenant, endpoint, reason, until))
        frozen.append((tenant, endpoint))

    yield do
    for tenant, endpoint in frozen:
        db.execute("SELECT idem_thaw(%s, %s)", (tenant, endpoint))


def records(db: Any, tenant: str, endpoint: str) -> int:
    return db.execute("SELECT count(*) FROM idem_list(%s, %s, true, 100000)", (tenant, endpoint)).fetchone()[0]


def check_problem(status: int, headers: Any, body: bytes, reason: Optional[str], retry_after: range) -> None:
    assert status == 503
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["retry-after"]) in retry_after
    p = json.loads(body)
    assert p["status"] == 503 and p["code"] == "idempotency-endpoint-frozen" and p["reason"] == reason
    if reason:
        assert reason in p["detail"]


def test_the_asgi_middleware_answers_503(db: Any, freeze: Any) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    ran: list[str] = []

    async def pay(request: Request) -> PlainTextResponse:
        ran.append(request.headers["idempotency-key"])
        return PlainTextResponse("paid", status_code=201)

    tenant = f"t-{uuid.uuid4()}"
    app = Starlette(routes=[Route("/pay/{id}", pay, methods=["POST"])])
    app.add_middleware(pg_idem.asgi.IdempotencyMiddleware, conninfo="", tenant=tenant)
    url, stop = serve_asgi(app)
    try:
        done = new_key()
        assert httpx.post(url + "/pay/1", headers={"Idempotency-Key": done}).status_code == 201
        freeze(tenant, "POST /pay/{id}", "double charges, INC-42", datetime.now(timezone.utc) + timedelta(seconds=30))
        r = httpx.post(url + "/pay/1", headers={"Idempotency-Key": new_key()})
        check_problem(r.status_code, r.headers, r.content, "double charges, INC-42", range(28, 31))
        again = httpx.post(url + "/pay/1", headers={"Idempotency-Key": done})
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true", "replays still replay"
        freeze(tenant, "POST /pay/{id}", None, None)  # open-ended, no reason: 60 s
        r = httpx.post(url + "/pay/2", headers={"Idempotency-Key": new_key()})
        check_problem(r.status_code, r.headers, r.content, None, range(60, 61))
    finally:
        stop()
    assert ran == [done]
    assert records(db, tenant, "POST /pay/{id}") == 1, "a frozen claim writes nothing"


def test_the_django_middleware_answers_503(db: Any, freeze: Any) -> None:
    import django_app  # noqa: F401  (configures Django)
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory, override_settings

    ran: list[int] = []

    def view(request: HttpRequest) -> HttpResponse:
        ran.append(1)
        return HttpResponse("paid", status=201)

    tenant = f"t-{uuid.uuid4()}"
    freeze(tenant, None, "maintenance", datetime.now(timezone.utc) + timedelta(minutes=5))  # every endpoint
    with override_settings(IDEM_TENANT=lambda request: tenant):
        middleware = pg_idem.django.IdempotencyMiddleware(view)
        r = middleware(RequestFactory().post("/frozen-pay", HTTP_IDEMPOTENCY_KEY=new_key()))
    check_problem(r.status_code, {k.lower(): v for k, v in r.items()}, r.content, "maintenance", range(295, 301))
    assert ran == [] and records(db, tenant, "POST /frozen-pay") == 0


def test_claim_surfaces_frozen(db: Any, freeze: Any) -> None:
    tenant = f"t-{uuid.uuid4()}"
    until = datetime.now(timezone.utc) + timedelta(seconds=90)
    freeze(tenant, "job", "stop the bleeding", until)
    with psycopg.connect("", autocommit=True) as conn:
        with pg_idem.claim(conn, tenant, "job", new_key()) as c:
            assert c.outcome == "frozen"
            assert c.frozen_reason == "stop the bleeding" and abs(c.frozen_until - until) < timedelta(seconds=1)
            with pytest.raises(pg_idem.Frozen) as e:
                c.raise_for_outcome()
    assert isinstance(e.value, pg_idem.IdemError) and e.value.status_code == 503 and e.value.outcome == "frozen"
    assert e.value.reason == "stop the bleeding" and 88 <= e.value.retry_after <= 90
    assert records(db, tenant, "job") == 0


def test_a_tool_raises_frozen_and_spends_nothing(db: Any, freeze: Any) -> None:
    tenant, task, name = f"t-{uuid.uuid4()}", f"task-{uuid.uuid4()}", f"tool-{uuid.uuid4()}"
    db.execute("SELECT idem_budget(%s, %s, 3)", (tenant, task))
    ran: list[int] = []

    @pg_idem.idempotent_tool("", tenant=tenant, name=name, task=task)
    def tool(x: int) -> int:
        ran.append(x)
        return x

    freeze(tenant, f"tool:{name}", "agent loop", None)
    with pytest.raises(pg_idem.Frozen) as e:
        tool(1, idempotency_key=new_key())
    assert e.value.reason == "agent loop" and e.value.until is None and e.value.retry_after == 60
    assert ran == [] and records(db, tenant, f"tool:{name}") == 0
    assert db.execute("SELECT spent FROM idem_budget WHERE tenant = %s", (tenant,)).fetchone()[0] == 0
