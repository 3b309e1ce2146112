"""Django middleware: ``IdempotencyMiddleware``, configured by settings ``IDEM_*``.

::

    MIDDLEWARE = [..., "pg_idem.django.IdempotencyMiddleware"]
    IDEM_CONNINFO = "dbname=shop"              # psycopg 3 conninfo ("" : libpq's environment)
    IDEM_TENANT = "shop.auth.tenant_of"        # callable(request) -> str, or its dotted path
    IDEM_REQUIRED = False                      # a request without the key gets 400
    IDEM_HEADER = "Idempotency-Key"
    IDEM_WAIT = False                          # True or seconds: wait for a concurrent duplicate
    IDEM_LEASE = None                          # seconds
    IDEM_RETRY_AFTER = 1
    IDEM_METHODS = ("POST", "PATCH")

The view reaches the claim's transaction as ``request.idem.conn`` (a psycopg
3 connection of its own: Django's ORM connection is another transaction).
``@pg_idem.django.idempotency(required=..., wait=..., lease=..., enabled=...)``
overrides the settings for one view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, TypeVar

import psycopg
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from . import _http
from ._claim import claim

F = TypeVar("F", bound=Callable[..., Any])


def idempotency(**options: Any) -> Callable[[F], F]:
    """Per-view options: ``required``, ``wait``, ``lease``, ``enabled``."""

    def mark(view: F) -> F:
        view.pg_idem_options = options  # type: ignore[attr-defined]
        return view

    return mark


def _answer(answer: _http.Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]
    for name, value in answer.headers:
        if name in response:  # a header sent more than once, as one list
            response[name] = response[name] + ", " + value
        else:
            response[name] = value
    return response


class IdempotencyMiddleware:
    """Idempotency keys for Django views (a psycopg connection per keyed request)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        tenant = getattr(settings, "IDEM_TENANT", None)
        if tenant is None:
            raise ValueError("pg_idem: set IDEM_TENANT to a callable(request) -> str")
        self.tenant = import_string(tenant) if isinstance(tenant, str) else tenant
        self.conninfo: str = getattr(settings, "IDEM_CONNINFO", "")
        self.required: bool = getattr(settings, "IDEM_REQUIRED", False)
        self.header: str = getattr(settings, "IDEM_HEADER", "Idempotency-Key")
        self.wait = getattr(settings, "IDEM_WAIT", False)
        self.lease: Optional[float] = getattr(settings, "IDEM_LEASE", None)
        self.retry_after: int = getattr(settings, "IDEM_RETRY_AFTER", 1)
        self.methods = {m.upper() for m in getattr(settings, "IDEM_METHODS", ("POST", "PATCH"))}

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in self.methods:
            return self.get_response(request)
        try:
            match = resolve(request.path_info)
            options = getattr(match.func, "pg_idem_options", {})
            template = "/" + match.route if match.route else request.path
        except Resolver404:
            options, template = {}, request.path
        if not options.get("enabled", True):
            return self.get_response(request)
        value = request.headers.get(self.header)
        key, bad = _http.check_key([] if value is None else [value], self.header)
        if bad is not None:
            return _answer(bad)
        if key is None:
            if options.get("required", self.required):
                return _answer(_http.missing_key(self.header))
            request.idem = None  # type: ignore[attr-defined]
            return self.get_response(request)

        tenant = self.tenant(request)
        if not isinstance(tenant, str) or not tenant:
            raise TypeError("pg_idem: IDEM_TENANT must give a non-empty string")
        endpoint = f"{request.method} {template}"
        fp = _http.request_fingerprint(request.method or "", request.get_full_path(), request.body,
                                       request.content_type)
        wait = _http.wait_seconds(options.get("wait", self.wait))
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            with claim(conn, tenant, endpoint, key, fp, wait=wait, lease=options.get("lease", self.lease)) as c:
                if c.outcome != "claimed":
                    return _answer(_http.outcome_answer(c.outcome, c.status, c.headers, c.body, self.retry_after))
                request.idem = c  # type: ignore[attr-defined]
                response = self.get_response(request)
                if response.streaming:
                    body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
                    held = HttpResponse(body, status=response.status_code)
                    del held["Content-Type"]
                    for name, v in response.items():
                        held[name] = v
                    response = held
                else:
                    body = response.content
                c.respond(response.status_code, body, _http.storable_headers(response.items()))
        # stored and committed: only now does Django send it
        return response
