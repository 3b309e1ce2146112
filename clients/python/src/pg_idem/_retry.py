"""The retry policy of every HTTP call the package makes (``pg_idem.request`` and the Dispatcher).

One place decides which answers are worth another attempt: a network
error, a timeout, 408, 429 and 5xx; never another 4xx, never a 3xx
(redirects are answers, not followed: urllib would re-send a POST as a
GET).  ``Retry-After`` (seconds or an HTTP-date) is honoured; without it
the delay is an exponential backoff with jitter.
"""

from __future__ import annotations

import random
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import Message as EmailMessage
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from typing import Any, Optional


def retryable(status: int) -> bool:
    """Whether an answer with this status is worth another attempt: 408, 429 and 5xx."""
    return status in (408, 429) or status >= 500


def succeeded(status: int) -> bool:
    """2xx."""
    return 200 <= status <= 299


def retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header: delay-seconds or an HTTP-date (RFC 9110, 10.2.3);
    None if absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:  # Python < 3.10 returns None for a bad date
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def backoff(attempt: int, base: float, cap: float) -> float:
    """The delay after failed attempt ``attempt`` (1, 2, ...): ``base * 2**(attempt-1)`` capped at
    ``cap``, with jitter (a random point of its upper half), so that callers that failed together
    do not retry together."""
    delay = min(cap, base * 2.0 ** max(0, attempt - 1))
    return delay / 2 + random.random() * delay / 2


@dataclass
class Sent:
    """What one HTTP attempt gave: an answer (``status``, ``headers``, ``body``) or an ``error``."""

    status: Optional[int] = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: None for an answer; else what went wrong (no answer within the timeout, a network error)
    error: Optional[str] = None
    timed_out: bool = False

    @property
    def retry_after(self) -> Optional[float]:
        """The answer's Retry-After in seconds (None without one)."""
        for name, value in self.headers.items():
            if name.lower() == "retry-after":
                return retry_after(value)
        return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not followed: urllib would re-send a POST as a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _headers(message: Optional[EmailMessage]) -> dict[str, str]:
    if message is None:
        return {}
    out: dict[str, str] = {}
    for name, value in message.items():
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def send(request: urllib.request.Request, timeout: float) -> Sent:
    """One attempt: never raises for an HTTP status, a timeout or a network error.

    ``timeout`` bounds the connection and each wait for the server's bytes.
    A ``ValueError`` (a header HTTP cannot carry, a bad URL) propagates: no
    attempt could ever send it.
    """
    try:
        with _opener.open(request, timeout=timeout) as response:
            body = response.read()
            return Sent(response.status, _headers(response.headers), body)
    except urllib.error.HTTPError as e:
        try:
            return Sent(e.code, _headers(e.headers), e.read())
        except (OSError, HTTPException):  # the error's body broke off: the status is the answer
            return Sent(e.code, _headers(e.headers), b"")
        finally:
            e.close()
    except (urllib.error.URLError, OSError, HTTPException) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return Sent(error=f"no answer within {timeout} s", timed_out=True)
        return Sent(error=f"{type(reason).__name__}: {reason}")
