"""The HTTP behaviour of both integrations (ASGI and Django), through real
HTTP servers and clients, against a real idem."""

from __future__ import annotations

import json
import logging
import socket
import threading
from typing import Any

import httpx
import pytest
from conftest import new_key, post, until

import pg_idem
from pg_idem._http import canonical_json


def stored(db: Any, endpoint: str, key: str) -> Any:
    return db.execute(
        "SELECT state, status, attempt, body, headers FROM idem_list('acme', %s, true, 100000) WHERE key = %s",
        (endpoint, key)).fetchone()


def items(db: Any, key: str) -> int:
    return db.execute("SELECT count(*) FROM items WHERE idem_key = %s", (key,)).fetchone()[0]


def assert_problem(r: httpx.Response, status: int) -> None:
    assert r.status_code == status
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["status"] == status and p["type"] == "about:blank"
    assert isinstance(p["title"], str) and isinstance(p["detail"], str)


def test_fresh_then_replay_byte_identical(server: Any, db: Any) -> None:
    key, tid = new_key(), new_key()
    first = post(server.url, "/items/7", key, headers={"x-test-id": tid})
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert first.json()["idem"] is True
    again = post(server.url, "/items/7", key, body='{ "a" : 1 }', headers={"x-test-id": tid})
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content and len(again.content) > 0
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert server.counts[f"item:{tid}"] == 1
    (row,) = [r for r in db.execute(
        "SELECT endpoint, state, body, headers FROM idem_list('acme', NULL, true, 100000) WHERE key = %s", (key,))]
    assert row[0] in ("POST /items/{id}", "POST /items/<int:id>")
    assert row[1] == "succeeded" and bytes(row[2]) == first.content
    names = {h.lower() for h in row[3]}
    assert "location" in names and "content-length" not in names


def test_required_mode_refuses_a_request_without_a_key(server: Any) -> None:
    tid = new_key()
    assert_problem(post(server.url, "/required/items/1", headers={"x-test-id": tid}), 400)
    assert server.counts[f"item:{tid}"] == 0


@pytest.mark.parametrize("key", [None, ""], ids=["no header", "empty header"])
def test_without_a_key_the_handler_runs_in_a_transaction_every_time(server: Any, db: Any, key: Any) -> None:
    tid = new_key()
    a = post(server.url, "/items/1", key, headers={"x-test-id": tid})
    b = post(server.url, "/items/1", key, headers={"x-test-id": tid})
    assert a.status_code == b.status_code == 201, a.text
    assert a.json()["idem"] is False and a.content != b.content
    assert "idempotent-replayed" not in b.headers
    assert server.counts[f"item:{tid}"] == 2
    for r in (a, b):  # committed before the answer was sent
        rows = db.execute("SELECT idem_key FROM items WHERE nonce = %s", (r.json()["nonce"],)).fetchall()
        assert rows == [(None,)]


def test_a_key_longer_than_255_characters_is_refused(server: Any) -> None:
    tid = new_key()
    assert_problem(post(server.url, "/items/1", "k" * 256, headers={"x-test-id": tid}), 400)
    assert server.counts[f"item:{tid}"] == 0
    assert post(server.url, "/items/1", new_key() + "k" * 219).status_code == 201


def test_the_same_key_with_another_body_is_a_mismatch(server: Any) -> None:
    key, tid = new_key(), new_key()
    assert post(server.url, "/items/1", key, body={"a": 1}, headers={"x-test-id": tid}).status_code == 201
    assert_problem(post(server.url, "/items/1", key, body={"a": 2}, headers={"x-test-id": tid}), 422)
    assert server.counts[f"item:{tid}"] == 1


def test_tenants_are_apart(server: Any) -> None:
    key = new_key()
    a = post(server.url, "/items/1", key)
    b = post(server.url, "/items/1", key, headers={"x-tenant": "globex"})
    assert b.status_code == 201 and "idempotent-replayed" not in b.headers and a.content != b.content


def in_thread(fn: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as e:  # reported by the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def result(out: dict[str, Any]) -> Any:
    out["thread"].join(120)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_concurrent_duplicate_gets_409_with_retry_after(server: Any) -> None:
    key, gate = new_key(), new_key()
    first = in_thread(lambda: post(server.url, "/items/1", key, headers={"x-gate": gate}))
    reached, opened = server.gates.get(gate)
    assert reached.wait(60)
    dup = post(server.url, "/items/1", key, headers={"x-gate": gate})
    assert_problem(dup, 409)
    assert dup.headers["retry-after"] == "1"
    opened.set()
    done = result(first)
    assert done.status_code == 201
    again = post(server.url, "/items/1", key)
    assert again.headers["idempotent-replayed"] == "true" and again.content == done.content


def waiting_claims(db: Any) -> int:
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND query LIKE '%%idem_claim%%'").fetchone()[0]


def test_wait_mode_gets_the_replay(server: Any, db: Any) -> None:
    key, gate, tid = new_key(), new_key(), new_key()
    headers = {"x-gate": gate, "x-test-id": tid}
    first = in_thread(lambda: post(server.url, "/wait/items/1", key, headers=headers))
    reached, opened = server.gates.get(gate)
    assert reached.wait(60)
    before = waiting_claims(db)
    dup = in_thread(lambda: post(server.url, "/wait/items/1", key, headers=headers))
    until(lambda: waiting_claims(db) > before, "the duplicate to wait for the claim")
    opened.set()
    a, b = result(first), result(dup)
    assert a.status_code == 201 and "idempotent-replayed" not in a.headers
    assert b.status_code == 201 and b.headers["idempotent-replayed"] == "true"
    assert b.content == a.content
    assert server.counts[f"item:{tid}"] == 1


def test_a_handler_that_raises_gets_500_and_the_retry_runs_again(server: Any, db: Any) -> None:
    key, tid = new_key(), new_key()
    first = post(server.url, "/boom", key, headers={"x-test-id": tid})
    assert_problem(first, 500)
    rec = stored(db, "POST /boom", key)
    assert rec[0] == "failed"
    assert items(db, key) == 0, "the handler's writes were rolled back"
    retry = post(server.url, "/boom", key, headers={"x-test-id": tid})
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
    assert retry.json()["attempt"] == rec[2] + 1
    assert server.counts[f"boom:{tid}"] == 2
    assert items(db, key) == 1


def test_a_handler_that_raises_without_a_key_gets_a_problem_500_and_its_writes_roll_back(
        server: Any, db: Any) -> None:
    tid = new_key()
    booms = "SELECT count(*) FROM items WHERE idem_key IS NULL AND nonce = 'boom'"
    before = db.execute(booms).fetchone()[0]
    assert_problem(post(server.url, "/boom", headers={"x-test-id": tid}), 500)
    assert server.counts[f"boom:{tid}"] == 1
    assert db.execute(booms).fetchone()[0] == before
    assert isinstance(server.errors[-1], RuntimeError)


def test_a_response_too_large_to_store_is_logged_and_answered_alike_without_running_again(
        server: Any, db: Any, caplog: pytest.LogCaptureFixture) -> None:
    key, tid = new_key(), new_key()
    first = post(server.url, "/big", key, headers={"x-test-id": tid})
    assert_problem(first, 500)
    assert first.json()["code"] == "idempotency-store-failed" and "retry it" not in first.json()["detail"]
    (log,) = [r for r in caplog.records if getattr(r, "idempotency_key", None) == key]
    assert log.levelno == logging.ERROR and log.name == "pg_idem"
    assert (log.sqlstate, log.status, log.body_size) == ("54000", 200, 2048)  # type: ignore[attr-defined]
    assert isinstance(server.errors[-1], pg_idem.ResponseNotStored) and server.errors[-1].claim.key == key
    assert items(db, key) == 0, "the handler's writes were rolled back"
    assert stored(db, "POST /big", key)[:2] == ("failed", 500)
    retry = post(server.url, "/big", key, headers={"x-test-id": tid})
    assert retry.status_code == 500 and retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert server.counts[f"big:{tid}"] == 1


def failing_commit(server: Any, key: Any, tid: str, code: str) -> httpx.Response:
    return post(server.url, "/failing-commit", key, headers={"x-test-id": tid, "x-fail-code": code})


def runs(db: Any, tid: str) -> int:
    return db.execute("SELECT count(*) FROM items WHERE nonce = %s", (tid,)).fetchone()[0]


@pytest.mark.parametrize("code", ["40001", "40P01", "55P03", "terminate"])
def test_a_commit_that_fails_but_may_pass_gets_503_with_retry_after_records_nothing_and_the_retry_runs_again(
        server: Any, db: Any, caplog: pytest.LogCaptureFixture, code: str) -> None:
    key, tid = new_key(), new_key()
    first = failing_commit(server, key, tid, code)
    assert_problem(first, 503)
    assert first.headers["retry-after"] == "1"
    assert first.json()["code"] == "idempotency-store-failed"
    sqlstate = "57P01" if code == "terminate" else code  # a broken connection: the backend's last word
    (log,) = [r for r in caplog.records if getattr(r, "idempotency_key", None) == key]
    assert log.levelno == logging.ERROR and log.name == "pg_idem"
    assert log.sqlstate == sqlstate or (code == "terminate" and log.sqlstate is None)  # type: ignore[attr-defined]
    error = server.errors[-1]
    assert isinstance(error, pg_idem.ResponseNotStored) and error.retryable and error.claim.key == key
    assert error.claim.verdict == "rolled_back"
    assert stored(db, "POST /failing-commit", key) is None, "nothing recorded: the claim rolled back too"
    assert runs(db, tid) == 0, "the handler's writes were rolled back"
    retry = failing_commit(server, key, tid, code)
    assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
    assert retry.text == "run 2"
    assert server.counts[f"failing:{tid}"] == 2
    assert stored(db, "POST /failing-commit", key)[0] == "succeeded"
    assert runs(db, tid) == 1


def test_a_commit_without_a_key_that_fails_but_may_pass_gets_503_with_retry_after(
        server: Any, db: Any, caplog: pytest.LogCaptureFixture) -> None:
    tid = new_key()
    first = failing_commit(server, None, tid, "40001")
    assert_problem(first, 503)
    assert first.headers["retry-after"] == "1" and first.json()["code"] == "idempotency-store-failed"
    assert any(getattr(r, "sqlstate", None) == "40001" and r.name == "pg_idem" for r in caplog.records)
    assert isinstance(server.errors[-1], pg_idem.ResponseNotStored) and server.errors[-1].retryable
    assert runs(db, tid) == 0
    retry = failing_commit(server, None, tid, "40001")
    assert retry.status_code == 200 and retry.text == "run 2" and runs(db, tid) == 1


def test_a_commit_that_fails_for_good_is_recorded_as_a_final_failure_and_replayed(
        server: Any, db: Any, caplog: pytest.LogCaptureFixture) -> None:
    key, tid = new_key(), new_key()
    first = failing_commit(server, key, tid, "23514")
    assert_problem(first, 500)
    assert "retry-after" not in first.headers and first.json()["code"] == "idempotency-store-failed"
    assert any(getattr(r, "idempotency_key", None) == key and getattr(r, "sqlstate", None) == "23514"
               for r in caplog.records)
    error = server.errors[-1]
    assert isinstance(error, pg_idem.ResponseNotStored) and not error.retryable and error.sqlstate == "23514"
    assert runs(db, tid) == 0
    assert stored(db, "POST /failing-commit", key)[:2] == ("failed", 500)
    retry = failing_commit(server, key, tid, "23514")
    assert retry.status_code == 500 and retry.headers["idempotent-replayed"] == "true"
    assert retry.content == first.content
    assert server.counts[f"failing:{tid}"] == 1


def test_a_business_error_is_stored_and_replayed(server: Any, db: Any) -> None:
    key, tid = new_key(), new_key()
    first = post(server.url, "/declined", key, headers={"x-test-id": tid})
    assert first.status_code in (402, 403)
    again = post(server.url, "/declined", key, headers={"x-test-id": tid})
    assert again.status_code == first.status_code
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert server.counts[f"declined:{tid}"] == 1
    assert stored(db, "POST /declined", key)[0] == "failed"


def test_a_client_that_disconnects_gets_the_stored_response_on_retry(server: Any, db: Any) -> None:
    key, gate, tid = new_key(), new_key(), new_key()
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"a": 1}).encode()
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(b"POST /items/1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Idempotency-Key: {key}\r\nX-Gate: {gate}\r\nX-Test-Id: {tid}\r\n".encode()
              + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    reached, opened = server.gates.get(gate)
    assert reached.wait(60)
    s.close()  # the client gives up while the handler runs
    opened.set()

    def answered() -> Any:
        r = post(server.url, "/items/1", key, headers={"x-test-id": tid})
        return None if r.status_code == 409 else r

    retry = until(answered, "the first attempt to finish")
    assert retry.status_code == 201
    assert retry.headers["idempotent-replayed"] == "true" and len(retry.content) > 0
    (nonce,) = db.execute("SELECT nonce FROM items WHERE idem_key = %s", (key,)).fetchone()
    assert retry.json()["nonce"] == nonce
    assert server.counts[f"item:{tid}"] == 1


def test_a_retry_sent_when_the_first_answer_arrives_gets_the_replay(server: Any) -> None:
    key = new_key()
    with httpx.Client(timeout=120) as client:
        h = {"idempotency-key": key, "content-type": "application/json"}
        first = client.post(server.url + "/slow-commit", content=b"{}", headers=h)
        retry = client.post(server.url + "/slow-commit", content=b"{}", headers=h)
    assert first.status_code == 200
    assert retry.status_code == 200, f"the retry got {retry.status_code}: the answer was sent before it was stored"
    assert retry.headers["idempotent-replayed"] == "true" and retry.content == first.content


@pytest.mark.parametrize("doc", [{"b": [1, {"y": 2, "x": 1}], "a": "é"}])
def test_canonical_json_ignores_key_order(doc: Any) -> None:
    assert canonical_json(doc) == canonical_json(json.loads(json.dumps(doc, indent=3)))
    assert canonical_json(doc) == '{"a":"é","b":[1,{"x":1,"y":2}]}'
