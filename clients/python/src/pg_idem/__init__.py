"""pg_idem: idempotency keys on PostgreSQL's idem extension, for psycopg 3.

``claim`` (and ``aclaim`` for an ``AsyncConnection``) is a context manager
around one claim of ``idem_claim``::

    with pg_idem.claim(conn, "acme", "POST /orders", key, fingerprint=body) as c:
        if c.outcome == "claimed":
            conn.execute("INSERT INTO orders ...")
            c.respond(201, body=b'{"id": 7}', headers={"Content-Type": "application/json"})
        elif c.outcome == "replay":
            ...  # c.status, c.headers, c.body: the stored response
        else:
            ...  # in_progress, mismatch, unknown: answer 409 / 422

The integrations are ``pg_idem.asgi`` (Starlette, FastAPI) and
``pg_idem.django``.  The outbox: ``enqueue`` writes a message in the
caller's transaction, a ``Dispatcher`` delivers it::

    pg_idem.enqueue(conn, "acme", "invoices", key, {"order": 7})
    pg_idem.Dispatcher("dbname=shop", "invoices", url="https://billing.example/hooks").run()

An agent's side-effecting tool runs once per ``idempotency_key``
(``idempotent_tool``); a call to another service is retried safely with one
key (``request``)::

    @pg_idem.idempotent_tool("dbname=shop", tenant="acme", task=lambda order, run: run)
    def refund(order: int, run: str) -> dict: ...

    refund(7, run="r-1", idempotency_key="refund-7")   # {"result": ..., "idempotency": {...}}
    pg_idem.request("https://billing.example/charges", body={"n": 1}, key="charge-7").outcome
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._claim import Claim, Frozen, IdemError, ResponseNotStored, aclaim, claim
from ._http import canonical_json, request_fingerprint
from ._outbox import Dispatcher, Enqueued, Message, Reply, enqueue
from ._request import RequestResult, request
from ._tool import BudgetExhausted, ToolResult, idempotent_tool
from ._trace import trace_id

if TYPE_CHECKING:
    from . import asgi, django  # noqa: F401  (pg_idem.asgi, pg_idem.django for type checkers)

__all__ = [
    "Claim", "Frozen", "IdemError", "ResponseNotStored", "aclaim", "claim", "canonical_json",
    "request_fingerprint", "Dispatcher", "Enqueued", "Message", "Reply", "enqueue",
    "RequestResult", "request", "BudgetExhausted", "ToolResult", "idempotent_tool", "trace_id",
]
__version__ = "0.4.0"


def __getattr__(name: str) -> Any:
    """``pg_idem.asgi`` and ``pg_idem.django`` after ``import pg_idem``: imported when first used,
    so that an ASGI application never imports Django, nor a Django one Starlette."""
    if name in ("asgi", "django"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
