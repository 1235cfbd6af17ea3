"""Every statement lifecycle runs, one module per table, compiled for the store's dialect.

- :mod:`.resources`: resources by key and by page, their moves (the compare-and-swap), the
  counts by state;
- :mod:`.journal`: journal rows and observations, and the two ordered streams ``verify``
  reads;
- :mod:`.effects`: the outbox's effects: inserting, the queue heads, claiming, leases,
  outcomes, listings and repairs;
- :mod:`.timers`: timers set, cancelled, fired and due;
- :mod:`.specs`: machines and their stored specs;
- :mod:`.job_queue`: the ``job_exit`` machine's database job queue;
- :mod:`.dashboard`: what the dashboard's pages and ``/metrics`` read;
- :mod:`.writes`: on PostgreSQL, a resource's write (its compare-and-swap, journal row,
  effects and timers) as one statement, and a batch of observations as one.

The hot path's statements are :class:`Statements`' attributes, compiled once per dialect and
run on a raw DBAPI cursor through :class:`lifecycle.store.Transaction` (SQLAlchemy's
per-statement overhead would otherwise cost several times the database's own work; see
benchmarks/). The rest are functions that take a SQLAlchemy connection of
``Store.read()``/``Store.begin()`` and return plain rows: nothing outside ``lifecycle.store``
builds SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

from .compiling import numbered
from .effects import EffectStatements
from .journal import JournalStatements
from .resources import ResourceStatements
from .specs import SpecStatements
from .timers import TimerStatements
from .writes import WriteStatements


class Statements(ResourceStatements, JournalStatements, EffectStatements, TimerStatements,
                 WriteStatements, SpecStatements):
    """The hot path's statements for one dialect, built from the schema once."""

    def __init__(self, dialect: Dialect) -> None:
        if dialect.name == "sqlite":
            dialect = sqlite_dialect.dialect(paramstyle="named")
        self.dialect = dialect
        self.positional = {}
        self._resources()
        self._journal()
        self._effects()
        self._timers()
        self._writes()
        self._specs()
        self.quick: QuickFire | None = QuickFire(
            by_key=numbered(self.resource_by_key, ("key",)),
            by_machine_key=numbered(self.resource_by_machine_key, ("machine", "key")),
            move=numbered(self.move[False, False], QuickFire.MOVE),
            journal=numbered(self.insert_journal, QuickFire.JOURNAL),
        ) if dialect.name == "sqlite" else None
        """On SQLite, what a common fire runs (see :class:`QuickFire`); None on PostgreSQL."""


_COMPILED: dict[tuple[str, str], Statements] = {}


def statements_for(dialect: Dialect) -> Statements:
    """The statements for ``dialect``'s database and driver, built by the first store of
    this process that opens one and shared by the next (nothing changes them after): each
    store cost some 0.15 s of compiling them again. They are built, as before, from the
    dialect a store has before it first connects, so they do not depend on the server."""
    key = (dialect.name, dialect.driver)
    found = _COMPILED.get(key)
    if found is None:
        found = _COMPILED[key] = Statements(dialect)
    return found


@dataclass(frozen=True, slots=True)
class QuickFire:
    """A common fire's statements on SQLite, each bound by position from a tuple the engine
    builds in a fixed order (no dict, no binding step): the read of the resource (``by_key``:
    ``(key,)``; ``by_machine_key``: ``(machine, key)``), the compare-and-swap of a move that
    rests on no observation and changes no data (``move``: :attr:`MOVE`'s order), and the
    journal row (``journal``: :attr:`JOURNAL`'s). The catalogue's own statements, their
    parameters numbered (``?N``)."""

    MOVE: ClassVar[tuple[str, ...]] = (
        "id_", "version_", "seq_", "new_state", "new_version", "new_seq", "new_spec_version",
        "now")
    JOURNAL: ClassVar[tuple[str, ...]] = (
        "resource_id", "seq", "kind", "trigger", "source", "dest", "version", "spec_version",
        "actor", "at", "payload", "guards", "observation_id", "fence")

    by_key: str
    by_machine_key: str
    move: str
    journal: str


__all__ = ["QuickFire", "Statements"]
