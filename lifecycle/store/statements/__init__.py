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

from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect

from .effects import EffectStatements
from .journal import JournalStatements
from .resources import ResourceStatements
from .timers import TimerStatements
from .writes import WriteStatements


class Statements(ResourceStatements, JournalStatements, EffectStatements, TimerStatements,
                 WriteStatements):
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


__all__ = ["Statements"]
