"""pg_idem.request against a local http.server: one key on every attempt, only what may pass retried."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

import pg_idem

Answer = tuple[int, dict[str, str], bytes]


class Service:
    """An HTTP server in a thread answering each request with ``answer(n, request)`` (n from 1)."""

    def __init__(self, answer: Callable[[int, dict[str, Any]], Answer]) -> None:
        self.requests: list[dict[str, Any]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def handle_any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = {"method": self.command, "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": body, "at": time.monotonic()}
                service.requests.append(request)
                status, headers, out = answer(len(service.requests), request)
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:  # the caller gave up waiting
                    pass

            do_POST = do_PUT = do_GET = handle_any  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/charges"
        threading.Thread(target=lambda: self.server.serve_forever(0.05), daemon=True).start()

    def keys(self) -> list[str]:
        return [r["headers"].get("idempotency-key") for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service(request: pytest.FixtureRequest) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(answer: Callable[[int, dict[str, Any]], Answer]) -> Service:
        made.append(Service(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


FAST = {"base_delay": 0.01, "max_delay": 5.0}


def test_two_503_then_201_one_key_on_every_attempt(service: Any) -> None:
    s = service(lambda n, r: (503, {}, b"busy") if n <= 2 else (201, {"Content-Type": "application/json"},
                                                                 b'{"id": 7}'))
    r = pg_idem.request(s.url, body={"amount": 12}, key="charge-7", attempts=5, **FAST)
    assert (r.outcome, r.status, r.body, r.key, r.attempts) == ("succeeded", 201, b'{"id": 7}', "charge-7", 3)
    assert r.json() == {"id": 7} and r.headers["Content-Type"] == "application/json"
    assert s.keys() == ["charge-7"] * 3
    assert {r["body"] for r in s.requests} == {b'{"amount":12}'}
    assert {r["headers"]["content-type"] for r in s.requests} == {"application/json"}
    assert {r["method"] for r in s.requests} == {"POST"}


def test_a_422_is_not_retried(service: Any) -> None:
    s = service(lambda n, r: (422, {}, b"bad amount"))
    r = pg_idem.request(s.url, body=b"x", key="k-422", attempts=5, **FAST)
    assert (r.outcome, r.status, r.body, r.attempts) == ("failed", 422, b"bad amount", 1)
    assert s.keys() == ["k-422"]


@pytest.mark.parametrize("status", [301, 400, 404, 409])
def test_no_other_4xx_nor_a_redirect_is_retried(service: Any, status: int) -> None:
    s = service(lambda n, r: (status, {"Location": "/elsewhere"}, b""))
    r = pg_idem.request(s.url, key="k", attempts=5, **FAST)
    assert (r.outcome, r.status, r.attempts) == ("failed", status, 1)


def test_a_server_that_never_answers_in_time_is_unknown_after_the_attempts(service: Any) -> None:
    def slow(n: int, r: dict[str, Any]) -> Answer:
        time.sleep(1.5)
        return 200, {}, b"too late"

    s = service(slow)
    started = time.monotonic()
    r = pg_idem.request(s.url, body="hello", key="k-slow", attempts=3, timeout=0.3, **FAST)
    assert (r.outcome, r.status, r.body, r.key, r.attempts) == ("unknown", None, None, "k-slow", 3)
    assert r.error == "no answer within 0.3 s"
    assert s.keys() == ["k-slow"] * 3
    assert time.monotonic() - started < 3


def test_a_network_error_is_retried_and_unknown() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    r = pg_idem.request(f"http://127.0.0.1:{port}/x", key="k-net", attempts=2, **FAST)
    assert (r.outcome, r.status, r.attempts) == ("unknown", None, 2)
    assert r.error is not None and "refused" in r.error.lower()


@pytest.mark.parametrize("status", [408, 500, 502, 503, 504])
def test_408_and_5xx_to_the_end_are_unknown(service: Any, status: int) -> None:
    s = service(lambda n, r: (status, {}, f"try {n}".encode()))
    r = pg_idem.request(s.url, key="k", attempts=3, **FAST)
    assert (r.outcome, r.status, r.body, r.attempts) == ("unknown", status, b"try 3", 3)


def test_429_to_the_end_is_failed(service: Any) -> None:
    s = service(lambda n, r: (429, {}, f"slow down {n}".encode()))
    r = pg_idem.request(s.url, key="k", attempts=3, **FAST)
    assert (r.outcome, r.status, r.attempts) == ("failed", 429, 3)


def test_three_identical_answers_stop_early(service: Any) -> None:
    s = service(lambda n, r: (503, {}, b"down for maintenance"))
    r = pg_idem.request(s.url, key="k", attempts=10, **FAST)
    assert (r.outcome, r.status, r.attempts) == ("unknown", 503, 3)
    assert len(s.requests) == 3


def test_retry_after_is_honoured_in_seconds_and_as_a_date(service: Any) -> None:
    s = service(lambda n, r: (503, {"Retry-After": "1"}, b"") if n == 1 else (200, {}, b"ok"))
    r = pg_idem.request(s.url, key="k", attempts=3, **FAST)
    assert r.outcome == "succeeded" and r.attempts == 2
    assert s.requests[1]["at"] - s.requests[0]["at"] >= 0.95
    when = datetime.now(timezone.utc) + timedelta(seconds=2)
    s = service(lambda n, r: (429, {"Retry-After": format_datetime(when, usegmt=True)}, b"")
                if n == 1 else (200, {}, b"ok"))
    r = pg_idem.request(s.url, key="k", attempts=3, **FAST)
    assert r.outcome == "succeeded" and r.attempts == 2
    assert s.requests[1]["at"] - s.requests[0]["at"] >= 0.9


def test_a_retry_after_longer_than_max_delay_stops(service: Any) -> None:
    s = service(lambda n, r: (503, {"Retry-After": "3600"}, b""))
    started = time.monotonic()
    r = pg_idem.request(s.url, key="k", attempts=5, base_delay=0.01, max_delay=2)
    assert (r.outcome, r.status, r.attempts) == ("unknown", 503, 1)
    assert time.monotonic() - started < 1


def test_backoff_grows_with_jitter(service: Any) -> None:
    delays: list[float] = []
    s = service(lambda n, r: (500, {}, f"{n}".encode()))
    r = pg_idem.request(s.url, key="k", attempts=4, base_delay=1.0, max_delay=3.0, sleep=delays.append)
    assert r.attempts == 4 and len(delays) == 3
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0 and 1.5 <= delays[2] <= 3.0


def test_the_key_is_required_before_any_call() -> None:
    with pytest.raises(TypeError):
        pg_idem.request("http://127.0.0.1:9/x")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        pg_idem.request("http://127.0.0.1:9/x", key=None)  # type: ignore[arg-type]
    for bad in ("", "k" * 256):
        with pytest.raises(ValueError):
            pg_idem.request("http://127.0.0.1:9/x", key=bad)
    with pytest.raises(ValueError, match="http or https"):
        pg_idem.request("ftp://127.0.0.1/x", key="k")


def test_headers_methods_and_bodies(service: Any) -> None:
    s = service(lambda n, r: (200, {}, json.dumps(r["headers"]).encode()))
    r = pg_idem.request(s.url, "put", "héllo", {"X-Trace": "t", "Idempotency-Key": "not this one"}, key="mine")
    seen = r.json()
    assert seen["idempotency-key"] == "mine" and seen["x-trace"] == "t"
    assert seen["content-type"] == "text/plain; charset=utf-8"
    assert s.requests[0]["method"] == "PUT" and s.requests[0]["body"] == "héllo".encode()
    r = pg_idem.request(s.url, "GET", key="g")
    assert r.outcome == "succeeded" and s.requests[1]["body"] == b""
