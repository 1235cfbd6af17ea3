"""The job queue: where step (c) of a job exit records that the job completed.

:class:`JobQueue` is what the ``job_exit`` machine talks to. The default,
:class:`DatabaseJobQueue`, is a table in lifecycle's own database (``lifecycle_job_queue``,
one row per job holding its ad): its update is written in the very transaction that marks the
effect done, so it commits exactly once, with the effect. A deployment points step (c) at
another queue (a schedd) with its own :class:`JobQueue`, whose ``complete`` does the update
at once and idempotently (only on a job that is not Completed yet, as ``condor_qedit
-constraint 'JobStatus != 4'`` would).
"""

from __future__ import annotations

import abc
import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.dialects.postgresql import psycopg as postgres_psycopg

from ..clock import SystemClock
from ..store import Store
from ..store.schema import Document, UtcDateTime, metadata, sqlite_time
from .htcondor import COMPLETED, RUNNING, TERMINAL_ATTRIBUTES, ClassAdValue, JobId

Writes = Callable[[Any], None]
"""Writes to run on the DBAPI cursor of the transaction that marks the effect done."""

# The queue's table is this adapter's, not the core's; it lives in lifecycle's metadata so
# that the same Alembic history creates it (migrations/env.py imports this module).
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


class JobQueue(abc.ABC):
    """A job queue that step (c) updates."""

    @abc.abstractmethod
    def complete(self, job: JobId, ad: Mapping[str, ClassAdValue], *, key: str,
                 now: dt.datetime) -> Writes | None:
        """Record that ``job`` completed: set the terminal attributes of its final ``ad``
        (``JobStatus = 4`` and the exit attributes) exactly once, and leave a job that is
        already Completed as it is. ``key`` is the effect's idempotency key.

        Called by the effect's handler outside any transaction: it may do I/O, and raises to
        fail the attempt (retried with backoff). A queue in lifecycle's database returns the
        writes to commit with the effect's completion; a queue elsewhere updates now and
        returns None."""


@dataclass(frozen=True, slots=True)
class QueueAd:
    """A job as the database queue holds it."""

    job: JobId
    ad: dict[str, Any]
    job_status: int
    updates: int
    submitted_at: dt.datetime
    updated_at: dt.datetime | None
    updated_by: str | None

    def to_json(self) -> dict[str, Any]:
        return {"job": str(self.job), "cluster": self.job.cluster, "proc": self.job.proc,
                "job_status": self.job_status, "updates": self.updates,
                "submitted_at": self.submitted_at.isoformat(),
                "updated_at": self.updated_at.isoformat() if self.updated_at else None,
                "updated_by": self.updated_by, "ad": self.ad}


class DatabaseJobQueue(JobQueue):
    """The job queue as a table in lifecycle's own database."""

    def complete(self, job: JobId, ad: Mapping[str, ClassAdValue], *, key: str,
                 now: dt.datetime) -> Writes:
        attributes = dict(ad)

        def writes(cursor: Any) -> None:
            record_completion(cursor, job=job, ad=attributes, key=key, now=now)

        return writes


# -- inside the effect's transaction ----------------------------------------------------------


class _Statements:
    """The queue's statements for one DBAPI driver (the worker hands its raw cursor)."""

    def __init__(self, dialect: Any, sqlite: bool) -> None:
        self.sqlite = sqlite
        q = job_queue.c

        def sql(statement: Any) -> str:
            return str(statement.compile(dialect=dialect))

        which = (q.cluster == bindparam("cluster"), q.proc == bindparam("proc"))
        read = select(q.ad, q.job_status).where(*which)
        self.read = sql(read if sqlite else read.with_for_update())
        completed: Any = literal_column(str(COMPLETED))
        self.update = sql(update(job_queue).where(
            *which, q.job_status != completed).values(
            ad=bindparam("ad"), job_status=completed, updates=q.updates + literal_column("1"),
            updated_at=bindparam("now"), updated_by=bindparam("key")))
        self.insert = sql(insert(job_queue).values(
            cluster=bindparam("cluster"), proc=bindparam("proc"), ad=bindparam("ad"),
            job_status=bindparam("job_status"), updates=bindparam("updates"),
            submitted_at=bindparam("now"), updated_at=bindparam("updated_at"),
            updated_by=bindparam("key")))

    def json(self, value: Any) -> Any:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        if self.sqlite:
            return text
        from psycopg.types.json import Jsonb

        return Jsonb(value, dumps=lambda _: text)

    def time(self, value: dt.datetime) -> Any:
        return sqlite_time(value) if self.sqlite else value

    def value(self, stored: Any) -> dict[str, Any]:
        return dict(json.loads(stored) if isinstance(stored, str | bytes) else stored)


_STATEMENTS: dict[bool, _Statements] = {}


def _statements(cursor: Any) -> _Statements:
    sqlite = type(cursor).__module__.startswith("sqlite3")
    found = _STATEMENTS.get(sqlite)
    if found is None:
        dialect = (sqlite_dialect.dialect(paramstyle="named") if sqlite
                   else postgres_psycopg.dialect())  # type: ignore[no-untyped-call]
        found = _STATEMENTS[sqlite] = _Statements(dialect, sqlite)
    return found


def record_completion(cursor: Any, *, job: JobId, ad: Mapping[str, ClassAdValue], key: str,
                      now: dt.datetime) -> bool:
    """In the caller's transaction: set the terminal attributes of ``ad``
    (``htcondor.TERMINAL_ATTRIBUTES``) on ``job``, or enter the job with the whole ``ad`` when
    the queue does not hold it. False, changing
    nothing, when the job is already Completed."""
    sql = _statements(cursor)
    where = {"cluster": job.cluster, "proc": job.proc}
    cursor.execute(sql.read, where)
    row = cursor.fetchone()
    if row is None:
        cursor.execute(sql.insert, {
            **where, "ad": sql.json(dict(ad)), "job_status": COMPLETED, "updates": 1,
            "now": sql.time(now), "updated_at": sql.time(now), "key": key})
        return True
    current, status = sql.value(row[0]), int(row[1])
    if status == COMPLETED:
        return False
    # what a job's end changes (HTCondor's terminate update); the rest (QDate, JobStartDate,
    # ...) is the queue's own
    terminal = {name: value for name, value in ad.items() if name in TERMINAL_ATTRIBUTES}
    terminal["LastJobStatus"] = status
    merged = {**current, **terminal}
    if "ExitSignal" in terminal:
        merged.pop("ExitCode", None)
    elif "ExitCode" in terminal:
        for stale in ("ExitSignal", "ExitReason"):
            merged.pop(stale, None)
    cursor.execute(sql.update, {**where, "ad": sql.json(merged), "now": sql.time(now),
                                "key": key})
    return bool(cursor.rowcount == 1)


# -- reading and entering jobs ----------------------------------------------------------------


def submit(store: Store, job: JobId, ad: Mapping[str, ClassAdValue],
           now: dt.datetime | None = None) -> QueueAd:
    """Enter ``job`` into the database queue with ``ad`` (``JobStatus`` from the ad, Running
    by default), as the schedd does when a job is submitted and runs."""
    document: dict[str, Any] = {"ClusterId": job.cluster, "ProcId": job.proc, **ad}
    status = document.setdefault("JobStatus", RUNNING)
    if not isinstance(status, int) or isinstance(status, bool):
        raise ValueError(f"JobStatus of job {job} must be an integer, not {status!r}")
    when = now or SystemClock().now()
    with store.begin() as db:
        db.execute(insert(job_queue).values(
            cluster=job.cluster, proc=job.proc, ad=document, job_status=status, updates=0,
            submitted_at=when))
    found = queue_ad(store, job)
    assert found is not None
    return found


def queue_ad(store: Store, job: JobId) -> QueueAd | None:
    """The job as the database queue holds it, or None."""
    q = job_queue.c
    with store.read() as db:
        row = db.execute(select(job_queue).where(q.cluster == job.cluster,
                                                 q.proc == job.proc)).first()
    if row is None:
        return None
    return QueueAd(JobId(row.cluster, row.proc), dict(row.ad), row.job_status, row.updates,
                   row.submitted_at, row.updated_at, row.updated_by)


__all__ = ["DatabaseJobQueue", "JobQueue", "QueueAd", "Writes", "queue_ad",
           "record_completion", "submit"]
