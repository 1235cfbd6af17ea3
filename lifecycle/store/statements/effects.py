"""Statements of ``lifecycle_effects``, the outbox: effects inserted with the transition that
asks for them, each resource's queue and its head, a worker's claims and their leases, an
effect's outcome (recorded only by the worker that still holds its claim), and the listings
and repairs of ``lifecycle outbox``, ``retry`` and ``show``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Dialect

from ...results import FAILED, OPEN, PENDING, RUNNING
from ..schema import HEADS_WHERE, journal, outbox, resources, timers
from .compiling import Compiling, constant


class EffectStatements(Compiling):
    """The hot path's statements of effects."""

    def _effects(self) -> None:
        sql, f = self._sql, outbox.c
        self.insert_effect = sql(insert(outbox).values(**{
            name: bindparam(name) for name in (
                "resource_id", "seq", "position", "name", "args", "status", "attempts",
                "next_attempt_at", "idempotency_key", "fence", "on_failure", "created_at",
                "head")}))
        self._queue_heads()
        claimed = (f.id == bindparam("id_"), f.claimed_by == bindparam("claimed_by_"),
                   f.attempts == bindparam("attempts_"), f.status == constant(RUNNING))
        # an effect's outcome, recorded only by the worker that still holds its claim
        self.finish_effect = sql(update(outbox).where(*claimed).values(
            status=bindparam("new_status"), finished_at=bindparam("now"),
            last_error=bindparam("error"), lease_until=null()))
        self.reschedule_effect = sql(update(outbox).where(*claimed).values(
            status=constant(PENDING), next_attempt_at=bindparam("next_attempt_at"),
            last_error=bindparam("error"), lease_until=null(), claimed_by=null(),
            claimant=null()))
        self.save_progress = sql(update(outbox).where(*claimed).values(
            progress=bindparam("progress")))
        self._batches()

    def _batches(self) -> None:
        """A worker's batch of outcomes in three statements on PostgreSQL, whatever its
        size (SQLite, in this process, runs the statements of each effect instead): the
        outcomes (``finish_effects``: arrays ``ids``, ``attempts``, ``statuses``,
        ``errors``; ``claimed_by_``, ``now``), each fenced by claim and attempt as
        ``finish_effect``, RETURNING the ids recorded; the rows of their resources locked
        (``lock_resources_of_effects``, ``ids``, in id order); and the heads of the done
        ones passed on (``pass_heads``, ``ids``; one effect of a resource at most)."""
        self.finish_effects: str | None = None
        self.lock_resources_of_effects: str | None = None
        self.pass_heads: str | None = None
        if self.dialect.name != "postgresql":
            return
        e, r = outbox.name, resources.name
        self.finish_effects = (
            f"UPDATE {e} AS e SET status = b.status, finished_at = %(now)s, "
            "last_error = b.error, lease_until = NULL "
            "FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(statuses)s::text[], "
            "%(errors)s::text[]) AS b(id, attempts, status, error) "
            "WHERE e.id = b.id AND e.attempts = b.attempts AND e.claimed_by = %(claimed_by_)s "
            f"AND e.status = '{RUNNING}' RETURNING e.id")
        self.lock_resources_of_effects = (
            f"SELECT id FROM {r} WHERE id IN (SELECT resource_id FROM {e} "
            "WHERE id = ANY(%(ids)s::bigint[])) ORDER BY id FOR UPDATE")
        self.pass_heads = (
            f"UPDATE {e} SET head = CASE WHEN id = ANY(%(ids)s::bigint[]) THEN NULL ELSE 1 END "
            "WHERE id = ANY(%(ids)s::bigint[]) OR id IN ("
            f"SELECT (SELECT min(a.id) FROM {e} AS a WHERE a.resource_id = d.resource_id "
            f"AND a.id > d.id AND a.status = '{PENDING}') FROM {e} AS d "
            "WHERE d.id = ANY(%(ids)s::bigint[]))")

    def _queue_heads(self) -> None:
        """Each resource's effects form a queue; its head (the first open effect, marked
        ``head = 1``) is the only one that may run. A transition that asks for effects makes
        its first one the head if nothing is open; an effect done passes the head to the
        next. Both run under the resource's row lock (the transition's compare-and-swap, or
        ``lock_resource_of_effect``), so on PostgreSQL neither misses the other's rows."""
        sql, f = self._sql, outbox.c
        self.open_effect = sql(select(func.min(f.id)).where(
            f.resource_id == bindparam("resource_id"),
            f.status.in_([constant(s) for s in OPEN])))
        of_effect = select(outbox.c.resource_id).where(
            outbox.c.id == bindparam("id_")).scalar_subquery()
        self.lock_resource_of_effect = (
            sql(select(resources.c.id).where(resources.c.id == of_effect).with_for_update())
            if self.dialect.name == "postgresql" else None)
        after = outbox.alias("after")
        following = (select(func.min(after.c.id))
                     .where(after.c.resource_id == of_effect,
                            after.c.id > bindparam("id_"),
                            after.c.status == constant(PENDING))
                     .scalar_subquery())
        self.pass_head = sql(
            update(outbox).where((f.id == bindparam("id_")) | (f.id == following))
            .values(head=case((f.id == bindparam("id_"), null()), else_=literal_column("1"))))


# -- a worker's claim -----------------------------------------------------------------------


def claim(dialect: Dialect, names: list[str]) -> tuple[tuple[str, dict[str, Any]],
                                                        tuple[str, dict[str, Any]] | None]:
    """A worker's claim compiled for ``dialect`` (the names of its handlers are part of it),
    each statement with the values of its constants: an UPDATE of the effects it picks
    (parameters ``now``, ``limit``, ``claimed_by``, ``claimant``, ``lease_until``). On
    PostgreSQL it is the only statement: joined to their resources and journal rows, it
    RETURNS what the handlers need (in any order). SQLite's RETURNING cannot name the tables
    of an UPDATE's FROM: there it RETURNS the ids, and a second statement reads what the
    handlers need of them (``claimed_by``, ``low``, ``high``), in id order."""
    e = outbox.alias("e")
    now: Any = bindparam("now")
    # effects of one resource run in order: only the head of its queue may run, and the
    # claim walks the heads alone (a partial index), however many effects wait behind them
    # (a running head was due when it was claimed: it is taken again once its lease ended)
    due = and_(e.c.next_attempt_at <= now,
               or_(e.c.status == literal_column(f"'{PENDING}'"), e.c.lease_until < now))
    # a worker claims only what it has handlers for: others may serve the rest
    picked = (select(e.c.id).where(text(HEADS_WHERE.replace("head", "e.head")
                                        .replace("status", "e.status")), due,
                                   e.c.name.in_([literal(n) for n in names]))
              .order_by(e.c.next_attempt_at, e.c.id).limit(bindparam("limit")))
    if dialect.name == "postgresql":
        picked = picked.with_for_update(skip_locked=True, of=e)
    t = outbox.c
    needed = (t.id, t.name, t.args, t.idempotency_key, t.fence, t.attempts, t.seq, t.progress,
              resources.c.machine, resources.c.key, resources.c.data, journal.c.trigger,
              journal.c.payload)
    taking = (update(outbox).where(t.id.in_(picked))
              .values(status=RUNNING, claimed_by=bindparam("claimed_by"),
                      claimant=bindparam("claimant"), lease_until=bindparam("lease_until"),
                      attempts=t.attempts + 1))
    if dialect.name == "postgresql":
        one = (taking.where(resources.c.id == t.resource_id,
                            journal.c.resource_id == t.resource_id, journal.c.seq == t.seq)
               .returning(*needed).compile(dialect=dialect))
        return (str(one), dict(one.params)), None
    taking = taking.returning(t.id)
    taken = (
        select(*needed)
        .join(resources, resources.c.id == t.resource_id)
        .join(journal, and_(journal.c.resource_id == t.resource_id, journal.c.seq == t.seq))
        .where(t.claimed_by == bindparam("claimed_by"), t.status == RUNNING,
               t.id.between(bindparam("low"), bindparam("high")))
        .order_by(t.id))
    compiled = [s.compile(dialect=dialect) for s in (taking, taken)]
    return ((str(compiled[0]), dict(compiled[0].params)),
            (str(compiled[1]), dict(compiled[1].params)))


def renew(db: Connection, ids: Collection[int], worker: str, until: dt.datetime) -> set[int]:
    """Extend the leases of the effects ``worker`` still holds among ``ids``; those."""
    t = outbox.c
    return set(db.execute(update(outbox).where(
        t.id.in_(ids), t.claimed_by == worker, t.status == RUNNING)
        .values(lease_until=until).returning(t.id)).scalars())


def unclaim(db: Connection, worker: str, *, ids: Collection[int] | None = None,
            except_ids: Collection[int] | None = None, refund: bool = True) -> int:
    """Put the running effects ``worker`` holds (of ``ids``, or all but ``except_ids``) back
    in the queue; with ``refund`` (their handlers never ran) the attempt their claim counted
    is returned; how many."""
    t = outbox.c
    which = [t.claimed_by == worker, t.status == RUNNING]
    if ids is not None:
        which.append(t.id.in_(ids))
    if except_ids is not None:
        which.append(t.id.not_in(except_ids))
    return int(db.execute(update(outbox).where(*which).values(
        status=PENDING, claimed_by=None, claimant=None, lease_until=None,
        attempts=t.attempts - 1 if refund else t.attempts)).rowcount)


def held_elsewhere(db: Connection, worker: str, names: Collection[str],
                   now: dt.datetime) -> list[Any]:
    """(worker, effects, latest lease) of effects named ``names`` that other workers hold
    now, by worker."""
    t = outbox.c
    return list(db.execute(
        select(t.claimed_by, func.count(), func.max(t.lease_until))
        .where(t.status == RUNNING, t.lease_until >= now, t.claimed_by != worker,
               t.name.in_(sorted(names)))
        .group_by(t.claimed_by).order_by(t.claimed_by)).all())


def claimants(db: Connection, prefix: str) -> list[str]:
    """The worker processes (claimants) starting with ``prefix`` that hold running effects."""
    t = outbox.c
    return list(db.execute(select(t.claimant).distinct().where(
        t.status == RUNNING, t.claimant.like(f"{prefix}%"))).scalars().all())


def expire(db: Connection, claimants: Collection[str], at: dt.datetime) -> int:
    """End the leases of the running effects of ``claimants`` (their processes are gone) at
    ``at``; how many."""
    t = outbox.c
    return int(db.execute(update(outbox).where(t.status == RUNNING, t.claimant.in_(claimants))
                          .values(lease_until=at)).rowcount)


def on_failure(db: Connection, effect_id: int) -> str | None:
    """The trigger an effect fires when it fails for good, if it has one."""
    value = db.execute(select(outbox.c.on_failure).where(outbox.c.id == effect_id)).scalar()
    return str(value) if value else None


def pending_head(db: Connection, machine: str, key: str) -> Any:
    """The pending head of a resource's effect queue, as a worker would claim it: (id, name,
    args, idempotency_key, fence, attempts, seq, progress, trigger, payload), or None."""
    e, j, r = outbox.c, journal.c, resources.c
    return db.execute(
        select(e.id, e.name, e.args, e.idempotency_key, e.fence, e.attempts, e.seq,
               e.progress, j.trigger, j.payload)
        .join(resources, r.id == e.resource_id)
        .join(journal, (j.resource_id == e.resource_id) & (j.seq == e.seq))
        .where(r.machine == machine, r.key == key, e.head == 1,
               e.status == PENDING)).first()


# -- listings and repairs -------------------------------------------------------------------


def listed(db: Connection, kind: Literal["effects", "timers"], columns: tuple[str, ...],
           order: tuple[str, ...], resource_id: int | None,
           statuses: tuple[str, ...] | None) -> list[Any]:
    """Rows of effects or timers (``kind``; of one resource or all, of these statuses or
    all), each its resource's machine and key, then ``columns``, in ``order``."""
    table = outbox if kind == "effects" else timers
    query = (select(resources.c.machine, resources.c.key, *(table.c[n] for n in columns))
             .join(resources, resources.c.id == table.c.resource_id)
             .order_by(*(table.c[n] for n in order)))
    if statuses is not None:
        query = query.where(table.c.status.in_(statuses))
    if resource_id is not None:
        query = query.where(table.c.resource_id == resource_id)
    return list(db.execute(query).all())


def retry_failed(db: Connection, resource_id: int, now: dt.datetime) -> int:
    """Put a resource's failed effects back in the queue, due ``now``; how many."""
    t = outbox.c
    return int(db.execute(update(outbox).where(
        t.resource_id == resource_id, t.status == FAILED).values(
        status=PENDING, attempts=0, next_attempt_at=now, finished_at=None,
        claimed_by=None, claimant=None, lease_until=None)).rowcount)


def counts(db: Connection) -> dict[str, int]:
    """Effects by status."""
    rows = db.execute(select(outbox.c.status, func.count()).group_by(outbox.c.status)).all()
    return {status: count for status, count in rows}


def unhandled(db: Connection, names: Collection[str]) -> dict[tuple[str, str], int]:
    """Open effects (pending, running or failed) whose name is not in ``names``, by (machine,
    effect name)."""
    f = outbox.c
    query = (select(resources.c.machine, f.name, func.count())
             .join(resources, resources.c.id == f.resource_id)
             .where(f.status.in_((PENDING, RUNNING, FAILED)))
             .group_by(resources.c.machine, f.name)
             .order_by(resources.c.machine, f.name))
    if names:
        query = query.where(f.name.not_in(sorted(names)))
    return {(machine, name): count for machine, name, count in db.execute(query).all()}


def of_resource(db: Connection, resource_id: int) -> list[Any]:
    """A resource's effects in order: (seq, name, status, attempts, next_attempt_at,
    last_error, progress, finished_at)."""
    f = outbox.c
    return list(db.execute(select(f.seq, f.name, f.status, f.attempts, f.next_attempt_at,
                                  f.last_error, f.progress, f.finished_at)
                           .where(f.resource_id == resource_id).order_by(f.id)).all())


__all__ = ["EffectStatements", "claim", "claimants", "counts", "expire", "held_elsewhere",
           "listed", "of_resource", "on_failure", "pending_head", "renew", "retry_failed",
           "unclaim", "unhandled"]
