"""The Engine: create, fire, step, observe, history. One fire is one database transaction.

The hot path reads the resource with its newest observation, decides with the
``transitions`` machine compiled once per spec, and writes the new state with a
compare-and-swap on the version, the journal row in the same transaction. If the version
moved underneath, it re-reads and decides again. A risky edge whose observation is stale
calls its probe first, outside any transaction, then decides on the answer.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from . import queries, registry
from .clock import Clock, SystemClock
from .effects import Effect, Handler, as_effect
from .errors import (
    ConcurrencyError,
    InvalidData,
    LifecycleError,
    Problem,
    ResourceExists,
    SpecError,
    StaleObservation,
    UnknownState,
    UnknownTrigger,
)
from .fresh import Probe, ProbeFailed, ProbeRequest, call_probe, clock_time, rule_text
from .records import FireResult, JournalEntry, Mismatch, Observation, Resource
from .runner import Decision, GuardContext, Runner
from .spec import EVENTLESS, EffectSpec, MachineSpec, SpecSource, _Edge, load_spec
from .store import Store

log = logging.getLogger(__name__)

Guard = Callable[[GuardContext], bool]
OnStale = Literal["raise", "return"]

_KEY_MAX = 255
_STALE_TIMER = "the timer is no longer pending"
_MAX_PROBES = 3

__all__ = ["Engine", "FireResult", "Guard", "JournalEntry", "Mismatch", "Observation",
           "Resource"]


class _Conflict(Exception):
    """The compare-and-swap lost: somebody else moved the resource first."""


class _NeedMachine(Exception):
    """The resource's machine must be loaded first, outside the write transaction (loading
    may register a spec, which takes a transaction of its own)."""


@dataclass(slots=True)
class _NeedProbe(Exception):
    """A risky edge needs a fresher observation: leave the transaction, ask the probe."""

    name: str
    request: ProbeRequest


class Within:
    """Writes a caller adds to a fire's transaction: ``before`` may withhold the fire (its
    reason, or None to go on); ``after`` sees the outcome, fired or refused."""

    def before(self, cursor: Any, resource_id: int) -> str | None:
        return None

    def after(self, cursor: Any, result: FireResult) -> None:
        return None


@dataclass(slots=True)
class _Row:
    """The resource as the hot path read it."""

    id: int
    machine: str
    key: str
    state: str
    version: int
    seq: int
    data: dict[str, Any]
    last_transition_at: dt.datetime
    observation: Observation | None


class Engine:
    """Runs machine specs against a store.

    ``guards`` maps guard names to predicates over a :class:`GuardContext`; guards never do
    I/O. ``probes`` maps probe names to functions that ask the outside world for a resource's
    status (called outside any transaction, given up after ``probe_timeout`` seconds).
    ``effects`` maps effect names to handlers (or :class:`Effect` with a retry policy), which
    a :class:`Worker` runs after the transitions that asked for them committed. Time comes
    from ``clock``.
    """

    def __init__(
        self,
        store: Store,
        machines: Iterable[SpecSource] = (),
        *,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Handler | Effect] | None = None,
        probes: Mapping[str, Probe] | None = None,
        clock: Clock | None = None,
        probe_timeout: float = 10.0,
        max_attempts: int = 50,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.guards: dict[str, Guard] = dict(guards or {})
        self.effects: dict[str, Effect] = {name: as_effect(handler)
                                           for name, handler in (effects or {}).items()}
        self.probes: dict[str, Probe] = dict(probes or {})
        self.probe_timeout = probe_timeout
        self.max_attempts = max_attempts
        self._runners: dict[str, Runner] = {}
        for spec in machines:
            self.register(spec)

    # -- machines ----------------------------------------------------------------------

    @property
    def machines(self) -> dict[str, MachineSpec]:
        return {name: runner.spec for name, runner in self._runners.items()}

    def register(self, source: SpecSource) -> MachineSpec:
        """Validate a spec, store it if it is new, and make it the machine's current version.

        A changed spec is refused when live resources are in states it no longer has."""
        spec = load_spec(source)
        self._check_names(spec)
        registry.store_spec(self.store, spec, self.clock.now())
        self._runners[spec.name] = Runner(spec, self.guards)
        return spec

    def _check_names(self, spec: MachineSpec) -> None:
        problems = []
        for kind, registered in (("guard", self.guards), ("effect", self.effects),
                                 ("probe", self.probes)):
            for name in sorted(_names(spec, kind) - set(registered)):
                where = [loc for loc, edge in _located_edges(spec) if name in _edge_names(
                    edge, kind)]
                if kind == "effect":
                    where += [spec.graph.effect_locations[state]
                              for state, effects in spec.graph.entry_effects.items()
                              if name in (e.name for e in effects)]
                problems.append(Problem(
                    ", ".join(where), f"{kind} {name!r} is not registered with this engine",
                    f"pass it in Engine({kind}s={{{name!r}: ...}})"))
        if problems:
            raise SpecError(spec.name, problems)

    def _runner(self, machine: str) -> Runner:
        runner = self._runners.get(machine)
        if runner is None:
            runner = self._load_stored(machine)
        return runner

    def _load_stored(self, machine: str) -> Runner:
        """A machine this engine was not given, as the database last registered it."""
        spec = registry.stored_spec(self.store, machine, list(self._runners))
        self._check_names(spec)
        runner = self._runners[machine] = Runner(spec, self.guards)
        return runner

    def machine_names(self) -> list[str]:
        """Every machine registered with this engine or stored in the database."""
        return sorted({*self._runners, *registry.stored_names(self.store)})

    def spec(self, machine: str) -> MachineSpec:
        return self._runner(machine).spec

    # -- creating ----------------------------------------------------------------------

    def create(
        self,
        machine: str,
        key: str,
        data: Mapping[str, Any] | None = None,
        *,
        state: str | None = None,
        actor: str | None = None,
    ) -> Resource:
        """A new resource in the machine's initial state, or adopted in ``state``: how a
        resource that already exists outside is brought under management."""
        runner = self._runner(machine)
        spec = runner.spec
        _check_key(key)
        if state is None:
            dest, kind = spec.graph.enter(spec.initial), "create"
        elif state in spec.graph.parent:
            dest, kind = spec.graph.enter(state), "adopt"
        else:
            raise UnknownState(machine, state, spec.graph.names)
        document = self._validated(spec, key, dict(data or {}))
        now = self.clock.now()
        store = self.store
        try:
            with store.write() as cursor:
                cursor.execute(store.sql.insert_resource, {
                    "machine": machine, "key": key, "spec_version": spec.version,
                    "state": dest, "version": 1, "seq": 1,
                    "data": store.json_param(document), "now": store.time_param(now),
                })
                resource_id = cursor.fetchone()[0]
                cursor.execute(store.sql.insert_journal, {
                    "resource_id": resource_id, "seq": 1, "kind": kind, "trigger": None,
                    "source": None, "dest": dest, "version": 1, "spec_version": spec.version,
                    "actor": actor, "at": store.time_param(now),
                    "payload": store.json_param(document) if document else None,
                    "guards": None, "observation_id": None, "fence": None,
                })
                if runner.on_entry:
                    row = _Row(resource_id, machine, key, dest, 1, 1, document, now, None)
                    entered = list(reversed(spec.graph.ancestors(dest)))
                    self._enter(cursor, runner, row, 1, (), [], entered, document, None, now)
        except store.integrity_error:
            raise ResourceExists(machine, key) from None
        except (TypeError, ValueError) as exc:
            raise InvalidData(machine, key, f"data is not JSON: {exc}") from None
        return Resource(machine, key, dest, 1, 1, document, spec.version, now, now)

    def update(self, key: str, data: Mapping[str, Any], *, actor: str | None = None) -> Resource:
        """Merge ``data`` into the resource's data: a new version and a journal row of kind
        ``update``, no change of state (so no risky edge's observation goes stale by it)."""
        store = self.store
        for _attempt in range(self.max_attempts):
            try:
                with store.write() as cursor:
                    row = self._locate(cursor, key)
                    runner = self._runners.get(row.machine)
                    if runner is None:
                        raise _NeedMachine(row.machine)
                    merged = self._validated(runner.spec, row.key, {**row.data, **data})
                    now = self.clock.now()
                    when = store.time_param(now)
                    try:
                        cursor.execute(store.sql.change_data, {
                            "id_": row.id, "version_": row.version, "seq_": row.seq,
                            "new_data": store.json_param(merged),
                            "new_version": row.version + 1, "new_seq": row.seq + 1,
                            "now": when})
                        if cursor.rowcount != 1:
                            raise _Conflict
                        cursor.execute(store.sql.insert_journal, {
                            "resource_id": row.id, "seq": row.seq + 1, "kind": "update",
                            "trigger": None, "source": row.state, "dest": row.state,
                            "version": row.version + 1, "spec_version": runner.spec.version,
                            "actor": actor, "at": when, "payload": store.json_param(dict(data)),
                            "guards": None, "observation_id": None, "fence": None})
                    except (TypeError, ValueError) as exc:
                        raise InvalidData(row.machine, row.key,
                                          f"data is not JSON: {exc}") from None
            except _NeedMachine as need:
                self._runner(str(need))
                continue
            except _Conflict:
                continue
            return Resource(row.machine, row.key, row.state, row.version + 1, row.seq + 1,
                            merged, runner.spec.version, now, now, row.observation)
        raise ConcurrencyError(f"{key}: update lost the race {self.max_attempts} times")

    # -- observing ---------------------------------------------------------------------

    def observe(
        self,
        key: str,
        status: Mapping[str, Any],
        observed_at: dt.datetime | None = None,
        *,
        source: str = "api",
    ) -> Observation:
        """Record a status report about ``key`` from outside. ``observed_at`` is when it was
        true at its source (default: now). Guards see the newest observation by
        ``observed_at``; an older one arriving late is kept in history but replaces nothing.
        A time ahead of the engine's clock is taken as now."""
        if not isinstance(status, Mapping):
            raise InvalidData("?", key, f"a status is a JSON object, not {type(status).__name__}")
        store = self.store
        recorded_at = self.clock.now()
        if observed_at is None:
            observed_at = recorded_at
        elif observed_at.tzinfo is None:
            raise InvalidData("?", key, f"observed_at {observed_at} has no time zone")
        elif observed_at > recorded_at:
            log.warning("%s: observation from %s is ahead of the clock (%s); taken as now",
                        key, observed_at.isoformat(), recorded_at.isoformat())
            observed_at = recorded_at
        try:
            with store.write() as cursor:
                row = self._locate(cursor, key)
                observation_id = self._record(cursor, row.id, dict(status), observed_at,
                                              recorded_at, source)
        except (TypeError, ValueError) as exc:
            raise InvalidData("?", key, f"status is not JSON: {exc}") from None
        return Observation(observation_id, dict(status), observed_at, recorded_at, source)

    def _record(self, cursor: Any, resource_id: int, status: dict[str, Any],
                observed_at: dt.datetime, recorded_at: dt.datetime, source: str) -> int:
        store = self.store
        when = store.time_param(observed_at)
        cursor.execute(store.sql.insert_observation, {
            "resource_id": resource_id, "status": store.json_param(status),
            "observed_at": when, "recorded_at": store.time_param(recorded_at),
            "source": source,
        })
        observation_id = int(cursor.fetchone()[0])
        cursor.execute(store.sql.newest_observation, {
            "id_": resource_id, "observation_id": observation_id, "observed_at_": when})
        return observation_id

    # -- firing ------------------------------------------------------------------------

    def fire(
        self,
        key: str,
        trigger: str,
        payload: Mapping[str, Any] | None = None,
        *,
        actor: str | None = None,
        on_stale: OnStale = "raise",
    ) -> FireResult:
        """Fire ``trigger`` on the resource ``key`` (``MACHINE:KEY`` or a plain key).

        Returns whether it fired, from and to which state, and the new version; when it did
        not fire, why (and nothing was written). A trigger the machine does not have at all
        raises :class:`UnknownTrigger`. A risky edge refused for want of a fresh observation
        is journaled, then raises :class:`StaleObservation` (or, with ``on_stale="return"``,
        comes back as a result whose ``error`` is ``"StaleObservation"``)."""
        if trigger == EVENTLESS:  # not a trigger of any machine: eventless edges need step()
            machine = queries.split_key(key)[0] or "?"
            raise UnknownTrigger(machine, trigger, [])
        return self._decide_and_commit(key, trigger, dict(payload or {}), actor, on_stale)

    def step(self, key: str, *, actor: str | None = None,
             on_stale: OnStale = "raise") -> FireResult:
        """Take the first eventless transition from the resource's state whose guards hold
        (in the order of :attr:`MachineSpec.transitions`: edges from the resource's own
        state before edges from its parent states)."""
        return self._decide_and_commit(key, EVENTLESS, {}, actor, on_stale)

    def _decide_and_commit(self, key: str, trigger: str, payload: dict[str, Any],
                           actor: str | None, on_stale: OnStale,
                           within: Within | None = None) -> FireResult:
        """Decide and commit, trying again when the resource moved underneath. ``within``
        adds writes of the caller (a timer's or an effect's bookkeeping) to the same
        transaction."""
        probed_version: int | None = None
        probes = 0
        probe_error: str | None = None
        for _attempt in range(self.max_attempts):
            try:
                with self.store.write() as cursor:
                    outcome = self._attempt(
                        cursor, key, trigger, payload, actor, within=within,
                        may_probe=probe_error is None and probes < _MAX_PROBES,
                        probe_error=probe_error, probed=probes > 0)
            except _NeedMachine as need:
                self._runner(str(need))
                continue
            except _Conflict:
                log.debug("%s: the resource moved while firing %s; deciding again", key,
                          trigger)
                continue
            except _NeedProbe as need:
                if need.request.version == probed_version:
                    # the probe's answer did not make it fresh, and nothing moved: refuse
                    probe_error = "the probe's answer was not fresh either"
                    continue
                probes += 1
                probed_version = need.request.version
                probe_error = self._probe(need)
                continue
            if isinstance(outcome, StaleObservation):
                if on_stale == "raise":
                    raise outcome
                result: FireResult = outcome.result
                return result
            return outcome
        raise ConcurrencyError(
            f"{key}: {_shown(trigger)} lost the race {self.max_attempts} times in a row; "
            "nothing was written. Try again, or look for a process that moves it in a loop")

    def fire_timer(self, timer_id: int, key: str, trigger: str) -> FireResult | None:
        """Fire a due timer's trigger, in one transaction with marking the timer fired; None
        when the timer is no longer pending (its state was left, or another worker fired
        it)."""
        store = self.store

        class Timer(Within):
            def before(self, cursor: Any, resource_id: int) -> str | None:
                cursor.execute(store.sql.fire_timer, {
                    "id_": timer_id, "now": store.time_param(engine.clock.now())})
                return None if cursor.rowcount == 1 else _STALE_TIMER

            def after(self, cursor: Any, result: FireResult) -> None:
                if not result.fired:
                    cursor.execute(store.sql.refuse_timer, {
                        "id_": timer_id, "outcome": result.reason})

        engine = self
        result = self._decide_and_commit(key, trigger, {}, "timer", "return", within=Timer())
        return None if result.reason == _STALE_TIMER else result

    def _probe(self, need: _NeedProbe) -> str | None:
        """Ask the probe and record its answer; the failure, if it failed."""
        request = need.request
        probe = self.probes[need.name]
        asked_at = self.clock.now()
        try:
            status, observed_at = call_probe(need.name, probe, request, self.probe_timeout)
        except ProbeFailed as failure:
            log.warning("%s:%s: %s", request.machine, request.key, failure)
            return str(failure)
        try:
            self.observe(f"{request.machine}:{request.key}", status,
                         observed_at or asked_at, source=need.name)
        except InvalidData as exc:
            return f"probe {need.name} answered a status that cannot be stored: {exc}"
        return None

    def _attempt(self, cursor: Any, key: str, trigger: str, payload: dict[str, Any],
                 actor: str | None, *, within: Within | None, may_probe: bool,
                 probe_error: str | None, probed: bool) -> FireResult | StaleObservation:
        store = self.store
        sql = store.sql
        row = self._locate(cursor, key)
        runner = self._runners.get(row.machine)
        if runner is None:
            raise _NeedMachine(row.machine)
        if trigger != EVENTLESS and trigger not in runner.triggers:
            raise UnknownTrigger(row.machine, trigger, sorted(runner.triggers))
        if within is not None:
            withheld = within.before(cursor, row.id)
            if withheld is not None:
                return FireResult(False, row.machine, row.key, _shown(trigger), row.state, None,
                                  row.version, withheld)
        now = self.clock.now()
        context = GuardContext(row.machine, row.key, row.state, row.version, row.data,
                               payload, now, row.observation, row.last_transition_at)
        decision = runner.decide(row.state, trigger, context)
        if context.stale and may_probe:
            # a risky edge whose guards held was stopped by its freshness rule alone: ask
            # for a fresh observation and decide again (nothing was written)
            for blocked, _ in context.stale:
                if blocked.fresh is not None and blocked.fresh.probe is not None:
                    raise _NeedProbe(blocked.fresh.probe, ProbeRequest(
                        row.machine, row.key, row.state, row.version, row.data,
                        row.observation))
        observation_id = row.observation.id if row.observation else None
        if not decision.fired:
            if not context.stale:
                result = _refused(row, trigger, decision)
                if within is not None:
                    within.after(cursor, result)
                return result
            stale = self._refuse_stale(cursor, runner, row, trigger, payload, actor,
                                       context, decision, probe_error, probed)
            if within is not None:
                within.after(cursor, stale.result)
            return stale
        edge = decision.edge
        assert edge is not None and decision.dest is not None
        risky = edge.fresh is not None
        seq = row.seq + 1
        params: dict[str, Any] = {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": observation_id,
            "new_state": decision.dest, "new_version": row.version + 1,
            "new_seq": seq, "new_spec_version": runner.spec.version,
            "now": store.time_param(now),
        }
        with_data = bool(payload) and edge.merge_payload
        data = row.data
        try:
            if with_data:
                data = self._validated(runner.spec, row.key, {**row.data, **payload})
                params["new_data"] = store.json_param(data)
            cursor.execute(sql.move[with_data, risky], params)
            if cursor.rowcount != 1:
                raise _Conflict
            fence = _fence(edge, row.observation) if risky else None
            cursor.execute(sql.insert_journal, {
                "resource_id": row.id, "seq": seq, "kind": "transition",
                "trigger": None if trigger == EVENTLESS else trigger,
                "source": row.state, "dest": decision.dest, "version": row.version + 1,
                "spec_version": runner.spec.version, "actor": actor, "at": params["now"],
                "payload": store.json_param(payload) if payload else None,
                "guards": store.json_param(decision.guards) if decision.guards else None,
                "observation_id": observation_id if risky else None,
                "fence": store.json_param(fence) if fence else None,
            })
        except (TypeError, ValueError) as exc:  # a payload that JSON cannot hold
            raise InvalidData(row.machine, row.key, f"payload is not JSON: {exc}") from None
        asked = len(edge.effects)
        if runner.on_entry:
            exited, entered = runner.crossed(row.state, decision.dest, edge.dest)
            asked = self._enter(cursor, runner, row, seq, edge.effects, exited, entered, data,
                                fence, now)
        elif edge.effects:
            self._ask_effects(cursor, row, seq, edge.effects, fence, now)
        result = FireResult(True, row.machine, row.key, _shown(trigger), row.state,
                            decision.dest, row.version + 1, None, decision.guards,
                            fence=fence, probed=probed, seq=seq, effects=asked)
        if within is not None:
            within.after(cursor, result)
        return result

    def _enter(self, cursor: Any, runner: Runner, row: _Row, seq: int,
               effects: tuple[EffectSpec, ...], exited: list[str], entered: list[str],
               data: Mapping[str, Any], fence: dict[str, Any] | None, now: dt.datetime) -> int:
        """What crossing state boundaries asks for: the transition's effects, then those of
        the states entered (outermost first); timers cancelled and set. How many effects."""
        effects = (*effects, *(e for state in entered for e in runner.entry_effects.get(
            state, ())))
        if effects:
            self._ask_effects(cursor, row, seq, effects, fence, now)
        if runner.timeouts:
            self._set_timers(cursor, runner, row, seq, exited, entered, data, now)
        return len(effects)

    def _ask_effects(self, cursor: Any, row: _Row, seq: int, effects: tuple[EffectSpec, ...],
                     fence: dict[str, Any] | None, now: dt.datetime) -> None:
        """The outbox: one row per effect, in the transition's own transaction."""
        store = self.store
        when = store.time_param(now)
        for position, effect in enumerate(effects):
            cursor.execute(store.sql.insert_effect, {
                "resource_id": row.id, "seq": seq, "position": position, "name": effect.name,
                "args": store.json_param(effect.args), "status": "pending", "attempts": 0,
                "next_attempt_at": when,
                "idempotency_key": f"{row.machine}:{row.key}:{seq}:{position}:{effect.name}",
                "fence": store.json_param(fence) if fence else None,
                "on_failure": effect.on_failure, "created_at": when,
            })

    def _set_timers(self, cursor: Any, runner: Runner, row: _Row, seq: int,
                    exited: Iterable[str], entered: Iterable[str], data: Mapping[str, Any],
                    now: dt.datetime) -> None:
        """Cancel the timers of the states left; schedule those of the states entered."""
        store = self.store
        when = store.time_param(now)
        for state in exited:
            if state in runner.timeouts:
                cursor.execute(store.sql.cancel_timers, {
                    "resource_id": row.id, "state_": state, "now": when})
        for state in entered:
            timeout = runner.timeouts.get(state)
            if timeout is None:
                continue
            after = timeout.after
            if isinstance(after, str):
                value = data.get(after)
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise InvalidData(row.machine, row.key, f"the timeout of {state!r} reads "
                                      f"data field {after!r}, which is {value!r}, not a "
                                      "number of seconds")
                after = float(value)
            cursor.execute(store.sql.insert_timer, {
                "resource_id": row.id, "seq": seq, "state": state, "trigger": timeout.trigger,
                "due_at": store.time_param(now + dt.timedelta(seconds=after)),
                "status": "pending", "created_at": when,
            })

    def _refuse_stale(self, cursor: Any, runner: Runner, row: _Row, trigger: str,
                      payload: dict[str, Any], actor: str | None, context: GuardContext,
                      decision: Decision, probe_error: str | None,
                      probed: bool) -> StaleObservation:
        """Journal the refusal of a risky edge (state and version unchanged)."""
        store = self.store
        edge, problem = context.stale[0]
        dest = runner.spec.graph.enter(edge.dest)
        observation_id = row.observation.id if row.observation else None
        cursor.execute(store.sql.refuse, {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": observation_id, "new_seq": row.seq + 1})
        if cursor.rowcount != 1:
            raise _Conflict
        cursor.execute(store.sql.insert_journal, {
            "resource_id": row.id, "seq": row.seq + 1, "kind": "refusal",
            "trigger": None if trigger == EVENTLESS else trigger, "source": row.state,
            "dest": dest, "version": row.version, "spec_version": runner.spec.version,
            "actor": actor, "at": store.time_param(context.now),
            "payload": store.json_param(payload) if payload else None,
            "guards": store.json_param(decision.guards) if decision.guards else None,
            "observation_id": observation_id, "fence": None,
        })
        assert edge.fresh is not None
        message = (
            f"StaleObservation: {row.machine} {row.key!r} edge {row.state}->{dest} "
            f"({_shown(trigger)}, {rule_text(edge.fresh)}) needs an observation newer than its "
            f"last transition at {clock_time(row.last_transition_at)} and at most "
            f"{edge.fresh.max_age:g} s old; {problem}"
        )
        if probe_error:
            message += f" ({probe_error})"
        elif edge.fresh.probe is None:
            message += " (no probe is named to ask for a fresh one)"
        return StaleObservation(
            message, machine=row.machine, key=row.key, trigger=_shown(trigger),
            source=row.state, dest=dest, probe_error=probe_error,
            result=FireResult(False, row.machine, row.key, _shown(trigger), row.state, None,
                              row.version, message, decision.guards, error="StaleObservation",
                              probed=probed))

    def _locate(self, cursor: Any, key: str) -> _Row:
        machine, plain = queries.split_key(key)
        store = self.store
        if machine is not None:
            cursor.execute(store.sql.resource_by_machine_key, {"machine": machine, "key": plain})
        else:
            cursor.execute(store.sql.resource_by_key, {"key": plain})
        rows = cursor.fetchall()
        if len(rows) != 1:
            from .errors import AmbiguousKey, UnknownResource

            if not rows:
                raise UnknownResource(plain, machine)
            raise AmbiguousKey(plain, [row[1] for row in rows])
        (rid, rmachine, rkey, state, version, seq, data, _spec_version, last_transition_at,
         oid, status, observed_at, recorded_at, source) = rows[0]
        observation = None
        if oid is not None:
            observation = Observation(oid, store.json_value(status),
                                      store.time_value(observed_at),
                                      store.time_value(recorded_at), source)
        return _Row(rid, rmachine, rkey, state, version, seq, store.json_value(data),
                    store.time_value(last_transition_at), observation)

    def _validated(self, spec: MachineSpec, key: str, data: dict[str, Any]) -> dict[str, Any]:
        if spec.data_model is None:
            return data
        try:
            return spec.data_model.model_validate(data).model_dump(mode="json")
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidData(spec.name, key, detail) from None

    # -- reading -----------------------------------------------------------------------

    def get(self, key: str) -> Resource:
        """The resource as it is now, with its newest observation."""
        with self.store.read() as db:
            return queries.get(db, key)

    def available_triggers(self, key: str) -> list[str]:
        """The triggers that have a transition from the resource's current state (guards,
        which may depend on the payload, are not evaluated)."""
        resource = self.get(key)
        return sorted(self._runner(resource.machine).triggers_from(resource.state))

    def history(self, key: str) -> list[JournalEntry]:
        """The resource's journal, oldest first, each row with the observation it rested on."""
        return queries.history(self.store, key)

    def observations(self, key: str) -> list[Observation]:
        """Every observation of the resource, in the order they were recorded."""
        return queries.observations_of(self.store, key)

    def resources(self, machine: str | None = None, state: str | None = None) -> list[Resource]:
        return queries.listing(self.store, machine, state)

    def counts(self, machine: str | None = None) -> dict[str, dict[str, int]]:
        """How many resources each machine has in each state."""
        return queries.counts(self.store, machine)

    def verify(self) -> list[Mismatch]:
        """Replay every resource's journal and compare it with the resource's row."""
        from .verify import verify

        return verify(self.store)


def _fence(edge: _Edge, observation: Observation | None) -> dict[str, Any]:
    assert observation is not None
    return {
        "observation_id": observation.id,
        "observed_at": observation.observed_at.isoformat(),
        "source": observation.source,
        "status": observation.status,
        "expect": dict(edge.fence) if edge.fence is not None else dict(observation.status),
    }


def _names(spec: MachineSpec, kind: str) -> set[str]:
    return {"guard": spec.guard_names, "effect": spec.effect_names,
            "probe": spec.probe_names}[kind]()


def _edge_names(edge: _Edge, kind: str) -> tuple[str, ...]:
    if kind == "guard":
        return (*edge.guards, *edge.unless)
    if kind == "effect":
        return tuple(effect.name for effect in edge.effects)
    return (edge.fresh.probe,) if edge.fresh and edge.fresh.probe else ()


def _located_edges(spec: MachineSpec) -> list[tuple[str, _Edge]]:
    return [*((f"transitions[{i}]", t) for i, t in enumerate(spec.transitions)),
            *((f"eventless[{i}]", e) for i, e in enumerate(spec.eventless))]


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or key != key.strip():
        raise LifecycleError(f"invalid key {key!r}: a key is a non-empty string without "
                             "surrounding spaces")
    if ":" in key:
        raise LifecycleError(f"invalid key {key!r}: ':' separates MACHINE:KEY, so a key "
                             "cannot contain it")
    if len(key) > _KEY_MAX:
        raise LifecycleError(f"invalid key {key[:40]!r}...: longer than {_KEY_MAX} characters")


def _shown(trigger: str) -> str:
    return "(step)" if trigger == EVENTLESS else trigger


def _refused(row: _Row, trigger: str, decision: Decision) -> FireResult:
    return FireResult(False, row.machine, row.key, _shown(trigger), row.state, None,
                      row.version, decision.reason, decision.guards)
