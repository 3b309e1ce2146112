"""pg_idem.claim and pg_idem.aclaim against a real idem."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from conftest import new_key

import pg_idem


def connect() -> psycopg.Connection[Any]:
    return psycopg.connect("", autocommit=True)


def test_claimed_then_replay(db: Any) -> None:
    key = new_key()
    with connect() as conn:
        with pg_idem.claim(conn, "acme", "job:py", key, fingerprint={"a": 1, "b": 2}) as c:
            assert c.outcome == "claimed" and c.conn is conn
            conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
            c.respond(201, b"\x00created", {"Content-Type": "application/octet-stream"})
        assert c.verdict == "stored"
        with pg_idem.claim(conn, "acme", "job:py", key, fingerprint={"b": 2, "a": 1}) as again:
            assert again.outcome == "replay" and again.replayed
            assert again.status == 201 and again.body == b"\x00created"
            assert again.headers == {"Content-Type": "application/octet-stream"}
    assert db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0] == 1


def test_an_exception_rolls_back_and_the_next_claim_executes(db: Any) -> None:
    key = new_key()
    with connect() as conn:
        with pytest.raises(ZeroDivisionError):
            with pg_idem.claim(conn, "acme", "job:py", key) as c:
                conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
                1 / 0  # noqa: B018
        assert db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0] == 0
        with pg_idem.claim(conn, "acme", "job:py", key) as c2:
            assert c2.outcome == "claimed" and c2.attempt == c.attempt + 1


def test_in_progress_and_mismatch(db: Any) -> None:
    key = new_key()
    with connect() as holder, connect() as conn:
        with holder.transaction():
            holder.execute("SELECT idem_claim('acme', 'job:py', %s, 'one'::text)", (key,))
            with pg_idem.claim(conn, "acme", "job:py", key, "one") as c:
                assert c.outcome == "in_progress"
                with pytest.raises(pg_idem.IdemError) as e:
                    c.raise_for_outcome()
                assert e.value.status_code == 409
        with pg_idem.claim(conn, "acme", "job:py", key, "two") as c:
            assert c.outcome == "mismatch"


def test_a_5xx_response_is_a_retryable_failure(db: Any) -> None:
    key = new_key()
    with connect() as conn:
        with pg_idem.claim(conn, "acme", "job:py", key) as c:
            conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
            c.respond(503, b"later")
        assert c.verdict == "retryable"
        assert db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0] == 0
        with pg_idem.claim(conn, "acme", "job:py", key) as c:
            assert c.outcome == "claimed"


def test_aclaim(db: Any) -> None:
    key = new_key()

    async def main() -> tuple[str, str, bytes | None]:
        async with await psycopg.AsyncConnection.connect("", autocommit=True) as conn:
            async with pg_idem.aclaim(conn, "acme", "job:apy", key, b"fp") as c:
                first = c.outcome
                await conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('apy', %s, 'x')", (key,))
                c.respond(200, "done")
            async with pg_idem.aclaim(conn, "acme", "job:apy", key, b"fp") as again:
                return first, again.outcome, again.body

    assert asyncio.run(main()) == ("claimed", "replay", b"done")


def test_a_response_idem_refuses_to_store_is_logged_and_a_failure_not_retried(
        db: Any, caplog: pytest.LogCaptureFixture) -> None:
    key = new_key()
    with connect() as conn:
        with pytest.raises(pg_idem.ResponseNotStored) as e:
            with pg_idem.claim(conn, "acme", "job:py", key) as c:
                conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
                conn.execute("SET LOCAL idem.max_body_size = '1kB'")
                c.respond(200, b"x" * 2048)
        assert e.value.sqlstate == "54000" and e.value.claim is c and c.verdict == "not_stored"
        assert db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0] == 0
        (log,) = [r for r in caplog.records if getattr(r, "idempotency_key", None) == key]
        assert log.sqlstate == "54000" and log.attempt == c.attempt  # type: ignore[attr-defined]
        with pg_idem.claim(conn, "acme", "job:py", key) as again:
            assert again.outcome == "replay"
            assert (again.status, again.headers, again.body) == (500, e.value.headers, e.value.body)
