"""Trace ids: what the package sets as ``idem.trace`` for a request's transaction."""

from __future__ import annotations

import re
import uuid
from typing import Optional

#: W3C Trace Context, version 00: ``00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>``
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

#: A request id taken as it is: printable ASCII without spaces, 1-255 characters (idem.trace's limit)
_REQUEST_ID = re.compile(r"[!-~]{1,255}")


def trace_from_traceparent(traceparent: Optional[str]) -> Optional[str]:
    """The trace-id of a valid W3C ``traceparent`` header (version 00, lower-case hex, neither the
    trace-id nor the parent-id all zeros), else None."""
    if traceparent is None:
        return None
    m = _TRACEPARENT.fullmatch(traceparent.strip())
    if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
        return None
    return m.group(1)


def trace_id(traceparent: Optional[str] = None, request_id: Optional[str] = None) -> str:
    """The trace id of a request: the trace-id of its ``traceparent`` header when that is valid,
    else its request id (an ``X-Request-Id`` header: printable ASCII, no spaces, 1-255 characters),
    else a new one (``uuid4().hex``)."""
    found = trace_from_traceparent(traceparent)
    if found is not None:
        return found
    if request_id is not None and _REQUEST_ID.fullmatch(request_id.strip()):
        return request_id.strip()
    return uuid.uuid4().hex
