"""The README's quickstarts, run as written (but for the database: libpq's environment)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from conftest import new_key, serve_asgi

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def block(marker: str) -> str:
    """The README's python block that holds ``marker``, from the marker on."""
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if marker in b]
    return code[code.index(marker):].replace('"dbname=shop"', '""')


def sent(key: str) -> str:
    return new_key() if key == "new" else key


def orders(db: Any, body: bytes) -> int:
    return db.execute("SELECT count(*) FROM orders WHERE body = %s", (body,)).fetchone()[0]


@pytest.mark.parametrize("key", [None, "", "new"], ids=["no header", "empty header", "a key"])
def test_starlette(db: Any, key: Optional[str]) -> None:
    app: dict[str, Any] = {}
    exec(compile(block("# app.py"), "README.md", "exec"), app)
    url, stop = serve_asgi(app["app"])
    headers = {"x-tenant": "readme"} if key is None else {"x-tenant": "readme", "idempotency-key": sent(key)}
    body = new_key().encode()
    try:
        first, again = (httpx.post(url + "/orders", content=body, headers=headers) for _ in range(2))
    finally:
        stop()
    assert first.status_code == again.status_code == 201, first.text
    assert ("idempotent-replayed" in again.headers) == bool(key)
    assert orders(db, body) == (1 if key else 2)


@pytest.mark.parametrize("key", [None, "", "new"], ids=["no header", "empty header", "a key"])
def test_django(db: Any, key: Optional[str]) -> None:
    import django_app  # noqa: F401  (configures Django)
    from django.test import RequestFactory

    import pg_idem

    views: dict[str, Any] = {}
    exec(compile(block("# views.py"), "README.md", "exec"), views)
    middleware = pg_idem.django.IdempotencyMiddleware(views["create_order"])
    extra = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": sent(key)}
    body = new_key().encode()
    first, again = (middleware(RequestFactory().post("/orders", body, content_type="application/octet-stream",
                                                     **extra)) for _ in range(2))
    assert first.status_code == again.status_code == 201, first.content
    assert again.has_header("Idempotent-Replayed") == bool(key)
    assert orders(db, body) == (1 if key else 2)


def run(marker: str, **replace: str) -> dict[str, Any]:
    code = block(marker)
    for old, new in replace.items():
        assert old in code, old
        code = code.replace(old, new)
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)
    return scope


def test_agent_tools(db: Any) -> None:
    key = new_key()
    scope = run("# tools.py", **{"order-7f3a": key})
    assert scope["first"]["idempotency"] == {"key": key, "replayed": False}
    assert scope["again"]["idempotency"] == {"key": key, "replayed": True}
    assert orders(db, b"2 x tea") >= 1
    (n,) = db.execute("SELECT count(*) FROM orders WHERE id = %s", (scope["first"]["result"]["order_id"],)).fetchone()
    assert n == 1


def test_calling_another_service(capsys: pytest.CaptureFixture[str]) -> None:
    from test_request import Service

    s = Service(lambda n, r: (503, {}, b"") if n == 1 else (201, {"Content-Type": "application/json"},
                                                              b'{"charged": true}'))
    try:
        scope = run("# call.py", **{"http://127.0.0.1:8000/charges": s.url})
    finally:
        s.close()
    assert scope["r"].outcome == "succeeded" and scope["r"].attempts == 2
    assert [r["headers"]["idempotency-key"] for r in s.requests] == ["charge-order-7"] * 2
    assert "201 {'charged': True}" in capsys.readouterr().out


def test_trace_ids_and_logs(db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    try:
        scope = run("# logs.py")
    finally:
        for h in list(logging.getLogger("pg_idem").handlers):
            if type(h).__name__ == "Decisions":
                logging.getLogger("pg_idem").removeHandler(h)
    out = capsys.readouterr().out.splitlines()
    key = scope["key"]
    assert f"claimed 1 POST /orders {key} 4bf92f3577b34da6a3ce929d0e0e4736" in out
    assert f"replay 1 POST /orders {key} 4bf92f3577b34da6a3ce929d0e0e4736" in out


def test_frozen_endpoints(db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run("# frozen.py")
    assert capsys.readouterr().out.startswith("double refunds, INC-42 ")
    assert db.execute("SELECT count(*) FROM idem_frozen('acme', 'POST /refunds')").fetchone()[0] == 0
