"""What the HTTP integrations share: the key, the fingerprint, the answers."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any, Optional, Union

#: The longest key idem accepts.
MAX_KEY_LENGTH = 255

#: Headers never stored nor replayed: the server computes them per answer.
NOT_STORED = frozenset({
    "connection", "content-length", "date", "keep-alive", "transfer-encoding", "idempotent-replayed",
    "upgrade", "trailer", "te", "proxy-connection", "server",
})


@dataclass
class Answer:
    """An HTTP answer: status, headers (name, value pairs) and body bytes."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def canonical_json(value: Any) -> str:
    """JSON with keys sorted at every level and no insignificant white space."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_fingerprint(method: str, path: str, body: bytes, content_type: Optional[str] = None) -> bytes:
    """SHA-256 over the method, the path (with its query) and the body, a JSON body in canonical form."""
    data = body
    if body and content_type and "json" in content_type.lower():
        try:
            data = canonical_json(json.loads(body)).encode()
        except ValueError:
            data = body
    h = hashlib.sha256(f"{method.upper()}\n{path}\n".encode())
    h.update(data)
    return h.digest()


def problem(status: int, detail: str, code: str, extra: Iterable[tuple[str, str]] = (),
            members: Optional[dict[str, Any]] = None) -> Answer:
    """A problem+json answer (RFC 9457); ``code`` names the case for programs; ``members`` are
    extension members of the problem."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code,
            **(members or {})}
    return Answer(status, [("Content-Type", "application/problem+json"), *extra], json.dumps(body).encode())


def check_key(values: list[str], header: str) -> tuple[Optional[str], Optional[Answer]]:
    """The key of a request's header values (None without one, or for an empty one), or the 400 to answer."""
    if len(values) > 1:
        return None, problem(400, f"send one {header} header, not {len(values)}", "idempotency-key-invalid")
    key = values[0] if values else ""
    if key == "":
        return None, None
    if len(key.encode()) > MAX_KEY_LENGTH:
        return None, problem(
            400, f"the {header} header is longer than {MAX_KEY_LENGTH} characters", "idempotency-key-invalid")
    return key, None


def missing_key(header: str) -> Answer:
    return problem(400, f"this request needs an {header} header", "idempotency-key-missing")


_MESSAGES = {
    "in_progress": ("a request with this idempotency key is in progress", "idempotency-key-in-progress", 409),
    "unknown": (
        "a request with this idempotency key did not finish; it is being reconciled",
        "idempotency-key-unknown", 409),
    "mismatch": ("this idempotency key was used with a different request", "idempotency-key-mismatch", 422),
}


#: Retry-After of a frozen endpoint without an ``until``.
FROZEN_RETRY_AFTER = 60


def frozen_retry_after(until: Optional[datetime]) -> int:
    """Seconds until a freeze ends (at least 1), else ``FROZEN_RETRY_AFTER`` (60)."""
    if until is None:
        return FROZEN_RETRY_AFTER
    if until.tzinfo is None:
        until = until.replace(tzinfo=timezone.utc)
    return max(1, math.ceil((until - datetime.now(timezone.utc)).total_seconds()))


def frozen_answer(reason: Optional[str], until: Optional[datetime]) -> Answer:
    """503 for a frozen endpoint: ``Retry-After`` the seconds until ``until`` (else 60), and a
    problem+json body naming the reason (members ``reason`` and ``until``, null when unknown)."""
    detail = "this endpoint is frozen" + (f" until {until.isoformat()}" if until is not None else "")
    detail += (f": {reason}" if reason else "") + "; nothing was done"
    return problem(503, detail, "idempotency-endpoint-frozen",
                   [("Retry-After", str(frozen_retry_after(until)))],
                   {"reason": reason, "until": None if until is None else until.isoformat()})


def outcome_answer(outcome: str, status: Optional[int], headers: dict[str, Any], body: Optional[bytes],
                   retry_after: int, reason: Optional[str] = None,
                   until: Optional[datetime] = None) -> Answer:
    """The answer to an outcome that executes nothing (``reason`` and ``until``: a freeze's)."""
    if outcome == "frozen":
        return frozen_answer(reason, until)
    if outcome == "replay":
        pairs = [(k, v) for k, v in header_pairs(headers) if k.lower() not in NOT_STORED]
        return Answer(int(status or 200), [*pairs, ("Idempotent-Replayed", "true")], body or b"")
    detail, code, st = _MESSAGES[outcome]
    extra = [("Retry-After", str(retry_after))] if st == 409 else []
    return problem(st, detail, code, extra)


def store_failed_answer(error: Any, retry_after: int) -> Answer:
    """The answer to a ResponseNotStored: with ``Retry-After`` when it may pass (503)."""
    extra = [("Retry-After", str(retry_after))] if error.retryable else []
    return Answer(error.status, [*error.headers.items(), *extra], error.body)


def header_pairs(headers: dict[str, Union[str, list[str]]]) -> list[tuple[str, str]]:
    """A stored headers object as (name, value) pairs."""
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        for v in [value] if isinstance(value, str) else value:
            out.append((name, v))
    return out


def storable_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, Union[str, list[str]]]:
    """(name, value) pairs as idem stores headers, without the ones the server computes."""
    out: dict[str, Union[str, list[str]]] = {}
    for name, value in pairs:
        if name.lower() in NOT_STORED:
            continue
        if name in out:
            prev = out[name]
            out[name] = [*([prev] if isinstance(prev, str) else prev), value]
        else:
            out[name] = value
    return out


def wait_seconds(wait: Union[bool, float, None]) -> Union[bool, float]:
    if wait is True:
        return 10.0
    return float(wait) if wait else False
