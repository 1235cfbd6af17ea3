"""A database opened for reading only (the dashboard's, and a worker's /metrics): a SQLite file
in SQLite's read-only mode (``mode=ro``, and ``query_only``), PostgreSQL sessions whose
transactions are read-only and whose statements time out. It never creates a file, a table
or a row, and never migrates: a database that is missing, empty of lifecycle's tables or at
another schema revision is :class:`Unavailable`, with what to do about it."""

from __future__ import annotations

import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError
from sqlalchemy.pool import QueuePool

from ..errors import DatabaseError
from ..revisions import core_revision
from ..urls import display_url, resolve_url
from . import migrate
from .database import SQLITE_BUSY_TIMEOUT_MS, parse_url, postgresql_engine, sqlite_file

STATEMENT_TIMEOUT_MS = 10_000
"""PostgreSQL: the longest a dashboard statement may run (a page is never worth more)."""


class Unavailable(Exception):
    """The database cannot be shown: ``reason`` says what is wrong, ``remedy`` what to do."""

    def __init__(self, reason: str, remedy: str) -> None:
        super().__init__(f"{reason}; {remedy}")
        self.reason = reason
        self.remedy = remedy


class ReadOnlyDatabase:
    """The database a dashboard (or a worker's /metrics) reads, as it is at each request."""

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_url(url)
        self.display_url = display_url(self.url)
        parsed = parse_url(self.url)  # DatabaseError for a URL lifecycle cannot open
        self.path: Path | None = None
        if parsed.get_backend_name() == "sqlite":
            self.path = sqlite_file(parsed)
            if self.path is None:
                raise DatabaseError(f"database {self.display_url}: an in-memory database "
                                    "holds nothing another process wrote; name a file")
            self.engine = _sqlite_engine(self.path)
        else:
            self.engine = _postgresql_engine(self.url)
        self.dialect: str = self.engine.dialect.name
        self.head = migrate.head_revision()  # the code's, read once: it does not change

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection inside one read transaction (one snapshot for a whole page), once the
        schema is known to be lifecycle's current one; :class:`Unavailable` otherwise."""
        if self.path is not None and not self.path.exists():
            raise Unavailable(f"there is no database at {str(self.path)!r}",
                              "create it with `lifecycle db upgrade --db PATH`, or name "
                              "another with --db")
        try:
            with self.engine.connect() as connection, connection.begin():
                self._check(connection)
                yield connection
        except DBAPIError as exc:
            raise Unavailable(f"database {self.display_url} cannot be read: "
                              f"{' '.join(str(exc.orig).split())}",
                              "check that it is running and that this user may read it") \
                from None

    def _check(self, connection: Connection) -> None:
        current = _revision(connection)
        head = self.head
        if current == head:
            return
        if current is None:
            raise Unavailable(f"database {self.display_url} has no lifecycle tables yet",
                              "create them with `lifecycle db upgrade` (the dashboard "
                              "only reads)")
        if current not in {r for r, _, _ in migrate.revisions()}:
            raise Unavailable(f"database {self.display_url} is at schema revision "
                              f"{current}, newer than this lifecycle knows ({head})",
                              "upgrade lifecycle")
        raise Unavailable(f"database {self.display_url} is at schema revision {current}, "
                          f"not {head}", "bring it up to date with `lifecycle db upgrade` "
                          "(the dashboard never migrates)")

    def dispose(self) -> None:
        self.engine.dispose()


def _revision(connection: Connection) -> str | None:
    """The database's schema revision; None when it has no version table (read directly:
    asking Alembic costs more than a whole page)."""
    try:  # (no savepoint: a database without the table is Unavailable, its read ends here)
        rows = connection.exec_driver_sql(
            f"SELECT version_num FROM {migrate.VERSION_TABLE}").scalars().all()
    except (OperationalError, ProgrammingError) as exc:
        if "no such table" in str(exc.orig) or "does not exist" in str(exc.orig):
            return None
        raise
    return core_revision([str(row) for row in rows])  # (machines' branches' rows aside)


def _sqlite_engine(path: Path) -> SAEngine:
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False,
                                     isolation_level=None)
        connection.execute("PRAGMA query_only=ON")
        connection.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        return connection

    engine = create_engine("sqlite://", creator=connect, poolclass=QueuePool, pool_size=8,
                           max_overflow=8)

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # a deferred transaction: one snapshot for the page, taking no lock a writer waits on
        connection.exec_driver_sql("BEGIN")

    return engine


def _postgresql_engine(url: str) -> SAEngine:
    # read-only transactions and the statement timeout are the session's from its start,
    # after any options of the URL's own (which cannot lift them)
    return postgresql_engine(url, "-c default_transaction_read_only=on "
                                  f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                             last=True, pool_size=8, max_overflow=8)


__all__ = ["STATEMENT_TIMEOUT_MS", "Connection", "ReadOnlyDatabase", "Unavailable"]
