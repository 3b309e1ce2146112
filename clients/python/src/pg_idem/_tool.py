"""Agent tools: ``idempotent_tool``, a function that runs once per ``idempotency_key``."""

from __future__ import annotations

import functools
import inspect
import json
import uuid
from typing import Any, Callable, Optional, Union

import psycopg

from ._claim import Claim, IdemError, ResponseNotStored, _store_failed, aclaim, claim
from ._http import MAX_KEY_LENGTH, canonical_json
from ._sql import idem_call

_SPEND_SQL = "SELECT {}(%s, %s, 1)"

#: SQLSTATE of a spend its budget cannot cover
BUDGET_SQLSTATE = "IB001"

ToolResult = dict[str, Any]
Of = Union[str, Callable[..., Any]]


class BudgetExhausted(Exception):
    """The task's budget (``idem_budget``) cannot cover one more execution: ``idem_spend`` refused
    it (SQLSTATE IB001).  Nothing ran and nothing was stored: the key is claimable again.

    ``tenant``, ``task``, ``sqlstate`` (``"IB001"``), ``message`` and ``detail`` (idem's, naming
    the task, what was spent and the total); the psycopg error is its ``__cause__``.
    """

    def __init__(self, tenant: str, task: str, cause: BaseException) -> None:
        diag = getattr(cause, "diag", None)
        message = (diag.message_primary if diag is not None else None) or str(cause)
        detail = diag.message_detail if diag is not None else None
        full = f"{message} ({detail})" if detail else message
        super().__init__(f"pg_idem: the budget of task {task!r} is spent: {full}")
        self.__cause__ = cause
        self.tenant = tenant
        self.task = task
        self.sqlstate = BUDGET_SQLSTATE
        self.message = message
        self.detail = detail


class _Refused(Exception):
    """Carries BudgetExhausted out of the claim, so that everything rolls back."""

    def __init__(self, error: BudgetExhausted) -> None:
        super().__init__(str(error))
        self.error = error


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"pg_idem: idempotency_key must be a string, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH or len(key.encode()) > MAX_KEY_LENGTH:
        raise ValueError(f"pg_idem: idempotency_key must be 1 to {MAX_KEY_LENGTH} characters (and bytes in "
                         f"UTF-8), not {len(key)}")
    return key


def _of(value: Optional[Of], what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[str]:
    if value is None:
        return None
    out = value(*args, **kwargs) if callable(value) else value
    if not isinstance(out, str) or not out:
        raise TypeError(f"pg_idem: {what} must be (or give) a non-empty string, not {out!r}")
    return out


def _result(c: Claim, executed: Optional[bytes]) -> ToolResult:
    """The tool's answer for a claim's outcome; raises for an outcome that executed nothing."""
    if executed is not None:
        return {"result": json.loads(executed), "idempotency": {"key": c.key, "replayed": False}}
    if c.outcome == "replay":
        if c.status is not None and c.status >= 400:
            # a result that could not be stored (ResponseNotStored): the key answers its failure
            e = IdemError("failed", f"pg_idem: the first call with this key ({c.endpoint}, key {c.key!r}) "
                                    f"failed for good, its result could not be stored: "
                                    f"{(c.body or b'').decode('utf-8', 'replace')}")
            e.status_code = c.status
            raise e
        return {"result": json.loads(c.body or b"null"), "idempotency": {"key": c.key, "replayed": True}}
    c.raise_for_outcome()  # in_progress (after the wait), mismatch, unknown, frozen
    raise IdemError(c.outcome)


def _stored(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def idempotent_tool(
    conninfo: str = "",
    *,
    tenant: Of,
    name: Optional[str] = None,
    task: Optional[Of] = None,
    wait: float = 60.0,
    lease: Optional[float] = None,
    schema: Optional[str] = None,
    trace: Optional[Callable[..., Optional[str]]] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a side-effecting (agent) tool run once per ``idempotency_key``.

    The decorated function takes a required keyword ``idempotency_key``
    (a str of 1-255 characters; else TypeError / ValueError, before any
    database call) and returns ``{"result": <the function's return value, as
    JSON gives it back>, "idempotency": {"key": <the key>, "replayed": <bool>}}``.
    Each call claims the key (``idem_claim``) on a connection of its own
    (``psycopg.connect(conninfo)``), endpoint ``tool:<name>`` (``name``
    defaults to the function's ``__name__``), with the canonical JSON of
    the other arguments (defaults applied) as the fingerprint, and runs the
    function inside the claim's transaction:

    - a new key runs it; its return value (JSON-serialisable) is stored as
      the record's body (status 200) and committed before the call returns;
    - a repeat returns the stored result, ``replayed`` True, without running
      it; a concurrent repeat waits (``wait`` seconds at most) for the first
      call and returns its result: never a second run;
    - an exception of the function rolls its transaction back, is stored as
      a retryable failure and propagates: the next call with that key runs
      the function again;
    - with ``task`` (a str, or a function of the tool's arguments), each run
      first spends one unit of the task's budget (``idem_spend(tenant, task,
      1)``, in the claim's transaction; the application creates the budget
      with ``idem_budget``).  A budget that cannot cover it raises
      ``BudgetExhausted``: the function does not run and nothing is stored.

    ``tenant`` is a str or a function of the tool's arguments (called as the
    tool is).  The other outcomes raise: ``Frozen`` (an ``IdemError``) for a
    frozen endpoint (``idem_freeze``); ``IdemError`` with ``outcome``
    ``mismatch`` (the key was used with other arguments), ``unknown``,
    ``in_progress`` (the first call still runs after ``wait``), or
    ``failed`` (the first call's result could not be stored:
    ``ResponseNotStored`` was raised to it).  ``ResponseNotStored`` as
    ``pg_idem.claim`` raises it.  ``trace``: a function of the tool's
    arguments giving its trace id (``idem.trace``), default a new
    ``uuid4().hex`` per call.  ``lease`` (seconds) and ``schema`` as for
    ``pg_idem.claim``.  An ``async def`` function gets an async wrapper
    (on a psycopg ``AsyncConnection``).  A function that declares
    ``idempotency_key`` itself gets it too.
    """
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or wait <= 0:
        raise ValueError(f"pg_idem: wait must be a positive number of seconds, not {wait!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        endpoint = f"tool:{name or fn.__name__}"
        signature = inspect.signature(fn)
        takes_key = "idempotency_key" in signature.parameters
        spend_sql = idem_call(_SPEND_SQL, "idem_spend", schema)

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any], key: Any) -> tuple[
                str, dict[str, Any], str, Optional[str], str]:
            key = _check_key(key)
            bound = signature.bind(*args, **({**kwargs, "idempotency_key": key} if takes_key else kwargs))
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != "idempotency_key"}
            try:
                canonical_json(arguments)
            except (TypeError, ValueError) as e:
                raise TypeError(f"pg_idem: the arguments of {endpoint} are not JSON: {e}") from e
            t = _of(tenant, "tenant", args, kwargs)
            assert t is not None
            k = _of(task, "task", args, kwargs)
            tr = (trace(*args, **kwargs) if trace is not None else None) or uuid.uuid4().hex
            return key, arguments, t, k, tr

        def call_args(kwargs: dict[str, Any], key: str) -> dict[str, Any]:
            return {**kwargs, "idempotency_key": key} if takes_key else kwargs

        def spend_refused(e: psycopg.Error, t: str, k: str) -> None:
            if getattr(e, "sqlstate", None) == BUDGET_SQLSTATE:
                raise _Refused(BudgetExhausted(t, k, e)) from e

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*args: Any, idempotency_key: str, **kwargs: Any) -> ToolResult:
                key, arguments, t, k, tr = prepare(args, kwargs, idempotency_key)
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    error: Optional[BaseException] = None
                    c: Optional[Claim] = None
                    executed: Optional[bytes] = None
                    try:
                        async with conn.transaction():
                            try:
                                async with aclaim(conn, t, endpoint, key, arguments, wait=float(wait),
                                                  lease=lease, schema=schema, trace=tr) as c:
                                    if c.outcome == "claimed":
                                        if k is not None:
                                            try:
                                                await conn.execute(spend_sql, (t, k))
                                            except psycopg.Error as e:
                                                spend_refused(e, t, k)
                                                raise
                                        executed = _stored(await fn(*args, **call_args(kwargs, key)))
                                        c.respond(200, executed, {"Content-Type": "application/json"})
                            except _Refused:
                                raise
                            except Exception as e:  # recorded by the claim: commit that, then raise it
                                error = e
                    except _Refused as r:
                        raise r.error from r.error.__cause__
                    except psycopg.Error as e:  # the commit failed: nothing is recorded
                        if error is not None:
                            raise error from e
                        assert c is not None
                        raise _commit_failed(c, e) from e
                    if error is not None:
                        raise error
                    assert c is not None
                    return _result(c, executed)

            _expose(awrapper, signature, takes_key)
            return awrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, idempotency_key: str, **kwargs: Any) -> ToolResult:
            key, arguments, t, k, tr = prepare(args, kwargs, idempotency_key)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                error: Optional[BaseException] = None
                c: Optional[Claim] = None
                executed: Optional[bytes] = None
                try:
                    with conn.transaction():
                        try:
                            with claim(conn, t, endpoint, key, arguments, wait=float(wait), lease=lease,
                                       schema=schema, trace=tr) as c:
                                if c.outcome == "claimed":
                                    if k is not None:
                                        try:
                                            conn.execute(spend_sql, (t, k))
                                        except psycopg.Error as e:
                                            spend_refused(e, t, k)
                                            raise
                                    executed = _stored(fn(*args, **call_args(kwargs, key)))
                                    c.respond(200, executed, {"Content-Type": "application/json"})
                        except _Refused:
                            raise
                        except Exception as e:  # recorded by the claim: commit that, then raise it
                            error = e
                except _Refused as r:
                    raise r.error from r.error.__cause__
                except psycopg.Error as e:  # the commit failed: nothing is recorded
                    if error is not None:
                        raise error from e
                    assert c is not None
                    raise _commit_failed(c, e) from e
                if error is not None:
                    raise error
                assert c is not None
                return _result(c, executed)

        _expose(wrapper, signature, takes_key)
        return wrapper

    return decorate


def _commit_failed(c: Claim, cause: psycopg.Error) -> ResponseNotStored:
    """The tool's transaction could not commit: everything rolled back, the claim too (retryable)."""
    error = _store_failed(c, cause)  # logged
    c.verdict = "rolled_back"
    return error if error.retryable else ResponseNotStored(c, cause, True)


def _expose(wrapper: Callable[..., Any], signature: inspect.Signature, takes_key: bool) -> None:
    """The wrapper's signature and annotations: the function's, with ``idempotency_key: str`` a
    required keyword (what frameworks that read signatures, such as MCP SDKs, show the agent)."""
    annotations: dict[str, Any] = dict(getattr(wrapper, "__annotations__", {}))
    annotations["idempotency_key"] = str
    annotations["return"] = dict
    wrapper.__annotations__ = annotations
    if takes_key:
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=inspect.Parameter.empty,
                            annotation=str) if p.name == "idempotency_key" else p
                  for p in signature.parameters.values()]
        # a keyword-only parameter may not come before a positional one
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      inspect.Parameter.VAR_POSITIONAL)
        params = ([p for p in params if p.kind in positional]
                  + [p for p in params if p.kind == p.KEYWORD_ONLY]
                  + [p for p in params if p.kind == p.VAR_KEYWORD])
    else:
        params = list(signature.parameters.values())
        key = inspect.Parameter("idempotency_key", inspect.Parameter.KEYWORD_ONLY, annotation=str)
        tail = [p for p in params if p.kind == p.VAR_KEYWORD]
        params = [p for p in params if p.kind != p.VAR_KEYWORD] + [key] + tail
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=dict)

