"""Statements of ``lifecycle_timers``: a timeout set on entering a state, cancelled on
leaving it, fired (or refused) when due."""

from __future__ import annotations

from sqlalchemy import bindparam, func, insert, literal_column, select, update

from ...results import CANCELLED, FIRED, PENDING, REFUSED
from ..schema import resources, timers
from .compiling import Compiling, constant

_DUE = (
    select(timers.c.id, timers.c.trigger, resources.c.machine, resources.c.key)
    .join(resources, resources.c.id == timers.c.resource_id)
    .where(timers.c.status == constant(PENDING), timers.c.due_at <= bindparam("now"))
    .order_by(timers.c.due_at, timers.c.id).limit(bindparam("limit"))
    .offset(literal_column("0")))  # (else SQLite's form binds an offset of its own)


class TimerStatements(Compiling):
    """The hot path's statements of timers."""

    def _timers(self) -> None:
        sql, t = self._sql, timers.c
        self.insert_timer = sql(insert(timers).values(**{
            name: bindparam(name) for name in (
                "resource_id", "seq", "state", "trigger", "due_at", "status", "created_at")}))
        self.cancel_timers = sql(
            update(timers)
            .where(t.resource_id == bindparam("resource_id"), t.state == bindparam("state_"),
                   t.status == constant(PENDING))
            .values(status=constant(CANCELLED), finished_at=bindparam("now")))
        self.fire_timer = sql(
            update(timers).where(t.id == bindparam("id_"), t.status == constant(PENDING))
            .values(status=constant(FIRED), finished_at=bindparam("now")))
        self.refuse_timer = sql(update(timers).where(t.id == bindparam("id_")).values(
            status=constant(REFUSED), outcome=bindparam("outcome")))
        self.due_timers = sql(_DUE)
        """The look for due timers (``now``, ``limit``) of ``Store.due_timers``: a worker
        looks on every ``run_until_idle``, and a compiled statement read on its thread's own
        connection costs a fraction of a read transaction's checkout, BEGIN and rollback."""
        self.soonest_due = sql(select(func.min(t.due_at)).where(t.status == constant(PENDING)))
        """When the soonest pending timer is due (as the database stores it; NULL: none),
        for ``Store.reading``: a simulation waking its worker for the next timer looks after
        every step, and a read transaction of its own cost more than the rest of its look."""


__all__ = ["TimerStatements"]
