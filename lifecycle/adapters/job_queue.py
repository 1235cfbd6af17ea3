"""The job queue: where step (c) of a job exit records that the job completed.

:class:`JobQueue` is what the ``job_exit`` machine talks to. The default,
:class:`DatabaseJobQueue`, is a table in lifecycle's own database (``lifecycle_job_queue``,
one row per job holding its ad; the machine's own, on its migration branch ``job_exit``): its
update is written in the very transaction that marks the effect done, so it commits exactly
once, with the effect. A deployment points step (c) at
another queue (a schedd) with its own :class:`JobQueue`, whose ``complete`` does the update
at once and idempotently (only on a job that is not Completed yet, as ``condor_qedit
-constraint 'JobStatus != 4'`` would).
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..clock import SystemClock
from ..store import Store, Transaction
from ..store.statements import job_queue as queue_rows
from .htcondor import COMPLETED, RUNNING, TERMINAL_ATTRIBUTES, ClassAdValue, JobId

Writes = Callable[[Transaction], None]
"""Writes to run in the transaction that marks the effect done."""


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

        def writes(tx: Transaction) -> None:
            record_completion(tx, job=job, ad=attributes, key=key, now=now)

        return writes


# -- inside the effect's transaction ----------------------------------------------------------


def record_completion(tx: Transaction, *, job: JobId, ad: Mapping[str, ClassAdValue], key: str,
                      now: dt.datetime) -> bool:
    """In the caller's transaction: set the terminal attributes of ``ad``
    (``htcondor.TERMINAL_ATTRIBUTES``) on ``job``, or enter the job with the whole ``ad`` when
    the queue does not hold it. False, changing
    nothing, when the job is already Completed."""
    sql = queue_rows.statements(tx)
    where = {"cluster": job.cluster, "proc": job.proc}
    tx.execute(sql.read, where)
    row = tx.fetchone()
    if row is None:
        tx.execute(sql.insert, {
            **where, "ad": tx.json(dict(ad)), "job_status": COMPLETED, "updates": 1,
            "now": tx.time(now), "updated_at": tx.time(now), "key": key})
        return True
    current, status = dict(tx.json_value(row[0])), int(row[1])
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
    tx.execute(sql.update, {**where, "ad": tx.json(merged), "now": tx.time(now), "key": key})
    return bool(tx.rowcount == 1)


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
        queue_rows.enter(db, job.cluster, job.proc, document, status, when)
    found = queue_ad(store, job)
    assert found is not None
    return found


def queue_ad(store: Store, job: JobId) -> QueueAd | None:
    """The job as the database queue holds it, or None."""
    with store.read() as db:
        row = queue_rows.job(db, job.cluster, job.proc)
    if row is None:
        return None
    return QueueAd(JobId(row.cluster, row.proc), dict(row.ad), row.job_status, row.updates,
                   row.submitted_at, row.updated_at, row.updated_by)


__all__ = ["DatabaseJobQueue", "JobQueue", "QueueAd", "Writes", "queue_ad",
           "record_completion", "submit"]
