"""The store: schema, database setup and the pre-compiled statements of the hot path."""

from __future__ import annotations

import datetime as dt
import json
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from sqlalchemy import (
    ARRAY,
    Connection,
    String,
    any_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    null,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, OperationalError

from ..errors import DatabaseError, SchemaOutOfDate
from ..records import (
    CANCELLED,
    FIRED,
    OBSERVATION_COLUMNS,
    OPEN,
    PENDING,
    REFUSED,
    RUNNING,
    SHOWN_COLUMNS,
    json_value,
    time_value,
)
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
    sqlite_time,
    state_counts,
    timers,
)

__all__ = ["Store", "journal", "machines", "metadata", "observations", "outbox", "resolve_url",
           "resources", "specs", "state_counts", "timers"]


class Store:
    """One database: SQLite by default, PostgreSQL when many processes and hosts share it.

    Opening checks that the schema is at the code's revision and refuses otherwise (or
    upgrades, when ``upgrade=True``); it never creates tables behind Alembic's back."""

    def __init__(self, url: str | None = None, *, upgrade: bool = False, check: bool = True):
        self.url = resolve_url(url)
        self.display_url = display_url(self.url)
        self._sqlite_file = sqlite_file(parse_url(self.url))  # DatabaseError if unusable
        if check and not upgrade and self._sqlite_file and not self._sqlite_file.exists():
            raise SchemaOutOfDate(self.display_url, None, migrate.head_revision())
        self.engine = create_sa_engine(self.url)
        self._held = HeldConnections(self.engine)
        # a store dropped without dispose() still gives its connections back
        self._closer = weakref.finalize(self, _close, self._held, self.engine)
        self.dialect: str = self.engine.dialect.name
        self.sql = Statements(self.engine.dialect)
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
        if check:
            self.check_schema(upgrade=upgrade)

    # -- schema ------------------------------------------------------------------------

    def current_revision(self) -> str | None:
        with self.read() as connection:
            return migrate.current_revision(connection)

    def check_schema(self, *, upgrade: bool = False) -> None:
        head = migrate.head_revision()
        current = self.current_revision()
        if current == head:
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

    def upgrade(self, revision: str = "head") -> None:
        migrate.upgrade(self.engine, revision)

    def downgrade(self, revision: str) -> None:
        migrate.downgrade(self.engine, revision)

    # -- connections -------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A SQLAlchemy connection for reading (a deferred transaction on SQLite)."""
        try:
            with self.engine.connect().execution_options(lifecycle_readonly=True) as connection:
                yield connection
        except OperationalError as exc:
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A SQLAlchemy connection inside one write transaction."""
        try:
            with self.engine.begin() as connection:
                yield connection
        except OperationalError as exc:
            raise DatabaseError(f"database {self.display_url}: {exc.orig}") from None

    @contextmanager
    def write(self, *, held: bool = True) -> Iterator[Any]:
        """A raw DBAPI cursor inside one write transaction, for ``self.sql`` statements, on
        the calling thread's own connection (``held=False``: one from the pool, given back
        after)."""
        with self._lost_database(), self._held.transaction(held=held) as cursor:
            yield cursor

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A raw DBAPI cursor for reads of one statement each (``self.sql``'s), on the calling
        thread's own connection and outside any transaction: each statement reads one
        consistent snapshot, without a pool checkout, a BEGIN or a rollback."""
        with self._lost_database(), self._held.reading() as cursor:
            yield cursor

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
    def scanning(self, streams: int = 1) -> Iterator[tuple[list[Any], Any]]:
        """Raw DBAPI cursors in one read transaction on a connection of the pool: ``streams``
        for long results read with ``fetchmany`` (on PostgreSQL server-side cursors, so
        millions of rows are never held at once), and one for small reads beside them."""
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
            yield long, dbapi.cursor()
        except self._connection_errors as exc:
            raise DatabaseError(f"database {self.display_url}: {exc}") from None
        finally:
            try:
                dbapi.rollback()
            finally:
                connection.close()

    @staticmethod
    def rollback(cursor: Any) -> None:
        """Undo what the :meth:`write` transaction of ``cursor`` wrote so far; the block then
        commits nothing (how the engine gives up an attempt that must be made again)."""
        cursor.connection.rollback()

    def dispose(self) -> None:
        """Close every connection this store opened (it may be used again: it reconnects)."""
        _close(self._held, self.engine)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.dispose()

    # -- many rows on the raw path ----------------------------------------------------

    def insert_many(self, cursor: Any, statement: str, rows: list[dict[str, Any]]) -> list[int]:
        """Run ``statement`` (an ``INSERT ... RETURNING id``) once per row, in the transaction
        of ``cursor``; the ids, in order. On PostgreSQL the rows go in one round trip
        (psycopg pipelines ``executemany``); SQLite runs in this process anyway."""
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

    # -- values on the raw path --------------------------------------------------------

    def time_param(self, value: dt.datetime) -> Any:
        return sqlite_time(value) if self.dialect == "sqlite" else value

    def json_param(self, value: Any) -> Any:
        """Strict JSON (no NaN or Infinity, which PostgreSQL refuses): raises ValueError or
        TypeError for what JSON cannot hold."""
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        if self.dialect == "sqlite":
            return text
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=lambda _: text)

    json_value = staticmethod(json_value)
    time_value = staticmethod(time_value)


def _close(held: HeldConnections, engine: Any) -> None:
    held.close()
    engine.dispose()


def _constant(value: str) -> Any:
    """A status written into a statement as a constant (it is part of the statement's text,
    compiled once)."""
    return literal_column(f"'{value}'")


class Statements:
    """The hot path's statements, built from the schema once and compiled for the dialect,
    then run on a raw DBAPI cursor: SQLAlchemy's per-statement overhead would otherwise cost
    several times the database's own work (see benchmarks/)."""

    RESOURCE_COLUMNS = ("id", "machine", "key", "state", "version", "seq", "data",
                        "spec_version", "last_transition_at", "created_at")
    OBSERVATION_COLUMNS = OBSERVATION_COLUMNS
    SHOWN_COLUMNS = SHOWN_COLUMNS

    def __init__(self, dialect: Dialect) -> None:
        if dialect.name == "sqlite":
            dialect = sqlite_dialect.dialect(paramstyle="named")
        self.dialect = dialect
        self._reading()
        self._verifying()
        self._bulk()
        self._moving()
        self._recording()
        self._outbox()

    def _sql(self, statement: Any) -> str:
        return str(statement.compile(dialect=self.dialect))

    def _reading(self) -> None:
        """The resource with its newest observation, by key."""
        r, o, sql = resources.c, observations.c, self._sql
        located = (
            select(*(r[n] for n in self.RESOURCE_COLUMNS),
                   *(o[n] for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id))
        )
        self.resource_by_key = sql(located.where(r.key == bindparam("key")))
        self.resource_by_machine_key = sql(
            located.where(r.machine == bindparam("machine"), r.key == bindparam("key")))
        # what a reader is shown: get, and the pages of a listing
        self.shown = (
            select(*(r[n] for n in self.SHOWN_COLUMNS),
                   *(o[n] for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id)))
        self.shown_by_key = sql(self.shown.where(r.key == bindparam("key")))
        self.shown_by_machine_key = sql(
            self.shown.where(r.machine == bindparam("machine"), r.key == bindparam("key")))
        self._pages: dict[tuple[bool, bool, bool], str] = {}
        c = state_counts.c
        self.counts = {by_machine: sql(
            select(c.machine, c.state, func.sum(c.n), func.count())
            .where(*([c.machine == bindparam("machine")] if by_machine else []))
            .group_by(c.machine, c.state)) for by_machine in (False, True)}

    FOLD_COUNTS: ClassVar[dict[str, list[str]]] = {
        # one statement, so no row committed meanwhile is deleted without being added up
        "postgresql": ["WITH gone AS (DELETE FROM lifecycle_state_counts "
                       "RETURNING machine, state, n) "
                       "INSERT INTO lifecycle_state_counts (machine, state, n) "
                       "SELECT machine, state, sum(n) FROM gone GROUP BY machine, state "
                       "HAVING sum(n) <> 0"],
        # writers take turns on SQLite: nothing is added while the transaction runs
        "sqlite": ["INSERT INTO lifecycle_state_counts (machine, state, n) "
                   "SELECT machine, state, sum(n) FROM lifecycle_state_counts "
                   "WHERE id <= :upto GROUP BY machine, state HAVING sum(n) <> 0",
                   "DELETE FROM lifecycle_state_counts WHERE id <= :upto"],
    }
    """Folding the count rows: one row per machine and state, the sum of its rows."""

    def _verifying(self) -> None:
        """Every resource with its journal, in order; a stored spec."""
        r, j, sql = resources.c, journal.c, self._sql
        # two streams in the same order, merged by the reader: each row read once, the
        # resource's columns not repeated on each of its journal rows
        self.verified_resources = sql(
            select(r.id, r.machine, r.key, r.state, r.version, r.seq).order_by(r.id))
        self.journals = sql(
            select(j.resource_id, j.seq, j.kind, j.trigger, j.source, j.dest, j.version,
                   j.spec_version).order_by(j.resource_id, j.seq))
        self.stored_spec = sql(select(specs.c.spec).where(
            specs.c.machine == bindparam("machine"), specs.c.version == bindparam("version")))

    def page(self, machine: bool, state: bool, after: bool) -> str:
        """A page of resources in (machine, key) order, with their newest observations: of
        one ``machine`` or all, in one ``state`` (or a state inside it: a ``LIKE`` prefix,
        ``/`` its escape) or all, ``after`` a (machine, key) position (with ``machine``, a
        key of it) or from the start; ``limit`` rows. Compiled on first use."""
        shape = (machine, state, after)
        if shape not in self._pages:
            r = resources.c
            where = []
            if machine:
                where.append(r.machine == bindparam("machine"))
            if state:
                where.append((r.state == bindparam("state"))
                             | r.state.like(bindparam("state_prefix"), escape="/"))
            if after and machine:  # keyset: past the last key of the page before
                where.append(r.key > bindparam("after_key"))
            elif after:  # keyset: (machine, key) past the last row of the page before
                where.append(tuple_(r.machine, r.key) > tuple_(
                    bindparam("after_machine"), bindparam("after_key")))
            limit = ":limit" if self.dialect.name == "sqlite" else "%(limit)s"
            # the page's ids first, then their rows and observations: the planner then
            # walks the index for ``limit`` entries (asked all at once, PostgreSQL misjudges
            # a row comparison's rows and joins and sorts half the table)
            ids = self._sql(select(r.id).where(*where).order_by(r.machine, r.key))
            shown = self._sql(self.shown.order_by(r.machine, r.key))
            table = self._sql(select(r.id)).split("FROM ", 1)[1].strip()
            assert shown.count(f"FROM {table} ") == 1, shown
            self._pages[shape] = shown.replace(
                f"FROM {table} ",
                f"FROM ({ids} LIMIT {limit}) AS page JOIN {table} ON {table}.id = page.id ")
        return self._pages[shape]

    def _bulk(self) -> None:
        """Many resources of one machine, with their newest observations, by key: the read
        of a batch (``Engine.observe_many``, ``Engine.step_many``). The keys are one
        parameter, ``keys``: an array on PostgreSQL, a JSON array on SQLite."""
        r, o, sql = resources.c, observations.c, self._sql
        if self.dialect.name == "postgresql":
            keys: Any = r.key == any_(bindparam("keys", type_=ARRAY(String)))
        else:
            keys = r.key.in_(select(literal_column("value")).select_from(
                func.json_each(bindparam("keys"))).scalar_subquery())
        self.resources_by_machine_keys = sql(
            select(*(r[n] for n in self.RESOURCE_COLUMNS),
                   *(o[n] for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id))
            .where(r.machine == bindparam("machine"), keys))
        # what an observation needs of its resource
        self.resource_ids_by_machine_keys = sql(
            select(r.id, r.machine, r.key).where(r.machine == bindparam("machine"), keys))

    def keys_param(self, keys: list[str]) -> Any:
        """The ``keys`` parameter of :attr:`resources_by_machine_keys` and
        :attr:`resource_ids_by_machine_keys`."""
        return keys if self.dialect.name == "postgresql" else json.dumps(keys)

    def _moving(self) -> None:
        """A resource created, moved, its data changed, a risky edge refused."""
        r, sql = resources.c, self._sql
        # compare-and-swap: the row is still the one the decision was taken on
        cas = (r.id == bindparam("id_"), r.version == bindparam("version_"),
               r.seq == bindparam("seq_"))
        rested = r.observation_id.is_not_distinct_from(bindparam("observation_id_"))
        moved: dict[str, Any] = {
            "state": bindparam("new_state"), "version": bindparam("new_version"),
            "seq": bindparam("new_seq"), "spec_version": bindparam("new_spec_version"),
            "updated_at": bindparam("now"), "last_transition_at": bindparam("now"),
        }
        self.move: dict[tuple[bool, bool], str] = {}
        for with_data in (False, True):
            for on_observation in (False, True):
                values = {**moved, "data": bindparam("new_data")} if with_data else moved
                where = (*cas, rested) if on_observation else cas
                self.move[with_data, on_observation] = sql(
                    update(resources).where(*where).values(**values))
        # a change of data alone: a new version, not a transition
        self.change_data = sql(update(resources).where(*cas).values(
            data=bindparam("new_data"), version=bindparam("new_version"),
            seq=bindparam("new_seq"), updated_at=bindparam("now")))
        # a refusal takes a journal sequence number, and changes nothing else
        self.refuse = sql(update(resources).where(*cas, rested).values(seq=bindparam("new_seq")))
        self.insert_resource = sql(
            insert(resources)
            .values(
                machine=bindparam("machine"), key=bindparam("key"),
                spec_version=bindparam("spec_version"), state=bindparam("state"),
                version=bindparam("version"), seq=bindparam("seq"), data=bindparam("data"),
                created_at=bindparam("now"), updated_at=bindparam("now"),
                last_transition_at=bindparam("now"),
            )
            .returning(r.id)
        )

    def _recording(self) -> None:
        """The journal row of every write; observations and which one is the newest."""
        r, o, sql = resources.c, observations.c, self._sql
        self.insert_journal = sql(
            insert(journal).values(
                resource_id=bindparam("resource_id"), seq=bindparam("seq"),
                kind=bindparam("kind"), trigger=bindparam("trigger"),
                source=bindparam("source"), dest=bindparam("dest"),
                version=bindparam("version"), spec_version=bindparam("spec_version"),
                actor=bindparam("actor"), at=bindparam("at"),
                payload=bindparam("payload"), guards=bindparam("guards"),
                observation_id=bindparam("observation_id"), fence=bindparam("fence"),
            )
        )
        self.insert_observation = sql(
            insert(observations).values(
                resource_id=bindparam("resource_id"), status=bindparam("status"),
                observed_at=bindparam("observed_at"), recorded_at=bindparam("recorded_at"),
                source=bindparam("source"),
            ).returning(o.id)
        )
        # the newest observation by observed_at; an older one arriving late does not replace it
        self.newest_observation = sql(
            update(resources)
            .where(r.id == bindparam("id_"),
                   (r.observed_at.is_(None)) | (r.observed_at <= bindparam("observed_at_")))
            .values(observation_id=bindparam("observation_id"),
                    observed_at=bindparam("observed_at_"))
        )

    def _queue_heads(self) -> None:
        """Each resource's effects form a queue; its head (the first open effect, marked
        ``head = 1``) is the only one that may run. A transition that asks for effects makes
        its first one the head if nothing is open; an effect done passes the head to the
        next. Both run under the resource's row lock (the transition's compare-and-swap, or
        ``lock_resource_of_effect``), so on PostgreSQL neither misses the other's rows."""
        sql, f = self._sql, outbox.c
        self.open_effect = sql(select(func.min(f.id)).where(
            f.resource_id == bindparam("resource_id"),
            f.status.in_([_constant(s) for s in OPEN])))
        of_effect = select(outbox.c.resource_id).where(
            outbox.c.id == bindparam("id_")).scalar_subquery()
        self.lock_resource_of_effect = (
            sql(select(resources.c.id).where(resources.c.id == of_effect).with_for_update())
            if self.dialect.name == "postgresql" else None)
        after = outbox.alias("after")
        following = (select(func.min(after.c.id))
                     .where(after.c.resource_id == of_effect,
                            after.c.id > bindparam("id_"),
                            after.c.status == _constant(PENDING))
                     .scalar_subquery())
        self.pass_head = sql(
            update(outbox).where((f.id == bindparam("id_")) | (f.id == following))
            .values(head=case((f.id == bindparam("id_"), null()), else_=literal_column("1"))))

    def _outbox(self) -> None:
        """Effects and timers asked for, and their outcomes."""
        sql = self._sql
        self.insert_effect = sql(insert(outbox).values(**{
            name: bindparam(name) for name in (
                "resource_id", "seq", "position", "name", "args", "status", "attempts",
                "next_attempt_at", "idempotency_key", "fence", "on_failure", "created_at",
                "head")}))
        self._queue_heads()
        t = timers.c
        self.insert_timer = sql(insert(timers).values(**{
            name: bindparam(name) for name in (
                "resource_id", "seq", "state", "trigger", "due_at", "status", "created_at")}))
        self.cancel_timers = sql(
            update(timers)
            .where(t.resource_id == bindparam("resource_id"), t.state == bindparam("state_"),
                   t.status == _constant(PENDING))
            .values(status=_constant(CANCELLED), finished_at=bindparam("now")))
        f = outbox.c
        claimed = (f.id == bindparam("id_"), f.claimed_by == bindparam("claimed_by_"),
                   f.attempts == bindparam("attempts_"), f.status == _constant(RUNNING))
        # an effect's outcome, recorded only by the worker that still holds its claim
        self.finish_effect = sql(update(outbox).where(*claimed).values(
            status=bindparam("new_status"), finished_at=bindparam("now"),
            last_error=bindparam("error"), lease_until=null()))
        self.reschedule_effect = sql(update(outbox).where(*claimed).values(
            status=_constant(PENDING), next_attempt_at=bindparam("next_attempt_at"),
            last_error=bindparam("error"), lease_until=null(), claimed_by=null(),
            claimant=null()))
        self.save_progress = sql(update(outbox).where(*claimed).values(
            progress=bindparam("progress")))
        self.fire_timer = sql(
            update(timers).where(t.id == bindparam("id_"), t.status == _constant(PENDING))
            .values(status=_constant(FIRED), finished_at=bindparam("now")))
        self.refuse_timer = sql(update(timers).where(t.id == bindparam("id_")).values(
            status=_constant(REFUSED), outcome=bindparam("outcome")))
