"""Opening a database: URL resolution, SQLite pragmas, PostgreSQL, and the transaction
helpers the engine uses."""

from __future__ import annotations

import os
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import ArgumentError

from ..errors import DatabaseError
from ..logs import logger
from ..storable import text_problem
from ..urls import display_url
from .schema import use_postgresql
from .transaction import Pipelined, Transaction, register_json_text

if TYPE_CHECKING:
    from .statements import Statements

log = logger(__name__)

SQLITE_SYNCHRONOUS_VARIABLE = "LIFECYCLE_SQLITE_SYNCHRONOUS"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def parse_url(url: str) -> URL:
    """The URL, parsed; :class:`DatabaseError` for one lifecycle cannot open (not a URL, a
    database or driver other than SQLite and PostgreSQL through psycopg 3)."""
    shown = display_url(url)
    problem = text_problem(url, 10_000)
    if problem is not None:
        raise DatabaseError(f"invalid database URL {shown!r}: it {problem}")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        reason = "its port is not a number" if isinstance(exc, ValueError) else \
            "write postgresql://USER@HOST/DB, sqlite:///PATH, or a plain file path"
        raise DatabaseError(f"invalid database URL {shown!r}: {reason}") from None
    backend = parsed.get_backend_name()
    if backend not in _DRIVERS:
        raise DatabaseError(f"unsupported database {backend!r} in {shown!r}: lifecycle runs "
                            "on SQLite (sqlite:///PATH) and PostgreSQL (postgresql://...)")
    driver = parsed.drivername.partition("+")[2] or parsed.get_driver_name()
    if driver != _DRIVERS[backend]:
        raise DatabaseError(f"database URL {shown!r} asks for the driver {driver!r}; "
                            f"lifecycle uses {_DRIVERS[backend]!r}: write "
                            f"{'postgresql://' if backend == 'postgresql' else 'sqlite:///'}...")
    return parsed


_DRIVERS = {"sqlite": "pysqlite", "postgresql": "psycopg"}
_SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_file(parsed: URL) -> Path | None:
    """The file of a SQLite URL (None for an in-memory database), once it is known that its
    directory exists and that, if the file exists, it is a SQLite database: opening it
    otherwise fails later with a message that names neither."""
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    name = parsed.database
    if parsed.query.get("uri") in ("true", "1") and name.startswith("file:"):
        name = urllib.parse.unquote(name[len("file:"):].split("?", 1)[0])
        if name in ("", ":memory:") or parsed.query.get("mode") == "memory":
            return None
    path = Path(name)
    shown = display_url(parsed.render_as_string(hide_password=False))
    if not path.parent.is_dir():
        raise DatabaseError(f"database {shown}: the directory {str(path.parent)!r} does not "
                            "exist; create it, or name a file in a directory that does")
    if path.is_dir():
        raise DatabaseError(f"database {shown}: {str(path)!r} is a directory, not a file")
    try:
        with path.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise DatabaseError(f"database {shown}: cannot read {str(path)!r}: "
                            f"{exc.strerror or exc}") from None
    if header and header != _SQLITE_HEADER:
        raise DatabaseError(f"database {shown}: {str(path)!r} is not a SQLite database "
                            "(its first bytes are not SQLite's header)")
    return path


def create_sa_engine(url: str) -> SAEngine:
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    # No pre-ping: it costs a round trip per transaction; a broken connection is thrown
    # away when it fails (HeldConnections) and the next transaction opens a new one.
    # Sessions in UTC, set when connecting (no round trip): psycopg then gives times in
    # datetime.UTC, which lifecycle keeps as they are instead of converting each one
    # (an options of the URL's own comes after, and wins).
    register_json_text()
    return postgresql_engine(parsed, "-c TimeZone=UTC")


def postgresql_engine(url: str | URL, options: str, *, last: bool = False,
                      **pool: Any) -> SAEngine:
    """An engine on PostgreSQL whose sessions start with ``options`` (``-c NAME=VALUE ...``,
    given when connecting: no round trip) beside the URL's own ``options``: before them,
    so that the URL's win, or (``last``) after them, so that these win. Its dialect answers
    the first connection in one round trip (:func:`answering_first_connect`); ``pool``:
    ``create_engine``'s pool arguments."""
    use_postgresql()
    given = make_url(url).query.get("options")
    given = " ".join(given) if isinstance(given, tuple) else given
    if given:
        options = f"{given} {options}" if last else f"{options} {given}"
    engine = create_engine(url, use_native_hstore=False, connect_args={"options": options},
                           **pool)
    engine.dialect.__class__ = answering_first_connect(type(engine.dialect))
    return engine


_ANSWERING: dict[type[Any], type[Any]] = {}


def answering_first_connect(dialect: type[Any]) -> type[Any]:
    """SQLAlchemy's PostgreSQL ``dialect``, learning what it asks on an engine's first
    connection in one statement, not eight round trips: the server's version and
    ``standard_conforming_strings`` are what the server told psycopg when it connected, the
    default schema and isolation level one SELECT in autocommit (no BEGIN, no ROLLBACK).
    (``use_native_hstore=False``, given to ``create_engine``, drops the hstore type's
    lookup: lifecycle has no hstore.) Each store and command makes an engine of its own,
    so each paid those round trips. (The dialect ``create_engine`` made from the URL is
    given this class: the same, but for these answers.)"""
    if dialect in _ANSWERING.values():
        return dialect
    if dialect in _ANSWERING:
        return _ANSWERING[dialect]

    class AnsweringFirstConnect(dialect):  # type: ignore[misc]
        supports_statement_cache = True  # (as its base: SQLAlchemy asks each subclass)
        _isolation: str | None = None

        def _get_server_version_info(self, connection: Connection) -> tuple[int, ...]:
            raw: Any = connection.connection.dbapi_connection
            number = int(raw.info.server_version)
            if number >= 100_000:  # PostgreSQL 10 on: major * 10000 + minor
                return number // 10_000, number % 10_000
            return number // 10_000, number // 100 % 100, number % 100

        def _get_default_schema_name(self, connection: Connection) -> str | None:
            raw: Any = connection.connection.dbapi_connection
            autocommit = raw.autocommit
            raw.autocommit = True
            try:
                row = raw.execute("SELECT current_schema(), "
                                  "current_setting('transaction_isolation')").fetchone()
            finally:
                raw.autocommit = autocommit
            self._isolation = str(row[1]).upper()
            return cast("str | None", row[0])

        def get_default_isolation_level(self, dbapi_connection: Any) -> Any:
            learnt, self._isolation = self._isolation, None
            return learnt or super().get_default_isolation_level(dbapi_connection)

        def _set_backslash_escapes(self, connection: Connection) -> None:
            raw: Any = connection.connection.dbapi_connection
            self._backslash_escapes = raw.info.parameter_status(
                "standard_conforming_strings") == "off"

    _ANSWERING[dialect] = AnsweringFirstConnect
    return AnsweringFirstConnect


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


class _Holder:
    """A thread's connection; when the thread ends, its thread-local dies with it, and the
    connection goes back to the pool (see HeldConnections._connection)."""

    __slots__ = ("__weakref__", "connection", "writer", "writing")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.writing: Pipelined | None = None  # the write transaction open on it, if any
        self.writer: Writing | None = None  # on SQLite: its transactions' one Writing


class HeldConnections:
    """One DBAPI connection per thread, taken from the pool once and kept while the thread
    lives: checking a connection out of the pool and back for every transaction cost more
    than half of the database's own work on SQLite (see benchmarks/). A connection that broke
    is thrown away, and the next transaction of that thread opens a new one."""

    def __init__(self, engine: SAEngine) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._local = threading.local()
        self._held: list[Any] = []
        self._lock = threading.Lock()

    def _connection(self) -> Any:
        holder = getattr(self._local, "holder", None)
        if holder is None:
            holder = _Holder(self.engine.raw_connection())
            self._local.holder = holder
            with self._lock:
                self._held.append(holder.connection)
            weakref.finalize(holder, self._release, holder.connection)
        return holder.connection

    def _release(self, connection: Any, *, broken: bool = False) -> None:
        """Give a held connection back (or throw it away), once."""
        with self._lock:
            if connection not in self._held:
                return
            self._held.remove(connection)
        try:
            dbapi = connection.dbapi_connection
            if broken or _broken(dbapi):
                connection.invalidate()
            else:
                if not self.sqlite and dbapi.autocommit and _idle(dbapi):
                    dbapi.autocommit = False  # (held, it was in autocommit: see Pipelined)
                connection.close()
        except Exception as exc:  # it is being given back; nothing else to do
            log.debug("releasing a held connection: %s", exc)

    def lend(self) -> None:
        """Before this thread takes a connection of the pool for a while (``Store.read()``,
        ``begin()``, ``scanning()``) on PostgreSQL: the connection it holds, when no write
        transaction is open on it, goes back to the pool, for that to take it rather than
        the server starting a second one (a process of its own, its catalogs read again)
        for a thread that reads and writes in turn; the thread's next write takes one
        again. (On SQLite a connection is a file opened: the thread keeps its own, and its
        transaction made once.)"""
        if self.sqlite:
            return
        holder = getattr(self._local, "holder", None)
        if holder is not None and holder.writing is None:
            self._local.holder = None
            self._release(holder.connection)

    def _discard(self) -> None:
        holder = getattr(self._local, "holder", None)
        self._local.holder = None
        if holder is not None:
            self._release(holder.connection, broken=True)

    def transaction(self, sql: Statements, lost: Callable[[Exception], Exception | None], *,
                    held: bool = True) -> Writing:
        """One write transaction (a context manager giving a :class:`Transaction`):
        committed on success, rolled back on any exception. The engine's hot path runs its
        pre-compiled statements here. On SQLite a cursor after ``BEGIN IMMEDIATE``; on
        PostgreSQL a :class:`Pipelined` transaction, whose statements are sent without
        waiting for each. With ``held=False`` the connection comes from the pool and goes
        back after (for threads that write rarely, such as effect handlers). ``lost`` says
        what a lost database (an error of the pool or of a connection) is raised as.
        (On SQLite a thread's held connection has one, with its cursor and
        :class:`Transaction`, made once: a write makes no object.)"""
        if held and self.sqlite:
            holder = getattr(self._local, "holder", None)
            if holder is not None and holder.writer is not None:
                return cast(Writing, holder.writer)
        return Writing(self, sql, lost, held)

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A DBAPI cursor for reads of one statement each, on the thread's held connection and
        outside any transaction: each statement reads one consistent snapshot, and a read
        costs neither a pool checkout nor a BEGIN and a rollback. (SQLite's connection is in
        autocommit mode already, and so is a PostgreSQL thread's held one, see
        :class:`Pipelined`; one borrowed is switched to it for the read, which psycopg does
        without a round trip.) Inside a write transaction of the same thread, the read
        is made in that transaction. A thread that holds no connection (it never wrote: an
        effect handler's, a reader's) borrows one from the pool for the read, as its writes
        do (``held=False``), so that many such threads do not each keep one."""
        holder = getattr(self._local, "holder", None)
        connection: Any = self.engine.raw_connection() if holder is None else holder.connection
        if holder is not None and holder.writing is not None:
            holder.writing.join()  # what it holds is sent first, for the read to see it
        dbapi = connection.dbapi_connection
        switched = not self.sqlite and not dbapi.autocommit and _idle(dbapi)
        try:
            if switched:
                dbapi.autocommit = True
            cursor = dbapi.cursor()
            try:
                yield cursor
            finally:
                cursor.close()
        except self.engine.dialect.dbapi.Error:  # type: ignore[union-attr]
            if _broken(dbapi):
                switched = False
                if holder is not None:
                    self._discard()
                else:
                    connection.invalidate()
            raise
        finally:
            if switched:
                dbapi.autocommit = False
            if holder is None:
                connection.close()  # (after invalidate(): nothing goes back to the pool)

    def close(self) -> None:
        with self._lock:
            held = list(self._held)
        for connection in held:
            self._release(connection)
        self._local = threading.local()


class Writing:
    """:meth:`HeldConnections.transaction`'s context manager: a class rather than nested
    generator-based ones, which cost a tenth of a SQLite fire's CPU."""

    __slots__ = ("_again", "_commit", "_connection", "_held", "_holder", "_keep", "_lost",
                 "_rollback", "_sql", "_tx")
    _connection: Any

    def __init__(self, held: HeldConnections, sql: Statements,
                 lost: Callable[[Exception], Exception | None], keep: bool) -> None:
        self._held, self._sql, self._lost, self._keep = held, sql, lost, keep
        self._again: Transaction | None = None

    def __enter__(self) -> Transaction:
        tx = self._again
        if tx is not None:  # SQLite, the thread's held connection: made once
            try:
                tx.execute("BEGIN IMMEDIATE")
            except Exception as exc:
                self._failed(exc)
                raise (self._lost(exc) or exc) from None
            return tx
        held = self._held
        try:
            connection = self._connection = (
                held._connection() if self._keep else held.engine.raw_connection())
        except Exception as exc:
            raise (self._lost(exc) or exc) from None
        dbapi: Any = connection.dbapi_connection
        try:
            if held.sqlite:
                cursor = dbapi.cursor()
                cursor.execute("BEGIN IMMEDIATE")
                self._tx: Transaction = Transaction(cursor, "sqlite", self._sql)
                self._commit, self._rollback = dbapi.commit, dbapi.rollback
                if self._keep:  # the thread's next writes reuse it
                    self._again = self._tx
                    held._local.holder.writer = self
            else:
                self._tx = Pipelined(dbapi, self._sql, restore=not self._keep)
                if self._keep:  # a read of this thread meanwhile joins it (reading())
                    self._holder = held._local.holder
                    self._holder.writing = self._tx
        except Exception as exc:
            self._failed(exc)
            raise (self._lost(exc) or exc) from None
        return self._tx

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 _tb: object) -> None:
        tx = self._tx
        pipelined = type(tx) is Pipelined
        if self._keep and pipelined:
            self._holder.writing = None
        try:
            if kind is None:
                cast(Pipelined, tx).commit() if pipelined else self._commit()
            else:
                cast(Pipelined, tx).abandon() if pipelined else self._rollback()
        except Exception as error:
            self._failed(error)
            raise (self._lost(error) or error) from None
        if exc is not None and isinstance(exc, Exception):
            self._failed(exc)
            lost = self._lost(exc)
            if lost is not None:
                raise lost from None
        elif not self._keep:
            self._connection.close()

    def _failed(self, exc: Exception) -> None:
        """After an error: a connection that broke is thrown away (never reset by the pool,
        which would log it as an ERROR); one from the pool that did not goes back."""
        held = self._held
        dbapi = self._connection.dbapi_connection
        errors: Any = held.engine.dialect.dbapi
        broken = isinstance(exc, errors.Error) and _broken(dbapi)
        if self._keep:
            if broken:  # thrown away, not reset by the pool (which would log the lost
                held._discard()  # connection as an ERROR with its traceback)
        else:
            if broken:
                self._connection.invalidate()
            self._connection.close()  # (after invalidate(): nothing goes back to the pool)


def _idle(dbapi: Any) -> bool:
    """Whether a psycopg connection is outside any transaction."""
    return int(dbapi.info.transaction_status) == 0  # psycopg.pq.TransactionStatus.IDLE


def _broken(dbapi: Any) -> bool:
    """Whether a DBAPI connection can no longer be used (psycopg says so; sqlite3 cannot
    break this way)."""
    return bool(getattr(dbapi, "broken", False) or getattr(dbapi, "closed", False))
