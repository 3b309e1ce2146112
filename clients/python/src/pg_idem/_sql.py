"""The package's SQL: every call of an idem function names it in the extension's schema."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from psycopg import sql


@lru_cache(maxsize=None)
def idem_call(template: str, function: str, schema: Optional[str]) -> sql.Composed:
    """``template`` with its ``{}`` replaced by ``function``, qualified by ``schema`` when given.

    Without a schema the function is found on the connection's search_path
    (``CREATE EXTENSION idem`` in ``public``); with one it is
    ``"schema"."function"``, quoted as identifiers.
    """
    name = sql.Identifier(schema, function) if schema else sql.Identifier(function)
    return sql.SQL(template).format(name)
