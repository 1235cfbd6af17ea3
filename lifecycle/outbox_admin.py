"""Reading and repairing the outbox: effects and timers by resource and status, failed
effects put back in the queue, counts by status."""

from __future__ import annotations

from typing import Any, Literal

from .engine import Engine
from .queries import resource_id
from .results import EffectRecord, TimerRecord
from .store.statements import effects as effect_rows


def _rows_of(engine: Engine, kind: Literal["effects", "timers"], columns: tuple[str, ...],
             order: tuple[str, ...], key: str | None,
             statuses: tuple[str, ...] | None) -> list[Any]:
    """Rows of the outbox (effects or timers): its resource's machine and key, then
    ``columns``."""
    with engine.store.read() as db:
        rid = resource_id(db, key)[0] if key is not None else None
        return effect_rows.listed(db, kind, columns, order, rid, statuses)


def effect_records(engine: Engine, key: str | None = None,
                   statuses: tuple[str, ...] | None = None) -> list[EffectRecord]:
    rows = _rows_of(engine, "effects", EffectRecord.COLUMNS, ("id",), key,
                    statuses)
    return [EffectRecord.from_row(r[0], r[1], r[2:]) for r in rows]


def timer_records(engine: Engine, key: str | None = None,
                  statuses: tuple[str, ...] | None = None) -> list[TimerRecord]:
    rows = _rows_of(engine, "timers", TimerRecord.COLUMNS, ("due_at", "id"), key,
                    statuses)
    return [TimerRecord.from_row(r[0], r[1], r[2:]) for r in rows]


def retry_failed(engine: Engine, key: str) -> int:
    """Put a stuck resource's failed effects back in the queue, due now; how many."""
    now = engine.clock.now()
    with engine.store.begin() as db:
        rid, _ = resource_id(db, key)
        return effect_rows.retry_failed(db, rid, now)


def outbox_counts(engine: Engine) -> dict[str, int]:
    """Effects by status."""
    with engine.store.read() as db:
        return effect_rows.counts(db)


def unhandled(engine: Engine) -> dict[tuple[str, str], int]:
    """Open effects (pending, running or failed) that no handler of ``engine`` can run, by
    (machine, effect name): what a worker of this process would leave undone."""
    with engine.store.read() as db:
        return effect_rows.unhandled(db, engine.handlers)


__all__ = ["EffectRecord", "TimerRecord", "effect_records", "outbox_counts", "retry_failed",
           "timer_records", "unhandled"]
