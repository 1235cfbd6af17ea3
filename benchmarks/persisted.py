"""Case 1: a persisted fire through ``lifecycle.Engine`` against the floor.

The floor runs the statements a fire needs, written by hand, through the raw driver with no
framework: read the resource row, compare-and-swap UPDATE of state and version WHERE id AND
version, journal INSERT, COMMIT. Its tables are lifecycle's own (created from
``lifecycle.store.schema``, so the shapes, keys and indexes are the same) in a file or
PostgreSQL schema of its own. On SQLite it opens the file as lifecycle does: WAL,
synchronous=NORMAL, foreign keys on, a busy timeout, and ``BEGIN IMMEDIATE``.

The floor reads the resource row alone: whatever else lifecycle's hot path reads or writes
(the newest observation, effect rows, timers) counts as lifecycle's cost.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Integer,
    String,
    Table,
    TypeDecorator,
    create_engine,
    func,
    select,
)
from sqlalchemy.types import TypeEngine

from lifecycle import Engine, Store
from lifecycle.store import Statements, journal, resources
from lifecycle.store import metadata as lifecycle_metadata

from . import postgres, toggle
from .harness import Bench, BenchError, Case, Workspace

UTC = dt.UTC
SPEC_VERSION = "0123456789abcdef"  # what a spec's content hash looks like

# -- lifecycle ------------------------------------------------------------------------------


@contextmanager
def lifecycle_fire(url: str, *, guarded: bool, nested: bool = False) -> Iterator[Bench]:
    """``Engine(Store(url, upgrade=True), [spec]).fire(key, "flip")``, one resource."""
    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [toggle.spec(guarded=guarded, nested=nested)],
                        guards={toggle.GUARD: toggle.enabled} if guarded else None)
        engine.create(toggle.MACHINE, toggle.KEY)
        fire, key, trigger = engine.fire, toggle.KEY, toggle.TRIGGER

        def op() -> None:
            if not fire(key, trigger):
                raise BenchError(f"lifecycle: {trigger} on {key} did not fire")

        def verify(n: int) -> None:
            resource = engine.get(key)
            with store.read() as db:
                rows = db.execute(  # its own rows (a fleet's database has others)
                    select(func.count()).select_from(journal.join(
                        resources, resources.c.id == journal.c.resource_id))
                    .where(resources.c.key == key)).scalar_one()
            _expect("lifecycle", resource.version, rows, n)

        yield Bench(op, verify)
    finally:
        store.dispose()


def _expect(who: str, version: int, journal_rows: int, n: int) -> None:
    """After ``n`` transitions from a fresh resource: version n + 1, n + 1 journal rows
    (the create and the transitions)."""
    if version != n + 1 or journal_rows != n + 1:
        raise BenchError(f"{who}: after {n} fires expected version and journal rows {n + 1}, "
                         f"found version {version} and {journal_rows} journal rows")


# -- the floor ------------------------------------------------------------------------------

# The resource columns lifecycle's hot path reads, so the floor reads as much of the row.
_READ = tuple(name for name in getattr(Statements, "RESOURCE_COLUMNS", (
    "id", "machine", "key", "state", "version", "seq", "data", "spec_version"))
    if name in resources.c)
_COLUMNS = ", ".join(_READ)
_ID, _STATE, _VERSION, _SEQ, _SPEC_VERSION = (
    _READ.index(name) for name in ("id", "state", "version", "seq", "spec_version"))
_JOURNAL_COLUMNS = ("resource_id, seq, kind, trigger, source, dest, version, spec_version, "
                    "actor, at, payload, guards")


def _sql(placeholder: str) -> tuple[str, str, str]:
    """The floor's statements: read, compare-and-swap, journal."""
    p = placeholder
    read = f"SELECT {_COLUMNS} FROM lifecycle_resources WHERE key = {p}"
    move = (f"UPDATE lifecycle_resources SET state = {p}, version = {p}, seq = {p}, "
            f"spec_version = {p}, updated_at = {p} WHERE id = {p} AND version = {p} AND seq = {p}")
    record = (f"INSERT INTO lifecycle_journal ({_JOURNAL_COLUMNS}) "
              f"VALUES ({', '.join([p] * 12)})")
    return read, move, record


def _create_and_seed(sqlalchemy_url: str) -> None:
    """lifecycle's tables, exactly as its schema declares them, and the resource in state
    ``a`` with its create row in the journal (setup, not timed)."""
    now = dt.datetime.now(UTC)
    engine = create_engine(sqlalchemy_url)
    try:
        with engine.begin() as connection:
            lifecycle_metadata.create_all(connection)
            rid = connection.execute(resources.insert().values(_required(resources, now, {
                "machine": toggle.MACHINE, "key": toggle.KEY, "spec_version": SPEC_VERSION,
                "state": "a", "version": 1, "seq": 1, "data": {}, "created_at": now,
                "updated_at": now,
            })).returning(resources.c.id)).scalar_one()
            connection.execute(journal.insert().values(_required(journal, now, {
                "resource_id": rid, "seq": 1, "kind": "create", "dest": "a", "version": 1,
                "spec_version": SPEC_VERSION, "at": now,
            })))
    finally:
        engine.dispose()


def _required(table: Table, now: dt.datetime, values: dict[str, Any]) -> dict[str, Any]:
    """``values``, plus a plain value for every other NOT NULL column without a default, so
    the seed rows fit lifecycle's schema as it grows."""
    plain: list[tuple[type[TypeEngine[Any]], Any]] = [
        (DateTime, now), (Integer, 0), (String, ""), (JSON, {})]
    out = dict(values)
    for column in table.columns:
        if (column.name in out or column.nullable or column.default is not None
                or column.server_default is not None or column.autoincrement is True):
            continue
        kind = column.type
        if isinstance(kind, TypeDecorator):
            kind = kind.impl_instance
        value = next((v for cls, v in plain if isinstance(kind, cls)), _MISSING)
        if value is _MISSING:
            raise BenchError(f"the floor cannot fill {table.name}.{column.name} "
                             f"({column.type}): update benchmarks/persisted.py")
        out[column.name] = value
    return out


_MISSING = object()


def _misfit(exc: Exception) -> BenchError:
    return BenchError(f"the floor's statements no longer fit lifecycle's schema ({exc}): "
                      "update benchmarks/persisted.py")


def _sqlite_time(value: dt.datetime) -> str:
    """UTC as sortable text, the format lifecycle stores on SQLite."""
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _journal_count(cursor: Any) -> int:
    cursor.execute("SELECT count(*) FROM lifecycle_journal")
    return int(cursor.fetchone()[0])


def _state_version(cursor: Any, read: str) -> int:
    cursor.execute(read, (toggle.KEY,))
    return int(cursor.fetchone()[_VERSION])


@contextmanager
def sqlite_floor(path: Path) -> Iterator[Bench]:
    _create_and_seed(f"sqlite:///{path}")
    connection = sqlite3.connect(path, isolation_level=None)
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    read, move, record = _sql("?")
    key, trigger = toggle.KEY, toggle.TRIGGER

    def op() -> None:
        cursor.execute("BEGIN IMMEDIATE")
        try:
            cursor.execute(read, (key,))
            row = cursor.fetchall()[0]
            rid, state, version, seq, spec_version = (
                row[_ID], row[_STATE], row[_VERSION], row[_SEQ], row[_SPEC_VERSION])
            dest = "b" if state == "a" else "a"
            at = _sqlite_time(dt.datetime.now(UTC))
            cursor.execute(move, (dest, version + 1, seq + 1, spec_version, at, rid, version,
                                  seq))
            if cursor.rowcount != 1:
                raise BenchError("floor: the compare-and-swap lost with no other writer")
            cursor.execute(record, (rid, seq + 1, "transition", trigger, state, dest,
                                    version + 1, spec_version, None, at, None, None))
        except sqlite3.IntegrityError as exc:
            cursor.execute("ROLLBACK")
            raise _misfit(exc) from exc
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")

    def verify(n: int) -> None:
        _expect("sqlite3 floor", _state_version(cursor, read), _journal_count(cursor), n)

    try:
        yield Bench(op, verify)
    finally:
        connection.close()


@contextmanager
def psycopg_floor(url: str) -> Iterator[Bench]:
    import psycopg

    _create_and_seed(url)
    connection = psycopg.connect(postgres.libpq(url))
    cursor = connection.cursor()
    read, move, record = _sql("%s")
    key, trigger, commit, rollback = toggle.KEY, toggle.TRIGGER, connection.commit, \
        connection.rollback

    def op() -> None:
        try:
            cursor.execute(read, (key,))
            row = cursor.fetchall()[0]
            rid, state, version, seq, spec_version = (
                row[_ID], row[_STATE], row[_VERSION], row[_SEQ], row[_SPEC_VERSION])
            dest = "b" if state == "a" else "a"
            at = dt.datetime.now(UTC)
            cursor.execute(move, (dest, version + 1, seq + 1, spec_version, at, rid, version,
                                  seq))
            if cursor.rowcount != 1:
                raise BenchError("floor: the compare-and-swap lost with no other writer")
            cursor.execute(record, (rid, seq + 1, "transition", trigger, state, dest,
                                    version + 1, spec_version, None, at, None, None))
        except psycopg.IntegrityError as exc:
            rollback()
            raise _misfit(exc) from exc
        except BaseException:
            rollback()
            raise
        commit()

    def verify(n: int) -> None:
        _expect("psycopg floor", _state_version(cursor, read), _journal_count(cursor), n)
        connection.rollback()

    try:
        yield Bench(op, verify)
    finally:
        connection.close()


# -- the cases ------------------------------------------------------------------------------


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _on_sqlite(name: str, opener: Callable[[Path], AbstractContextManager[Bench]]) -> Callable[
        [Workspace], AbstractContextManager[Bench]]:
    return lambda ws: opener(ws.sqlite_path(name))


def _on_postgres(name: str, opener: Callable[[str], AbstractContextManager[Bench]]) -> Callable[
        [Workspace], AbstractContextManager[Bench]]:
    return lambda ws: opener(ws.postgres_schema(name))


SQLITE_FLOOR = Case("sqlite.floor", "raw sqlite3", _on_sqlite("floor", sqlite_floor))
SQLITE_LIFECYCLE = Case(
    "sqlite.lifecycle", "lifecycle Engine.fire",
    _on_sqlite("lifecycle", lambda p: lifecycle_fire(_sqlite_url(p), guarded=False)))
SQLITE_LIFECYCLE_GUARD = Case(
    "sqlite.lifecycle_guard", "lifecycle Engine.fire, 1 guard",
    _on_sqlite("lifecycle_guard", lambda p: lifecycle_fire(_sqlite_url(p), guarded=True)))
SQLITE_LIFECYCLE_NESTED = Case(
    "sqlite.lifecycle_nested", "lifecycle Engine.fire, 1 guard, nested",
    _on_sqlite("lifecycle_nested",
               lambda p: lifecycle_fire(_sqlite_url(p), guarded=True, nested=True)))

PG_FLOOR = Case("pg.floor", "raw psycopg", _on_postgres("floor", psycopg_floor), "postgres")
PG_LIFECYCLE = Case(
    "pg.lifecycle", "lifecycle Engine.fire",
    _on_postgres("lifecycle", lambda url: lifecycle_fire(url, guarded=False)), "postgres")
PG_LIFECYCLE_GUARD = Case(
    "pg.lifecycle_guard", "lifecycle Engine.fire, 1 guard",
    _on_postgres("lifecycle_guard", lambda url: lifecycle_fire(url, guarded=True)), "postgres")

