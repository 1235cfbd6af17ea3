"""Opening a database: URL resolution, SQLite pragmas, PostgreSQL, and the transaction
helpers the engine uses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..errors import DatabaseError

DEFAULT_URL = "sqlite:///lifecycle.db"
URL_VARIABLE = "LIFECYCLE_DATABASE_URL"
SQLITE_SYNCHRONOUS_VARIABLE = "LIFECYCLE_SQLITE_SYNCHRONOUS"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def resolve_url(url: str | None = None) -> str:
    """The database URL: the argument, else ``$LIFECYCLE_DATABASE_URL``, else
    ``./lifecycle.db``. A plain path means a SQLite file; ``postgresql://`` means psycopg 3."""
    url = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    if "://" not in url:
        return f"sqlite:///{url}"
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain):]
    return url


def display_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def create_sa_engine(url: str) -> SAEngine:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise DatabaseError(f"invalid database URL {url!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True)
    raise DatabaseError(f"unsupported database {parsed.get_backend_name()!r} in {url!r}: "
                        "lifecycle runs on SQLite and PostgreSQL")


def _sqlite_engine(url: str) -> SAEngine:
    synchronous = os.environ.get(SQLITE_SYNCHRONOUS_VARIABLE, "NORMAL").upper()
    if synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise DatabaseError(f"{SQLITE_SYNCHRONOUS_VARIABLE}={synchronous!r}: "
                            "use NORMAL (the default) or FULL")
    memory = make_url(url).database in (None, "", ":memory:")
    engine = create_engine(url, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling is switched off: lifecycle says BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # A writer takes the write lock up front, so two writers never deadlock on an upgrade
        # from a read lock; readers ask for a plain deferred BEGIN.
        readonly = connection.get_execution_options().get("lifecycle_readonly", False)
        connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


@contextmanager
def raw_transaction(engine: SAEngine) -> Iterator[Any]:
    """A DBAPI cursor inside one write transaction: committed on success, rolled back on
    any exception. The engine's hot path runs its pre-compiled statements here."""
    connection = engine.raw_connection()
    try:
        cursor = connection.cursor()
        if engine.dialect.name == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            connection.rollback()
            raise
        connection.commit()
    finally:
        connection.close()
