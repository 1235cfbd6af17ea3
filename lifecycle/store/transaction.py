"""One transaction on the store, as the code that writes in it sees it.

:meth:`Store.write` gives a :class:`Transaction`; so do :meth:`Store.reading` (single reads,
each its own snapshot) and :meth:`Store.scanning` (long reads in one snapshot). The engine's
hot path, the worker, and a caller's own writes in a fire's transaction
(:class:`lifecycle.Within`, :attr:`lifecycle.FollowUp.writes`) all receive one. It runs a
statement with its parameters and reads the rows, knows the database it talks to, and
converts values the way that database stores them, so that code written against it runs on
SQLite and PostgreSQL alike without looking at the driver.

Its methods are the DBAPI cursor's own, bound once (``execute`` costs what the driver's
does): the hot path pays nothing for the wrapper but its construction.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..records import json_value, time_value
from .schema import sqlite_time

if TYPE_CHECKING:
    from .statements import Statements


def _sqlite_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _postgres_json(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return Jsonb(value, dumps=lambda _: text)


def _same(value: dt.datetime) -> dt.datetime:
    return value


JSON_PARAM: dict[str, Callable[[Any], Any]] = {"sqlite": _sqlite_json,
                                               "postgresql": _postgres_json}
"""A JSON document as a statement's parameter, by dialect: strict JSON (no NaN or Infinity,
which PostgreSQL refuses), raising ValueError or TypeError for what JSON cannot hold."""
TIME_PARAM: dict[str, Callable[[dt.datetime], Any]] = {"sqlite": sqlite_time,
                                                       "postgresql": _same}
"""A time as a statement's parameter, by dialect (SQLite: text in UTC)."""


class Transaction:
    """A transaction on lifecycle's database (or, from :meth:`Store.reading`, reads each in
    a snapshot of their own).

    - ``execute(statement, params)`` runs a statement: one of the store's catalogue
      (``sql``, compiled for this database) or one of the caller's own, written in the
      database's parameter style (``paramstyle``: ``named``, ``:name``, on SQLite;
      ``pyformat``, ``%(name)s``, on PostgreSQL); ``fetchone``, ``fetchall``, ``fetchmany``
      and ``rowcount`` read its outcome.
    - ``json(value)`` and ``time(value)`` turn a document and an aware datetime into
      parameters; ``json_value`` and ``time_value`` turn what the database returns back.
    - ``dialect`` is ``"sqlite"`` or ``"postgresql"``.

    A write transaction commits when the block that opened it ends, and rolls back if it
    raises; nothing here commits."""

    __slots__ = ("_cursor", "dialect", "execute", "executemany", "fetchall", "fetchmany",
                 "fetchone", "json", "paramstyle", "sql", "time")

    json_value = staticmethod(json_value)
    time_value = staticmethod(time_value)

    def __init__(self, cursor: Any, dialect: str, sql: Statements | None = None) -> None:
        self._cursor = cursor
        self.dialect = dialect
        self.paramstyle = "named" if dialect == "sqlite" else "pyformat"
        self.sql: Statements | None = sql
        self.execute: Callable[..., Any] = cursor.execute
        self.executemany: Callable[..., Any] = cursor.executemany
        self.fetchone: Callable[[], Any] = cursor.fetchone
        self.fetchall: Callable[[], list[Any]] = cursor.fetchall
        self.fetchmany: Callable[[int], list[Any]] = cursor.fetchmany
        self.json = JSON_PARAM[dialect]
        self.time = TIME_PARAM[dialect]

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed."""
        return int(self._cursor.rowcount)

    def rollback(self) -> None:
        """Undo what this transaction wrote so far; the block then commits nothing (how the
        engine gives up an attempt that must be made again)."""
        self._cursor.connection.rollback()

    def insert_many(self, statement: str, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Run ``statement`` (an ``INSERT ... RETURNING id``) once per row; the ids, in order.
        On PostgreSQL the rows go in one round trip (psycopg pipelines ``executemany``);
        SQLite runs in this process anyway."""
        cursor = self._cursor
        if self.dialect == "postgresql" and len(rows) > 1:
            cursor.executemany(statement, rows, returning=True)
            ids = [cursor.fetchone()[0]]
            while cursor.nextset():
                ids.append(cursor.fetchone()[0])
            return ids
        ids = []
        for row in rows:
            cursor.execute(statement, row)
            ids.append(cursor.fetchone()[0])
        return ids


__all__ = ["JSON_PARAM", "TIME_PARAM", "Transaction"]
