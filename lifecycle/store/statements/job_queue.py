"""Statements of ``lifecycle_job_queue``, the ``job_exit`` machine's database job queue (one
row per job, holding its ad): step (c) of a job exit, written in the transaction that marks
the effect done, and the reads and entries of ``lifecycle queue``.

The table is the machine's, not the core's: it is on a MetaData of its own (:data:`metadata`),
and its revisions are the machine's migration branch ``job_exit``
(``lifecycle/machines/_migrations/job_exit/``, ``Builtin.migrations``). Core revision 0004
made it before the branch existed, and still does (a database upgraded without the machine
keeps a queue); the branch's base revision adopts it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)

from ..schema import NAMING, Document, UtcDateTime
from ..transaction import Transaction
from .compiling import Compiling

metadata = MetaData(naming_convention=NAMING)
"""The job_exit machine's tables (the migration tests compare it with its branch's schema)."""

job_queue = Table(
    "lifecycle_job_queue",
    metadata,
    Column("cluster", Integer, nullable=False),
    Column("proc", Integer, nullable=False),
    Column("ad", Document(), nullable=False, comment="the job's ClassAd: attribute -> value"),
    Column("job_status", Integer, nullable=False,
           comment="JobStatus: 1 Idle, 2 Running, 3 Removed, 4 Completed, 5 Held, ..."),
    Column("updates", Integer, nullable=False,
           comment="how many times the job's completion was recorded"),
    Column("submitted_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime()),
    Column("updated_by", String(400), comment="idempotency key of the effect that recorded it"),
    PrimaryKeyConstraint("cluster", "proc"),
    comment="the job queue the job_exit machine updates (step c): one row per job",
)

COMPLETED = 4
"""HTCondor's ``JobStatus`` of a completed job."""


class JobQueueStatements(Compiling):
    """Step (c)'s statements, compiled for one dialect."""

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect
        q, sql = job_queue.c, self._sql
        which = (q.cluster == bindparam("cluster"), q.proc == bindparam("proc"))
        read = select(q.ad, q.job_status).where(*which)
        self.read = sql(read if dialect.name == "sqlite" else read.with_for_update())
        completed: Any = literal_column(str(COMPLETED))  # written as a constant
        self.update = sql(update(job_queue).where(
            *which, q.job_status != completed).values(
            ad=bindparam("ad"), job_status=completed, updates=q.updates + literal_column("1"),
            updated_at=bindparam("now"), updated_by=bindparam("key")))
        self.insert = sql(insert(job_queue).values(
            cluster=bindparam("cluster"), proc=bindparam("proc"), ad=bindparam("ad"),
            job_status=bindparam("job_status"), updates=bindparam("updates"),
            submitted_at=bindparam("now"), updated_at=bindparam("updated_at"),
            updated_by=bindparam("key")))


_COMPILED: dict[str, JobQueueStatements] = {}


def statements(tx: Transaction) -> JobQueueStatements:
    """Step (c)'s statements for the database of ``tx``, compiled on first use."""
    found = _COMPILED.get(tx.dialect)
    if found is None:
        assert tx.sql is not None
        found = _COMPILED[tx.dialect] = JobQueueStatements(tx.sql.dialect)
    return found


def enter(db: Connection, cluster: int, proc: int, ad: dict[str, Any], status: int,
          now: dt.datetime) -> None:
    """Enter a job into the queue."""
    db.execute(insert(job_queue).values(cluster=cluster, proc=proc, ad=ad, job_status=status,
                                        updates=0, submitted_at=now))


def job(db: Connection, cluster: int, proc: int) -> Any:
    """The job's row, or None."""
    q = job_queue.c
    return db.execute(select(job_queue).where(q.cluster == cluster, q.proc == proc)).first()


__all__ = ["JobQueueStatements", "enter", "job", "job_queue", "metadata", "statements"]
