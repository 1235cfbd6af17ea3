"""Reading and repairing the outbox: effects and timers by resource and status, failed
effects put back in the queue, counts by status."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update

from .effects import FAILED, PENDING
from .engine import Engine
from .queries import resource_id
from .store import outbox, resources, timers


@dataclass(frozen=True, slots=True)
class EffectRecord:
    id: int
    machine: str
    key: str
    seq: int
    position: int
    name: str
    status: str
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None
    idempotency_key: str
    claimed_by: str | None = None
    """The worker that holds (or last held) the claim."""
    lease_until: dt.datetime | None = None
    """While the effect runs: when its claim ends unless its worker renews it."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "machine": self.machine, "key": self.key, "seq": self.seq,
                "position": self.position, "name": self.name, "status": self.status,
                "attempts": self.attempts, "next_attempt_at": self.next_attempt_at.isoformat(),
                "last_error": self.last_error, "idempotency_key": self.idempotency_key,
                "claimed_by": self.claimed_by,
                "lease_until": self.lease_until.isoformat() if self.lease_until else None}


@dataclass(frozen=True, slots=True)
class TimerRecord:
    id: int
    machine: str
    key: str
    seq: int
    state: str
    trigger: str
    due_at: dt.datetime
    status: str
    outcome: str | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "machine": self.machine, "key": self.key, "seq": self.seq,
                "state": self.state, "trigger": self.trigger, "due_at": self.due_at.isoformat(),
                "status": self.status, "outcome": self.outcome}


def _rows_of(engine: Engine, table: Any, order: tuple[Any, ...], key: str | None,
             statuses: tuple[str, ...] | None) -> list[Any]:
    """Rows of the outbox (effects or timers) with their resource's machine and key."""
    query = (select(table, resources.c.machine, resources.c.key)
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
    rows = _rows_of(engine, outbox, (outbox.c.id,), key, statuses)
    return [EffectRecord(r.id, r.machine, r.key, r.seq, r.position, r.name, r.status,
                         r.attempts, r.next_attempt_at, r.last_error, r.idempotency_key,
                         r.claimed_by, r.lease_until)
            for r in rows]


def timer_records(engine: Engine, key: str | None = None,
                  statuses: tuple[str, ...] | None = None) -> list[TimerRecord]:
    rows = _rows_of(engine, timers, (timers.c.due_at, timers.c.id), key, statuses)
    return [TimerRecord(r.id, r.machine, r.key, r.seq, r.state, r.trigger, r.due_at, r.status,
                        r.outcome) for r in rows]


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


__all__ = ["EffectRecord", "TimerRecord", "effect_records", "outbox_counts", "retry_failed",
           "timer_records"]
