"""The outbox's client side: ``enqueue`` in the caller's transaction, and the ``Dispatcher``.

A dispatcher takes due messages with ``idem_take`` (autocommit: the lease
is committed before anything leaves the process), delivers each (an HTTP
POST or a handler) and records the answer with the attempt ``idem_take``
gave it.  That attempt is the fencing token: a dispatcher whose lease ran
out while it waited for the receiver cannot record over the attempt of the
dispatcher that took the message after it (idem answers 55000).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Union

import psycopg
from psycopg import errors
from psycopg.types.json import Jsonb

from . import _retry
from ._sql import idem_call

Headers = Mapping[str, Union[str, Sequence[str]]]
Payload = Union[bytes, bytearray, memoryview, str, Any]

_ENQUEUE_SQL = {
    kind: "SELECT outcome, id, state, created_at FROM {}(%s, %s, %s, %s::" + kind + ", "
    "headers => %s::jsonb, not_before => %s::timestamptz, ordering_key => %s::text, "
    "max_attempts => %s::integer, redeliver => %s::boolean)"
    for kind in ("bytea", "text", "jsonb")
}
_TAKE_SQL = (
    "SELECT id, tenant, topic, key, payload, headers, attempt, lease_expires_at FROM {}("
    "%s, max_messages => %s::integer, lease => %s::interval, tenant => %s::text)"
)
_DELIVERED_SQL = "SELECT {}(%s::bigint, %s::integer, %s::integer, %s::bytea)"
_DELIVERED_MANY_SQL = "SELECT {}(%s::bigint[], %s::integer[], %s::integer[], %s::bytea[])"
_RETRY_SQL = "SELECT {}(%s::bigint, %s::integer, %s::text, %s::interval)"
_DEAD_SQL = "SELECT {}(%s::bigint, %s::integer, %s::text)"
_PURGE_SQL = "SELECT {}()"

#: How much of a receiver's error body goes into the message's last_error.
_ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class Enqueued:
    """What ``idem_enqueue`` answered.

    ``outcome`` is ``enqueued`` (a new message), ``duplicate`` (the key
    exists with the same payload) or ``mismatch`` (with another payload);
    the last two change nothing.
    """

    outcome: str
    id: int
    state: str
    created_at: datetime


def enqueue(
    conn: psycopg.Connection[Any],
    tenant: str,
    topic: str,
    key: str,
    payload: Payload,
    *,
    headers: Optional[Headers] = None,
    not_before: Optional[datetime] = None,
    ordering_key: Optional[str] = None,
    max_attempts: Optional[int] = None,
    redeliver: bool = True,
    schema: Optional[str] = None,
) -> Enqueued:
    """Write an outbound message in ``conn``'s transaction: it is delivered only if that commits.

    ``payload``: bytes as bytea, str as text, anything else as its JSON
    (jsonb).  ``headers`` go with the message to the receiver (strings or
    lists of strings).  ``schema``: the schema of the extension (default:
    found on the search_path).
    """
    value: Any
    if isinstance(payload, (bytes, bytearray, memoryview)):
        kind, value = "bytea", bytes(payload)
    elif isinstance(payload, str):
        kind, value = "text", payload
    else:
        kind, value = "jsonb", Jsonb(payload)
    row = conn.execute(idem_call(_ENQUEUE_SQL[kind], "idem_enqueue", schema), (
        tenant, topic, key, value, None if headers is None else Jsonb(dict(headers)), not_before,
        ordering_key, max_attempts, redeliver,
    )).fetchone()
    assert row is not None
    return Enqueued(outcome=row[0], id=row[1], state=row[2], created_at=row[3])


@dataclass(frozen=True)
class Message:
    """A message as a handler gets it."""

    id: int
    tenant: str
    topic: str
    key: str
    payload: bytes
    headers: dict[str, Union[str, list[str]]]
    #: 1 on the first take, one more on each: the fencing token of this lease
    attempt: int
    lease_expires_at: datetime
    #: ``tenant/topic/key``, the same on every attempt: the receiver's idempotency key
    idempotency_key: str
    #: the ``time.monotonic()`` by which the handler should have answered (the dispatcher's timeout)
    deadline: float


@dataclass(frozen=True)
class Reply:
    """A handler's answer: 2xx (or no status) delivered; 408, 429, 5xx retried; anything else dead."""

    status: Optional[int] = None
    #: stored with a delivered message
    body: Union[bytes, str, None] = None
    #: seconds until a retry (default: idem's backoff)
    retry_after: Optional[float] = None


class _Batch:
    """The successful deliveries of one take, recorded together by one ``idem_delivered_many``.

    Each delivery of the take reports to it once (``done``), with its
    verdict when it is a success the batch records.  The last report flushes
    the batch; so does the take's deadline (``expire``, at ``timeout``
    after the take, inside the lease), so that a slow delivery never keeps
    the others' successes unrecorded until their leases run out; a success
    reported after that is recorded on its own.
    """

    def __init__(self, size: int, flush: Callable[[list[tuple[Message, _Verdict]]], None],
                 seconds: float) -> None:
        self._lock = threading.Lock()
        self._left = size
        self._pending: list[tuple[Message, _Verdict]] = []
        self._closed = False
        self._flush = flush
        self._timer = threading.Timer(seconds, self.expire)
        self._timer.daemon = True
        if size > 0:
            self._timer.start()

    def done(self, message: Message, verdict: Optional[_Verdict]) -> None:
        items: list[tuple[Message, _Verdict]] = []
        with self._lock:
            self._left -= 1
            if verdict is not None:
                if self._closed:
                    items = [(message, verdict)]
                else:
                    self._pending.append((message, verdict))
            if self._left == 0 and not self._closed:
                self._closed = True
                items, self._pending = self._pending, []
                self._timer.cancel()
        if items:
            self._flush(items)

    def expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            items, self._pending = self._pending, []
        if items:
            self._flush(items)


@dataclass(frozen=True)
class _Verdict:
    kind: str  # delivered, retry or dead
    status: Optional[int] = None
    body: Optional[bytes] = None
    error: Optional[str] = None
    after: Optional[timedelta] = None


def _verdict(status: Optional[int], body: Optional[bytes], after: Optional[float]) -> _Verdict:
    """What to record for a receiver's status (3xx included: redirects are not followed), by the
    package's one retry policy (``_retry``): 2xx delivered, 408, 429 and 5xx retried, anything else dead."""
    if status is None or _retry.succeeded(status):
        return _Verdict("delivered", status=status, body=body)
    text = f": {body[:_ERROR_BODY_CHARS * 4].decode('utf-8', 'replace')[:_ERROR_BODY_CHARS]}" if body else ""
    error = f"HTTP {status}{text}"
    if _retry.retryable(status):
        return _Verdict("retry", error=error, after=None if after is None else timedelta(seconds=after))
    return _Verdict("dead", error=error)


def _reply_verdict(reply: Optional[Reply]) -> _Verdict:
    if reply is None:
        return _Verdict("delivered")
    if not isinstance(reply, Reply):
        raise TypeError(f"pg_idem: the handler returned {reply!r}, not a pg_idem.Reply or None")
    status = reply.status
    if status is not None and (not isinstance(status, int) or not 100 <= status <= 599):
        raise TypeError(f"pg_idem: the handler returned status {status!r}, not an HTTP status")
    body = reply.body.encode() if isinstance(reply.body, str) else reply.body
    return _verdict(status, body, reply.retry_after)


class Dispatcher:
    """Delivers one topic's messages: ``run()`` until ``stop()``, or ``run_once()``.

    ``url``: each message is POSTed there (its payload as the body) with
    ``Idempotency-Key: tenant/topic/key`` (the same on every attempt), the
    message's headers and ``Idem-Attempt``.  ``handler``: called with a
    ``Message``, it returns a ``Reply`` or None (delivered); an exception
    is retried.  2xx is recorded as delivered; 408, 429, 5xx, a timeout and
    a connection error are retried (after ``Retry-After`` when given, else
    idem's backoff); any other status is dead.

    ``concurrency`` deliveries run at once, in threads; a take asks for no
    more messages than there are free threads (at most ``batch_size``,
    default ``concurrency``).  ``lease`` is an interval (``"30 seconds"``),
    seconds or a ``timedelta``; ``timeout`` (seconds) must be shorter.
    In url mode it bounds the connection and each wait for the receiver's
    bytes; a handler gets it as ``Message.deadline`` and is waited for, and
    what it returns late is recorded if the lease is still live.  The
    dispatcher ``LISTEN``s on ``idem_outbox`` and takes when a notification
    names its topic, else every ``poll_interval`` seconds.  ``schema``: the
    schema of the extension (default: found on the search_path).
    ``purge_interval`` (seconds; none by default): it also calls
    ``idem_purge()`` that often, on a connection of its own, for a database
    where no background worker purges (idem's SQL edition on a managed
    service, or idem not preloaded); its role needs ``EXECUTE`` on it.

    The successes of one take are recorded together, with one
    ``idem_delivered_many`` (when the take's last delivery finishes, or at
    the latest ``timeout`` after the take), their statuses and bodies
    kept.  Retries and deaths are recorded one by one, as each finishes.
    """

    def __init__(
        self,
        conninfo: str,
        topic: str,
        handler: Optional[Callable[[Message], Optional[Reply]]] = None,
        url: Optional[str] = None,
        *,
        concurrency: int = 4,
        batch_size: Optional[int] = None,
        lease: Union[str, float, timedelta] = "30 seconds",
        timeout: float = 10.0,
        tenant: Optional[str] = None,
        poll_interval: float = 1.0,
        logger: Optional[logging.Logger] = None,
        schema: Optional[str] = None,
        purge_interval: Optional[float] = None,
    ) -> None:
        if (handler is None) == (url is None):
            raise TypeError("pg_idem: give the Dispatcher either handler or url")
        if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"pg_idem: {url!r} is not an http or https URL")
        if not topic:
            raise ValueError("pg_idem: the Dispatcher needs a topic")
        for name, value in (("concurrency", concurrency), ("batch_size", batch_size)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"pg_idem: {name} must be a positive integer, not {value!r}")
        for name, seconds in (("timeout", timeout), ("poll_interval", poll_interval),
                              ("purge_interval", 1.0 if purge_interval is None else purge_interval)):
            if not seconds > 0:
                raise ValueError(f"pg_idem: {name} must be positive, not {seconds!r}")
        self.conninfo = conninfo
        self.topic = topic
        self.handler = handler
        self.url = url
        self.concurrency = concurrency
        self.batch_size = concurrency if batch_size is None else batch_size
        self.lease: Union[str, timedelta] = (
            lease if isinstance(lease, (str, timedelta)) else timedelta(seconds=lease))
        self.timeout = float(timeout)
        self.tenant = tenant
        self.poll_interval = float(poll_interval)
        self.purge_interval = None if purge_interval is None else float(purge_interval)
        self._purge_sql = idem_call(_PURGE_SQL, "idem_purge", schema)
        self.logger = logger or logging.getLogger("pg_idem.dispatcher")
        self._take_sql, self._delivered_sql, self._retry_sql, self._dead_sql, self._delivered_many_sql = (
            idem_call(template, function, schema) for template, function in (
                (_TAKE_SQL, "idem_take"), (_DELIVERED_SQL, "idem_delivered"), (_RETRY_SQL, "idem_retry"),
                (_DEAD_SQL, "idem_dead"), (_DELIVERED_MANY_SQL, "idem_delivered_many")))

        self._lock = threading.Lock()
        self._in_flight = 0
        self._more = False  # more messages may be due: take again when a thread frees
        self._heard = False  # a notification of the topic came during this wait
        self._stopping = threading.Event()
        self._running = False
        # while run() runs: stop() or a freed thread interrupts its wait in select()
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._conn: Optional[psycopg.Connection[Any]] = None
        self._listen: Optional[psycopg.Connection[Any]] = None
        self._lease_checked = False

    # -- running

    def run(self) -> None:
        """Deliver until ``stop()``; returns once the deliveries in flight are recorded.

        A lost connection is logged and made again (every ``poll_interval``
        while the server cannot be reached).
        """
        with self._lock:
            if self._running:
                raise RuntimeError("pg_idem: this Dispatcher is running already")
            if self._stopping.is_set():
                raise RuntimeError("pg_idem: this Dispatcher was stopped; make a new one")
            self._running = True
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"pg-idem {self.topic}")
        purger = None
        if self.purge_interval is not None:
            purger = threading.Thread(target=self._purge_loop, name=f"pg-idem {self.topic} purge")
            purger.start()
        try:
            while not self._stopping.is_set():
                try:
                    self._connect()
                except psycopg.OperationalError as e:
                    self.logger.error("pg_idem dispatcher %s: cannot connect (%s); trying again in %s s",
                                      self.topic, e, self.poll_interval)
                    self._stopping.wait(self.poll_interval)
                    continue
                try:
                    self._step(executor)
                except psycopg.Error as e:
                    assert self._conn is not None and self._listen is not None
                    lost = self._conn.closed or self._listen.closed
                    self.logger.log(logging.WARNING if lost else logging.ERROR, "pg_idem dispatcher %s: %s%s",
                                    self.topic, e, "; connecting again" if lost else "")
                    # a broken connection is made again at once; a statement that failed waits
                    if not lost:
                        self._stopping.wait(self.poll_interval)
        finally:
            if purger is not None:
                purger.join()
            executor.shutdown(wait=True)
            for conn in (self._listen, self._conn):
                if conn is not None:
                    conn.close()
            self._listen = self._conn = None
            with self._lock:
                self._running = False
                wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, None, None
            wake_r.close()
            wake_w.close()

    def _purge_loop(self) -> None:
        """``idem_purge()`` every ``purge_interval`` seconds until ``stop()``; a failure is logged."""
        assert self.purge_interval is not None
        while not self._stopping.wait(self.purge_interval):
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    row = conn.execute(self._purge_sql).fetchone()
                if row is not None and row[0]:
                    self.logger.info("pg_idem dispatcher %s: idem_purge() deleted %s", self.topic, row[0])
            except psycopg.Error as e:
                self.logger.error("pg_idem dispatcher %s: idem_purge() failed: %s", self.topic, e)

    def stop(self) -> None:
        """Stop taking messages (from any thread); ``run()`` returns once those in flight are recorded."""
        self._stopping.set()
        self._wake()

    def run_once(self) -> int:
        """Take one batch (up to ``batch_size``) and deliver it; returns how many were taken."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            self._check_lease(conn)
            rows = conn.execute(
                self._take_sql, (self.topic, self.batch_size, self.lease, self.tenant)).fetchall()
            batch = _Batch(len(rows), lambda items: self._record_many(conn, items), self.timeout)
            with ThreadPoolExecutor(self.concurrency) as executor:
                for row in rows:
                    executor.submit(self._deliver, conn, self._message(row), batch)
        return len(rows)

    def _check_lease(self, conn: psycopg.Connection[Any]) -> None:
        # an answer that comes after the lease ran out cannot be recorded: the
        # message went to another attempt, and the delivery was wasted
        if self._lease_checked:
            return
        row = conn.execute("SELECT extract(epoch FROM %s::interval)::float8", (self.lease,)).fetchone()
        assert row is not None
        if self.timeout >= row[0]:
            raise ValueError(f"pg_idem: the timeout ({self.timeout} s) must be shorter than the lease "
                             f"({self.lease}, {row[0]} s)")
        self._lease_checked = True

    def _connect(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True)
            self._check_lease(self._conn)
        if self._listen is None or self._listen.closed:
            listen = psycopg.connect(self.conninfo, autocommit=True)
            listen.add_notify_handler(self._notified)
            listen.execute("LISTEN idem_outbox")
            self._listen = listen
            self._more = True  # what was enqueued while nobody listened

    def _notified(self, n: psycopg.Notify) -> None:
        if n.channel == "idem_outbox" and n.payload == self.topic:
            self._more = True
            self._heard = True

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w is None:  # run() is not running: nothing to wake
                return
            try:
                self._wake_w.send(b"\0")
            except BlockingIOError:  # the wake-up socket is full: a wake-up is pending anyway
                pass

    def _step(self, executor: ThreadPoolExecutor) -> None:
        """One take if threads are free, then a wait unless more may be due."""
        assert self._conn is not None and self._listen is not None
        with self._lock:
            free = self.concurrency - self._in_flight
        if free > 0:
            # no more than the free threads: a message taken waits for no
            # thread while its lease runs
            n = min(self.batch_size, free)
            self._more = False
            rows = self._conn.execute(self._take_sql, (self.topic, n, self.lease, self.tenant)).fetchall()
            batch = _Batch(len(rows), self._record_many_now, self.timeout)
            for row in rows:
                with self._lock:
                    self._in_flight += 1
                executor.submit(self._run_delivery, self._message(row), batch)
            if len(rows) == n:
                self._more = True
            with self._lock:
                if self._more and self._in_flight < self.concurrency:
                    return
        self._wait()

    def _wait(self) -> None:
        """Until a notification of the topic, a wake-up or the poll interval."""
        assert self._listen is not None and self._wake_r is not None
        end = time.monotonic() + self.poll_interval
        self._heard = False
        while not self._heard:
            left = end - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([self._listen.fileno(), self._wake_r], [], [], left)
            if self._wake_r in ready:
                try:
                    while self._wake_r.recv(64):
                        pass
                except BlockingIOError:
                    pass
                return
            if ready:
                # notifications arrived: a statement reads them, calling
                # _notified (psycopg 3.1's notifies() cannot time out).  LISTEN
                # again changes nothing, and pg_stat_activity keeps showing
                # what the session is for
                self._listen.execute("LISTEN idem_outbox")

    def _run_delivery(self, message: Message, batch: _Batch) -> None:
        try:
            # the connection as it is now: run() replaces a broken one
            conn = self._conn
            assert conn is not None
            self._deliver(conn, message, batch)
        finally:
            with self._lock:
                self._in_flight -= 1
            if self._more:
                self._wake()

    def _message(self, row: Sequence[Any]) -> Message:
        id_, tenant, topic, key, payload, headers, attempt, lease_expires_at = row
        return Message(
            id=id_, tenant=tenant, topic=topic, key=key, payload=bytes(payload), headers=dict(headers or {}),
            attempt=attempt, lease_expires_at=lease_expires_at, idempotency_key=f"{tenant}/{topic}/{key}",
            deadline=time.monotonic() + self.timeout,
        )

    # -- delivering

    def _deliver(self, conn: psycopg.Connection[Any], message: Message, batch: _Batch) -> None:
        """Deliver one message and record the answer (a success with its take's batch); never
        raises."""
        batched: Optional[_Verdict] = None
        try:
            try:
                verdict = self._post(message) if self.url is not None else self._call(message)
            except Exception as e:  # a handler's failure, whatever it is, is worth a retry
                verdict = _Verdict("retry", error=f"{type(e).__name__}: {e}")
            if verdict.kind == "delivered":
                batched = verdict
            else:
                self._record(conn, message, verdict)
        finally:
            batch.done(message, batched)

    def _record_many_now(self, items: list[tuple[Message, _Verdict]]) -> None:
        conn = self._conn
        if conn is None:  # run() is over: cannot happen while deliveries are in flight
            for message, _ in items:
                self.logger.error("pg_idem dispatcher: %s attempt %s: no connection to record its delivery",
                                  message.idempotency_key, message.attempt)
            return
        self._record_many(conn, items)

    def _record_many(self, conn: psycopg.Connection[Any], items: list[tuple[Message, _Verdict]]) -> None:
        """Record a batch of successes with one ``idem_delivered_many``; never raises.

        A stale attempt anywhere makes idem write nothing of the batch (55000):
        then each is recorded on its own, so that the live ones are kept.
        """
        if len(items) == 1:
            self._record(conn, *items[0])
            return
        try:
            conn.execute(self._delivered_many_sql, (
                [m.id for m, _ in items], [m.attempt for m, _ in items], [v.status for _, v in items],
                [v.body for _, v in items]))
        except errors.ObjectNotInPrerequisiteState:
            for message, verdict in items:
                self._record(conn, message, verdict)
            return
        except psycopg.Error as e:
            for message, _ in items:
                self.logger.error("pg_idem dispatcher: %s attempt %s: recording the answer (delivered) "
                                  "failed: %s",
                                  message.idempotency_key, message.attempt, e)
            return
        for message, verdict in items:
            status = "" if verdict.status is None else f" ({verdict.status})"
            self.logger.info("pg_idem dispatcher: %s attempt %s: delivered%s", message.idempotency_key,
                             message.attempt, status)

    def _call(self, message: Message) -> _Verdict:
        assert self.handler is not None
        return _reply_verdict(self.handler(message))

    def _post(self, message: Message) -> _Verdict:
        assert self.url is not None
        request = urllib.request.Request(self.url, data=message.payload, method="POST")
        for name, value in message.headers.items():
            request.add_header(name, value if isinstance(value, str) else ", ".join(value))
        request.add_header("Idempotency-Key", message.idempotency_key)
        request.add_header("Idem-Attempt", str(message.attempt))
        if not request.has_header("Content-type"):  # urllib would send a form's type
            request.add_header("Content-Type", "application/octet-stream")
        try:
            sent = _retry.send(request, self.timeout)
        except ValueError as e:
            # a header HTTP cannot carry (http.client refuses it): no attempt could ever send it
            return _Verdict("dead", error=f"the message cannot be sent: {e}")
        if sent.error is not None:  # a timeout or a network error: retried
            return _Verdict("retry", error=sent.error)
        assert sent.status is not None
        return _verdict(sent.status, sent.body, sent.retry_after)

    def _record(self, conn: psycopg.Connection[Any], message: Message, verdict: _Verdict) -> None:
        """Record a verdict with the message's own attempt; a stale lease is a warning, not an error."""
        who = f"pg_idem dispatcher: {message.idempotency_key} attempt {message.attempt}"
        try:
            if verdict.kind == "delivered":
                conn.execute(self._delivered_sql, (message.id, message.attempt, verdict.status, verdict.body))
                status = "" if verdict.status is None else f" ({verdict.status})"
                self.logger.info("%s: delivered%s", who, status)
            elif verdict.kind == "retry":
                args = (message.id, message.attempt, verdict.error, verdict.after)
                row = conn.execute(self._retry_sql, args).fetchone()
                if row is not None and row[0] == "dead":
                    self.logger.error("%s: dead, its last attempt failed: %s", who, verdict.error)
                else:
                    after = "" if verdict.after is None else f" after {verdict.after.total_seconds()} s"
                    self.logger.warning("%s: to retry%s: %s", who, after, verdict.error)
            else:
                conn.execute(self._dead_sql, (message.id, message.attempt, verdict.error))
                self.logger.error("%s: dead: %s", who, verdict.error)
        except errors.ObjectNotInPrerequisiteState as e:
            self.logger.warning("%s: stale lease, the answer (%s) is not recorded: %s", who, verdict.kind, e)
        except psycopg.Error as e:
            self.logger.error("%s: recording the answer (%s) failed: %s", who, verdict.kind, e)
