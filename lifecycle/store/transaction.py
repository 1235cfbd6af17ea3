"""One transaction on the store, as the code that writes in it sees it.

:meth:`Store.write` gives a :class:`Transaction`; so do :meth:`Store.reading` (single reads,
each its own snapshot) and :meth:`Store.scanning` (long reads in one snapshot). The engine's
hot path, the worker, and a caller's own writes in a fire's transaction
(:class:`lifecycle.Within`, :attr:`lifecycle.FollowUp.writes`) all receive one. It runs a
statement with its parameters and reads the rows, knows the database it talks to, and
converts values the way that database stores them, so that code written against it runs on
SQLite and PostgreSQL alike without looking at the driver.

On SQLite its methods are the DBAPI cursor's own, bound once (``execute`` costs what the
driver's does): the hot path pays nothing for the wrapper but its construction. On PostgreSQL
it is a :class:`Pipelined` transaction: its reads of the resources go outside the
transaction, its writes are sent without waiting for each (psycopg's pipeline mode, BEGIN and
COMMIT only around two or more), and a result is waited for only when it is read, so a fire
costs two round trips (its read, then its writes), not one per statement, and a decision to
write nothing one.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from typing import TYPE_CHECKING, Any

from ..results import json_value, time_value
from .schema import sqlite_time

if TYPE_CHECKING:
    from .statements import Statements


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""The one JSON encoder (``json.dumps`` with options of its own makes one per call)."""


def json_text(value: Any) -> str:
    """A JSON document's text, strict (no NaN or Infinity), as a plain ``str``: SQLite's
    parameter; raises ValueError or TypeError for what JSON cannot hold."""
    return _ENCODE(value)


class JsonText(str):
    """A JSON document's text as a PostgreSQL parameter: ``jsonb`` (the dumper registered
    for it when a store opens a PostgreSQL database, :func:`register_json_text`), encoded
    once, wrapped in nothing else."""

    __slots__ = ()


def _postgres_json(value: Any) -> Any:
    return JsonText(_ENCODE(value))


def register_json_text() -> None:
    """Make psycopg send a :class:`JsonText` as ``jsonb`` (once; before connecting: a
    connection copies the adapters it starts with)."""
    if _registered:
        return
    import psycopg
    from psycopg.adapt import Dumper

    class JsonbTextDumper(Dumper):
        oid = psycopg.adapters.types["jsonb"].oid

        def dump(self, obj: JsonText) -> bytes:
            return obj.encode()

    psycopg.adapters.register_dumper(JsonText, JsonbTextDumper)
    _registered.append(True)


_registered: list[bool] = []


def _same(value: dt.datetime) -> dt.datetime:
    return value


JSON_PARAM: dict[str, Callable[[Any], Any]] = {"sqlite": json_text,
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

    __slots__ = ("_cursor", "cursor", "dialect", "execute", "executemany", "fetchall", "fetchmany",
                 "fetchone", "json", "paramstyle", "sql", "time")

    json_value = staticmethod(json_value)
    time_value = staticmethod(time_value)

    def __init__(self, cursor: Any, dialect: str, sql: Statements | None = None) -> None:
        self._cursor = cursor
        self.cursor = cursor
        """The DBAPI cursor (on PostgreSQL the transaction's first; its statements run on
        cursors of their own): on SQLite, the engine's common fire reads ``rowcount`` here."""
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

    def changes(self, statement: str, params: Any) -> Callable[[], int]:
        """Run a statement; what says how many rows it changed (on PostgreSQL, waiting for
        the answer if it is not in when asked, so that what follows is sent with it)."""
        self.execute(statement, params)
        count = int(self._cursor.rowcount)
        return lambda: count

    def rollback(self) -> None:
        """Undo what this transaction wrote so far; the block then commits nothing (how the
        engine gives up an attempt that must be made again)."""
        self._cursor.connection.rollback()

    def write(self, change: str, params: dict[str, Any], journal: dict[str, Any],
              effects: Sequence[dict[str, Any]] = (), exited: Sequence[str] = (),
              timers: Sequence[dict[str, Any]] = (), now: Any = None, *,
              strict: bool = False) -> Any:
        """One write of a resource: ``change`` (the catalogue's compare-and-swap: a ``move``,
        ``refuse``, ``change_data``; or ``insert_resource``) with its ``params``, and only
        if it changed the row, its ``journal`` row, its ``effects`` (the first one its
        resource's queue head when nothing else of it is open), the pending timers of the
        states ``exited`` cancelled (at ``now``) and ``timers`` set. The rows are given
        without their ``resource_id``, which the write fills in.

        The resource's id; None when the compare-and-swap found the row moved, and nothing
        was written. (On PostgreSQL a :class:`Pending` that says so once the answer is in;
        ``strict``: a moved row then fails the whole transaction, with :class:`Moved`.)"""
        execute, sql = self.execute, self.sql
        assert sql is not None
        positional = sql.positional  # bound by position: what sqlite3 binds cheapest
        text, bind = positional[change]
        execute(text, bind(params))
        if change is sql.insert_resource:
            resource_id = self.fetchone()[0]
        elif self._cursor.rowcount != 1:
            return None
        else:
            resource_id = params["id_"]
        journal["resource_id"] = resource_id
        text, bind = positional[sql.insert_journal]
        execute(text, bind(journal))
        if effects:  # the first is its resource's queue head when nothing else is open
            execute(sql.open_effect, {"resource_id": resource_id})
            if self.fetchone()[0] is None:
                effects[0]["head"] = 1
            for effect in effects:
                effect["resource_id"] = resource_id
                execute(sql.insert_effect, effect)
        for state in exited:
            execute(sql.cancel_timers, {"resource_id": resource_id, "state_": state,
                                        "now": now})
        for timer in timers:
            timer["resource_id"] = resource_id
            execute(sql.insert_timer, timer)
        return resource_id

    def observed(self, rows: list[dict[str, Any]], source: str) -> Callable[[], list[int]]:
        """Write observations (``resource_id``, ``status``, ``observed_at``,
        ``recorded_at``: parameters), each the newest of its resource if it is (by
        ``observed_at``; of two at one time, the later given). What gives their ids once
        the transaction has them (on PostgreSQL, after the commit)."""
        assert self.sql is not None
        ids = []
        for row in rows:
            row["source"] = source
            self.execute(self.sql.insert_observation, row)
            ids.append(self.fetchone()[0])
        self.executemany(self.sql.newest_observation, [
            {"id_": row["resource_id"], "observation_id": oid,
             "observed_at_": row["observed_at"]} for row, oid in zip(rows, ids, strict=True)])
        return lambda: ids


class Moved(Exception):
    """A strict write (:meth:`Transaction.write`) found its row moved: the transaction was
    rolled back, and whatever else it wrote with it."""


class Pending:
    """A write sent on PostgreSQL whose answer may not be in yet: :meth:`id` waits for it
    (after the commit, it is in)."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def id(self) -> int | None:
        """The resource's id, or None when the compare-and-swap found the row moved."""
        row = self._cursor.fetchone()
        return None if row is None else int(row[0])


class Pipelined(Transaction):
    """A write transaction on PostgreSQL that sends what it must and no more, on a connection
    in autocommit (psycopg's pipeline mode for its writes):

    - its reads of the resources (the catalogue's ``snapshot_reads``), until it has written
      something, are sent outside the transaction, each its own snapshot (in READ
      COMMITTED, what a read in the transaction would see too; what is decided on them is
      written with a compare-and-swap): a transaction that writes nothing sends nothing
      more, not even a ``COMMIT``;
    - its first write is held, and sent at the commit alone, in a transaction of its own
      (one statement: atomic by itself), when it is the only one;
    - with a second statement (or when its answer is read first) the transaction begins:
      ``BEGIN``, the writes and the ``COMMIT`` are pipelined, sent without waiting for
      each, and a statement's result is waited for when it is read (``fetch*``,
      ``rowcount``).

    A read and the writes decided from it cost two round trips; a read that decides to
    write nothing, one. Each statement runs on a cursor of its own, so that reading one
    result never reads another's. A server error surfaces where the next result is read,
    at the latest at the commit; the transaction is then rolled back."""

    __slots__ = ("_begun", "_connection", "_held", "_last", "_pipeline", "_reads",
                 "_restore", "_stack")

    def __init__(self, connection: Any, sql: Statements, *, restore: bool = False) -> None:
        super().__init__(connection.cursor(), "postgresql", sql)
        self._connection = connection
        if not connection.autocommit:
            connection.autocommit = True
        self._restore = restore  # a connection of the pool: out of autocommit afterwards
        self._stack: ExitStack | None = None
        self._pipeline: Any = None
        self._begun = False
        self._held: tuple[Any, str, Any, dict[str, Any]] | None = None
        self._reads = sql.snapshot_reads
        self._last = self._cursor
        self.execute = self._execute
        self.executemany = self._executemany
        self.fetchone = self._fetchone
        self.fetchall = self._fetchall
        self.fetchmany = self._fetchmany

    def _execute(self, statement: str, params: Any = None, **options: Any) -> Any:
        if not self._begun:
            if self._held is None and self._pipeline is None:
                cursor = self._last = self._connection.cursor()
                if statement in self._reads:  # outside the transaction: one round trip
                    return cursor.execute(statement, params, **options)
                self._held = (cursor, statement, params, options)  # sent later
                return cursor
            self._begin()
        cursor = self._last = self._connection.cursor()
        # (it may read the answers already in, and raise an earlier statement's error)
        return self._answered(cursor.execute, statement, params, **options)

    def _executemany(self, statement: str, rows: Any, **options: Any) -> Any:
        if not self._begun:
            self._begin()
        cursor = self._last = self._connection.cursor()
        return self._answered(cursor.executemany, statement, rows, **options)

    def _begin(self) -> None:
        """Begin the transaction: ``BEGIN`` and the write held, pipelined."""
        if self._stack is None:
            self._stack = ExitStack()
            self._pipeline = self._stack.enter_context(self._connection.pipeline())
        self._cursor.execute("BEGIN")
        self._begun = True
        held, self._held = self._held, None
        if held is not None:
            cursor, statement, params, options = held
            self._answered(cursor.execute, statement, params, **options)

    def join(self) -> None:
        """Begin the transaction if a write is held (a read of the thread's own joins it, and
        must see it)."""
        if self._held is not None:
            self._begin()

    def _fetchone(self) -> Any:
        if self._held is not None:
            self._begin()
        return self._answered(self._last.fetchone)

    def _fetchall(self) -> list[Any]:
        if self._held is not None:
            self._begin()
        return self._answered(self._last.fetchall)  # type: ignore[no-any-return]

    def _fetchmany(self, size: int) -> list[Any]:
        if self._held is not None:
            self._begin()
        return self._answered(self._last.fetchmany, size)  # type: ignore[no-any-return]

    @property
    def rowcount(self) -> int:
        if self._held is not None:
            self._begin()
        if self._last.pgresult is None and self._pipeline is not None:
            self._answered(self._pipeline.sync)
        return int(self._last.rowcount)

    def _answered(self, call: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """``call``, which waits for results: a strict write's moved row as :class:`Moved`."""
        try:
            return call(*args, **options)
        except self._not_null as exc:
            if _moved(exc):
                raise Moved() from None
            raise

    def changes(self, statement: str, params: Any) -> Callable[[], int]:
        cursor = self.execute(statement, params)

        def count() -> int:
            if self._held is not None and self._held[0] is cursor:
                self._begin()
            if cursor.pgresult is None and self._pipeline is not None:
                self._answered(self._pipeline.sync)
            return int(cursor.rowcount)
        return count

    @property
    def _not_null(self) -> type[Exception]:
        from psycopg.errors import NotNullViolation

        return NotNullViolation

    def rollback(self) -> None:
        self._held = None  # never sent: nothing to undo
        if self._begun:
            self._begun = False
            self._cursor.execute("ROLLBACK")

    def commit(self) -> None:
        """Send what is held or the COMMIT, and wait for every answer (one round trip with
        what is still unanswered; none when nothing was written); roll back and raise the
        first error, if there was one."""
        held, self._held = self._held, None
        if self._stack is None:
            if held is not None:  # the only write: alone, a transaction of its own
                cursor, statement, params, options = held
                try:
                    cursor.execute(statement, params, **options)
                except BaseException as exc:
                    self._finish()
                    if isinstance(exc, self._not_null) and _moved(exc):
                        raise Moved() from None
                    raise
            if self._restore:
                self._finish()
            return
        try:
            if self._begun:
                self._begun = False
                self._cursor.execute("COMMIT")  # (may raise an earlier statement's error)
            stack, self._stack = self._stack, None
            stack.close()
        except BaseException as exc:
            self._end()
            if isinstance(exc, self._not_null) and _moved(exc):
                raise Moved() from None
            raise
        if self._restore:
            self._finish()

    def abandon(self) -> None:
        """Roll back after the block that wrote raised."""
        self._held = None
        if self._stack is None:
            self._finish()
            return
        with suppress(Exception):  # already failing: the block's error is the one raised
            self.rollback()
        self._end()

    def _end(self) -> None:
        """After an error: leave pipeline mode (which reads every answer still owed, the
        error's included), then roll back."""
        stack, self._stack = self._stack, None
        if stack is not None:
            with suppress(Exception):  # the first error is the one raised
                stack.close()
        self._finish()

    def _finish(self) -> None:
        """Out of any transaction; a connection of the pool out of autocommit again (the
        thread's held connection stays in it)."""
        connection = self._connection
        if int(connection.info.transaction_status) not in (0, 4):  # neither IDLE nor UNKNOWN
            try:
                connection.rollback()
            except Exception:
                connection.close()  # in no state to be used again: it is thrown away
                raise
        if self._restore and not connection.closed and int(
                connection.info.transaction_status) == 0:
            connection.autocommit = False

    def write(self, change: str, params: dict[str, Any], journal: dict[str, Any],
              effects: Sequence[dict[str, Any]] = (), exited: Sequence[str] = (),
              timers: Sequence[dict[str, Any]] = (), now: Any = None, *,
              strict: bool = False) -> Any:
        sql = self.sql
        assert sql is not None
        values = {**params, **{_JOURNAL_PARAM[name]: value for name, value in journal.items()}}
        create = change is sql.insert_resource
        if effects:
            first = effects[0]
            values.update(e_seq=first["seq"], e_at=first["created_at"], e_fence=first["fence"],
                          e_names=[e["name"] for e in effects],
                          e_args=[e["args"] for e in effects],
                          e_keys=[e["idempotency_key"] for e in effects],
                          e_on_failure=[e["on_failure"] for e in effects])
        if exited:
            values.update(x_states=list(exited), x_now=now)
        if timers:
            values.update(t_seq=timers[0]["seq"], t_at=timers[0]["created_at"],
                          t_states=[t["state"] for t in timers],
                          t_triggers=[t["trigger"] for t in timers],
                          t_due=[t["due_at"] for t in timers])
        cursor = self.execute(sql.written(change, create, bool(effects), bool(exited),
                                          bool(timers), strict), values)
        if effects and not create:  # the head: a statement of its own, after the row lock
            self.execute(sql.head_effect, {"resource_id": params["id_"],
                                           "seq": effects[0]["seq"]})
        return Pending(cursor)

_JOURNAL_PARAM = {name: f"j_{name}" for name in (
    "resource_id", "seq", "kind", "trigger", "source", "dest", "version", "spec_version",
    "actor", "at", "payload", "guards", "observation_id", "fence")}
"""A journal row's column as the parameter of :meth:`Pipelined.write`'s statement."""


def _moved(exc: Any) -> bool:
    """Whether a not-null violation is a strict write's journal row missing the id its
    compare-and-swap would have returned."""
    return bool(exc.diag.table_name == "lifecycle_journal"
                and exc.diag.column_name == "resource_id")


__all__ = ["JSON_PARAM", "TIME_PARAM", "JsonText", "Moved", "Pending", "Pipelined", "Transaction",
           "json_text", "register_json_text"]
