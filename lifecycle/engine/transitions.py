"""One attempt of a fire or a step: read the resource, decide with its machine, and write
what was decided (:meth:`Transitions.decide_and_write`): the transition
(:meth:`~Transitions.write_transition`), the journaled refusal of a risky edge
(:meth:`~Transitions.write_refusal`), or nothing (refused by its guards). The write itself
is one :meth:`Transaction.write`: the compare-and-swap, the journal row, effects, timers."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..clock import Clock
from ..compiled import CompiledMachine, Decision, GuardContext
from ..errors import InvalidData, StaleObservation, UnknownTrigger
from ..freshness import ProbeRequest, clock_time, rule_text
from ..graph import EVENTLESS
from ..results import FireResult
from ..store import Store, Transaction
from ..within import Within
from .checks import shown, validated_data
from .entries import entered, fence_for, journal_row
from .outcomes import (
    MOVED,
    STALE_TIMER,
    Again,
    Entry,
    OnStale,
    Row,
    Stale,
    Tries,
    Unsure,
    not_fired,
    unsure_or,
)
from .retry import RetryLoop
from .rows import locate, row_of


class Transitions(RetryLoop):
    """Deciding and writing one fire, inside the retry loop's transaction."""

    def fire_once(self, key: str, trigger: str, payload: dict[str, Any], actor: str | None,
                  on_stale: OnStale) -> FireResult | None:
        """A fire on SQLite in one pass, without the retry loop: one transaction that reads
        the row and writes by position (``Statements.quick``). A decision known before the
        row is read (``CompiledMachine.plan``) that writes the move and its journal row alone
        is written here; any other is :meth:`decide_and_write`'s, on the row read. None, with
        nothing written, when the fire needs the loop (a probe, a machine to load, a row that
        moved, a key not found once): :meth:`firing` (:meth:`stepping`) then makes it from
        the start. The arguments are checked; a step's plan is left to the decision."""
        store = self.store
        quick = store.sql.quick
        if quick is None:
            return None
        machine, sep, plain = key.partition(":")
        with store.write() as tx:
            execute = tx.execute
            if sep and machine and plain:
                execute(quick.by_machine_key, (machine, plain))
            else:
                execute(quick.by_key, (key,))
            rows = tx.fetchall()
            if len(rows) != 1:  # unknown or ambiguous: the loop says which
                tx.rollback()
                return None
            fetched = rows[0]
            compiled = self._compiled.get(fetched[1])
            if compiled is None:
                tx.rollback()
                return None
            state = fetched[3]
            plan: Any = compiled.plans.get((state, trigger), False)  # False: not asked yet
            if plan is False:
                plan = compiled.plan(state, trigger)
            if plan is not None and plan.plain and not payload and trigger != EVENTLESS:
                rid, version, seq = fetched[0], fetched[4], fetched[5]
                dest, spec_version = plan.dest, compiled.spec.version
                at = store.time_param(self.clock.now())
                execute(quick.move, (rid, version, seq, dest, version + 1, seq + 1,
                                     spec_version, at))
                if tx.cursor.rowcount != 1:  # moved underneath: the loop decides again
                    tx.rollback()
                    return None
                execute(quick.journal, (rid, seq + 1, "transition", trigger, state, dest,
                                        version + 1, spec_version, actor, at, None, None,
                                        None, None))
                outcome: Any = FireResult(True, fetched[1], fetched[2], trigger, state, dest,
                                          version + 1, None, {}, None, None, False, seq + 1, 0)
            else:
                outcome = self.decide_and_write(tx, key, trigger, payload, actor, None,
                                                Tries(), row_of(store, fetched))
                if isinstance(outcome, Again):
                    tx.rollback()
                    return None
        if type(outcome) is Stale:  # a journaled refusal, as the loop gives it
            if on_stale == "raise":
                raise StaleObservation(outcome.result, dest=outcome.dest,
                                       probe_error=outcome.probe_error)
            outcome = outcome.result
        result: FireResult = outcome  # (typing.cast is a call: it costs every fire)
        return result

    def decide_and_write(self, tx: Transaction, key: str, trigger: str,
                         payload: dict[str, Any], actor: str | None, within: Within | None,
                         tries: Tries, row: Row | None = None) -> Any:
        """Read (unless a batch read ``row`` in this transaction), decide and write one
        fire, in the transaction of ``tx``. With ``within``, the write is strict: a row that
        moved undoes the hook's writes with it."""
        if row is None:
            if type(within) is TimerFired:
                within.ahead(tx)  # sent with the read: one round trip on PostgreSQL
            row = locate(self.store, tx, key)
        compiled = self._compiled.get(row.machine)  # (a method call costs every fire)
        if compiled is None:
            return Again(machine=row.machine)
        if trigger != EVENTLESS and trigger not in compiled.triggers:
            raise UnknownTrigger(row.machine, trigger, sorted(compiled.triggers))
        withheld = within.before(tx, row.id) if within is not None else None
        if withheld is not None:
            return not_fired(row, trigger, withheld)
        context = GuardContext(row.machine, row.key, row.state, row.version, row.data,
                               payload, self.clock.now(), row.observation,
                               row.last_transition_at)
        decision = compiled.decide(row.state, trigger, context)
        if context.stale and tries.may_probe:
            # a risky edge whose guards held was stopped by its freshness rule alone: ask
            # for a fresh observation and decide again (nothing is written)
            for blocked, _ in context.stale:
                if blocked.fresh is not None and blocked.fresh.probe in self.probes:
                    return Again(probe=(blocked.fresh.probe, ProbeRequest(
                        row.machine, row.key, row.state, row.version, row.data,
                        row.observation)))
        outcome: Any
        strict = within is not None
        if decision.fired:
            outcome = self.write_transition(tx, compiled, row, trigger, payload, actor,
                                            decision, context.now, probed=tries.probes > 0,
                                            strict=strict)
        elif context.stale:
            outcome = self.write_refusal(tx, compiled, row, trigger, payload, actor, context,
                                         decision, tries, strict=strict)
        else:  # refused by its guards, perhaps on the answer a probe just gave
            outcome = not_fired(row, trigger, decision.reason, decision.guards,
                                probed=tries.probes > 0)
        if within is not None and not isinstance(outcome, Again):
            # a strict write: if its row moved, the hook's writes are undone with it
            done = outcome.value if type(outcome) is Unsure else outcome
            within.after(tx, done.result if isinstance(done, Stale) else done)
        return outcome

    def write_transition(self, tx: Transaction, compiled: CompiledMachine, row: Row,
                         trigger: str, payload: dict[str, Any], actor: str | None,
                         decision: Decision, now: dt.datetime, *, probed: bool,
                         strict: bool = False) -> Any:
        """Write the transition decided: the compare-and-swap, its journal row, what its
        effects and the states it enters ask for (:meth:`Transaction.write`). The
        :class:`FireResult`, ``MOVED``, or on PostgreSQL an ``Unsure`` of them."""
        store = self.store
        edge, dest = decision.edge, decision.dest
        assert edge is not None and dest is not None
        spec = compiled.spec
        risky = edge.fresh is not None
        seq = row.seq + 1
        at = store.time_param(now)
        observation_id = row.observation.id if row.observation else None
        params: dict[str, Any] = {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": observation_id, "new_state": dest,
            "new_version": row.version + 1, "new_seq": seq,
            "new_spec_version": spec.version, "now": at,
        }
        # a data model that follows transitions computes the data each one leaves (startd)
        moves = compiled.follows_transitions
        with_data = (bool(payload) and edge.merge_payload) or moves
        data = row.data
        fence = fence_for(edge, row.observation) if risky else None
        try:
            if with_data:
                merged = {**row.data, **payload} if edge.merge_payload else row.data
                data = validated_data(spec, row.key, merged, {
                    "trigger": trigger, "source": row.state, "dest": dest,
                    "payload": payload, "now": now, "seq": seq} if moves else None)
                params["new_data"] = store.json_param(data)
            journaled = journal_row(
                store, seq, "transition", trigger=trigger, source=row.state, dest=dest,
                version=row.version + 1, spec_version=spec.version, actor=actor, at=at,
                payload=payload or None, guards=decision.guards or None,
                # guards decided on the newest observation: the row keeps it
                observation_id=observation_id if risky or decision.guards else None,
                fence=fence)
        except InvalidData:  # the data model refused it, and said why
            raise
        except (TypeError, ValueError) as exc:  # a payload that JSON cannot hold
            raise InvalidData(row.machine, row.key, f"payload is not JSON: {exc}") from None
        effects: list[dict[str, Any]] = []
        exited: list[str] = []
        timers: list[dict[str, Any]] = []
        if compiled.on_entry or edge.effects:
            entry = Entry(row, seq, data, fence, now, edge.effects)
            if compiled.on_entry:
                entry.exited, entry.entered = compiled.crossed(row.state, dest, edge.dest)
            effects, exited, timers = entered(store, compiled, entry, at)
        written = tx.write(store.sql.move[with_data, risky], params, journaled, effects, exited,
                           timers, at, strict=strict)
        if written is None:
            return MOVED
        result = FireResult(True, row.machine, row.key, shown(trigger), row.state, dest,
                            row.version + 1, None, decision.guards, None, fence, probed, seq,
                            len(effects))
        return result if written.__class__ is int else unsure_or(written, result)

    def write_refusal(self, tx: Transaction, compiled: CompiledMachine, row: Row,
                      trigger: str, payload: dict[str, Any], actor: str | None,
                      context: GuardContext, decision: Decision, tries: Tries, *,
                      strict: bool = False) -> Any:
        """Journal the refusal of a risky edge (state and version unchanged): a ``Stale``,
        ``MOVED``, or on PostgreSQL an ``Unsure`` of them."""
        store = self.store
        edge, problem = context.stale[0]
        assert edge.fresh is not None
        dest = compiled.spec.graph.enter(edge.dest)
        observation_id = row.observation.id if row.observation else None
        written = tx.write(store.sql.refuse, {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": observation_id, "new_seq": row.seq + 1},
            journal_row(store, row.seq + 1, "refusal", trigger=trigger, source=row.state,
                        dest=dest, version=row.version, spec_version=compiled.spec.version,
                        actor=actor, at=store.time_param(context.now),
                        payload=payload or None, guards=decision.guards or None,
                        observation_id=observation_id),
            strict=strict)
        if written is None:
            return MOVED
        message = (
            f"{row.machine} {row.key!r} edge {row.state}->{dest} ({shown(trigger)}, "
            f"{rule_text(edge.fresh)}) needs an observation newer than its last transition at "
            f"{clock_time(row.last_transition_at)} and at most {edge.fresh.max_age:g} s old; "
            f"{problem}")
        if tries.probe_error:
            message += f" ({tries.probe_error})"
        elif edge.fresh.probe is None:
            message += " (no probe is named to ask for a fresh one)"
        elif edge.fresh.probe not in self.probes:
            message += (f" (probe {edge.fresh.probe!r} is not registered with this engine, so "
                        "none was asked)")
        result = not_fired(row, trigger, message, decision.guards, error="StaleObservation",
                           probed=tries.probes > 0)
        return unsure_or(written, Stale(result, dest, tries.probe_error))


class TimerFired(Within):
    """Marks a timer fired in the transaction of the trigger it fires; withholds the fire
    when the timer is no longer pending."""

    def __init__(self, store: Store, clock: Clock, timer_id: int) -> None:
        self.store, self.clock, self.timer_id = store, clock, timer_id
        self.marked: Any = None

    def ahead(self, tx: Transaction) -> None:
        """Mark the timer fired, before the resource is read (so that on PostgreSQL the
        two go in one round trip); :meth:`before` reads whether it was still pending."""
        self.marked = tx.changes(self.store.sql.fire_timer, {
            "id_": self.timer_id, "now": self.store.time_param(self.clock.now())})

    def before(self, tx: Transaction, resource_id: int) -> str | None:
        marked, self.marked = self.marked, None
        return None if marked() == 1 else STALE_TIMER

    def after(self, tx: Transaction, result: FireResult) -> None:
        if not result.fired:
            tx.execute(self.store.sql.refuse_timer, {
                "id_": self.timer_id, "outcome": result.reason})
