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


def recorded(db: Any, endpoint: str, key: str) -> Any:
    return db.execute("SELECT state, status, retryable FROM idem_list('acme', %s, true, 100000) WHERE key = %s",
                      (endpoint, key)).fetchone()


def count_items(db: Any, key: str) -> int:
    return db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0]


class StoreFails(psycopg.Connection):  # type: ignore[type-arg]
    """A connection whose statement that stores a response runs ``instead`` (a real server error) in its place."""

    instead: str = ""

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:  # type: ignore[override]
        text = query.as_string(self) if isinstance(query, psycopg.sql.Composable) else str(query)
        if self.instead and "idem_complete" in text:
            return super().execute(self.instead)
        return super().execute(query, params, **kw)


@pytest.mark.parametrize("code", ["40001", "40P01"])
def test_a_commit_that_fails_but_may_pass_rolls_everything_back_and_records_nothing(
        db: Any, caplog: pytest.LogCaptureFixture, code: str) -> None:
    key = new_key()
    with connect() as conn:
        with pytest.raises(pg_idem.ResponseNotStored) as e:
            with pg_idem.claim(conn, "acme", "job:py", key) as c:
                conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
                conn.execute("INSERT INTO py_failing_commit (code) VALUES (%s)", (code,))
                c.respond(201, b"made")
        assert e.value.retryable and e.value.sqlstate == code and e.value.status == 503
        assert e.value.claim is c and c.verdict == "rolled_back"
        assert recorded(db, "job:py", key) is None and count_items(db, key) == 0
        (log,) = [r for r in caplog.records if getattr(r, "idempotency_key", None) == key]
        assert log.name == "pg_idem" and log.sqlstate == code  # type: ignore[attr-defined]
        with pg_idem.claim(conn, "acme", "job:py", key) as again:
            assert again.outcome == "claimed"
            again.respond(201, b"made")
        assert recorded(db, "job:py", key)[0] == "succeeded"


def test_aclaim_a_commit_that_fails_but_may_pass_records_nothing(db: Any) -> None:
    key = new_key()

    async def main() -> tuple[pg_idem.ResponseNotStored, str]:
        async with await psycopg.AsyncConnection.connect("", autocommit=True) as conn:
            with pytest.raises(pg_idem.ResponseNotStored) as e:
                async with pg_idem.aclaim(conn, "acme", "job:apy", key):
                    await conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('apy', %s, 'x')", (key,))
                    await conn.execute("INSERT INTO py_failing_commit (code) VALUES ('40001')")
            async with pg_idem.aclaim(conn, "acme", "job:apy", key) as again:
                return e.value, again.outcome

    error, outcome = asyncio.run(main())
    assert error.retryable and error.sqlstate == "40001" and error.claim.verdict == "rolled_back"
    assert outcome == "claimed"
    assert count_items(db, key) == 0


@pytest.mark.parametrize("instead,sqlstate", [
    ("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$", "40P01"),
    ("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)", "57014"),
    ("SELECT pg_terminate_backend(pg_backend_pid())", "57P01"),  # a broken connection
], ids=["deadlock", "statement timeout", "broken connection"])
def test_a_store_that_fails_but_may_pass_rolls_everything_back_and_records_nothing(
        db: Any, instead: str, sqlstate: str) -> None:
    key = new_key()
    with StoreFails.connect("", autocommit=True) as conn:
        conn.instead = instead
        with pytest.raises(pg_idem.ResponseNotStored) as e:
            with pg_idem.claim(conn, "acme", "job:py", key) as c:
                conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
                c.respond(200, b"done")
    assert e.value.retryable and e.value.sqlstate in (sqlstate, None) and c.verdict == "rolled_back"
    assert recorded(db, "job:py", key) is None and count_items(db, key) == 0
    with connect() as conn:
        with pg_idem.claim(conn, "acme", "job:py", key) as again:
            assert again.outcome == "claimed"


def test_a_commit_that_fails_for_good_records_a_final_failure(db: Any) -> None:
    key = new_key()
    with connect() as conn:
        with pytest.raises(pg_idem.ResponseNotStored) as e:
            with pg_idem.claim(conn, "acme", "job:py", key) as c:
                conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
                conn.execute("INSERT INTO py_failing_commit (code) VALUES ('23514')")
        assert not e.value.retryable and e.value.sqlstate == "23514" and e.value.status == 500
        assert c.verdict == "not_stored" and count_items(db, key) == 0
        assert recorded(db, "job:py", key) == ("failed", 500, False)
        with pg_idem.claim(conn, "acme", "job:py", key) as again:
            assert again.outcome == "replay"
            assert (again.status, again.headers, again.body) == (500, e.value.headers, e.value.body)


def test_a_store_that_fails_but_may_pass_in_the_callers_transaction_rolls_back_to_its_savepoint(db: Any) -> None:
    key, other = new_key(), new_key()
    with StoreFails.connect("", autocommit=True) as conn:
        conn.instead = "DO $$ BEGIN RAISE EXCEPTION 'serialization' USING ERRCODE = '40001'; END $$"
        with conn.transaction():
            conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'caller')", (other,))
            with pytest.raises(pg_idem.ResponseNotStored) as e:
                with pg_idem.claim(conn, "acme", "job:py", key) as c:
                    conn.execute("INSERT INTO items (app, idem_key, nonce) VALUES ('py', %s, 'x')", (key,))
            assert e.value.retryable and c.verdict == "rolled_back"
    assert count_items(db, other) == 1, "the caller's transaction goes on"
    assert count_items(db, key) == 0 and recorded(db, "job:py", key) is None
