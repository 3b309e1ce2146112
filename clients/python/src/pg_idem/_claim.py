"""The claim context managers, sync and async."""

from __future__ import annotations

import json
import logging
import re
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

_FROZEN_SQL = "SELECT reason, until FROM {}(%s, %s)"
_TRACE_SQL = "SELECT set_config('idem.trace', %s, true)"


class IdemError(Exception):
    """An outcome that executes nothing: ``in_progress``, ``mismatch``, ``unknown`` (or ``frozen``:
    the subclass ``Frozen``).  ``status_code`` is the HTTP status it maps to: 409, 422, (503)."""

    def __init__(self, outcome: str, message: Optional[str] = None) -> None:
        super().__init__(message or f"idem: {outcome}")
        self.outcome = outcome
        self.status_code = {"mismatch": 422, "frozen": 503}.get(outcome, 409)


class Frozen(IdemError):
    """The (tenant, endpoint) is frozen by ``idem_freeze``: nothing was executed, nothing written.

    ``reason`` and ``until`` (a datetime, None when the freeze is open-ended)
    are the freeze's, read with ``idem_frozen(tenant, endpoint)``;
    ``retry_after`` is the seconds until ``until`` (at least 1), else 60.
    """

    def __init__(self, tenant: Optional[str], endpoint: str, reason: Optional[str],
                 until: Optional[datetime]) -> None:
        why = f": {reason}" if reason else ""
        end = f" until {until.isoformat()}" if until is not None else ""
        super().__init__("frozen", f"idem: {endpoint} is frozen{end}{why}")
        self.tenant = tenant
        self.endpoint = endpoint
        self.reason = reason
        self.until = until

    @property
    def retry_after(self) -> int:
        return _http.frozen_retry_after(self.until)


@dataclass
class Claim:
    """What ``idem_claim`` answered, and for ``claimed`` the response to store.

    ``outcome`` is ``claimed``, ``replay``, ``in_progress``, ``mismatch``,
    ``unknown`` or ``frozen`` (``frozen_reason`` and ``frozen_until`` then
    say why and until when, from ``idem_frozen``); the HTTP integrations
    give a request without a key an ``unkeyed`` one (its ``tenant`` and ``key`` are None: nothing is
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
    #: for claimed, after the block: "stored", "retryable" (a retryable failure recorded), "not_stored"
    #: (a final failure recorded) or "rolled_back" (nothing recorded, the claim rolled back; see ResponseNotStored)
    verdict: Optional[str] = None
    #: the trace id set as ``idem.trace`` in the claim's transaction (None: not set)
    trace: Optional[str] = None
    #: for frozen: the freeze's reason and end (None when open-ended)
    frozen_reason: Optional[str] = None
    frozen_until: Optional[datetime] = None

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
        """Raise IdemError for in_progress, mismatch and unknown, Frozen (an IdemError) for frozen."""
        if self.outcome == "frozen":
            raise Frozen(self.tenant, self.endpoint, self.frozen_reason, self.frozen_until)
        if self.outcome in ("in_progress", "mismatch", "unknown"):
            raise IdemError(self.outcome)


class ResponseNotStored(Exception):
    """A claimed block's response could not be stored, or its transaction could not commit.

    Nothing of it was done: the block's writes are rolled back.  ``retryable``
    says which of two cases it is, by the error's SQLSTATE (``sqlstate``,
    None when the error is not the database's, e.g. a broken connection):

    - ``retryable`` True: a failure that may pass (no SQLSTATE, class 08, 40
      such as 40001 or 40P01, 53, 57, 58, or 55P03).  Everything is rolled
      back, the claim too: nothing is recorded under the key and the next
      claim executes again.  ``status`` 503; the HTTP integrations answer it
      with ``Retry-After``.
    - ``retryable`` False: a failure that would come again, e.g. a body over
      ``idem.max_body_size`` (54000).  The key holds a failure that is not
      retryable, whose answer every later claim of the key replays:
      ``status`` 500.

    ``headers`` and ``body`` are the answer (problem+json, code
    ``idempotency-store-failed``), ``claim`` the Claim.  It is logged
    (logger ``pg_idem``) before it is raised.
    """

    def __init__(self, claim: Claim, cause: BaseException, retryable: bool = False) -> None:
        code = _sqlstate(cause)
        what = ("the response could not be stored" if claim.key is not None
                else "the transaction could not be committed")
        super().__init__(f"pg_idem: {what} (key {claim.key!r}): {cause}")
        self.claim = claim
        self.sqlstate = code
        self.retryable = retryable
        if retryable:
            answer = _http.problem(
                503, f"{what}, so it was not sent and the request's writes were rolled back; retry the request",
                "idempotency-store-failed")
        elif claim.key is not None:
            answer = _http.problem(
                500, "the response could not be stored, so it was not sent and the request's writes were rolled "
                "back; this idempotency key answers this error from now on", "idempotency-store-failed")
        else:
            answer = _http.problem(
                500, f"{what} (SQLSTATE {code}), and nothing was done", "idempotency-store-failed")
        self.status = answer.status
        self.headers = dict(answer.headers)
        self.body = answer.body


_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


def _sqlstate(error: BaseException) -> Optional[str]:
    """The SQLSTATE of an error the server raised; None for any other error."""
    code = getattr(error, "sqlstate", None)
    return code if isinstance(code, str) and _SQLSTATE.fullmatch(code) else None


def _transient(error: BaseException) -> bool:
    """Whether a failed store or commit may pass when tried again: no SQLSTATE
    (a broken connection), class 08, 40, 53, 57 or 58, or 55P03 (lock timeout)."""
    code = _sqlstate(error)
    return code is None or code[:2] in ("08", "40", "53", "57", "58") or code == "55P03"


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


def _claim_from(row: Any, conn: Any, tenant: str, endpoint: str, key: str, trace: Optional[str]) -> Claim:
    outcome, status, body, headers, attempt, expires_at = row
    return Claim(
        outcome=outcome, conn=conn, tenant=tenant, endpoint=endpoint, key=key, attempt=attempt,
        expires_at=expires_at, status=status, headers=dict(headers or {}),
        body=None if body is None else bytes(body), trace=trace,
    )


def _log_decision(c: Claim) -> None:
    """One log line per decision (logger ``pg_idem``): INFO for claimed and replay, WARNING for the others."""
    level = logging.INFO if c.outcome in ("claimed", "replay") else logging.WARNING
    logger.log(level, "pg_idem claim: tenant=%r endpoint=%r key=%r outcome=%s attempt=%s trace=%r",
               c.tenant, c.endpoint, c.key, c.outcome, c.attempt, c.trace,
               extra={"idempotency_key": c.key, "tenant": c.tenant, "endpoint": c.endpoint,
                      "outcome": c.outcome, "attempt": c.attempt, "trace_id": c.trace})


def frozen(conn: psycopg.Connection[Any], tenant: str, endpoint: str,
           schema: Optional[str] = None) -> tuple[Optional[str], Optional[datetime]]:
    """The reason and end of the freeze of (tenant, endpoint): ``idem_frozen(tenant, endpoint)``;
    (None, None) when it is not frozen."""
    row = conn.execute(idem_call(_FROZEN_SQL, "idem_frozen", schema), (tenant, endpoint)).fetchone()
    return (None, None) if row is None else (row[0], row[1])


async def afrozen(conn: psycopg.AsyncConnection[Any], tenant: str, endpoint: str,
                  schema: Optional[str] = None) -> tuple[Optional[str], Optional[datetime]]:
    """``frozen`` for a psycopg ``AsyncConnection``."""
    cur = await conn.execute(idem_call(_FROZEN_SQL, "idem_frozen", schema), (tenant, endpoint))
    row = await cur.fetchone()
    return (None, None) if row is None else (row[0], row[1])


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


def _store_failed(c: Claim, cause: BaseException, raised: Optional[BaseException] = None) -> ResponseNotStored:
    """Log a response not stored (a transaction not committed); the exception to raise.

    ``raised``: what the block raised before, logged with its traceback."""
    retryable = _transient(cause)
    code = _sqlstate(cause)
    diag = getattr(cause, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(cause) or type(cause).__name__
    if retryable:
        then = "everything is rolled back, the claim too, and a retry runs it again (503)"
    elif c.key is not None:
        then = "its writes are rolled back and the key answers 500 from now on"
    else:
        then = "its writes are rolled back (500)"
    body_size = len(c.body or b"")
    if c.key is None:
        logger.error(
            "pg_idem: the transaction of %s (no key, status %s) could not be committed: %s (SQLSTATE %s); %s",
            c.endpoint, c.status, message, code, then,
            extra={"idempotency_key": None, "tenant": None, "endpoint": c.endpoint, "attempt": None,
                   "sqlstate": code, "status": c.status, "body_size": body_size, "retryable": retryable})
    else:
        logger.error(
            "pg_idem: the response to %s (key %r, attempt %s, status %s, body %d bytes) could not be stored: "
            "%s (SQLSTATE %s); %s",
            c.endpoint, c.key, c.attempt, c.status, body_size, message, code, then, exc_info=raised,
            extra={"idempotency_key": c.key, "tenant": c.tenant, "endpoint": c.endpoint, "attempt": c.attempt,
                   "sqlstate": code, "status": c.status, "body_size": body_size, "retryable": retryable})
    c.verdict = "rolled_back" if retryable else "not_stored"
    return ResponseNotStored(c, cause, retryable)


def _first(row: Optional[Any]) -> Any:
    assert row is not None
    return row[0]


def _not_stored(c: Claim, cause: BaseException, schema: Optional[str]) -> tuple[ResponseNotStored, Statement]:
    """A refused response (a final failure): the exception to raise and the failure to record instead."""
    error = _store_failed(c, cause)
    return error, _fail(c, schema, error.status, error.body, False, error.headers)


def _record_failed(c: Claim, error: Exception) -> None:
    logger.error("pg_idem: recording that the response to %s (key %r) could not be stored failed; "
                 "the key stays claimable", c.endpoint, c.key, exc_info=error,
                 extra={"idempotency_key": c.key, "tenant": c.tenant, "endpoint": c.endpoint,
                        "sqlstate": _sqlstate(error)})


def _final(c: Claim, row: Any, error: ResponseNotStored, schema: Optional[str]) -> Optional[Statement]:
    """After a final failure that rolled the claim back: claimed again (row), the failure to record."""
    if row is None or row[0] != "claimed":
        return None
    c.attempt = row[4]
    return _fail(c, schema, error.status, error.body, False, error.headers)


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
    trace: Optional[str] = None,
) -> Iterator[Claim]:
    """Claim a key in a transaction of ``conn``; yield the Claim.

    The block runs inside the claim's transaction (``conn.transaction()``: a
    transaction of its own, or a savepoint of the caller's).  For
    ``claimed``: when the block exits normally the response set by
    ``respond()`` (default 200, no body) is stored and the transaction
    commits; when it raises, its writes roll back, a retryable failure is
    recorded (the next claim executes again) and the exception propagates.
    When the response cannot be stored or the transaction cannot commit,
    ``ResponseNotStored`` is raised: for a failure that may pass (40001,
    40P01, a broken connection...) with everything rolled back, the claim
    too (``retryable``); for another (54000...) once a final failure is
    recorded under the key.  ``fingerprint``: bytes (bytea), str (text) or
    a JSON document (jsonb, canonical).  ``wait``: True (10 s) or seconds to
    wait for another holder of the key; ``lease`` in seconds.  ``schema``:
    the schema of the extension (default: found on the search_path).
    ``trace``: a trace id, set as ``idem.trace`` for the claim's
    transaction only (``set_config(..., true)``: it ends with it; inside a
    transaction of the caller's, with the caller's), so that
    idem stores it on the record and logs it with the decision (see
    ``trace_id``).  Each decision is logged to logger ``pg_idem``.  For
    ``frozen`` the Claim's ``frozen_reason`` and ``frozen_until`` are read
    with ``idem_frozen``; ``raise_for_outcome()`` raises ``Frozen``.
    """
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    claim_sql = idem_call(_CLAIM_SQL[kind], "idem_claim", schema)
    error: Optional[Exception] = None
    settling = False  # the block is over: what fails now is storing its outcome, or the commit
    c: Optional[Claim] = None
    try:
        with conn.transaction():
            if trace is not None:
                conn.execute(_TRACE_SQL, (trace,))
            try:
                with conn.transaction():
                    previous = None
                    if timeout is not None:
                        previous = _first(conn.execute(
                            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                            (f"{int(timeout * 1000)}ms",)).fetchone())
                    row = conn.execute(claim_sql, _claim_args(tenant, endpoint, key, fp, timeout, lease)).fetchone()
                    if previous is not None:
                        conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
            except errors.LockNotAvailable:
                row = ("in_progress", None, None, None, None, None)
            c = _claim_from(row, conn, tenant, endpoint, key, trace)
            if c.outcome == "frozen":
                c.frozen_reason, c.frozen_until = frozen(conn, tenant, endpoint, schema)
            _log_decision(c)
            if c.outcome != "claimed":
                yield c
                return
            c.status = None
            c.headers = {}
            record: Optional[Statement] = None  # a failure recorded once the block's writes rolled back
            try:
                with conn.transaction() as block:
                    yield c
                    settling = True
                    stored, retryable = _finish(c, schema)
                    if retryable:
                        record, c.verdict = stored, "retryable"
                        raise psycopg.Rollback(block)
                    conn.execute(*stored)  # stored with the block's writes, or neither
                    c.verdict = "stored"
            except Exception as e:
                if not settling:  # the block failed: a system error
                    settling = True
                    error, record, c.verdict = e, _fail(c, schema, 500, None, True, {}), "retryable"
                elif _transient(e):
                    raise  # everything rolls back, the claim too
                else:  # refused: a final failure, recorded in place of the response
                    error, record = _not_stored(c, e, schema)
            if record is not None:
                conn.execute(*record)
    except Exception as e:
        if not settling or c is None:
            raise
        error = _store_failed(c, e, None if isinstance(error, ResponseNotStored) else error)
        if not error.retryable:  # the commit failed: record the final failure in a transaction of its own
            try:
                with conn.transaction():
                    row = conn.execute(claim_sql, _claim_args(tenant, endpoint, key, fp, None, lease)).fetchone()
                    final = _final(c, row, error, schema)
                    if final is not None:
                        conn.execute(*final)
            except Exception as e2:
                _record_failed(c, e2)
        raise error from e
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
    trace: Optional[str] = None,
) -> AsyncIterator[Claim]:
    """``claim`` for a psycopg ``AsyncConnection``: ``async with aclaim(...) as c``."""
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    claim_sql = idem_call(_CLAIM_SQL[kind], "idem_claim", schema)
    error: Optional[Exception] = None
    settling = False
    c: Optional[Claim] = None
    try:
        async with conn.transaction():
            if trace is not None:
                await conn.execute(_TRACE_SQL, (trace,))
            try:
                async with conn.transaction():
                    previous = None
                    if timeout is not None:
                        cur = await conn.execute(
                            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                            (f"{int(timeout * 1000)}ms",))
                        previous = _first(await cur.fetchone())
                    cur = await conn.execute(claim_sql, _claim_args(tenant, endpoint, key, fp, timeout, lease))
                    row = await cur.fetchone()
                    if previous is not None:
                        await conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
            except errors.LockNotAvailable:
                row = ("in_progress", None, None, None, None, None)
            c = _claim_from(row, conn, tenant, endpoint, key, trace)
            if c.outcome == "frozen":
                c.frozen_reason, c.frozen_until = await afrozen(conn, tenant, endpoint, schema)
            _log_decision(c)
            if c.outcome != "claimed":
                yield c
                return
            c.status = None
            c.headers = {}
            record: Optional[Statement] = None
            try:
                async with conn.transaction() as block:
                    yield c
                    settling = True
                    stored, retryable = _finish(c, schema)
                    if retryable:
                        record, c.verdict = stored, "retryable"
                        raise psycopg.Rollback(block)
                    await conn.execute(*stored)
                    c.verdict = "stored"
            except Exception as e:
                if not settling:
                    settling = True
                    error, record, c.verdict = e, _fail(c, schema, 500, None, True, {}), "retryable"
                elif _transient(e):
                    raise
                else:
                    error, record = _not_stored(c, e, schema)
            if record is not None:
                await conn.execute(*record)
    except Exception as e:
        if not settling or c is None:
            raise
        error = _store_failed(c, e, None if isinstance(error, ResponseNotStored) else error)
        if not error.retryable:
            try:
                async with conn.transaction():
                    cur = await conn.execute(claim_sql, _claim_args(tenant, endpoint, key, fp, None, lease))
                    final = _final(c, await cur.fetchone(), error, schema)
                    if final is not None:
                        await conn.execute(*final)
            except Exception as e2:
                _record_failed(c, e2)
        raise error from e
    if error is not None:
        raise error


@contextmanager
def unkeyed(conn: psycopg.Connection[Any], endpoint: str, trace: Optional[str] = None) -> Iterator[Claim]:
    """A request without a key: the block runs in a transaction as a claimed one does, and nothing is claimed.

    The transaction commits when the block exits normally with a status
    (``respond()``) below 500, and rolls back otherwise.  A commit that
    fails raises ``ResponseNotStored`` (``retryable`` as for a claim).
    """
    c = Claim(outcome="unkeyed", conn=conn, tenant=None, endpoint=endpoint, key=None, trace=trace)
    settling = False
    try:
        with conn.transaction() as tx:
            if trace is not None:
                conn.execute(_TRACE_SQL, (trace,))
            yield c
            settling = True
            if c.status is not None and c.status >= 500:
                raise psycopg.Rollback(tx)
    except Exception as e:
        if not settling:
            raise
        raise _store_failed(c, e) from e


@asynccontextmanager
async def aunkeyed(conn: psycopg.AsyncConnection[Any], endpoint: str,
                   trace: Optional[str] = None) -> AsyncIterator[Claim]:
    """``unkeyed`` for a psycopg ``AsyncConnection``."""
    c = Claim(outcome="unkeyed", conn=conn, tenant=None, endpoint=endpoint, key=None, trace=trace)
    settling = False
    try:
        async with conn.transaction() as tx:
            if trace is not None:
                await conn.execute(_TRACE_SQL, (trace,))
            yield c
            settling = True
            if c.status is not None and c.status >= 500:
                raise psycopg.Rollback(tx)
    except Exception as e:
        if not settling:
            raise
        raise _store_failed(c, e) from e
