"""Reading and repairing the outbox: effects and timers by resource and status, failed
effects put back in the queue, counts by status."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from .effects import FAILED, PENDING, RUNNING
from .engine import Engine
from .queries import resource_id
from .records import EffectRecord, TimerRecord
from .store import outbox, resources, timers


def _rows_of(engine: Engine, table: Any, columns: tuple[str, ...], order: tuple[Any, ...],
             key: str | None, statuses: tuple[str, ...] | None) -> list[Any]:
    """Rows of the outbox (effects or timers): its resource's machine and key, then
    ``columns``."""
    query = (select(resources.c.machine, resources.c.key, *(table.c[n] for n in columns))
             .join(resources, resources.c.id == table.c.resource_id).order_by(*order))
    if statuses is not None:
        query = query.where(table.c.status.in_(statuses))
    with engine.store.read() as db:
        if key is not None:
            rid, _ = resource_id(db, key)
            query = query.where(table.c.resource_id == rid)
        return list(db.execute(query).all())


def effect_records(engine: Engine, key: str | None = None,
                   statuses: tuple[str, ...] | None = None) -> list[EffectRecord]:
    rows = _rows_of(engine, outbox, EffectRecord.COLUMNS, (outbox.c.id,), key, statuses)
    return [EffectRecord.from_row(r[0], r[1], r[2:]) for r in rows]


def timer_records(engine: Engine, key: str | None = None,
                  statuses: tuple[str, ...] | None = None) -> list[TimerRecord]:
    rows = _rows_of(engine, timers, TimerRecord.COLUMNS, (timers.c.due_at, timers.c.id), key,
                    statuses)
    return [TimerRecord.from_row(r[0], r[1], r[2:]) for r in rows]


def retry_failed(engine: Engine, key: str) -> int:
    """Put a stuck resource's failed effects back in the queue, due now; how many."""
    now = engine.clock.now()
    with engine.store.begin() as db:
        rid, _ = resource_id(db, key)
        moved = db.execute(update(outbox).where(
            outbox.c.resource_id == rid, outbox.c.status == FAILED).values(
            status=PENDING, attempts=0, next_attempt_at=now, finished_at=None,
            claimed_by=None, claimant=None, lease_until=None))
    return int(moved.rowcount)


def outbox_counts(engine: Engine) -> dict[str, int]:
    """Effects by status."""
    with engine.store.read() as db:
        rows = db.execute(select(outbox.c.status, func.count())
                          .group_by(outbox.c.status)).all()
    return {status: count for status, count in rows}


def unhandled(engine: Engine) -> dict[tuple[str, str], int]:
    """Open effects (pending, running or failed) that no handler of ``engine`` can run, by
    (machine, effect name): what a worker of this process would leave undone."""
    names = sorted(engine.handlers)
    query = (select(resources.c.machine, outbox.c.name, func.count())
             .join(resources, resources.c.id == outbox.c.resource_id)
             .where(outbox.c.status.in_((PENDING, RUNNING, FAILED)))
             .group_by(resources.c.machine, outbox.c.name)
             .order_by(resources.c.machine, outbox.c.name))
    if names:
        query = query.where(outbox.c.name.not_in(names))
    with engine.store.read() as db:
        return {(machine, name): count for machine, name, count in db.execute(query).all()}


__all__ = ["EffectRecord", "TimerRecord", "effect_records", "outbox_counts", "retry_failed",
           "timer_records", "unhandled"]
