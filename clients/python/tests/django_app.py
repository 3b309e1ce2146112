"""The example Django project of the tests (settings, URLs and views in one module)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import django
from django.conf import settings

from conftest import Gates

counts: Counter[str] = Counter()
gates = Gates()
errors: list[Exception] = []

settings.configure(
    DEBUG=False,
    SECRET_KEY="test",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    DATABASES={},
    MIDDLEWARE=["pg_idem.django.IdempotencyMiddleware"],
    IDEM_CONNINFO="",
    IDEM_TENANT=lambda request: request.headers.get("X-Tenant", "acme"),
    IDEM_ON_ERROR=lambda error, request: errors.append(error),
    LOGGING_CONFIG=None,
)
django.setup()

from django.core.exceptions import PermissionDenied  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from pg_idem.django import idempotency  # noqa: E402


def item(request: HttpRequest, id: int) -> HttpResponse:  # noqa: A002
    idem = request.idem  # type: ignore[attr-defined]
    counts[f"item:{request.headers.get('X-Test-Id')}"] += 1
    gate = request.headers.get("X-Gate")
    if gate:
        gates.arrive_and_wait(gate)
    nonce = str(uuid.uuid4())
    (row_id,) = idem.conn.execute(
        "INSERT INTO items (app, idem_key, nonce) VALUES ('django', %s, %s) RETURNING id",
        (idem.key, nonce)).fetchone()
    response = JsonResponse({"id": row_id, "nonce": nonce, "idem": idem.key is not None,
                             "attempt": idem.attempt}, status=201)
    response["Location"] = f"/items/{id}/{row_id}"
    return response


def boom(request: HttpRequest) -> HttpResponse:
    idem = request.idem  # type: ignore[attr-defined]
    name = f"boom:{request.headers.get('X-Test-Id')}"
    counts[name] += 1
    idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('django', %s, 'boom')", (idem.key,))
    if counts[name] == 1:
        raise RuntimeError("the database went away")
    return JsonResponse({"attempt": idem.attempt})


def declined(request: HttpRequest) -> HttpResponse:
    counts[f"declined:{request.headers.get('X-Test-Id')}"] += 1
    raise PermissionDenied("card declined")


def big(request: HttpRequest) -> HttpResponse:
    idem = request.idem  # type: ignore[attr-defined]
    counts[f"big:{request.headers.get('X-Test-Id')}"] += 1
    idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('django', %s, 'big')", (idem.key,))
    idem.conn.execute("SET LOCAL idem.max_body_size = '1kB'")
    return HttpResponse("x" * 2048, content_type="text/plain")


def slow_commit(request: HttpRequest) -> HttpResponse:
    request.idem.conn.execute("INSERT INTO slow_commit DEFAULT VALUES")  # type: ignore[attr-defined]
    return HttpResponse(f"done {uuid.uuid4()}", content_type="text/plain")


def failing_commit(request: HttpRequest) -> HttpResponse:
    """The first run of a test (X-Test-Id) makes its commit fail with X-Fail-Code."""
    idem = request.idem  # type: ignore[attr-defined]
    tid = request.headers.get("X-Test-Id")
    counts[f"failing:{tid}"] += 1
    idem.conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('django', %s, %s)", (idem.key, tid))
    if counts[f"failing:{tid}"] == 1:
        idem.conn.execute("INSERT INTO py_failing_commit (code) VALUES (%s)", (request.headers["X-Fail-Code"],))
    return HttpResponse(f"run {counts[f'failing:{tid}']}", content_type="text/plain")


def body_json(request: HttpRequest) -> Any:
    return json.loads(request.body or b"{}")


urlpatterns = [
    path("items/<int:id>", csrf_exempt(item)),
    path("required/items/<int:id>", idempotency(required=True)(csrf_exempt(item))),
    path("wait/items/<int:id>", idempotency(wait=60)(csrf_exempt(item))),
    path("boom", csrf_exempt(boom)),
    path("declined", csrf_exempt(declined)),
    path("big", csrf_exempt(big)),
    path("slow-commit", csrf_exempt(slow_commit)),
    path("failing-commit", csrf_exempt(failing_commit)),
]

application = get_wsgi_application()
