"""The caller's side: ``request``, a call to another service with an idempotency key, retried safely."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import _retry
from ._http import MAX_KEY_LENGTH

#: How many identical answers in a row end the attempts early.
IDENTICAL_ANSWERS = 3


@dataclass(frozen=True)
class RequestResult:
    """What ``pg_idem.request`` ended with.

    ``outcome``:

    - ``succeeded``: a 2xx answer;
    - ``failed``: an answer that is not retried (a 4xx but 408 and 429, a
      3xx: redirects are not followed), or 429 to the end when no attempt
      before could have acted (the callee refused every time);
    - ``unknown``: the attempts ran out (or stopped) on a timeout, a network
      error, 408 or 5xx: the callee may have acted.  Call again later with
      the same ``key``, or check.

    ``status``, ``headers`` and ``body`` are the last answer's (None, {} and
    None when the last attempt got none), ``error`` what went wrong on the
    last attempt without an answer (else None), ``attempts`` how many were
    sent, all with the same ``key``.
    """

    outcome: str
    status: Optional[int]
    body: Optional[bytes]
    key: str
    attempts: int
    headers: dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body or b"null")


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"pg_idem: key must be a string, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH or len(key.encode()) > MAX_KEY_LENGTH:
        raise ValueError(f"pg_idem: key must be 1 to {MAX_KEY_LENGTH} characters (and bytes), not {len(key)}")
    return key


def _body(body: Any) -> tuple[Optional[bytes], Optional[str]]:
    """The bytes to send and their default Content-Type."""
    if body is None:
        return None, None
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), "application/octet-stream"
    if isinstance(body, str):
        return body.encode(), "text/plain; charset=utf-8"
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), "application/json"


def request(
    url: str,
    method: str = "POST",
    body: Any = None,
    headers: Optional[Mapping[str, str]] = None,
    *,
    key: str,
    attempts: int = 5,
    timeout: float = 10.0,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> RequestResult:
    """Call ``url`` with ``Idempotency-Key: key`` on every attempt, retrying what may pass.

    ``key`` is required (no key, no call: TypeError, ValueError for an empty
    one or one over 255 characters, before anything is sent).  ``body``:
    bytes as they are (``application/octet-stream``), str as UTF-8
    (``text/plain``), anything else as its JSON (``application/json``), the
    Content-Type unless ``headers`` gives one.  ``timeout`` (seconds)
    bounds the connection and each wait for the server's bytes, per
    attempt.

    Up to ``attempts`` attempts: only a network error, a timeout, 408, 429
    and 5xx are retried, after the answer's ``Retry-After`` (seconds or an
    HTTP-date) when it gives one, else after an exponential backoff with
    jitter (``base_delay`` doubled each attempt, capped at ``max_delay``).
    The attempts stop early after three identical answers in a row (the same
    status and body), and when a ``Retry-After`` asks for more than
    ``max_delay``.  Never raises for an HTTP status, a timeout or a network
    error: see ``RequestResult.outcome``.  (A ValueError for what no attempt
    could send: a URL that is not http or https, a header HTTP cannot carry.)
    """
    key = _check_key(key)
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"pg_idem: attempts must be a positive integer, not {attempts!r}")
    if not timeout > 0:
        raise ValueError(f"pg_idem: timeout must be positive, not {timeout!r}")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"pg_idem: {url!r} is not an http or https URL")
    data, content_type = _body(body)
    given = dict(headers or {})
    if content_type is not None and not any(k.lower() == "content-type" for k in given):
        given["Content-Type"] = content_type
    given = {k: v for k, v in given.items() if k.lower() != "idempotency-key"}
    given["Idempotency-Key"] = key

    last = _retry.Sent()
    may_have_acted = False  # an attempt ended in a way that leaves the callee's action unknown
    same = 0
    sent = 0
    for n in range(1, attempts + 1):
        req = urllib.request.Request(url, data=data, method=method.upper(), headers=given)
        answer = _retry.send(req, timeout)
        sent = n
        if answer.error is not None:
            may_have_acted = True
            same = 0
            delay = _retry.backoff(n, base_delay, max_delay)
        else:
            assert answer.status is not None
            if _retry.succeeded(answer.status) or not _retry.retryable(answer.status):
                last = answer
                break
            if answer.status != 429:
                may_have_acted = True
            repeated = last.error is None and (last.status, last.body) == (answer.status, answer.body)
            same = same + 1 if repeated else 1
            if same >= IDENTICAL_ANSWERS:
                last = answer
                break
            asked = answer.retry_after
            if asked is not None and asked > max_delay:
                last = answer
                break
            delay = asked if asked is not None else _retry.backoff(n, base_delay, max_delay)
        last = answer
        if n < attempts:
            sleep(delay)
    if last.error is None and last.status is not None:
        if _retry.succeeded(last.status):
            outcome = "succeeded"
        elif not _retry.retryable(last.status) or (last.status == 429 and not may_have_acted):
            outcome = "failed"
        else:
            outcome = "unknown"
        return RequestResult(outcome, last.status, last.body, key, sent, last.headers)
    return RequestResult("unknown", None, None, key, sent, {}, last.error)
