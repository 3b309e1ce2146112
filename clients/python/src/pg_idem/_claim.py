"""The claim context managers, sync and async."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Union

import psycopg
from psycopg import errors
from psycopg.types.json import Jsonb

Headers = Mapping[str, Union[str, Sequence[str]]]
Fingerprint = Union[bytes, str, Mapping[str, Any], Sequence[Any], None]

#: Seconds a waiting claim waits when ``wait=True``.
DEFAULT_WAIT = 10.0

_CLAIM_SQL = {
    "bytea": "SELECT outcome, status, body, headers, attempt, expires_at FROM idem_claim("
    "%s, %s, %s, %s::bytea, wait => %s, lease => %s::interval, wait_timeout => %s::interval)",
    "text": "SELECT outcome, status, body, headers, attempt, expires_at FROM idem_claim("
    "%s, %s, %s, %s::text, wait => %s, lease => %s::interval, wait_timeout => %s::interval)",
    "jsonb": "SELECT outcome, status, body, headers, attempt, expires_at FROM idem_claim("
    "%s, %s, %s, %s::jsonb, wait => %s, lease => %s::interval, wait_timeout => %s::interval)",
}
_COMPLETE_SQL = "SELECT idem_complete(%s, %s, %s, %s, %s::bytea, attempt => %s, headers => %s::jsonb)"
_FAIL_SQL = (
    "SELECT idem_fail(%s, %s, %s, %s, %s::bytea, retryable => %s, attempt => %s, headers => %s::jsonb)"
)


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
    ``unknown``.  For ``replay``, ``status``, ``headers`` and ``body`` are the
    stored response.  For ``claimed``, ``conn`` is the connection whose
    transaction holds the claim, and ``respond()`` sets what is stored when
    the block exits.
    """

    outcome: str
    conn: Any
    tenant: str
    endpoint: str
    key: str
    attempt: Optional[int] = None
    expires_at: Optional[datetime] = None
    status: Optional[int] = None
    headers: dict[str, Union[str, list[str]]] = field(default_factory=dict)
    body: Optional[bytes] = None
    #: for claimed: the stored verdict after the block ("stored" or "retryable")
    verdict: Optional[str] = None

    @property
    def replayed(self) -> bool:
        """True for a stored response replayed."""
        return self.outcome == "replay"

    def respond(self, status: int = 200, body: Union[bytes, str, None] = None, headers: Optional[Headers] = None) -> None:
        """Set the response to store for a ``claimed`` key.

        Below 400 it is completed; 400-499 is a business failure, stored and
        replayed; 500 and up rolls the block's writes back and records a
        retryable failure, so that the next claim executes again.
        """
        if self.outcome != "claimed":
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


def _claim_from(row: Any, conn: Any, tenant: str, endpoint: str, key: str) -> Claim:
    outcome, status, body, headers, attempt, expires_at = row
    return Claim(
        outcome=outcome, conn=conn, tenant=tenant, endpoint=endpoint, key=key, attempt=attempt,
        expires_at=expires_at, status=status, headers=dict(headers or {}),
        body=None if body is None else bytes(body),
    )


def _finish_args(c: Claim) -> tuple[str, tuple[Any, ...], bool]:
    """The statement that stores the claim's response; and whether to roll back first."""
    status = 200 if c.status is None else c.status
    headers = json.dumps(c.headers or {})
    if status < 400:
        return _COMPLETE_SQL, (c.tenant, c.endpoint, c.key, status, c.body, c.attempt, headers), False
    retryable = status >= 500
    args = (c.tenant, c.endpoint, c.key, status, c.body, retryable, c.attempt, headers)
    return _FAIL_SQL, args, retryable


def _retryable_args(c: Claim) -> tuple[Any, ...]:
    return (c.tenant, c.endpoint, c.key, 500, None, True, c.attempt, "{}")


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
) -> Iterator[Claim]:
    """Claim a key in a transaction of ``conn``; yield the Claim.

    The block runs inside the claim's transaction (``conn.transaction()``: a
    transaction of its own, or a savepoint of the caller's).  For
    ``claimed``: when the block exits normally the response set by
    ``respond()`` (default 200, no body) is stored and the transaction
    commits; when it raises, its writes roll back, a retryable failure is
    recorded (the next claim executes again) and the exception propagates.
    ``fingerprint``: bytes (bytea), str (text) or a JSON document (jsonb,
    canonical).  ``wait``: True (10 s) or seconds to wait for another holder
    of the key; ``lease`` in seconds.
    """
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    error: Optional[BaseException] = None
    with conn.transaction():
        try:
            with conn.transaction():
                previous = None
                if timeout is not None:
                    previous = conn.execute(
                        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                        (f"{int(timeout * 1000)}ms",)).fetchone()[0]
                row = conn.execute(_CLAIM_SQL[kind], (
                    tenant, endpoint, key, fp, timeout is not None,
                    None if lease is None else f"{lease} seconds",
                    None if timeout is None else f"{timeout} seconds",
                )).fetchone()
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
        try:
            with conn.transaction() as handler:
                yield c
                sql, args, rollback = _finish_args(c)
                if rollback:
                    raise psycopg.Rollback(handler)
        except Exception as e:  # the block failed: a system error
            error = e
            conn.execute(_FAIL_SQL, _retryable_args(c))
            c.verdict = "retryable"
        else:
            conn.execute(sql, args)
            c.verdict = "retryable" if rollback else "stored"
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
) -> AsyncIterator[Claim]:
    """``claim`` for a psycopg ``AsyncConnection``: ``async with aclaim(...) as c``."""
    kind, fp = _fingerprint_arg(fingerprint)
    timeout = _wait_args(wait)
    error: Optional[BaseException] = None
    async with conn.transaction():
        try:
            async with conn.transaction():
                previous = None
                if timeout is not None:
                    cur = await conn.execute(
                        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                        (f"{int(timeout * 1000)}ms",))
                    previous = (await cur.fetchone())[0]
                cur = await conn.execute(_CLAIM_SQL[kind], (
                    tenant, endpoint, key, fp, timeout is not None,
                    None if lease is None else f"{lease} seconds",
                    None if timeout is None else f"{timeout} seconds",
                ))
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
        try:
            async with conn.transaction() as handler:
                yield c
                sql, args, rollback = _finish_args(c)
                if rollback:
                    raise psycopg.Rollback(handler)
        except Exception as e:
            error = e
            await conn.execute(_FAIL_SQL, _retryable_args(c))
            c.verdict = "retryable"
        else:
            await conn.execute(sql, args)
            c.verdict = "retryable" if rollback else "stored"
    if error is not None:
        raise error
