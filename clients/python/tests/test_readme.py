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
