"""The claim context managers, sync and async."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Union

import psycopg
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from . import _http
from ._sql import idem_call

Headers = Mapping[str, Union[str, Sequence[str]]]
Fingerprint = Union[bytes, str, Mapping[str, Any], Sequence[Any], None]

#: Seconds a waiting claim waits when ``wait=True``.
DEFAULT_WAIT = 10.0

logger = logging.getLogger("pg_idem")

_CLAIM_SQL = {
    kind: "SELECT outcome, status, body, headers, attempt, expires_at FROM {}("
    "%s, %s, %s, %s::" + kind + ", wait => %s, lease => %s::interval, wait_timeout => %s::interval)"
    for kind in ("bytea", "text", "jsonb")
}
_COMPLETE_SQL = "SELECT {}(%s, %s, %s, %s, %s::bytea, attempt => %s, headers => %s::jsonb)"
_FAIL_SQL = "SELECT {}(%s, %s, %s, %s, %s::bytea, retryable => %s, attempt => %s, headers => %s::jsonb)"

class IdemError(Exception):
    """An outcome that executes nothing: ``in_progress``, ``mismatch`` or ``unknown``."""

    def __init__(self, outcome: str) -> None:
        super().__init__(f"idem: {outcome}")
        self.outcome = outcome
        self.status_code = 422 if outcome == "mismatch" else 409


@dataclass
class Claim:
    """What ``idem_claim`` answered, and for ``claimed`` the response to store.

    ``outcome`` is ``claimed``, ``replay``, ``in_progress``, ``mismatch`` or
    ``unknown``; the HTTP integrations give a request without a key an
    ``unkeyed`` one (its ``tenant`` and ``key`` are None: nothing is
    claimed, the handler's writes commit in a transaction of their own).
    For ``replay``, ``status``, ``headers`` and ``body`` are the stored
    response.  For ``claimed``, ``conn`` is the connection whose
    transaction holds the claim, and ``respond()`` sets what is stored when
    the block exits.
    """

    outcome: str
    conn: Any
    tenant: Optional[str]
    endpoint: str
    key: Optional[str]
    attempt: Optional[int] = None
    expires_at: Optional[datetime] = None
    status: Optional[int] = None
    headers: dict[str, Union[str, list[str]]] = field(default_factory=dict)
    body: Optional[bytes] = None
    #: for claimed, after the block: "stored", "retryable" or "not_stored" (see ResponseNotStored)
    verdict: Optional[str] = None

    @property
    def replayed(self) -> bool:
        """True for a stored response replayed."""
        return self.outcome == "replay"

    def respond(self, status: int = 200, body: Union[bytes, str, None] = None, headers: Optional[Headers] = None) -> None:
        """Set the response to store for a ``claimed`` key.

        Below 400 it is completed; 400-499 is a business failure, stored and
        replayed; 500 and up rolls the block's writes back and records a
        retryable failure (its status, not its body), so that the next claim
        executes again.
        """
        if self.outcome not in ("claimed", "unkeyed"):
            raise RuntimeError(f"pg_idem: respond() on outcome {self.outcome}")
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"pg_idem: status {status!r} is not an HTTP status")
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.headers = {k: (v if isinstance(v, str) else list(v)) for k, v in (headers or {}).items()}

    def raise_for_outcome(self) -> None:
        """Raise IdemError for in_progress, mismatch and unknown."""
        if self.outcome in ("in_progress", "mismatch", "unknown"):
            raise IdemError(self.outcome)


class ResponseNotStored(Exception):
    """idem refused to store a claimed block's response, e.g. a body over ``idem.max_body_size`` (54000).

    Running the block again would give the same response, refused again: so
    its writes are rolled back and the key holds a failure that is not
    retryable, whose answer every later claim of the key replays: ``status``
    500, ``headers`` and ``body`` (problem+json, code
    ``idempotency-store-failed``).  ``sqlstate`` is the refusal's SQLSTATE,
    ``claim`` the Claim.  It is logged (logger ``pg_idem``) before it is
    raised, once the transaction committed.
    """

    def __init__(self, claim: Claim, cause: psycopg.Error) -> None:
        super().__init__(f"pg_idem: the response to key {claim.key!r} could not be stored: {cause}")
        self.claim = claim
        self.sqlstate = cause.sqlstate
        answer = _http.problem(
            500, "the response could not be stored, so it was not sent and the request's writes were rolled "
            "back; this idempotency key answers this error from now on", "idempotency-store-failed")
        self.status = answer.status
        self.headers = dict(answer.headers)
        self.body = answer.body


def _fingerprint_arg(fingerprint: Fingerprint) -> tuple[str, Any]:
    if fingerprint is None or isinstance(fingerprint, (bytes, bytearray, memoryview)):
        return "bytea", None if fingerprint is None else bytes(fingerprint)
    if isinstance(fingerprint, str):
        return "text", fingerprint
    return "jsonb", Jsonb(fingerprint)


def _wait_args(wait: Union[bool, float]) -> Optional[float]:
    if wait is True:
        return DEFAULT_WAIT
    if not wait:
        return None
    return float(wait)


def _claim_args(tenant: str, endpoint: str, key: str, fp: Any, timeout: Optional[float],
                lease: Optional[float]) -> tuple[Any, ...]:
    return (tenant, endpoint, key, fp, timeout is not None, None if lease is None else f"{lease} seconds",
            None if timeout is None else f"{timeout} seconds")


def _claim_from(row: Any, conn: Any, tenant: str, endpoint: str, key: str) -> Claim:
    outcome, status, body, headers, attempt, expires_at = row
    return Claim(
        outcome=outcome, conn=conn, tenant=tenant, endpoint=endpoint, key=key, attempt=attempt,
        expires_at=expires_at, status=status, headers=dict(headers or {}),
        body=None if body is None else bytes(body),
    )


Statement = tuple[sql.Composed, tuple[Any, ...]]


def _fail(c: Claim, schema: Optional[str], status: int, body: Optional[bytes], retryable: bool,
          headers: Mapping[str, Any]) -> Statement:
    return idem_call(_FAIL_SQL, "idem_fail", schema), (
        c.tenant, c.endpoint, c.key, status, body, retryable, c.attempt, json.dumps(dict(headers)))


def _finish(c: Claim, schema: Optional[str]) -> tuple[Statement, bool]:
    """The statement that stores the block's response; and whether it is a retryable failure (5xx)."""
    status = 200 if c.status is None else c.status
    if status >= 500:
        return _fail(c, schema, status, None, True, {}), True
    if status >= 400:
        return _fail(c, schema, status, c.body, False, c.headers), False
    return (idem_call(_COMPLETE_SQL, "idem_complete", schema),
            (c.tenant, c.endpoint, c.key, status, c.body, c.attempt, json.dumps(c.headers))), False


def _not_stored(c: Claim, cause: psycopg.Error, schema: Optional[str]) -> tuple[ResponseNotStored, Statement]:
    """Log a refused response; the exception to raise and the failure to record instead."""
    body_size = len(c.body or b"")
    logger.error(
        "pg_idem: the response to %s (key %r, attempt %s, status %s, body %d bytes) could not be stored: "
        "%s (SQLSTATE %s); its writes are rolled back and the key answers 500 from now on",
        c.endpoint, c.key, c.attempt, c.status, body_size, cause.diag.message_primary or cause,
        cause.sqlstate,
        extra={"idempotency_key": c.key, "tenant": c.tenant, "endpoint": c.endpoint, "attempt": c.attempt,
               "sqlstate": cause.sqlstate, "status": c.status, "body_size": body_size})
    error = ResponseNotStored(c, cause)
    c.verdict = "not_stored"
    return error, _fail(c, schema, error.status, error.body, False, error.headers)


@contextmanager
def claim(
    conn: psycopg.Connection[Any],
    tenant: str,
    endpoint: str,
    key: str,
    fingerprint: Fingerprint = None,
    *,
    wait: Union[bool, float] = False,
    lease: Optional[float] = None,
    schema: Optional[str] = None,
) -> Iterator[Claim]:
    """Claim a key in a transaction of ``conn``; yield the Claim.

    The block runs inside the claim's transaction (``conn.transaction()``: a
    transaction of its own, or a savepoint of the caller's).  For
    ``claimed``: when the block exits normally the response set by
    ``respond()`` (default 200, no body) is stored and the transaction
    commits; when it raises, its writes roll back, a retryable failure is
    recorded (the next claim executes again) and the exception propagates.
    When idem refuses to store the response, ``ResponseNotStored`` is
    raised after the commit.  ``fingerprint``: bytes (bytea), str (text) or
    a JSON document (jsonb, canonical).  ``wait``: True (10 s) or seconds to
    wait for another holder of the key; ``lease`` in seconds.  ``schema``:
    the schema of the extension (default: found on the search_path).
    """
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    error: Optional[Exception] = None
    with conn.transaction():
        try:
            with conn.transaction():
                previous = None
                if timeout is not None:
                    previous = conn.execute(
                        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                        (f"{int(timeout * 1000)}ms",)).fetchone()[0]
                row = conn.execute(idem_call(_CLAIM_SQL[kind], "idem_claim", schema),
                                   _claim_args(tenant, endpoint, key, fp, timeout, lease)).fetchone()
                if previous is not None:
                    conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
        except errors.LockNotAvailable:
            row = ("in_progress", None, None, None, None, None)
        c = _claim_from(row, conn, tenant, endpoint, key)
        if c.outcome != "claimed":
            yield c
            return
        c.status = None
        c.headers = {}
        record: Optional[Statement] = None  # a failure recorded once the block's writes rolled back
        try:
            with conn.transaction() as block:
                yield c
                stored, retryable = _finish(c, schema)
                if retryable:
                    record, c.verdict = stored, "retryable"
                    raise psycopg.Rollback(block)
                try:  # stored with the block's writes, or neither
                    conn.execute(*stored)
                    c.verdict = "stored"
                except psycopg.Error as e:
                    error, record = _not_stored(c, e, schema)
                    raise psycopg.Rollback(block) from None
        except Exception as e:  # the block failed: a system error
            error, record, c.verdict = e, _fail(c, schema, 500, None, True, {}), "retryable"
        if record is not None:
            conn.execute(*record)
    if error is not None:
        raise error


@asynccontextmanager
async def aclaim(
    conn: psycopg.AsyncConnection[Any],
    tenant: str,
    endpoint: str,
    key: str,
    fingerprint: Fingerprint = None,
    *,
    wait: Union[bool, float] = False,
    lease: Optional[float] = None,
    schema: Optional[str] = None,
) -> AsyncIterator[Claim]:
    """``claim`` for a psycopg ``AsyncConnection``: ``async with aclaim(...) as c``."""
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    error: Optional[Exception] = None
    async with conn.transaction():
        try:
            async with conn.transaction():
                previous = None
                if timeout is not None:
                    cur = await conn.execute(
                        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                        (f"{int(timeout * 1000)}ms",))
                    previous = (await cur.fetchone())[0]
                cur = await conn.execute(idem_call(_CLAIM_SQL[kind], "idem_claim", schema),
                                         _claim_args(tenant, endpoint, key, fp, timeout, lease))
                row = await cur.fetchone()
                if previous is not None:
                    await conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
        except errors.LockNotAvailable:
            row = ("in_progress", None, None, None, None, None)
        c = _claim_from(row, conn, tenant, endpoint, key)
        if c.outcome != "claimed":
            yield c
            return
        c.status = None
        c.headers = {}
        record: Optional[Statement] = None
        try:
            async with conn.transaction() as block:
                yield c
                stored, retryable = _finish(c, schema)
                if retryable:
                    record, c.verdict = stored, "retryable"
                    raise psycopg.Rollback(block)
                try:
                    await conn.execute(*stored)
                    c.verdict = "stored"
                except psycopg.Error as e:
                    error, record = _not_stored(c, e, schema)
                    raise psycopg.Rollback(block) from None
        except Exception as e:
            error, record, c.verdict = e, _fail(c, schema, 500, None, True, {}), "retryable"
        if record is not None:
            await conn.execute(*record)
    if error is not None:
        raise error


@contextmanager
def unkeyed(conn: psycopg.Connection[Any], endpoint: str) -> Iterator[Claim]:
    """A request without a key: the block runs in a transaction as a claimed one does, and nothing is claimed.

    The transaction commits when the block exits normally with a status
    (``respond()``) below 500, and rolls back otherwise.
    """
    c = Claim(outcome="unkeyed", conn=conn, tenant=None, endpoint=endpoint, key=None)
    with conn.transaction() as tx:
        yield c
        if c.status is not None and c.status >= 500:
            raise psycopg.Rollback(tx)


@asynccontextmanager
async def aunkeyed(conn: psycopg.AsyncConnection[Any], endpoint: str) -> AsyncIterator[Claim]:
    """``unkeyed`` for a psycopg ``AsyncConnection``."""
    c = Claim(outcome="unkeyed", conn=conn, tenant=None, endpoint=endpoint, key=None)
    async with conn.transaction() as tx:
        yield c
        if c.status is not None and c.status >= 500:
            raise psycopg.Rollback(tx)
