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
    String,
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

from ...results import DONE, FAILED, OPEN, PENDING, RUNNING
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
        held = (f.claimed_by == bindparam("claimed_by_"), f.attempts == bindparam("attempts_"),
                f.status == constant(RUNNING))
        # an effect's outcome, recorded only by the worker that still holds its claim; in
        # a fire's transaction, so a lost claim must undo the fire with it: the statement
        # fails (its status NULL, see lost_claim) rather than write nothing, and on
        # PostgreSQL nothing waits for its answer before the COMMIT
        self.finish_effect = sql(update(outbox).where(f.id == bindparam("id_")).values(
            status=case((and_(*held), bindparam("new_status", type_=String)), else_=null()),
            finished_at=bindparam("now"), last_error=bindparam("error"), lease_until=null()))
        claimed = (f.id == bindparam("id_"), *held)
        self.reschedule_effect = sql(update(outbox).where(*claimed).values(
            status=constant(PENDING), next_attempt_at=bindparam("next_attempt_at"),
            last_error=bindparam("error"), lease_until=null(), claimed_by=null(),
            claimant=null()))
        self.save_progress = sql(update(outbox).where(*claimed).values(
            progress=bindparam("progress")))
        self._batches()

    def _batches(self) -> None:
        """A worker's batch of outcomes in four statements on PostgreSQL, whatever its
        size, none of which waits for another's answer (SQLite, in this process, runs the
        statements of each effect instead): the done and failed outcomes
        (``finish_effects``: arrays ``ids``, ``attempts``, ``statuses``, ``errors``;
        ``claimed_by_``, ``now``) and those to be tried again (``reschedule_effects``:
        ``ids``, ``attempts``, ``dues``, ``errors``; ``claimed_by_``), each fenced by claim
        and attempt as ``finish_effect``, RETURNING the ids recorded; the rows of the
        resources of the effects that statement made done locked
        (``lock_resources_of_effects``, ``ids``, in id order); and their heads passed on
        (``pass_heads``, ``ids``; one effect of a resource at most). The last two find the
        effects made done by what is done and still the head of its queue: an effect
        recorded by another worker (whose claim this one lost) passed its head on in its
        own transaction."""
        self.finish_effects: str | None = None
        self.reschedule_effects: str | None = None
        self.lock_resources_of_effects: str | None = None
        self.pass_heads: str | None = None
        if self.dialect.name != "postgresql":
            return
        e, r = outbox.name, resources.name
        fenced = ("WHERE e.id = b.id AND e.attempts = b.attempts "
                  f"AND e.claimed_by = %(claimed_by_)s AND e.status = '{RUNNING}' RETURNING e.id")
        self.finish_effects = (
            f"UPDATE {e} AS e SET status = b.status, finished_at = %(now)s, "
            "last_error = b.error, lease_until = NULL "
            "FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(statuses)s::text[], "
            f"%(errors)s::text[]) AS b(id, attempts, status, error) {fenced}")
        self.reschedule_effects = (
            f"UPDATE {e} AS e SET status = '{PENDING}', next_attempt_at = b.due, "
            "last_error = b.error, lease_until = NULL, claimed_by = NULL, claimant = NULL "
            "FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], "
            "%(dues)s::timestamptz[], %(errors)s::text[]) AS b(id, attempts, due, error) "
            f"{fenced}")
        made_done = (f"SELECT id, resource_id FROM {e} WHERE id = ANY(%(ids)s::bigint[]) "
                     f"AND status = '{DONE}' AND head = 1")
        self.lock_resources_of_effects = (
            f"SELECT id FROM {r} WHERE id IN (SELECT resource_id FROM ({made_done}) AS d) "
            "ORDER BY id FOR UPDATE")
        self.pass_heads = (
            f"WITH d AS ({made_done}) "
            f"UPDATE {e} SET head = CASE WHEN id IN (SELECT id FROM d) THEN NULL ELSE 1 END "
            "WHERE id IN (SELECT id FROM d) OR id IN ("
            f"SELECT (SELECT min(a.id) FROM {e} AS a WHERE a.resource_id = d.resource_id "
            f"AND a.id > d.id AND a.status = '{PENDING}') FROM d)")

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


def claim(dialect: Dialect, names: list[str]) -> tuple[str, dict[str, Any]]:
    """A worker's claim compiled for ``dialect`` (the names of its handlers are part of it),
    with the values of its constants: one UPDATE of the effects it picks (parameters
    ``now``, ``limit``, ``claimed_by``, ``claimant``, ``lease_until``) that RETURNS what the
    handlers need (in any order). On PostgreSQL it is joined to their resources and journal
    rows; SQLite's RETURNING cannot name the tables of an UPDATE's FROM, so there it reads
    them with scalar subqueries (RETURNING needs SQLite 3.35, as lifecycle's inserts do)."""
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
        # picked once: as a subquery of the UPDATE's join, the planner may run it again for
        # larger limits, and SKIP LOCKED then finds the next rows each time (a claim of 100
        # took 745, in 0.6 s)
        picked = select(picked.with_for_update(skip_locked=True, of=e)
                        .cte("picked").prefix_with("MATERIALIZED").c.id)
    t = outbox.c
    taking = (update(outbox).where(t.id.in_(picked))
              .values(status=RUNNING, claimed_by=bindparam("claimed_by"),
                      claimant=bindparam("claimant"), lease_until=bindparam("lease_until"),
                      attempts=t.attempts + 1))
    own = (t.id, t.name, t.args, t.idempotency_key, t.fence, t.attempts, t.seq, t.progress)
    if dialect.name == "postgresql":
        taking = taking.where(resources.c.id == t.resource_id,
                              journal.c.resource_id == t.resource_id, journal.c.seq == t.seq
                              ).returning(*own, resources.c.machine, resources.c.key,
                                          resources.c.data, journal.c.trigger,
                                          journal.c.payload)
    else:
        # (named in full: SQLite's RETURNING leaves its columns' tables unnamed)
        effect: dict[str, Any] = {
            name: literal_column(f"{outbox.name}.{name}") for name in ("resource_id", "seq")}
        of_resource = resources.c.id == effect["resource_id"]
        of_journal = and_(journal.c.resource_id == effect["resource_id"],
                          journal.c.seq == effect["seq"])
        taking = taking.returning(
            *own, *(select(c).where(of_resource).scalar_subquery() for c in (
                resources.c.machine, resources.c.key, resources.c.data)),
            *(select(c).where(of_journal).scalar_subquery() for c in (
                journal.c.trigger, journal.c.payload)))
    compiled = taking.compile(dialect=dialect)
    return str(compiled), dict(compiled.params)


def lost_claim(exc: BaseException) -> bool:
    """Whether ``exc`` is ``finish_effect`` failing its fence: the worker no longer holds
    the claim of the effect whose outcome it recorded (on PostgreSQL, raised where the
    transaction's answers are read, at the latest at its COMMIT)."""
    diag = getattr(exc, "diag", None)
    if diag is not None:  # psycopg
        return bool(diag.table_name == outbox.name and diag.column_name == "status")
    return str(exc) == f"NOT NULL constraint failed: {outbox.name}.status"


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
           "listed", "lost_claim", "of_resource", "on_failure", "pending_head", "renew",
           "retry_failed", "unclaim", "unhandled"]
