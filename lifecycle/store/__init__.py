"""The store: schema, database setup and the pre-compiled statements of the hot path."""

from __future__ import annotations

import datetime as dt
import functools
import os
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from ..errors import DatabaseError, SchemaOutOfDate
from ..results import json_value, time_value
from ..revisions import core_revision
from ..urls import display_url, resolve_url
from . import migrate
from .database import (
    HeldConnections,
    create_sa_engine,
    parse_url,
    sqlite_file,
)
from .schema import (
    journal,
    machines,
    metadata,
    observations,
    outbox,
    resources,
    specs,
    state_counts,
    timers,
)
from .statements import Statements, statements_for
from .transaction import JSON_PARAM, TIME_PARAM, Moved, Pending, Transaction

__all__ = ["Moved", "Pending", "Statements", "Store", "Transaction", "journal", "machines",
           "metadata", "observations", "outbox", "resolve_url", "resources", "specs",
           "state_counts", "timers"]


class Store:
    """One database: SQLite by default, PostgreSQL when many processes and hosts share it.

    Opening checks that the schema is at the code's revision and refuses otherwise (or
    upgrades, when ``upgrade=True``); it never creates tables behind Alembic's back.

    ``branches`` are the directories of the migration branches of the machines the
    application runs that keep tables of their own (``Builtin.migrations``: job_exit's job
    queue): checked and upgraded with the core's. A branch not given is left alone."""

    def __init__(self, url: str | None = None, *, upgrade: bool = False, check: bool = True,
                 branches: Sequence[str | os.PathLike[str]] = ()):
        self.url = resolve_url(url)
        self.branches: tuple[str, ...] = tuple(dict.fromkeys(os.fspath(b) for b in branches))
        self.display_url = display_url(self.url)
        self._sqlite_file = sqlite_file(parse_url(self.url))  # DatabaseError if unusable
        if check and not upgrade and self._sqlite_file and not self._sqlite_file.exists():
            raise SchemaOutOfDate(self.display_url, None, migrate.head_revision())
        self.engine = create_sa_engine(self.url)
        self._held = HeldConnections(self.engine)
        # a store dropped without dispose() still gives its connections back
        self._closer = weakref.finalize(self, _close, self._held, self.engine)
        self.dialect: str = self.engine.dialect.name
        self.sql = statements_for(self.engine.dialect)
        self.json_param = JSON_PARAM[self.dialect]
        """A JSON document as a statement's parameter (:attr:`Transaction.json`)."""
        self.time_param = TIME_PARAM[self.dialect]
        """A time as a statement's parameter (:attr:`Transaction.time`)."""
        self.planned_each_time: dict[str, Any] = (
            {"prepare": False} if self.dialect == "postgresql" else {})
        """Keyword arguments of ``cursor.execute`` for a statement PostgreSQL must plan for
        its parameters each time: psycopg prepares a statement run often, and the generic
        plan of a page (``LIMIT`` and the keyset's bounds unknown) scans and sorts the
        whole table."""
        dbapi: Any = self.engine.dialect.dbapi
        self.integrity_error: type[Exception] = dbapi.IntegrityError
        self._connection_errors: tuple[type[Exception], ...] = (
            dbapi.OperationalError, dbapi.InterfaceError)
        self._driver_error: type[Exception] = dbapi.Error
        if check:
            self.check_schema(upgrade=upgrade)

    @classmethod
    def new_sqlite(cls, path: str | os.PathLike[str]) -> Store:
        """A store on a new SQLite file at ``path`` (refused if one is there), at the code's
        schema revision: a copy of an empty database that Alembic migrated once in this
        process, so that a process making many fresh databases (the simulations' variants,
        one replay after another) runs the revisions once, not once per database."""
        with open(path, "xb") as file:
            file.write(_migrated_sqlite())
        return cls(f"sqlite:///{path}")  # (checks the copy is at the code's revision)

    # -- schema ------------------------------------------------------------------------

    def current_revision(self) -> str | None:
        """The core's schema revision the database is at (None: it has no schema)."""
        return core_revision(self.revisions())

    def revisions(self) -> list[str]:
        """Every row of the version table: the core's revision and each branch's (none: the
        database has no schema). One statement on the driver, outside any transaction: a
        missing table is the database's own answer, not asked first (which cost a
        reflection's query and a read transaction of every store's opening)."""
        with self.reading() as tx:
            try:
                tx.execute(migrate.VERSION_ROWS)
            except self._driver_error as exc:
                if migrate.no_version_table(exc):
                    return []
                raise
            return [str(row[0]) for row in tx.fetchall()]

    def branch_revision(self, directory: str) -> str | None:
        """The revision of the branch in ``directory`` the database is at (None: absent)."""
        return migrate.branch_revision(self.revisions(), directory)

    def check_schema(self, *, upgrade: bool = False) -> None:
        head = migrate.head_revision()
        rows = self.revisions()
        current = core_revision(rows)
        if current == head:
            self._check_branches(rows, upgrade=upgrade)
            return
        known = [r for r, _, _ in migrate.revisions()]
        if current is not None and current not in known:
            raise DatabaseError(
                f"database {self.display_url} is at schema revision {current}, which this "
                f"version of lifecycle does not know (its newest is {head}): upgrade lifecycle"
            )
        if not upgrade:
            raise SchemaOutOfDate(self.display_url, current, head)
        self.upgrade()

    def _check_branches(self, rows: list[str], *, upgrade: bool) -> None:
        for branch in self.branches:
            current = migrate.branch_revision(rows, branch)
            head = migrate.branch_head(branch)
            if current != head:
                if not upgrade:
                    raise SchemaOutOfDate(
                        self.display_url, current or f"(no {migrate.branch_label(branch)} "
                        "branch)", head)
                self.upgrade()
                return

    def upgrade(self, revision: str = "head") -> None:
        """Upgrade the core and this store's branches (``head``: each to its newest). A
        database whose version table holds just those heads already is left as it is,
        without importing Alembic (a fifth of a second of CPU: ``lifecycle db upgrade`` run
        again, as a deployment does)."""
        if revision == "head" and set(self.revisions()) == {
                migrate.head_revision(), *(migrate.branch_head(b) for b in self.branches)}:
            return
        migrate.upgrade(self.engine, revision, self.branches)

    def downgrade(self, revision: str) -> None:
        migrate.downgrade(self.engine, revision, self.branches)

    # -- connections -------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A SQLAlchemy connection for reading (a deferred transaction on SQLite)."""
        self._held.lend()
        try:
            with self.engine.connect().execution_options(lifecycle_readonly=True) as connection:
                yield connection
        except OperationalError as exc:
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A SQLAlchemy connection inside one write transaction."""
        self._held.lend()
        try:
            with self.engine.begin() as connection:
                yield connection
        except OperationalError as exc:
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None

    def write(self, *, held: bool = True) -> AbstractContextManager[Transaction]:
        """One write transaction, for ``self.sql`` statements on the raw driver, on the
        calling thread's own connection (``held=False``: one from the pool, given back
        after); committed when the block ends, rolled back if it raises."""
        return self._held.transaction(self.sql, self._lost, held=held)

    def _lost(self, exc: Exception) -> Exception | None:
        """A pool that cannot connect, or a connection that broke, as :class:`DatabaseError`
        (None: another error)."""
        if isinstance(exc, DBAPIError):  # raised when the pool cannot connect
            return DatabaseError(f"database {self.display_url}: {exc.orig}")
        if isinstance(exc, self._connection_errors):
            return DatabaseError(f"database {self.display_url}: {exc}")
        return None

    @contextmanager
    def reading(self) -> Iterator[Transaction]:
        """Reads of one statement each (``self.sql``'s), on the calling thread's own
        connection and outside any transaction: each statement reads one consistent
        snapshot, without a pool checkout, a BEGIN or a rollback."""
        with self._lost_database(), self._held.reading() as cursor:
            yield Transaction(cursor, self.dialect, self.sql)

    def due_timers(self, now: dt.datetime, limit: int) -> list[Any]:
        """(timer id, trigger, machine, key) of the pending timers due by ``now``, soonest
        first, at most ``limit``: one statement on this thread's own connection."""
        with self.reading() as tx:
            tx.execute(self.sql.due_timers, {"now": tx.time(now), "limit": limit})
            return tx.fetchall()

    @contextmanager
    def _lost_database(self) -> Iterator[None]:
        """A pool that cannot connect, or a connection that broke, as :class:`DatabaseError`."""
        try:
            yield
        except DBAPIError as exc:  # raised when the pool cannot connect
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None
        except self._connection_errors as exc:
            raise DatabaseError(f"database {self.display_url}: {exc}") from None

    @contextmanager
    def scanning(self, streams: int = 1) -> Iterator[tuple[list[Transaction],
                                                                  Transaction]]:
        """Reads in one read transaction on a connection of the pool: ``streams``
        for long results read with ``fetchmany`` (on PostgreSQL server-side cursors, so
        millions of rows are never held at once), and one for small reads beside them."""
        self._held.lend()
        try:
            connection = self.engine.raw_connection()
        except DBAPIError as exc:
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None
        dbapi: Any = connection.dbapi_connection
        try:
            if self.dialect == "sqlite":
                dbapi.execute("BEGIN")
                long = [dbapi.cursor() for _ in range(streams)]
            else:
                long = [dbapi.cursor(name=f"lifecycle_scan_{n}") for n in range(streams)]
                for cursor in long:
                    cursor.itersize = 5000
            yield ([Transaction(cursor, self.dialect, self.sql) for cursor in long],
                   Transaction(dbapi.cursor(), self.dialect, self.sql))
        except self._connection_errors as exc:
            raise DatabaseError(f"database {self.display_url}: {exc}") from None
        finally:
            try:
                dbapi.rollback()
            finally:
                connection.close()

    def dispose(self) -> None:
        """Close every connection this store opened (it may be used again: it reconnects)."""
        _close(self._held, self.engine)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.dispose()

    json_value = staticmethod(json_value)
    time_value = staticmethod(time_value)


@functools.cache
def _migrated_sqlite() -> bytes:
    """The file of an empty SQLite database Alembic migrated to the code's revision (read
    through SQLite, so with anything a write-ahead log still held)."""
    with tempfile.TemporaryDirectory(prefix="lifecycle-schema-") as directory:
        path = Path(directory) / "schema.db"
        Store(f"sqlite:///{path}", upgrade=True).dispose()
        with closing(sqlite3.connect(path)) as connection:
            return connection.serialize()


def _close(held: HeldConnections, engine: Any) -> None:
    held.close()
    engine.dispose()
