"""Writes of one resource: create, update, fire, step, a timer's fire. Each is checked,
then made by the retry loop (:meth:`RetryLoop.retrying`) one attempt at a time; a fire's
attempt is :meth:`Transitions.decide_and_write`.

The path of a fire: :meth:`SingleWrites.fire` drives (:meth:`RetryLoop.drive`) the
generator :meth:`SingleWrites.firing`, which checks the arguments and runs
:meth:`~SingleWrites.firing_checked`: the retry loop around ``decide_and_write``, which
reads the row (``rows.locate``), decides (``CompiledMachine.decide``) and writes
(``write_transition``: ``Transaction.write``). On SQLite a fire without ``within`` is made
in one pass first (:meth:`Transitions.fire_once`), and goes round the loop only when it
needs to (a probe, a machine to load, a row that moved)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from .. import queries
from ..errors import (
    InvalidData,
    ResourceExists,
    UnknownState,
    UnknownTrigger,
)
from ..graph import EVENTLESS
from ..results import FireResult, Resource
from ..store import Transaction
from ..within import Within
from .checks import document, key_document, new_key, shown, validated_data
from .entries import entered, journal_row
from .outcomes import MOVED, STALE_TIMER, Again, Entry, OnStale, Row, unsure_or
from .retry import Deciding
from .rows import locate
from .transitions import TimerFired, Transitions


class SingleWrites(Transitions):
    """The writes of one resource, each one transaction (made again until it finishes)."""

    def create(self, machine: str, key: str, data: Mapping[str, Any] | None = None, *,
               state: str | None = None, actor: str | None = None) -> Resource:
        """A new resource in the machine's initial state, or adopted in ``state``: how a
        resource that already exists outside is brought under management."""
        new_key(key)
        given = document(machine, key, data, "data", actor)
        compiled = self.load(machine)
        spec = compiled.spec
        if state is None:
            dest, kind = spec.graph.enter(spec.initial), "create"
        elif state in spec.graph.parent:
            dest, kind = spec.graph.enter(state), "adopt"
        else:
            raise UnknownState(machine, state, spec.graph.names)
        given = validated_data(spec, key, given)
        now = self.clock.now()
        store = self.store
        at = store.time_param(now)
        try:
            effects: list[dict[str, Any]] = []
            timers: list[dict[str, Any]] = []
            if compiled.on_entry:
                row = Row(0, machine, key, dest, 1, 1, given, now, now, None)
                effects, _, timers = entered(store, compiled, Entry(
                    row, 1, given, None, now,
                    entered=list(reversed(spec.graph.ancestors(dest)))), at)
            with store.write() as tx:  # on PostgreSQL one round trip, with its COMMIT
                tx.write(store.sql.insert_resource, {
                    "machine": machine, "key": key, "spec_version": spec.version,
                    "state": dest, "version": 1, "seq": 1,
                    "data": store.json_param(given), "now": at,
                }, journal_row(store, 1, kind, source=None, dest=dest, version=1,
                               spec_version=spec.version, actor=actor, at=at,
                               payload=given or None), effects, (), timers)
        except store.integrity_error:
            raise ResourceExists(machine, key) from None
        except (TypeError, ValueError) as exc:
            raise InvalidData(machine, key, f"data is not JSON: {exc}") from None
        return Resource(machine=machine, key=key, state=dest, version=1, seq=1, data=given,
                        spec_version=spec.version, created_at=now, updated_at=now)

    def update(self, key: str, data: Mapping[str, Any], *, actor: str | None = None) -> Resource:
        """Merge ``data`` into the resource's data: a new version and a journal row of kind
        ``update``, no change of state (so no risky edge's observation goes stale by it)."""
        changes = key_document(key, data, "data", actor)
        return cast(Resource, self.drive(self.retrying(
            key, "update", lambda tx, _tries: self.write_update(tx, key, changes, actor))))

    def write_update(self, tx: Transaction, key: str, changes: dict[str, Any],
                     actor: str | None) -> Any:
        """One attempt of :meth:`update`: the resource with its data merged, ``MOVED``, or
        on PostgreSQL an ``Unsure`` of them."""
        row = locate(self.store, tx, key)
        compiled = self.loaded(row.machine)
        if compiled is None:
            return Again(machine=row.machine)
        spec = compiled.spec
        merged = validated_data(spec, row.key, {**row.data, **changes})
        now = self.clock.now()
        store = self.store
        at = store.time_param(now)
        try:
            written = tx.write(store.sql.change_data, {
                "id_": row.id, "version_": row.version, "seq_": row.seq,
                "new_data": store.json_param(merged), "new_version": row.version + 1,
                "new_seq": row.seq + 1, "now": at},
                journal_row(store, row.seq + 1, "update", source=row.state, dest=row.state,
                            version=row.version + 1, spec_version=spec.version, actor=actor,
                            at=at, payload=changes))
        except (TypeError, ValueError) as exc:
            raise InvalidData(row.machine, row.key, f"data is not JSON: {exc}") from None
        if written is None:
            return MOVED
        return unsure_or(written, Resource(
            machine=row.machine, key=row.key, state=row.state, version=row.version + 1,
            seq=row.seq + 1, data=merged, spec_version=spec.version,
            created_at=store.time_value(row.created_at), updated_at=now,
            observation=row.observation))

    def fire(self, key: str, trigger: str, payload: Mapping[str, Any] | None = None, *,
             actor: str | None = None, on_stale: OnStale = "raise",
             within: Within | None = None) -> FireResult:
        """Fire ``trigger`` on the resource ``key`` (``MACHINE:KEY`` or a plain key).

        Returns whether it fired, from and to which state, and the new version; when it did
        not fire, why (and nothing was written). A trigger the machine does not have at all
        raises :class:`UnknownTrigger`. A risky edge refused for want of a fresh observation
        is journaled, then raises :class:`StaleObservation` (or, with ``on_stale="return"``,
        comes back as a result whose ``error`` is ``"StaleObservation"``). ``within`` adds
        writes of the caller's own to the same transaction (see :class:`Within`)."""
        if within is None and trigger != EVENTLESS and self.store.sql.quick is not None:
            # SQLite: the common fire in one pass (fire_once); the loop if it needs one
            done = self.fire_once(key, trigger, key_document(key, payload, "payload", actor),
                                  actor, on_stale)
            if done is not None:
                return done
        return self.drive(self.firing(key, trigger, payload, actor=actor, on_stale=on_stale,
                                      within=within))

    def firing(self, key: str, trigger: str, payload: Mapping[str, Any] | None = None, *,
               actor: str | None = None, on_stale: OnStale = "raise",
               within: Within | None = None) -> Deciding[FireResult]:
        """:meth:`fire`, sans-IO: its arguments are checked now; the generator decides and
        writes, yielding each probe call it needs (see :meth:`drive`)."""
        checked = key_document(key, payload, "payload", actor)
        if trigger == EVENTLESS:  # not a trigger of any machine: eventless edges need step()
            # UnknownResource first, as for any trigger
            machine = queries.get(self.store, key).machine
            raise UnknownTrigger(machine, trigger, sorted(self.compiled(machine).triggers),
                                 hint="eventless edges are taken by step(), not fired")
        return self.firing_checked(key, trigger, checked, actor, on_stale, within)

    def step(self, key: str, *, actor: str | None = None,
             on_stale: OnStale = "raise") -> FireResult:
        """Take the first eventless transition from the resource's state whose guards hold
        (in the order of :attr:`MachineSpec.transitions`: edges from the resource's own
        state before edges from its parent states). On SQLite made in one pass first, as a
        fire is (:meth:`fire_once`: most steps of a heartbeat find no edge to take)."""
        if self.store.sql.quick is not None:
            key_document(key, None, "payload", actor)
            done = self.fire_once(key, EVENTLESS, {}, actor, on_stale)
            if done is not None:
                return done
        return self.drive(self.stepping(key, actor=actor, on_stale=on_stale))

    def stepping(self, key: str, *, actor: str | None = None,
                 on_stale: OnStale = "raise") -> Deciding[FireResult]:
        """:meth:`step`, sans-IO (see :meth:`firing`)."""
        key_document(key, None, "payload", actor)
        return self.firing_checked(key, EVENTLESS, {}, actor, on_stale, None)

    def fire_timer(self, timer_id: int, key: str, trigger: str) -> FireResult | None:
        """Fire a due timer's trigger, in one transaction with marking the timer fired; None
        when the timer is no longer pending (its state was left, or another worker fired
        it)."""
        return self.drive(self.timer_firing(timer_id, key, trigger))

    def timer_firing(self, timer_id: int, key: str,
                     trigger: str) -> Deciding[FireResult | None]:
        """:meth:`fire_timer`, sans-IO (see :meth:`firing`)."""
        result = yield from self.firing_checked(key, trigger, {}, "timer", "return",
                                                TimerFired(self.store, self.clock, timer_id))
        return None if result.reason == STALE_TIMER else result

    def firing_checked(self, key: str, trigger: str, payload: dict[str, Any],
                       actor: str | None, on_stale: OnStale,
                       within: Within | None) -> Deciding[FireResult]:
        """A fire whose arguments were checked: the retry loop around
        :meth:`decide_and_write` (a journaled refusal raised or returned, as asked)."""
        return self.retrying(key, shown(trigger), self.decide_and_write, on_stale,
                             (key, trigger, payload, actor, within))


__all__ = ["SingleWrites"]
