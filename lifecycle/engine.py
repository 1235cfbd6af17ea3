"""The Engine: create, fire, step, observe, update, history. One write is one transaction.

Every write goes the same way: read the resource (with its newest observation) on the held
connection, decide with the machine compiled once per spec, and write the new row with a
compare-and-swap on its version and sequence number, the journal row (and the effects and
timers asked for) in the same transaction. An attempt that cannot finish is rolled back and
made again by one retry loop: when the resource moved underneath, when its machine must be
loaded first, or when a risky edge needs a fresh observation, which a probe is asked for
outside any transaction.

The retry loop is sans-IO about probes: it is a generator that yields the :class:`ProbeCall`
it needs (a batch of resources, a :class:`ProbeBatch`) and is sent the answer.
:meth:`Engine.drive` answers by calling the probe (in a thread, with its timeout; a batch's
calls in up to ``at_once`` threads); :class:`lifecycle.aio.AsyncEngine` answers by awaiting
it on its event loop. Both run the one decision and transaction code below
(``Engine.firing``, ``Engine.stepping_many``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, cast

from pydantic import ValidationError

from . import queries, registry, values
from .clock import Clock, SystemClock
from .compiled import CompiledMachine, Decision, GuardContext
from .effects import PENDING, Effect, Handler, as_effect
from .errors import (
    AmbiguousKey,
    ConcurrencyError,
    InvalidData,
    LifecycleError,
    ProbeFailed,
    ResourceExists,
    SpecError,
    StaleObservation,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)
from .fresh import (
    Probe,
    ProbeBatch,
    ProbeCall,
    ProbeOutcome,
    ProbeRequest,
    call_probe,
    clock_time,
    rule_text,
)
from .graph import EVENTLESS, stored_triggers
from .logs import logger
from .records import FireResult, JournalEntry, Mismatch, Observation, Resource
from .spec import Edge, EffectSpec, MachineSpec, SpecSource, load_spec
from .store import Moved, Pending, Store, Transaction
from .transaction import Within
from .verify import verify

log = logger(__name__)

Guard = Callable[[GuardContext], bool]
OnStale = Literal["raise", "return"]
SpecFor = Callable[[str], MachineSpec | None]
"""Given a machine's name, the spec to register for it, or None to run the stored one."""

T = TypeVar("T")
Deciding = Generator[ProbeCall | ProbeBatch, Any, T]
Fire = tuple[str, str, Mapping[str, Any] | None, str | None, Within | None]
"""One fire of :meth:`Engine.fire_many`: key, trigger, payload, actor, ``within`` hooks."""
"""A write decided sans-IO: it yields the probe calls it needs (a :class:`ProbeCall`, sent
back its :data:`ProbeOutcome`; a :class:`ProbeBatch`, sent back the list of theirs), and
returns its result (see :meth:`Engine.drive`)."""

_KEY_MAX = 255
_NAME_MAX = 200  # the schema's Name columns (an observation's source)
_STALE_TIMER = "the timer is no longer pending"
_MAX_PROBES = 3
_LONGEST_TIMEOUT = 10 * 365 * 86400.0  # ten years, as spec.Seconds allows


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
    created_at: Any
    """As the database gave it (read by ``update`` alone; converting it costs every fire)."""
    observation: Observation | None


@dataclass(frozen=True, slots=True)
class _Again:
    """Why an attempt was rolled back and is made again: load ``machine`` first, ask
    ``probe`` first, or (neither) the resource moved underneath."""

    machine: str | None = None
    probe: tuple[str, ProbeRequest] | None = None


_MOVED = _Again()


@dataclass(slots=True)
class _Unsure:
    """An outcome whose write was sent on PostgreSQL and not yet answered: ``value`` once
    the answer says its compare-and-swap held, else ``moved`` (nothing was written)."""

    pending: Pending
    value: Any
    moved: Any = _MOVED

    def settled(self) -> Any:
        return self.value if self.pending.id() is not None else self.moved


@dataclass(frozen=True, slots=True)
class _Stale:
    """A refusal of a risky edge, journaled: raised as :class:`StaleObservation` or returned,
    as the caller asked."""

    result: FireResult
    dest: str
    probe_error: str | None


@dataclass(slots=True)
class _Tries:
    """What the retry loop learnt from the probes it asked."""

    probes: int = 0
    probed_version: int | None = None
    probe_error: str | None = None

    @property
    def may_probe(self) -> bool:
        return self.probe_error is None and self.probes < _MAX_PROBES


@dataclass(slots=True)
class _Entry:
    """What crossing into a state asks for, in the transition's transaction."""

    row: _Row
    seq: int
    data: Mapping[str, Any]
    fence: dict[str, Any] | None
    now: dt.datetime
    effects: tuple[EffectSpec, ...] = ()
    exited: list[str] = field(default_factory=list)
    entered: list[str] = field(default_factory=list)


class Engine:
    """Runs machine specs against a store.

    ``guards`` maps guard names to predicates over a :class:`GuardContext`; guards never do
    I/O. ``probes`` maps probe names to functions that ask the outside world for a resource's
    status (called outside any transaction, given up after ``probe_timeout`` seconds).
    ``effects`` maps effect names to handlers (or :class:`Effect` with a retry policy), which
    a :class:`~lifecycle.worker.Worker` runs after the transitions that asked for them
    committed; the engine keeps them as :attr:`handlers`. Time comes from ``clock``.

    A machine the engine was not given is loaded when first met: ``spec_for(name)`` may give
    the spec to register (an application's built-in machines, as its code declares them);
    otherwise the spec the database last registered under that name is run.

    A spec must name only guards, effects and probes the engine has. With ``strict=False``
    it may name effects and probes the engine lacks (guards it still needs, to decide): its
    resources are created, observed, updated and moved as usual, their effects wait in the
    outbox for a worker that has the handlers, and a risky edge whose probe is missing is
    refused as stale, saying which probe it lacked (how a command line without a site's
    adapters still records and inspects drones).
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
        spec_for: SpecFor | None = None,
        strict: bool = True,
    ) -> None:
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.guards: dict[str, Guard] = dict(guards or {})
        self.handlers: dict[str, Effect] = {name: as_effect(handler)
                                            for name, handler in (effects or {}).items()}
        self.probes: dict[str, Probe] = dict(probes or {})
        self.probe_timeout = probe_timeout
        self.max_attempts = max_attempts
        self.spec_for = spec_for
        self.strict = strict
        self._compiled: dict[str, CompiledMachine] = {}
        for spec in machines:
            self.register(spec)

    # -- machines ----------------------------------------------------------------------

    @property
    def machines(self) -> dict[str, MachineSpec]:
        return {name: compiled.spec for name, compiled in self._compiled.items()}

    def register(self, source: SpecSource) -> MachineSpec:
        """Validate a spec, store it if it is new, and make it the machine's current version.

        A changed spec is refused when live resources are in states it no longer has."""
        spec = load_spec(source)
        self.check_names(spec)
        registry.store_spec(self.store, spec, self.clock.now())
        self._compiled[spec.name] = CompiledMachine(spec, self.guards)
        return spec

    def check_names(self, spec: MachineSpec) -> None:
        """Refuse a spec that names a guard, an effect or a probe this engine lacks."""
        known: dict[str, Mapping[str, Any]] = {"guards": self.guards}
        if self.strict:
            known.update(effects=self.handlers, probes=self.probes)
        problems = spec.unregistered(**known)
        if problems:
            raise SpecError(spec.name, problems)

    def compiled(self, machine: str) -> CompiledMachine:
        """The machine, compiled; loaded (see ``spec_for``) when this engine has not met it."""
        compiled = self._compiled.get(machine)
        if compiled is not None:
            return compiled
        _argument(machine, "machine name")
        given = self.spec_for(machine) if self.spec_for is not None else None
        if given is not None:
            self.register(given)
        else:
            spec = registry.stored_spec(self.store, machine, list(self._compiled))
            self.check_names(spec)
            self._compiled[machine] = CompiledMachine(spec, self.guards)
        return self._compiled[machine]

    def machine_names(self) -> list[str]:
        """Every machine registered with this engine or stored in the database."""
        return sorted({*self._compiled, *registry.stored_names(self.store)})

    def spec(self, machine: str) -> MachineSpec:
        """The machine's spec, to read: the compiled one, else the one ``spec_for`` gives,
        else the database's current one. Reading it needs none of the machine's guards,
        effects or probes (compiling it does: :meth:`compiled`), and writes nothing."""
        compiled = self._compiled.get(machine)
        if compiled is not None:
            return compiled.spec
        _argument(machine, "machine name")
        given = self.spec_for(machine) if self.spec_for is not None else None
        if given is not None:
            return load_spec(given)
        return registry.stored_spec(self.store, machine, list(self._compiled))

    def missing_names(self, machine: str) -> dict[str, list[str]]:
        """The guards, effects and probes ``machine`` names that this engine has not loaded
        (empty lists: it can decide and run it all)."""
        spec = self.spec(machine)
        return {"guards": sorted(spec.guard_names() - set(self.guards)),
                "effects": sorted(spec.effect_names() - set(self.handlers)),
                "probes": sorted(spec.probe_names() - set(self.probes))}

    # -- the one retry loop --------------------------------------------------------------

    def drive(self, deciding: Deciding[T]) -> T:
        """Run a sans-IO decision to its end, answering each probe call it yields by calling
        the probe (:func:`~lifecycle.fresh.call_probe`: a thread, with ``probe_timeout``;
        a batch's calls ``at_once`` at a time)."""
        outcome: Any = None
        try:
            while True:
                asked = deciding.send(outcome)
                if isinstance(asked, ProbeCall):
                    outcome = self._ask(asked)
                elif len(asked.calls) > 1 and asked.at_once > 1:
                    with ThreadPoolExecutor(min(asked.at_once, len(asked.calls)),
                                            thread_name_prefix="lifecycle-probe") as pool:
                        outcome = list(pool.map(self._ask, asked.calls))
                else:
                    outcome = [self._ask(call) for call in asked.calls]
        except StopIteration as done:
            return cast(T, done.value)

    def _ask(self, call: ProbeCall) -> ProbeOutcome:
        try:
            return call_probe(call.name, self.probes[call.name], call.request,
                              self.probe_timeout)
        except ProbeFailed as failure:
            return failure

    def _retrying(self, key: str, what: str,
                  attempt: Callable[[Any, _Tries], T | _Again]) -> T:
        return self.drive(self._deciding(key, what, attempt))

    def _deciding(self, key: str, what: str,
                  attempt: Callable[[Any, _Tries], T | _Again]) -> Deciding[T]:
        """Run ``attempt`` in a write transaction until it finishes; roll back and go again
        when it says why it cannot (see :class:`_Again`), asking a probe (yielded: outside
        any transaction) when that is why."""
        tries = _Tries()
        for _ in range(self.max_attempts):
            try:
                with self.store.write() as tx:
                    outcome = attempt(tx, tries)
                    if isinstance(outcome, _Again):
                        tx.rollback()
            except Moved:  # a strict write's row moved: the transaction was rolled back
                outcome = _MOVED
            if type(outcome) is _Unsure:  # its answer is in: the transaction committed
                outcome = outcome.settled()
            if not isinstance(outcome, _Again):
                return outcome
            if outcome.machine is not None:
                self.compiled(outcome.machine)  # outside the transaction: it may register
            elif outcome.probe is not None:
                name, request = outcome.probe
                if not _asking(tries, request):
                    continue
                asked_at = self.clock.now()
                answer = yield ProbeCall(name, request)
                self._observed(tries, name, request, answer, asked_at)
            else:
                log.debug("%s: the resource moved during %s; deciding again", key, what)
        raise ConcurrencyError(
            f"{key}: {what} lost the race {self.max_attempts} times in a row; nothing was "
            "written. Try again, or look for a process that moves it in a loop")

    def _observed(self, tries: _Tries, name: str, request: ProbeRequest,
                  answer: ProbeOutcome, asked_at: dt.datetime) -> None:
        """Record the probe's answer as an observation; remember a failure."""
        if isinstance(answer, ProbeFailed):
            log.warning("%s:%s: %s", request.machine, request.key, answer)
            tries.probe_error = str(answer)
            return
        status, observed_at = answer
        try:
            self.observe(f"{request.machine}:{request.key}", status, observed_at or asked_at,
                         source=name)
        except InvalidData as exc:
            tries.probe_error = f"probe {name} answered a status that cannot be stored: {exc}"

    # -- creating and updating ---------------------------------------------------------

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
        _check_key(key)
        document = _document(machine, key, data, "data", actor)
        compiled = self.compiled(machine)
        spec = compiled.spec
        if state is None:
            dest, kind = spec.graph.enter(spec.initial), "create"
        elif state in spec.graph.parent:
            dest, kind = spec.graph.enter(state), "adopt"
        else:
            raise UnknownState(machine, state, spec.graph.names)
        document = self._validated(spec, key, document)
        now = self.clock.now()
        store = self.store
        at = store.time_param(now)
        try:
            effects: list[dict[str, Any]] = []
            timers: list[dict[str, Any]] = []
            if compiled.on_entry:
                row = _Row(0, machine, key, dest, 1, 1, document, now, now, None)
                effects, _, timers = self._entered(compiled, _Entry(
                    row, 1, document, None, now,
                    entered=list(reversed(spec.graph.ancestors(dest)))), at)
            with store.write() as tx:  # on PostgreSQL one round trip, with its COMMIT
                tx.write(store.sql.insert_resource, {
                    "machine": machine, "key": key, "spec_version": spec.version,
                    "state": dest, "version": 1, "seq": 1,
                    "data": store.json_param(document), "now": at,
                }, self._journal(1, kind, source=None, dest=dest, version=1,
                                 spec_version=spec.version, actor=actor, at=at,
                                 payload=document or None), effects, (), timers)
        except store.integrity_error:
            raise ResourceExists(machine, key) from None
        except (TypeError, ValueError) as exc:
            raise InvalidData(machine, key, f"data is not JSON: {exc}") from None
        return Resource(machine=machine, key=key, state=dest, version=1, seq=1, data=document,
                        spec_version=spec.version, created_at=now, updated_at=now)

    def update(self, key: str, data: Mapping[str, Any], *, actor: str | None = None) -> Resource:
        """Merge ``data`` into the resource's data: a new version and a journal row of kind
        ``update``, no change of state (so no risky edge's observation goes stale by it)."""
        changes = _document(values.split_key(_looked_up(key))[0], key, data, "data", actor)
        return cast(Resource, self._retrying(key, "update", lambda tx, _tries: self._update(
            tx, key, changes, actor)))

    def _update(self, tx: Transaction, key: str, changes: dict[str, Any],
                actor: str | None) -> Any:
        row = self._locate(tx, key)
        compiled = self._compiled.get(row.machine)
        if compiled is None:
            return _Again(machine=row.machine)
        spec = compiled.spec
        merged = self._validated(spec, row.key, {**row.data, **changes})
        now = self.clock.now()
        store = self.store
        at = store.time_param(now)
        try:
            written = tx.write(store.sql.change_data, {
                "id_": row.id, "version_": row.version, "seq_": row.seq,
                "new_data": store.json_param(merged), "new_version": row.version + 1,
                "new_seq": row.seq + 1, "now": at},
                self._journal(row.seq + 1, "update", source=row.state, dest=row.state,
                              version=row.version + 1, spec_version=spec.version, actor=actor,
                              at=at, payload=changes))
        except (TypeError, ValueError) as exc:
            raise InvalidData(row.machine, row.key, f"data is not JSON: {exc}") from None
        if written is None:
            return _MOVED
        resource = Resource(machine=row.machine, key=row.key, state=row.state,
                        version=row.version + 1, seq=row.seq + 1, data=merged,
                        spec_version=spec.version, created_at=store.time_value(row.created_at),
                        updated_at=now,
                        observation=row.observation)
        return _Unsure(written, resource) if type(written) is Pending else resource

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
        document, observed_at, recorded_at = self._checked_observation(
            key, status, observed_at, source)
        with self.store.write() as tx:
            row = self._locate(tx, key)
            recorded = self._record_observations(
                tx, [((row.id, row.machine, row.key), document, observed_at, recorded_at)],
                source)
        [observation] = recorded()
        if isinstance(observation, LifecycleError):
            raise observation
        return observation

    def _checked_observation(self, key: str, status: Mapping[str, Any],
                             observed_at: dt.datetime | None,
                             source: str) -> tuple[dict[str, Any], dt.datetime, dt.datetime]:
        """An observation as it is to be recorded (status, observed at, recorded at), or
        :class:`InvalidData`."""
        document = _document(values.split_key(_looked_up(key))[0], key, status, "status")
        problem = values.text_problem(source, _NAME_MAX)
        if problem is not None:
            raise InvalidData("?", key, f"source {problem}")
        recorded_at = self.clock.now()
        if observed_at is None:
            observed_at = recorded_at
        elif observed_at.tzinfo is None or not _in_range(observed_at):
            raise InvalidData("?", key, f"observed_at {observed_at} has no time zone"
                              if observed_at.tzinfo is None else
                              f"observed_at {observed_at} is not a time in UTC's years 1-9999")
        elif observed_at > recorded_at:
            log.warning("%s: observation from %s is ahead of the clock (%s); taken as now",
                        key, observed_at.isoformat(), recorded_at.isoformat())
            observed_at = recorded_at
        return document, observed_at, recorded_at

    def _record_observations(
            self, tx: Transaction,
            items: list[tuple[tuple[int, str, str], dict[str, Any], dt.datetime, dt.datetime]],
            source: str) -> Callable[[], list[Observation | LifecycleError]]:
        """Write observations (of a resource (id, machine, key): status, observed at,
        recorded at), each the newest of its resource if it is; all of them in a statement
        or two (:meth:`Transaction.observed`). A status that JSON cannot hold is refused
        alone, before anything is written. What gives the outcomes once the transaction
        committed (an observation's id may come with the commit)."""
        store = self.store
        out: list[Observation | LifecycleError] = []
        rows: list[dict[str, Any]] = []
        for (resource_id, machine, key), document, observed_at, recorded_at in items:
            try:
                status = store.json_param(document)
            except (TypeError, ValueError) as exc:
                out.append(InvalidData(machine, key, f"status is not JSON: {exc}"))
                continue
            out.append(Observation(id=0, status=document, observed_at=observed_at,
                                   recorded_at=recorded_at, source=source))
            rows.append({"resource_id": resource_id, "status": status,
                         "observed_at": store.time_param(observed_at),
                         "recorded_at": store.time_param(recorded_at)})
        ids = tx.observed(rows, source) if rows else list

        def outcomes() -> list[Observation | LifecycleError]:
            given = iter(ids())
            return [replace(o, id=next(given)) if isinstance(o, Observation) else o
                    for o in out]
        return outcomes

    # -- firing ------------------------------------------------------------------------

    def fire(
        self,
        key: str,
        trigger: str,
        payload: Mapping[str, Any] | None = None,
        *,
        actor: str | None = None,
        on_stale: OnStale = "raise",
        within: Within | None = None,
    ) -> FireResult:
        """Fire ``trigger`` on the resource ``key`` (``MACHINE:KEY`` or a plain key).

        Returns whether it fired, from and to which state, and the new version; when it did
        not fire, why (and nothing was written). A trigger the machine does not have at all
        raises :class:`UnknownTrigger`. A risky edge refused for want of a fresh observation
        is journaled, then raises :class:`StaleObservation` (or, with ``on_stale="return"``,
        comes back as a result whose ``error`` is ``"StaleObservation"``). ``within`` adds
        writes of the caller's own to the same transaction (see :class:`Within`)."""
        return self.drive(self.firing(key, trigger, payload, actor=actor, on_stale=on_stale,
                                      within=within))

    def firing(self, key: str, trigger: str, payload: Mapping[str, Any] | None = None, *,
               actor: str | None = None, on_stale: OnStale = "raise",
               within: Within | None = None) -> Deciding[FireResult]:
        """:meth:`fire`, sans-IO: its arguments are checked now; the generator decides and
        writes, yielding each probe call it needs (see :meth:`drive`)."""
        if trigger == EVENTLESS:  # not a trigger of any machine: eventless edges need step()
            machine = self.get(key).machine      # UnknownResource first, as for any trigger
            raise UnknownTrigger(machine, trigger, sorted(self.compiled(machine).triggers),
                                 hint="eventless edges are taken by step(), not fired")
        document = _document(values.split_key(_looked_up(key))[0], key, payload, "payload",
                             actor)
        return self._firing(key, trigger, document, actor, on_stale, within)

    def step(self, key: str, *, actor: str | None = None,
             on_stale: OnStale = "raise") -> FireResult:
        """Take the first eventless transition from the resource's state whose guards hold
        (in the order of :attr:`MachineSpec.transitions`: edges from the resource's own
        state before edges from its parent states)."""
        return self.drive(self.stepping(key, actor=actor, on_stale=on_stale))

    def stepping(self, key: str, *, actor: str | None = None,
                 on_stale: OnStale = "raise") -> Deciding[FireResult]:
        """:meth:`step`, sans-IO (see :meth:`firing`)."""
        _document(values.split_key(_looked_up(key))[0], key, None, "payload", actor)
        return self._firing(key, EVENTLESS, {}, actor, on_stale, None)

    def fire_timer(self, timer_id: int, key: str, trigger: str) -> FireResult | None:
        """Fire a due timer's trigger, in one transaction with marking the timer fired; None
        when the timer is no longer pending (its state was left, or another worker fired
        it)."""
        return self.drive(self.timer_firing(timer_id, key, trigger))

    def timer_firing(self, timer_id: int, key: str,
                     trigger: str) -> Deciding[FireResult | None]:
        """:meth:`fire_timer`, sans-IO (see :meth:`firing`)."""
        result = yield from self._firing(key, trigger, {}, "timer", "return",
                                         _TimerFired(self, timer_id))
        return None if result.reason == _STALE_TIMER else result

    def _firing(self, key: str, trigger: str, payload: dict[str, Any], actor: str | None,
                on_stale: OnStale, within: Within | None) -> Deciding[FireResult]:
        def attempt(tx: Transaction, tries: _Tries) -> Any:
            return self._attempt(tx, key, trigger, payload, actor, within, tries)

        # (mypy cannot solve T from ``T | _Again`` when T is itself a union: say it)
        outcome = cast(FireResult | _Stale,
                       (yield from self._deciding(key, _shown(trigger), attempt)))
        if isinstance(outcome, _Stale):
            if on_stale == "raise":
                raise StaleObservation(outcome.result, dest=outcome.dest,
                                       probe_error=outcome.probe_error)
            return outcome.result
        return outcome

    # -- many resources per transaction ------------------------------------------------

    def observe_many(self, statuses: Iterable[tuple[str, Mapping[str, Any]]],
                     observed_at: dt.datetime | None = None, *, source: str = "api",
                     batch: int = 500) -> list[Observation | LifecycleError]:
        """:meth:`observe` of many resources (``(key, status)`` pairs), up to ``batch`` of
        them in one transaction. The result of each, in order: its :class:`Observation`, or
        the :class:`LifecycleError` that refused it (an unknown key, a status that cannot be
        stored); a refusal writes nothing for that resource and loses none of the others."""
        items = list(statuses)
        checked: dict[int, tuple[dict[str, Any], dt.datetime, dt.datetime]] = {}
        refused: dict[int, LifecycleError] = {}
        for i, (key, status) in enumerate(items):
            try:
                checked[i] = self._checked_observation(key, status, observed_at, source)
            except LifecycleError as exc:
                refused[i] = exc

        if batch < 1:
            raise ValueError("batch: at least 1")
        results: dict[int, Observation | LifecycleError] = dict(refused)
        todo = [i for i in range(len(items)) if i not in refused]
        for start in range(0, len(todo), batch):
            chunk = todo[start:start + batch]
            with self.store.write() as tx:
                rows = self._rows(tx, [items[i][0] for i in chunk], whole=False)
                found = []
                for i in chunk:
                    row = rows[items[i][0]]
                    if isinstance(row, LifecycleError):
                        results[i] = row
                    else:
                        found.append(i)
                recorded = self._record_observations(
                    tx, [(rows[items[i][0]], *checked[i]) for i in found],
                    source)
            results.update(zip(found, recorded(), strict=True))
        return [results[i] for i in range(len(items))]

    def step_many(self, keys: Iterable[str], *, actor: str | None = None,
                  on_stale: OnStale = "return", batch: int = 500, probes: int = 8,
                  retry_conflicts: bool = True) -> list[FireResult | LifecycleError]:
        """:meth:`step` of many resources, up to ``batch`` in one transaction, each with its
        own compare-and-swap and journal row, as one ``step`` would write them. The result of
        each, in order: its :class:`FireResult`, or the :class:`LifecycleError` that refused
        it (with ``on_stale="raise"``, a :class:`StaleObservation` in its place).

        A resource that another writer moved between the batch's read and its write (a
        conflict) is decided again on what was written, in a later transaction, with the
        others that must go again; with ``retry_conflicts=False`` its result is a
        :class:`ConcurrencyError` instead, and nothing was written for it. A risky edge that
        needs a fresh observation has its probe asked outside any transaction, up to
        ``probes`` probes at once (threads), and its resource decided again."""
        return self.drive(self.stepping_many(keys, actor=actor, on_stale=on_stale,
                                             batch=batch, probes=probes,
                                             retry_conflicts=retry_conflicts))

    def stepping_many(self, keys: Iterable[str], *, actor: str | None = None,
                      on_stale: OnStale = "return", batch: int = 500, probes: int = 8,
                      retry_conflicts: bool = True
                      ) -> Deciding[list[FireResult | LifecycleError]]:
        """:meth:`step_many`, sans-IO (see :meth:`firing`): it yields a :class:`ProbeBatch`
        of the probe calls its risky edges need between its transactions, and an empty one
        after each transaction."""
        order = list(keys)
        refused: dict[int, LifecycleError] = {}
        for i, key in enumerate(order):
            try:
                _document(values.split_key(_looked_up(key))[0], key, None, "payload", actor)
            except LifecycleError as exc:
                refused[i] = exc

        def attempt(tx: Transaction, row: _Row, _i: int, tries: _Tries) -> Any:
            outcome = self._attempt(tx, row.key, EVENTLESS, {}, actor, None, tries, row)
            unsure = outcome if type(outcome) is _Unsure else None
            if unsure is not None:  # settled once the batch committed
                outcome = unsure.value
            moved = _MOVED if retry_conflicts else ConcurrencyError(
                f"{row.machine}:{row.key}: another writer moved it between the batch's read "
                "and its write; nothing was written for it")
            if outcome is _MOVED:
                return moved
            if isinstance(outcome, _Stale):
                outcome = (StaleObservation(outcome.result, dest=outcome.dest,
                                            probe_error=outcome.probe_error)
                           if on_stale == "raise" else outcome.result)
            return outcome if unsure is None else _Unsure(unsure.pending, outcome, moved)

        done = yield from self._many(order, "step", attempt, batch, skip=refused,
                                     probes=probes)
        return [refused[i] if i in refused else cast(FireResult | LifecycleError, done[i])
                for i in range(len(order))]

    def fire_many(self, fires: Iterable[Fire], *, on_stale: OnStale = "return",
                  batch: int = 500, probes: int = 8) -> list[FireResult | LifecycleError]:
        """:meth:`fire` of many triggers, each ``(key, trigger, payload, actor, within)``,
        up to ``batch`` in one transaction, each with its own compare-and-swap, journal row
        and ``within`` hooks, as one ``fire`` would write it. The result of each, in order:
        its :class:`FireResult`, or the :class:`LifecycleError` that refused it (raised by
        its ``within`` hook too: the transaction is rolled back and made again without it;
        with ``on_stale="raise"``, a :class:`StaleObservation` in its place). Conflicts and
        probes are handled as :meth:`step_many` handles them."""
        return self.drive(self.firing_many(fires, on_stale=on_stale, batch=batch,
                                           probes=probes))

    def firing_many(self, fires: Iterable[Fire], *, on_stale: OnStale = "return",
                    batch: int = 500, probes: int = 8
                    ) -> Deciding[list[FireResult | LifecycleError]]:
        """:meth:`fire_many`, sans-IO (see :meth:`stepping_many`)."""
        order = list(fires)
        refused: dict[int, LifecycleError] = {}
        payloads: dict[int, dict[str, Any]] = {}
        for i, (key, trigger, payload, actor, _within) in enumerate(order):
            try:
                if trigger == EVENTLESS:
                    raise LifecycleError(f"{key}: eventless edges are taken by step(), not "
                                         "fired")
                payloads[i] = _document(values.split_key(_looked_up(key))[0], key, payload,
                                        "payload", actor)
            except LifecycleError as exc:
                refused[i] = exc

        def attempt(tx: Transaction, row: _Row, i: int,
                    tries: _Tries) -> FireResult | LifecycleError | _Again:
            _key, trigger, _payload, actor, within = order[i]
            outcome = self._attempt(tx, row.key, trigger, payloads[i], actor, within, tries,
                                    row)
            if isinstance(outcome, _Stale):
                return (StaleObservation(outcome.result, dest=outcome.dest,
                                         probe_error=outcome.probe_error)
                        if on_stale == "raise" else outcome.result)
            return cast(FireResult | LifecycleError | _Again, outcome)

        done = yield from self._many([fire[0] for fire in order], "fire", attempt, batch,
                                     skip=refused, probes=probes)
        return [refused[i] if i in refused else cast(FireResult | LifecycleError, done[i])
                for i in range(len(order))]

    def _many(self, keys: list[str], what: str,
              attempt: Callable[[Any, _Row, int, _Tries], T | _Again], batch: int, *,
              skip: Mapping[int, Any] | None = None,
              probes: int = 1) -> Deciding[dict[int, T | LifecycleError]]:
        """The retry loop of many resources, sans-IO: ``attempt`` each (by index into
        ``keys``) in transactions of ``batch``, yielding an empty :class:`ProbeBatch` after
        each; those that must go again (see :class:`_Again`) go again together after the
        machines were loaded and the probes asked (one batch of calls)."""
        if batch < 1 or probes < 1:
            raise ValueError("batch and probes: at least 1")
        results: dict[int, T | LifecycleError] = {}
        tries: dict[int, _Tries] = {}
        pending = [i for i in range(len(keys)) if i not in (skip or {})]
        for _ in range(self.max_attempts):
            again: list[tuple[int, _Again]] = []
            for start in range(0, len(pending), batch):
                again += self._one_batch(keys, pending[start:start + batch], attempt, tries,
                                         results)
                yield ProbeBatch(())
            pending = [i for i, _ in again]
            if not pending:
                return results
            for machine in {a.machine for _, a in again if a.machine is not None}:
                self.compiled(machine)
            asked = [(tries[i], *a.probe) for i, a in again
                     if a.probe is not None and _asking(tries[i], a.probe[1])]
            if asked:
                asked_at = self.clock.now()
                answers = yield ProbeBatch(tuple(ProbeCall(name, request)
                                                 for _, name, request in asked), probes)
                for (tried, name, request), answer in zip(asked, answers, strict=True):
                    self._observed(tried, name, request, answer, asked_at)
        for i in pending:
            results[i] = ConcurrencyError(
                f"{keys[i]}: {what} lost the race {self.max_attempts} times in a row; "
                "nothing was written")
        return results

    def _one_batch(self, keys: list[str], chunk: list[int],
                   attempt: Callable[[Any, _Row, int, _Tries], T | _Again],
                   tries: dict[int, _Tries],
                   results: dict[int, T | LifecycleError]) -> list[tuple[int, _Again]]:
        """One transaction of a batch. A resource whose attempt raised is reported, the
        transaction rolled back, and the batch made again without it."""
        while True:
            done: dict[int, T | LifecycleError] = {}
            again: list[tuple[int, _Again]] = []
            failed: tuple[int, LifecycleError] | None = None
            with self.store.write() as tx:
                rows = self._rows(tx, [keys[i] for i in chunk])
                for i in chunk:
                    row = rows[keys[i]]
                    if isinstance(row, LifecycleError):
                        done[i] = row
                        continue
                    try:
                        outcome = attempt(tx, row, i, tries.setdefault(i, _Tries()))
                    except LifecycleError as exc:
                        failed = (i, exc)
                        tx.rollback()
                        break
                    if isinstance(outcome, _Again):
                        again.append((i, outcome))
                    else:
                        done[i] = outcome
            if failed is None:  # committed: each write's answer is in
                for i, answer in done.items():
                    settled: Any = answer.settled() if type(answer) is _Unsure else answer
                    if isinstance(settled, _Again):
                        again.append((i, settled))
                    else:
                        results[i] = settled
                return again
            results[failed[0]] = failed[1]
            chunk = [i for i in chunk if i != failed[0]]

    def _attempt(self, tx: Transaction, key: str, trigger: str, payload: dict[str, Any],
                 actor: str | None, within: Within | None, tries: _Tries,
                 row: _Row | None = None) -> Any:
        """Read (unless a batch read ``row`` in this transaction), decide and write one fire,
        in the transaction of ``tx``. With ``within``, the write is strict: a row that moved
        undoes the hook's writes with it."""
        if row is None:
            if type(within) is _TimerFired:
                within.ahead(tx)  # sent with the read: one round trip on PostgreSQL
            row = self._locate(tx, key)
        compiled = self._compiled.get(row.machine)
        if compiled is None:
            return _Again(machine=row.machine)
        if trigger != EVENTLESS and trigger not in compiled.triggers:
            raise UnknownTrigger(row.machine, trigger, sorted(compiled.triggers))
        withheld = within.before(tx, row.id) if within is not None else None
        if withheld is not None:
            return _not_fired(row, trigger, withheld)
        context = GuardContext(row.machine, row.key, row.state, row.version, row.data,
                               payload, self.clock.now(), row.observation,
                               row.last_transition_at)
        decision = compiled.decide(row.state, trigger, context)
        if context.stale and tries.may_probe:
            # a risky edge whose guards held was stopped by its freshness rule alone: ask
            # for a fresh observation and decide again (nothing is written)
            for blocked, _ in context.stale:
                if blocked.fresh is not None and blocked.fresh.probe in self.probes:
                    return _Again(probe=(blocked.fresh.probe, ProbeRequest(
                        row.machine, row.key, row.state, row.version, row.data,
                        row.observation)))
        outcome: Any
        strict = within is not None
        if decision.fired:
            outcome = self._transition(tx, compiled, row, trigger, payload, actor,
                                       decision, context.now, probed=tries.probes > 0,
                                       strict=strict)
        elif context.stale:
            outcome = self._refuse_stale(tx, compiled, row, trigger, payload, actor,
                                         context, decision, tries, strict=strict)
        else:  # refused by its guards, perhaps on the answer a probe just gave
            outcome = _not_fired(row, trigger, decision.reason, decision.guards,
                                 probed=tries.probes > 0)
        if within is not None and not isinstance(outcome, _Again):
            # a strict write: if its row moved, the hook's writes are undone with it
            done = outcome.value if type(outcome) is _Unsure else outcome
            within.after(tx, done.result if isinstance(done, _Stale) else done)
        return outcome

    def _transition(self, tx: Transaction, compiled: CompiledMachine, row: _Row, trigger: str,
                    payload: dict[str, Any], actor: str | None, decision: Decision,
                    now: dt.datetime, *, probed: bool, strict: bool = False) -> Any:
        """Write the transition decided: the compare-and-swap, its journal row, what its
        effects and the states it enters ask for (:meth:`Transaction.write`). The
        :class:`FireResult`, ``_MOVED``, or on PostgreSQL an ``_Unsure`` of them."""
        store = self.store
        edge, dest = decision.edge, decision.dest
        assert edge is not None and dest is not None
        risky = edge.fresh is not None
        seq = row.seq + 1
        at = store.time_param(now)
        params: dict[str, Any] = {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": row.observation.id if row.observation else None,
            "new_state": dest, "new_version": row.version + 1, "new_seq": seq,
            "new_spec_version": compiled.spec.version, "now": at,
        }
        # a data model that follows transitions computes the data each one leaves (startd)
        moves = getattr(compiled.spec.data_model, "follows_transitions", False) is True
        with_data = (bool(payload) and edge.merge_payload) or moves
        data = row.data
        fence = fence_for(edge, row.observation) if risky else None
        try:
            if with_data:
                merged = {**row.data, **payload} if edge.merge_payload else row.data
                data = self._validated(compiled.spec, row.key, merged, {
                    "trigger": trigger, "source": row.state, "dest": dest,
                    "payload": payload, "now": now, "seq": seq} if moves else None)
                params["new_data"] = store.json_param(data)
            journaled = self._journal(
                seq, "transition", trigger=trigger, source=row.state, dest=dest,
                version=row.version + 1, spec_version=compiled.spec.version, actor=actor, at=at,
                payload=payload or None, guards=decision.guards or None,
                # guards decided on the newest observation: the row keeps it
                observation_id=params["observation_id_"] if risky or decision.guards else None,
                fence=fence)
        except InvalidData:  # the data model refused it, and said why
            raise
        except (TypeError, ValueError) as exc:  # a payload that JSON cannot hold
            raise InvalidData(row.machine, row.key, f"payload is not JSON: {exc}") from None
        effects: list[dict[str, Any]] = []
        exited: list[str] = []
        timers: list[dict[str, Any]] = []
        if compiled.on_entry or edge.effects:
            entry = _Entry(row, seq, data, fence, now, edge.effects)
            if compiled.on_entry:
                entry.exited, entry.entered = compiled.crossed(row.state, dest, edge.dest)
            effects, exited, timers = self._entered(compiled, entry, at)
        written = tx.write(store.sql.move[with_data, risky], params, journaled, effects, exited,
                           timers, at, strict=strict)
        if written is None:
            return _MOVED
        result = FireResult(fired=True, machine=row.machine, key=row.key,
                            trigger=_shown(trigger), source=row.state, dest=dest,
                            version=row.version + 1, guards=decision.guards, fence=fence,
                            probed=probed, seq=seq, effects=len(effects))
        return _Unsure(written, result) if type(written) is Pending else result

    def _refuse_stale(self, tx: Transaction, compiled: CompiledMachine, row: _Row, trigger: str,
                      payload: dict[str, Any], actor: str | None, context: GuardContext,
                      decision: Decision, tries: _Tries, *, strict: bool = False) -> Any:
        """Journal the refusal of a risky edge (state and version unchanged): a ``_Stale``,
        ``_MOVED``, or on PostgreSQL an ``_Unsure`` of them."""
        store = self.store
        edge, problem = context.stale[0]
        assert edge.fresh is not None
        dest = compiled.spec.graph.enter(edge.dest)
        observation_id = row.observation.id if row.observation else None
        written = tx.write(store.sql.refuse, {
            "id_": row.id, "version_": row.version, "seq_": row.seq,
            "observation_id_": observation_id, "new_seq": row.seq + 1},
            self._journal(row.seq + 1, "refusal", trigger=trigger, source=row.state, dest=dest,
                          version=row.version, spec_version=compiled.spec.version, actor=actor,
                          at=store.time_param(context.now), payload=payload or None,
                          guards=decision.guards or None, observation_id=observation_id),
            strict=strict)
        if written is None:
            return _MOVED
        message = (
            f"{row.machine} {row.key!r} edge {row.state}->{dest} ({_shown(trigger)}, "
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
        result = _not_fired(row, trigger, message, decision.guards, error="StaleObservation",
                            probed=tries.probes > 0)
        stale = _Stale(result, dest, tries.probe_error)
        return _Unsure(written, stale) if type(written) is Pending else stale

    # -- what a write asks for besides the row ---------------------------------------------

    def _journal(self, seq: int, kind: str, *, source: str | None, dest: str, version: int,
                 spec_version: str, actor: str | None, at: Any, trigger: str | None = None,
                 payload: Mapping[str, Any] | None = None,
                 guards: Mapping[str, bool] | None = None, observation_id: int | None = None,
                 fence: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The journal row of a write (without its resource's id, which the write fills
        in): the one place it is made. ``at`` is the write's time as a statement parameter
        (``Store.time_param``), converted once per write."""
        json = self.store.json_param
        return {
            "seq": seq, "kind": kind,
            "trigger": None if trigger in (None, EVENTLESS) else trigger,
            "source": source, "dest": dest, "version": version, "spec_version": spec_version,
            "actor": actor, "at": at,
            "payload": json(payload) if payload else None,
            "guards": json(guards) if guards else None,
            "observation_id": observation_id,
            "fence": json(fence) if fence else None,
        }

    def _entered(self, compiled: CompiledMachine, entry: _Entry,
                 when: Any) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
        """What crossing state boundaries asks for: the rows of the transition's effects,
        then those of the states entered (outermost first); the states exited whose timers
        are cancelled; the rows of the timers set. ``when`` is ``entry.now`` as a
        parameter."""
        effects = (*entry.effects, *(effect for state in entry.entered
                                     for effect in compiled.entry_effects.get(state, ())))
        store = self.store
        row = entry.row
        fence = store.json_param(entry.fence) if entry.fence else None
        rows = [{  # the outbox: one row per effect (its head set by the write)
            "seq": entry.seq, "position": position, "name": effect.name,
            "args": store.json_param(effect.args), "status": PENDING, "attempts": 0,
            "next_attempt_at": when,
            "idempotency_key": f"{row.machine}:{row.key}:{entry.seq}:{position}:{effect.name}",
            "fence": fence, "on_failure": effect.on_failure, "created_at": when, "head": None,
        } for position, effect in enumerate(effects)]
        if not compiled.timeouts:
            return rows, [], []
        return (rows, [state for state in entry.exited if state in compiled.timeouts],
                self._timers(compiled, entry, when))

    def _timers(self, compiled: CompiledMachine, entry: _Entry,
                when: Any) -> list[dict[str, Any]]:
        """The timers of the states entered, as rows."""
        store = self.store
        row, timers = entry.row, []
        for state in entry.entered:
            timeout = compiled.timeouts.get(state)
            if timeout is None:
                continue
            after = timeout.after
            if isinstance(after, str):
                value = entry.data.get(after)
                if isinstance(value, bool) or not isinstance(value, int | float) or not (
                        0 <= value <= _LONGEST_TIMEOUT):
                    raise InvalidData(row.machine, row.key, f"the timeout of {state!r} reads "
                                      f"data field {after!r}, which is {value!r}, not a "
                                      f"number of seconds from 0 to {_LONGEST_TIMEOUT:g}")
                after = float(value)
            timers.append({
                "seq": entry.seq, "state": state, "trigger": timeout.trigger,
                "due_at": store.time_param(entry.now + dt.timedelta(seconds=after)),
                "status": PENDING, "created_at": when,
            })
        return timers

    # -- reading inside a write --------------------------------------------------------

    def _locate(self, tx: Transaction, key: str) -> _Row:
        machine, plain = values.split_key(key)
        store = self.store
        if machine is not None:
            tx.execute(store.sql.resource_by_machine_key, {"machine": machine, "key": plain})
        else:
            tx.execute(store.sql.resource_by_key, {"key": plain})
        rows = tx.fetchall()
        if not rows:
            raise UnknownResource(plain, machine)
        if len(rows) > 1:
            raise AmbiguousKey(plain, [row[1] for row in rows])
        return self._row(rows[0])

    def _row(self, fetched: Any) -> _Row:
        """A row of ``Statements.resource_by_key`` (and its kin) as the hot path uses it."""
        (rid, rmachine, rkey, state, version, seq, data, _spec_version, last_transition_at,
         created_at, oid, status, observed_at, recorded_at, source) = fetched
        store = self.store
        observation = None
        if oid is not None:
            observation = Observation(oid, store.json_value(status),
                                      store.time_value(observed_at),
                                      store.time_value(recorded_at), source)
        return _Row(rid, rmachine, rkey, state, version, seq, store.json_value(data),
                    store.time_value(last_transition_at), created_at, observation)

    def _rows(self, tx: Transaction, keys: list[str], *,
              whole: bool = True) -> dict[str, Any]:
        """The resources of ``keys`` read in the transaction of ``tx`` (``_Row``s; with
        ``whole=False`` only ``(id, machine, key)``), or why not (a ``LifecycleError``): one
        statement per machine named (``MACHINE:KEY``), one per plain key."""
        found: dict[str, Any] = {}
        by_machine: dict[str, dict[str, str]] = {}
        for key in dict.fromkeys(keys):
            machine, plain = values.split_key(key)
            if machine is not None:
                by_machine.setdefault(machine, {})[plain] = key
                continue
            try:
                row = self._locate(tx, key)
                found[key] = row if whole else (row.id, row.machine, row.key)
            except LifecycleError as exc:
                found[key] = exc
        sql = self.store.sql
        statement = (sql.resources_by_machine_keys if whole
                     else sql.resource_ids_by_machine_keys)
        for machine, named in by_machine.items():
            tx.execute(statement, {"machine": machine, "keys": sql.keys_param(list(named))})
            for fetched in tx.fetchall():
                found[named[fetched[2]]] = self._row(fetched) if whole else tuple(fetched[:3])
            for plain, key in named.items():
                found.setdefault(key, UnknownResource(plain, machine))
        return found

    def _validated(self, spec: MachineSpec, key: str, data: dict[str, Any],
                   transition: dict[str, Any] | None = None) -> dict[str, Any]:
        return validated_data(spec, key, data, transition)

    # -- reading -----------------------------------------------------------------------

    def get(self, key: str) -> Resource:
        """The resource as it is now, with its newest observation (one statement on the
        thread's held connection, as a fire reads it; the key is checked there)."""
        return queries.get(self.store, key)

    def available_triggers(self, key: str) -> list[str]:
        """The triggers that have a transition from the resource's current state (guards,
        which may depend on the payload, are not evaluated)."""
        resource = self.get(key)
        compiled = self._compiled.get(resource.machine)
        if compiled is not None:
            return sorted(compiled.triggers_from(resource.state))
        # from the spec alone: its guards need not be loaded to say which edges leave a state
        return stored_triggers(self.spec(resource.machine).to_json(), resource.state)

    def history(self, key: str) -> list[JournalEntry]:
        """The resource's journal, oldest first, each row with the observation it rested on."""
        return queries.history(self.store, _looked_up(key))

    def observations(self, key: str) -> list[Observation]:
        """Every observation of the resource, in the order they were recorded."""
        return queries.observations_of(self.store, _looked_up(key))

    def resources(self, machine: str | None = None, state: str | None = None, *,
                  limit: int | None = None, after: str | None = None) -> list[Resource]:
        """Resources in (machine, key) order; ``state`` may be a composite state, which
        takes in every state inside it. ``limit`` makes it one page (of at most that many;
        without it, every resource), ``after`` starts it past a position, ``MACHINE:KEY``
        (or a plain key of ``machine``): the last resource of the page before. The position
        need not exist any more; a page costs the same wherever it starts."""
        if limit is None:
            return list(self.iter_resources(machine, state, after=after))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise LifecycleError(f"invalid limit {limit!r}: a whole number, 0 or more")
        _argument(machine, "machine name")
        _argument(state, "state")
        start = queries.position(after, machine) if after is not None else None
        return queries.page(self.store, machine, state, limit, start) if limit else []

    def iter_resources(self, machine: str | None = None, state: str | None = None, *,
                       after: str | None = None, page: int = 1000) -> Iterator[Resource]:
        """Every resource (of ``machine``, in ``state``, past ``after``) in (machine, key)
        order, read ``page`` at a time: memory stays flat, and no transaction is held
        between pages (a resource created or moved meanwhile shows or not by its key)."""
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise LifecycleError(f"invalid page {page!r}: a whole number, 1 or more")
        while True:
            found = self.resources(machine, state, limit=page, after=after)
            yield from found
            if len(found) < page:
                return
            after = f"{found[-1].machine}:{found[-1].key}"

    def counts(self, machine: str | None = None) -> dict[str, dict[str, int]]:
        """How many resources each machine has in each state (kept by the database as
        resources are written: no scan of the resources)."""
        _argument(machine, "machine name")
        return queries.counts(self.store, machine)

    def verify(self) -> list[Mismatch]:
        """Replay every resource's journal and compare it with the resource's row (streamed:
        memory does not grow with the journal)."""
        return verify(self.store)


class _TimerFired(Within):
    """Marks a timer fired in the transaction of the trigger it fires; withholds the fire
    when the timer is no longer pending."""

    def __init__(self, engine: Engine, timer_id: int) -> None:
        self.engine, self.timer_id = engine, timer_id
        self.marked: Any = None

    def ahead(self, tx: Transaction) -> None:
        """Mark the timer fired, before the resource is read (so that on PostgreSQL the
        two go in one round trip); :meth:`before` reads whether it was still pending."""
        store = self.engine.store
        self.marked = tx.changes(store.sql.fire_timer, {
            "id_": self.timer_id, "now": store.time_param(self.engine.clock.now())})

    def before(self, tx: Transaction, resource_id: int) -> str | None:
        marked, self.marked = self.marked, None
        return None if marked() == 1 else _STALE_TIMER

    def after(self, tx: Transaction, result: FireResult) -> None:
        if not result.fired:
            tx.execute(self.engine.store.sql.refuse_timer, {
                "id_": self.timer_id, "outcome": result.reason})


def _asking(tries: _Tries, request: ProbeRequest) -> bool:
    """Whether to ask the probe for ``request``: not when its last answer did not make the
    resource fresh and nothing moved since (then the edge is refused)."""
    if request.version == tries.probed_version:
        tries.probe_error = "the probe's answer was not fresh either"
        return False
    tries.probes += 1
    tries.probed_version = request.version
    return True


def validated_data(spec: MachineSpec, key: str, data: dict[str, Any],
                   transition: dict[str, Any] | None = None) -> dict[str, Any]:
    """The data as the spec's model makes it. The key is in the validation context (a model
    may check the data against it: job_exit's id); so is, for a model whose class says
    ``follows_transitions = True``, the ``transition`` being written (trigger, source, dest,
    payload, now, seq), from which it computes the data that follows."""
    if spec.data_model is None:
        return data
    try:
        return spec.data_model.model_validate(data, context={
            "key": key, "transition": transition}).model_dump(mode="json")
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'data'}: {e['msg']}"
            for e in exc.errors()
        )
        raise InvalidData(spec.name, key, detail) from None


def fence_for(edge: Edge, observation: Observation | None) -> dict[str, Any]:
    """The fence a risky edge's transition records: the observation it rested on and
    what its effects may expect of the world (the edge's ``fence``, else the status)."""
    assert observation is not None
    return {
        "observation_id": observation.id,
        "observed_at": observation.observed_at.isoformat(),
        "source": observation.source,
        "status": observation.status,
        "expect": dict(edge.fence) if edge.fence is not None else dict(observation.status),
    }


def _argument(value: str | None, what: str) -> None:
    """A name to look up (a machine's, a state's) is text a database can be asked about."""
    if value is not None and (problem := values.text_problem(value, 4 * _KEY_MAX)):
        raise LifecycleError(f"invalid {what} {value!r}: it {problem}")


def _looked_up(key: str) -> str:
    """``key`` (or ``MACHINE:KEY``), if it is text a database can be asked about."""
    problem = values.text_problem(key, 2 * _KEY_MAX)
    if problem is not None:
        raise LifecycleError(f"invalid key {key!r}: it {problem}")
    return key


def _document(machine: str | None, key: str, document: Any, what: str,
              actor: str | None = None) -> dict[str, Any]:
    """``document`` (data, a payload, a status) as a dict, if it is a JSON object that both
    databases keep as it is (see :mod:`lifecycle.values`); ``actor`` checked too."""
    if actor is not None and (problem := values.text_problem(actor, _KEY_MAX)) is not None:
        raise InvalidData(machine or "?", key, f"actor {problem}")
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise InvalidData(machine or "?", key,
                          f"{what} must be a JSON object, not {type(document).__name__}")
    try:
        values.check(document, what)
    except values.ValueProblem as exc:
        raise InvalidData(machine or "?", key, str(exc)) from None
    return dict(document)


def _in_range(moment: dt.datetime) -> bool:
    try:
        moment.astimezone(dt.UTC)
    except OverflowError:
        return False
    return True


def _check_key(key: str) -> None:
    _looked_up(key)
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


def _not_fired(row: _Row, trigger: str, reason: str | None,
               guards: Mapping[str, bool] | None = None, *, error: str | None = None,
               probed: bool = False) -> FireResult:
    return FireResult(fired=False, machine=row.machine, key=row.key, trigger=_shown(trigger),
                      source=row.state, dest=None, version=row.version, reason=reason,
                      guards=dict(guards or {}), error=error, probed=probed)


__all__ = ["Deciding", "Engine", "Fire", "Guard", "OnStale", "SpecFor", "fence_for",
           "validated_data"]
