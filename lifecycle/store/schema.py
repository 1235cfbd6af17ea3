"""The database schema: the single source of truth. Every change here comes with an Alembic
revision in ``migrations/versions/`` (a test checks that the two agree)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
    text,
)

from ..results import (
    CANCELLED,
    DONE,
    FAILED,
    FIRED,
    GAVE_UP,
    PENDING,
    REFUSED,
    RUNNING,
    time_value,
)

UTC = dt.UTC

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""How constraints and indexes are named, on the core's tables and a machine's alike."""

metadata = MetaData(naming_convention=NAMING)
"""The core's tables, and only those: a machine's own tables are on a MetaData of their own
(job_exit's job queue: :mod:`lifecycle.store.statements.job_queue`), migrated by its branch."""


def sqlite_time(value: dt.datetime) -> str:
    """How a time is stored on SQLite: UTC, sortable text (SQLAlchemy's own format,
    ``YYYY-MM-DD HH:MM:SS.ffffff``). Formatted with the zone and cut before it: one call
    into C instead of three, on every write's path."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:26]


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite has no time zones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: lifecycle stores aware UTC times")
        return value.astimezone(UTC).replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        return None if value is None else time_value(value)


class Document(TypeDecorator[Any]):
    """A JSON document: JSONB on PostgreSQL, JSON elsewhere. PostgreSQL's dialect (about
    twenty modules) is imported when a PostgreSQL database is used, not by every command
    on SQLite."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


_PARTIAL: list[tuple[Index, str]] = []


def _partial(name: str, *columns: str, where: str) -> Index:
    """An index of the rows ``where`` holds, on SQLite and on PostgreSQL: PostgreSQL's
    WHERE is given by :func:`use_postgresql` (naming a dialect's option imports the dialect,
    about twenty modules that a command on SQLite has no use for)."""
    index = Index(name, *columns, sqlite_where=text(where))
    _PARTIAL.append((index, where))
    return index


def use_postgresql() -> None:
    """The tables as PostgreSQL has them: each partial index with its WHERE there too.
    Called whenever an engine on PostgreSQL is made."""
    for index, where in _PARTIAL:
        if index.dialect_options["postgresql"]["where"] is None:
            index.dialect_kwargs["postgresql_where"] = text(where)


Key = String(255)
Name = String(200)
Hash = String(64)
# SQLite only makes INTEGER PRIMARY KEY columns auto-increment.
Id = BigInteger().with_variant(Integer(), "sqlite")

machines = Table(
    "lifecycle_machines",
    metadata,
    Column("name", Name, primary_key=True),
    Column("spec_version", Hash, nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    comment="each machine name and the spec version registered last",
)

specs = Table(
    "lifecycle_specs",
    metadata,
    Column("machine", Name, nullable=False),
    Column("version", Hash, nullable=False),
    Column("spec", Document(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    PrimaryKeyConstraint("machine", "version"),
    comment="every spec version ever used, so history can be read long after a file changed",
)

resources = Table(
    "lifecycle_resources",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("machine", Name, nullable=False),
    Column("key", Key, nullable=False),
    Column("spec_version", Hash, nullable=False),
    Column("state", Name, nullable=False),
    Column("version", Integer, nullable=False, comment="bumped by every change of state or data"),
    Column("seq", Integer, nullable=False, comment="sequence number of the last journal row"),
    Column("data", Document(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("last_transition_at", UtcDateTime(), nullable=False,
           comment="when the last transition (or the creation) committed"),
    Column("observation_id", Id, comment="the newest observation (by observed_at)"),
    Column("observed_at", UtcDateTime(), comment="observed_at of that observation"),
    UniqueConstraint("machine", "key"),
    Index(None, "key"),
    # counts per state, and a state's resources in key order a page at a time (the dashboard)
    Index(None, "machine", "state", "key"),
)

FENCED_WHERE = "fence IS NOT NULL"
REFUSALS_WHERE = "kind = 'refusal'"
"""The journal rows of risky edges, each kind with a partial index of its own: transitions
that kept a fence, and refusals. A query repeats these terms word for word to use them."""

journal = Table(
    "lifecycle_journal",
    metadata,
    Column("resource_id", Id, ForeignKey(resources.c.id, ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", String(16), nullable=False,
           comment="create, adopt, transition, refusal, update"),
    Column("trigger", Name),
    Column("source", Name),
    Column("dest", Name, nullable=False),
    Column("version", Integer, nullable=False, comment="the resource's version after this row"),
    Column("spec_version", Hash, nullable=False),
    Column("actor", String(255)),
    Column("at", UtcDateTime(), nullable=False),
    Column("payload", Document()),
    Column("guards", Document(), comment="the verdict of each guard evaluated"),
    Column("observation_id", Id, comment="the observation the decision rested on"),
    Column("fence", Document(), comment="what the effects may still assume of the world"),
    PrimaryKeyConstraint("resource_id", "seq"),
    # risky edges' transitions and refusals counted by edge (/metrics), and refusals listed
    # (the dashboard), read only these rows however long the journal, in the order grouped
    _partial("ix_lifecycle_journal_fenced", "spec_version", "trigger", "source", "dest",
             where=FENCED_WHERE),
    _partial("ix_lifecycle_journal_refusals", "spec_version", "trigger", "source", "dest",
             "at", where=REFUSALS_WHERE),
)

observations = Table(
    "lifecycle_observations",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("resource_id", Id, ForeignKey(resources.c.id, ondelete="CASCADE"), nullable=False),
    Column("status", Document(), nullable=False),
    Column("observed_at", UtcDateTime(), nullable=False,
           comment="when the status was true at its source"),
    Column("recorded_at", UtcDateTime(), nullable=False),
    Column("source", Name, nullable=False),
    Index(None, "resource_id", "observed_at"),
    Index(None, "source"),  # each probe's answers counted (/metrics)
    comment="status reports from outside, append-only",
)

HEADS_WHERE = "head = 1 AND status IN ('pending', 'running')"
"""The heads a worker may claim: the partial index the claim walks, and the terms the claim
must repeat word for word for SQLite to use it."""
HEAD_COMMENT = ("1 on the first open (pending, running or failed) effect of its resource, "
                "the only one that may run; NULL on every other")
outbox = Table(
    "lifecycle_effects",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True,
           comment="per resource, the order effects run in"),
    Column("resource_id", Id, ForeignKey(resources.c.id, ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False, comment="the journal row that asked for it"),
    Column("position", Integer, nullable=False),
    Column("name", Name, nullable=False),
    Column("args", Document(), nullable=False),
    Column("status", String(16), nullable=False,
           comment=", ".join((PENDING, RUNNING, DONE, FAILED, GAVE_UP))),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UtcDateTime(), nullable=False),
    Column("last_error", Text),
    Column("idempotency_key", String(400), nullable=False, unique=True),
    Column("fence", Document()),
    Column("on_failure", Name, comment="trigger fired when it fails for good"),
    Column("progress", Document(), comment="what the handler saved across attempts"),
    Column("claimed_by", String(200), comment="the worker holding the claim (its name)"),
    Column("claimant", String(200),
           comment="the claiming process: boot id/PID namespace/pid/start time"),
    Column("lease_until", UtcDateTime(),
           comment="the claim's end, renewed by its worker's heartbeat"),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("finished_at", UtcDateTime()),
    Column("head", Integer, comment=HEAD_COMMENT),
    Index(None, "status", "next_attempt_at"),
    Index(None, "resource_id", "status"),
    # the claim walks the heads of the resources' queues in due order: its cost does not
    # grow with the effects waiting behind them
    _partial("ix_lifecycle_effects_heads", "next_attempt_at", "id", where=HEADS_WHERE),
    comment="the transactional outbox: side effects of committed transitions",
)

timers = Table(
    "lifecycle_timers",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("resource_id", Id, ForeignKey(resources.c.id, ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False, comment="the journal row that entered the state"),
    Column("state", Name, nullable=False),
    Column("trigger", Name, nullable=False),
    Column("due_at", UtcDateTime(), nullable=False),
    Column("status", String(16), nullable=False,
           comment=", ".join((PENDING, FIRED, REFUSED, CANCELLED))),
    Column("outcome", Text),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("finished_at", UtcDateTime()),
    Index(None, "status", "due_at"),
    Index(None, "resource_id", "status"),
    comment="timeouts of states: fired only while the resource is in the visit that set them",
)

state_counts = Table(
    "lifecycle_state_counts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("machine", Name, nullable=False),
    Column("state", Name, nullable=False),
    Column("n", Integer, nullable=False, comment="resources gained (or, negative, lost)"),
    comment="how many resources each machine has in each state, as rows to add up: triggers "
            "on lifecycle_resources append +1 and -1 in the writing transaction, and reading "
            "the counts folds them now and then (no row every writer updates)",
)

_COUNTED = "INSERT INTO lifecycle_state_counts (machine, state, n) VALUES "
COUNT_TRIGGERS: dict[str, tuple[list[str], list[str]]] = {
    # dialect: (statements that create the triggers, statements that drop them)
    "sqlite": ([
        "CREATE TRIGGER lifecycle_count_insert AFTER INSERT ON lifecycle_resources BEGIN "
        f"{_COUNTED}(NEW.machine, NEW.state, 1); END",
        "CREATE TRIGGER lifecycle_count_delete AFTER DELETE ON lifecycle_resources BEGIN "
        f"{_COUNTED}(OLD.machine, OLD.state, -1); END",
        "CREATE TRIGGER lifecycle_count_update AFTER UPDATE OF machine, state ON "
        "lifecycle_resources WHEN OLD.state IS NOT NEW.state OR OLD.machine IS NOT "
        f"NEW.machine BEGIN {_COUNTED}(OLD.machine, OLD.state, -1), "
        "(NEW.machine, NEW.state, 1); END",
    ], [f"DROP TRIGGER IF EXISTS lifecycle_count_{what}"
        for what in ("insert", "delete", "update")]),
    "postgresql": ([
        "CREATE FUNCTION lifecycle_count() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF TG_OP <> 'INSERT' THEN "
        f"{_COUNTED}(OLD.machine, OLD.state, -1); END IF; "
        "IF TG_OP <> 'DELETE' THEN "
        f"{_COUNTED}(NEW.machine, NEW.state, 1); END IF; "
        "RETURN NULL; END $$",
        "CREATE TRIGGER lifecycle_count_insert_delete AFTER INSERT OR DELETE ON "
        "lifecycle_resources FOR EACH ROW EXECUTE FUNCTION lifecycle_count()",
        "CREATE TRIGGER lifecycle_count_update AFTER UPDATE OF machine, state ON "
        "lifecycle_resources FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR "
        "OLD.machine IS DISTINCT FROM NEW.machine) EXECUTE FUNCTION lifecycle_count()",
    ], ["DROP TRIGGER IF EXISTS lifecycle_count_update ON lifecycle_resources",
        "DROP TRIGGER IF EXISTS lifecycle_count_insert_delete ON lifecycle_resources",
        "DROP FUNCTION IF EXISTS lifecycle_count()"]),
}
"""The triggers that keep ``lifecycle_state_counts``, per dialect: in the database rather
than in the engine, so every write (the engine's, a bulk one, a DELETE by hand, a cascade)
counts."""
COUNTS_SEED = ("INSERT INTO lifecycle_state_counts (machine, state, n) "
               "SELECT machine, state, count(*) FROM lifecycle_resources GROUP BY machine, state")
"""The counts of the resources there are, when the counting starts."""


def _count_triggers(target: Any, connection: Any, **_kw: Any) -> None:
    """``metadata.create_all`` creates the counting triggers too (Alembic creates them in
    its revision)."""
    for statement in COUNT_TRIGGERS.get(connection.dialect.name, ([], []))[0]:
        connection.exec_driver_sql(statement)


event.listen(metadata, "after_create", _count_triggers)
