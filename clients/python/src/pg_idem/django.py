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
    IDEM_SCHEMA = None                         # the extension's schema (None: found on the search_path)
    IDEM_ON_ERROR = None                       # callable(exception, request), or its dotted path

The view reaches the claim's transaction as ``request.idem.conn`` (a psycopg
3 connection of its own: Django's ORM connection is another transaction).
A request without the key (or with an empty one), when it is not required,
claims nothing and runs the same way, in a transaction of
``request.idem.conn`` (``request.idem.key`` is None).  A view that raises
(but for Django's 4xx exceptions, such as ``Http404``), a database error and
a response that cannot be stored are logged to logger ``pg_idem`` and
answered problem+json: 503 with ``Retry-After`` when the store or the
commit failed for a reason that may pass (40001, 40P01, a broken
connection...), nothing recorded; else 500.  ``IDEM_ON_ERROR`` is then
called too.
``@pg_idem.django.idempotency(required=..., wait=..., lease=..., enabled=...)``
overrides the settings for one view.

The request's transaction gets ``idem.trace`` (``request.idem.trace``): the
trace-id of a valid W3C ``traceparent`` header, else an ``X-Request-Id``
header, else a new ``uuid4().hex``.  A frozen endpoint (``idem_freeze``)
answers 503 with ``Retry-After`` and a problem+json body naming the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional, TypeVar

import psycopg
from django.conf import settings
from django.core import signals
from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from . import _http
from ._claim import Claim, ResponseNotStored, claim, unkeyed
from ._trace import trace_id

logger = logging.getLogger("pg_idem")

#: What Django answers 4xx itself (django.core.handlers.exception.response_for_exception)
_CLIENT_ERRORS = (Http404, PermissionDenied, BadRequest, SuspiciousOperation, MultiPartParserError)

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
    """Idempotency keys for Django views (a psycopg connection per request of ``IDEM_METHODS``)."""

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
        self.schema: Optional[str] = getattr(settings, "IDEM_SCHEMA", None)
        on_error = getattr(settings, "IDEM_ON_ERROR", None)
        self.on_error: Optional[Callable[[Exception, HttpRequest], Any]] = (
            import_string(on_error) if isinstance(on_error, str) else on_error)

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
        if key is None and options.get("required", self.required):
            return _answer(_http.missing_key(self.header))
        endpoint = f"{request.method} {template}"
        try:
            with self._transaction(request, endpoint, key, options) as c:
                if c.outcome not in ("claimed", "unkeyed"):
                    return _answer(_http.outcome_answer(c.outcome, c.status, c.headers, c.body,
                                                        self.retry_after, c.frozen_reason, c.frozen_until))
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
        except ResponseNotStored as e:  # logged as it was raised
            self._report(request, e)
            return _answer(_http.store_failed_answer(e, self.retry_after))
        except Exception as e:
            return self._failed(request, endpoint, key, e)
        # stored and committed: only now does Django send it
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> Optional[HttpResponse]:
        """A view of a request this middleware runs raised: a problem+json 500 (Django answers its 4xx)."""
        c: Optional[Claim] = getattr(request, "idem", None)
        if c is None or isinstance(exception, _CLIENT_ERRORS):
            return None
        signals.got_request_exception.send(sender=None, request=request)
        return self._failed(request, c.endpoint, c.key, exception)

    @contextmanager
    def _transaction(self, request: HttpRequest, endpoint: str, key: Optional[str],
                     options: dict[str, Any]) -> Iterator[Claim]:
        trace = trace_id(request.headers.get("traceparent"), request.headers.get("X-Request-Id"))
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            if key is None:
                with unkeyed(conn, endpoint, trace) as c:
                    yield c
                return
            tenant = self.tenant(request)
            if not isinstance(tenant, str) or not tenant:
                raise TypeError("pg_idem: IDEM_TENANT must give a non-empty string")
            fp = _http.request_fingerprint(request.method or "", request.get_full_path(), request.body,
                                           request.content_type)
            wait = _http.wait_seconds(options.get("wait", self.wait))
            with claim(conn, tenant, endpoint, key, fp, wait=wait, lease=options.get("lease", self.lease),
                       schema=self.schema, trace=trace) as c:
                yield c

    def _failed(self, request: HttpRequest, endpoint: str, key: Optional[str],
                error: Exception) -> HttpResponse:
        logger.error("pg_idem: %s failed (key %r); its writes are rolled back", endpoint, key,
                     exc_info=error, extra={"idempotency_key": key, "endpoint": endpoint,
                                            "sqlstate": getattr(error, "sqlstate", None)})
        self._report(request, error)
        return _answer(_http.problem(500, "the request failed; retry it", "internal-error"))

    def _report(self, request: HttpRequest, error: Exception) -> None:
        if self.on_error is None:
            return
        try:
            self.on_error(error, request)
        except Exception:
            logger.exception("pg_idem: IDEM_ON_ERROR raised")
