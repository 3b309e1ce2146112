"""pg_idem.idempotent_tool against a real idem: one run per idempotency_key."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from conftest import new_key, until

import pg_idem

runs: Counter[str] = Counter()


def record(db: Any, tenant: str, endpoint: str, key: str) -> Any:
    return db.execute("SELECT state, retryable, attempt, status FROM idem_list(%s, %s, true, 100000) WHERE key = %s",
                      (tenant, endpoint, key)).fetchone()


def waiting_claims(db: Any) -> int:
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND query LIKE '%%idem_claim%%'").fetchone()[0]


gates: dict[str, tuple[threading.Event, threading.Event]] = {}


@pg_idem.idempotent_tool("", tenant="acme", name="refund")
def refund(order: int, amount: float, note: str = "", gate: str = "") -> dict[str, Any]:
    runs[f"refund:{order}"] += 1
    if gate:
        reached, opened = gates[gate]
        reached.set()
        assert opened.wait(60)
    return {"order": order, "refunded": amount, "run": runs[f"refund:{order}"], "id": str(uuid.uuid4())}


def test_one_key_five_calls_two_of_them_concurrent_run_it_once(db: Any) -> None:
    order, key, gate = 1000 + len(runs), new_key(), new_key()
    gates[gate] = (threading.Event(), threading.Event())
    out: list[Any] = []
    first = threading.Thread(target=lambda: out.append(refund(order, 9.5, gate=gate, idempotency_key=key)))
    first.start()
    assert gates[gate][0].wait(30), "the first call runs the tool"
    before = waiting_claims(db)
    second = threading.Thread(target=lambda: out.append(refund(order, 9.5, gate=gate, idempotency_key=key)))
    second.start()
    until(lambda: waiting_claims(db) > before, "the concurrent repeat to wait for the first")
    gates[gate][1].set()
    first.join(60)
    second.join(60)
    for _ in range(3):
        out.append(refund(order, 9.5, gate=gate, idempotency_key=key))
    assert runs[f"refund:{order}"] == 1
    # the two concurrent calls may return in either order
    assert sorted(r["idempotency"]["replayed"] for r in out) == [False, True, True, True, True]
    assert [r["idempotency"]["replayed"] for r in out[2:]] == [True, True, True]
    assert all(r["idempotency"]["key"] == key for r in out)
    assert all(r["result"] == out[0]["result"] for r in out) and out[0]["result"]["run"] == 1
    assert record(db, "acme", "tool:refund", key)[:2] == ("succeeded", False)


def test_the_key_is_required_and_checked_before_any_database_call() -> None:
    @pg_idem.idempotent_tool("host=/nonexistent port=1", tenant="acme")
    def tool(x: int) -> int:
        raise AssertionError("never runs")

    with pytest.raises(TypeError, match="idempotency_key"):
        tool(1)
    with pytest.raises(TypeError):
        tool(1, idempotency_key=7)
    for bad in ("", "k" * 256, "é" * 200):
        with pytest.raises(ValueError):
            tool(1, idempotency_key=bad)
    with pytest.raises(TypeError):  # arguments the function does not take
        tool(1, 2, idempotency_key="k")
    with pytest.raises(psycopg.OperationalError):  # a good call reaches the database
        tool(1, idempotency_key="k" * 255)


def test_the_signature_shows_the_key() -> None:
    import inspect

    sig = inspect.signature(refund)
    assert sig.parameters["idempotency_key"].kind == inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["idempotency_key"].default is inspect.Parameter.empty
    assert refund.__name__ == "refund"


def test_a_tool_that_raises_is_a_retryable_failure_and_runs_again(db: Any) -> None:
    name, key = f"flaky-{uuid.uuid4()}", new_key()

    @pg_idem.idempotent_tool("", tenant="acme", name=name)
    def flaky(n: int) -> str:
        runs[name] += 1
        if runs[name] == 1:
            raise ConnectionError("the payment service went away")
        return f"done {runs[name]}"

    with pytest.raises(ConnectionError):
        flaky(1, idempotency_key=key)
    assert record(db, "acme", f"tool:{name}", key)[:3] == ("failed", True, 1)
    assert flaky(1, idempotency_key=key) == {"result": "done 2", "idempotency": {"key": key, "replayed": False}}
    assert flaky(1, idempotency_key=key)["idempotency"]["replayed"] is True
    assert runs[name] == 2
    assert record(db, "acme", f"tool:{name}", key)[:3] == ("succeeded", False, 2)


def test_other_arguments_under_the_same_key_are_a_mismatch(db: Any) -> None:
    key = new_key()
    order = 5000 + len(runs)
    refund(order, 1.0, idempotency_key=key)
    assert refund(order, 1.0, "", idempotency_key=key)["idempotency"]["replayed"], "defaults are applied"
    with pytest.raises(pg_idem.IdemError) as e:
        refund(order, 2.0, idempotency_key=key)
    assert e.value.outcome == "mismatch" and e.value.status_code == 422
    assert runs[f"refund:{order}"] == 1


def test_a_budget_is_spent_per_execution_and_a_refused_spend_runs_and_stores_nothing(db: Any) -> None:
    tenant, task = f"t-{uuid.uuid4()}", f"task-{uuid.uuid4()}"
    name = f"mail-{uuid.uuid4()}"
    db.execute("SELECT idem_budget(%s, %s, 2)", (tenant, task))

    @pg_idem.idempotent_tool("", tenant=lambda to, **_: tenant, name=name, task=lambda to, **_: task)
    def send_mail(to: str) -> str:
        runs[name] += 1
        return f"sent to {to}"

    def spent() -> int:
        return db.execute("SELECT spent FROM idem_budget WHERE tenant = %s AND task = %s",
                          (tenant, task)).fetchone()[0]

    k1, k2, k3 = new_key(), new_key(), new_key()
    assert send_mail("a", idempotency_key=k1)["result"] == "sent to a"
    assert spent() == 1
    assert send_mail("a", idempotency_key=k1)["idempotency"]["replayed"]
    assert spent() == 1, "a replay spends nothing"
    send_mail("b", idempotency_key=k2)
    assert spent() == 2
    with pytest.raises(pg_idem.BudgetExhausted) as e:
        send_mail("c", idempotency_key=k3)
    assert e.value.sqlstate == "IB001" and e.value.task == task and e.value.tenant == tenant
    assert isinstance(e.value.__cause__, psycopg.Error) and e.value.__cause__.sqlstate == "IB001"
    assert task in str(e.value)
    assert runs[name] == 2 and spent() == 2
    assert record(db, tenant, f"tool:{name}", k3) is None, "nothing stored"
    db.execute("DELETE FROM idem_budget WHERE tenant = %s", (tenant,))  # a bigger budget: the key runs
    db.execute("SELECT idem_budget(%s, %s, 5)", (tenant, task))
    assert send_mail("c", idempotency_key=k3)["idempotency"]["replayed"] is False
    assert runs[name] == 3


def test_an_async_tool(db: Any) -> None:
    name, key = f"async-{uuid.uuid4()}", new_key()

    @pg_idem.idempotent_tool("", tenant="acme", name=name)
    async def book(room: str) -> dict[str, Any]:
        runs[name] += 1
        await asyncio.sleep(0)
        return {"room": room, "booking": str(uuid.uuid4())}

    @pg_idem.idempotent_tool("", tenant="acme", name=f"{name}-boom")
    async def boom(room: str) -> None:
        runs[f"{name}-boom"] += 1
        raise RuntimeError("no")

    async def main() -> list[Any]:
        first = await book("blue", idempotency_key=key)
        again = await book("blue", idempotency_key=key)
        for _ in range(2):
            with pytest.raises(RuntimeError):
                await boom("blue", idempotency_key=key)
        return [first, again]

    first, again = asyncio.run(main())
    assert first["idempotency"] == {"key": key, "replayed": False}
    assert again == {"result": first["result"], "idempotency": {"key": key, "replayed": True}}
    assert runs[name] == 1 and runs[f"{name}-boom"] == 2


def test_a_tenant_per_argument(db: Any) -> None:
    name, key = f"tenant-{uuid.uuid4()}", new_key()

    @pg_idem.idempotent_tool("", tenant=lambda account, cents: account, name=name)
    def charge(account: str, cents: int) -> int:
        runs[name] += 1
        return cents

    assert charge("acme", 5, idempotency_key=key)["idempotency"]["replayed"] is False
    assert charge("globex", 5, idempotency_key=key)["idempotency"]["replayed"] is False, "tenants are apart"
    assert charge("acme", 5, idempotency_key=key)["idempotency"]["replayed"] is True
    assert runs[name] == 2
