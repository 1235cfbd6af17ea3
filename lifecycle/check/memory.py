"""The engine and the worker on an in-memory :class:`~lifecycle.check.state.State`.

Deciding is the machine's own: :class:`~lifecycle.compiled.CompiledMachine` (the guards,
the freshness rules as their last condition, the order of edges), its ``crossed`` states,
entry effects and timeouts; the data as the spec's model validates it
(:func:`~lifecycle.engine.validated_data`), the fence a risky edge records
(:func:`~lifecycle.engine.fence_for`), the effect handlers and probes the machine runs with
in a scenario (``Builtin.simulation``, against the :class:`~lifecycle.scenario.World` the
state holds), called with :class:`~lifecycle.effects.EffectCall` as the worker calls them.
What is here is the bookkeeping the engine and the worker do around those decisions in the
database (which observation is newest, the outbox's queue per resource, retries, timers),
without the database: a state is a value, so a branch costs a copy of a tuple, not of a
database. Each written counterexample is replayed by ``lifecycle replay`` on the real engine
and worker, which is where the two are checked against each other.
"""

from __future__ import annotations

import datetime as dt
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..clock import SimulatedClock
from ..compiled import CompiledMachine, Decision, GuardContext
from ..effects import Effect, EffectCall, FollowUp, as_effect
from ..engine import fence_for, validated_data
from ..errors import InvalidInput, LifecycleError, PermanentError, ProbeFailed
from ..freshness import ProbeRequest, checked_answer, run_to_end
from ..graph import EVENTLESS
from ..results import Observation
from ..scenario import Playable, World, begun, finished
from ..spec import EffectSpec
from .moves import (
    Advance,
    Begin,
    Crash,
    Create,
    Finish,
    Fire,
    FireTimers,
    Move,
    Note,
    Observe,
    Retry,
    RunEffect,
    SetWorld,
    Step,
    Update,
)
from .state import Frozen, Pending, Res, Seen, State, Timer, freeze, thaw

Actions = list[tuple[str, str, dict[str, Any]]]
"""What effect handlers asked the world to do during a move, as the scenario's world records
it: (action, key, details)."""


COMMITTED = "committed"
"""The action the checker records when a handler's database writes commit with its effect's
outcome (``FollowUp.writes``); a scenario's world never records it."""


class _Moment(SimulatedClock):
    """The world's clock, set to each state's time before a move (a state explored later
    may be earlier than the last one)."""

    __slots__ = ("at",)

    def __init__(self, start: dt.datetime) -> None:
        super().__init__(start)
        self.at: dt.datetime = start

    def now(self) -> dt.datetime:
        return self.at


class _StateWorld(World):
    """The world of the state a move starts from: its status is thawed from the state's
    frozen one only when something reads it (a handler, a probe, a guard, a world's move),
    and frozen again only when it was read: most moves read none, and a handler's call
    remembered sets the world it left without thawing it."""

    _frozen: Frozen | None
    _status: dict[str, dict[str, Any]]

    @property
    def status(self) -> dict[str, dict[str, Any]]:
        if self._frozen is not None:
            self._status, self._frozen = thaw(self._frozen), None
        return self._status

    @status.setter
    def status(self, value: dict[str, dict[str, Any]]) -> None:
        self._status, self._frozen = value, None

    def load(self, frozen: Frozen) -> None:
        """Make ``frozen`` the status (thawed when first read)."""
        self._frozen = frozen

    def put(self, key: str, status: dict[str, Any]) -> None:
        """Set ``key``'s status, in the frozen status when nothing thawed it."""
        if self._frozen is None:
            self._status[key] = status
        else:  # as freeze() orders it: by key
            self._frozen = Frozen(sorted({**dict(self._frozen), key: freeze(status)}.items()))

    def frozen(self) -> Frozen:
        """The status frozen (as loaded, when nothing read it since)."""
        return self._frozen if self._frozen is not None else freeze(self._status)


@dataclass(frozen=True, slots=True)
class Fired:
    """What a fire or a step came to (as ``replay`` shows it)."""

    fired: bool
    dest: str | None = None
    reason: str | None = None
    probed: bool = False


class CheckError(InvalidInput):
    """The machine does something the checker cannot run in memory, or its model names what
    the machine does not have."""


_Do = Callable[..., tuple[State, Fired | None]]
"""What a kind of move does: a method of :class:`Memory` given the state and the move."""


class Memory:
    """A machine's engine and worker over in-memory states."""

    def __init__(self, machine: Playable, start: dt.datetime) -> None:
        self.start = start
        self.clock = _Moment(start)
        self._times: dict[float, dt.datetime] = {}
        self.world = _StateWorld(clock=self.clock)
        simulation = machine.simulation
        guards, effects, probes = (simulation(self.world) if simulation is not None
                                   else (machine.guards, {}, {}))
        self.spec = machine.spec
        self.compiled = CompiledMachine(machine.spec, guards)
        self.handlers: dict[str, Effect] = {n: as_effect(h) for n, h in effects.items()}
        self.probes = dict(probes)
        self._follows = getattr(self.spec.data_model, "follows_transitions", False) is True
        self._frozen_args: dict[int, tuple[EffectSpec, Frozen]] = {}
        self._calls = _calls_of(machine, start)
        """What each handler call did (see :meth:`_call`): kept with ``machine``, so that
        checking it again (other bounds, other moves of its world) reuses the calls."""

    def time(self, seconds: float) -> dt.datetime:
        found = self._times.get(seconds)
        if found is None:  # a few distinct times, asked for at every move
            found = self._times[seconds] = self.start + dt.timedelta(seconds=seconds)
        return found

    # -- moves -------------------------------------------------------------------------

    def apply(self, state: State, move: Move) -> tuple[State, Actions, Fired | None]:
        """The state after ``move``, what handlers did in the world, and what a fire or a
        step came to."""
        kind = type(move)
        found = self._KINDS.get(kind)
        if found is None:  # a kind of move not seen yet: by the first class it is of
            found = self._kind(kind)
            if found is None:
                raise CheckError(f"unknown move {move!r}")
        do, reads, writes = found
        self._enter(state, reads)
        state, fired = do(self, state, move)
        if writes:  # the world's
            state = state.but(world=self.world.frozen())
        return state, list(self.world.actions), fired

    def _advance(self, state: State, move: Advance) -> tuple[State, Fired | None]:
        return state.but(now=state.now + move.seconds), None

    def _note(self, state: State, move: Note) -> tuple[State, Fired | None]:
        extra = {**thaw(state.extra), **{k: v for k, v in move.values}}
        return state.but(extra=freeze(extra)), None

    def _set_world(self, state: State, move: SetWorld) -> tuple[State, Fired | None]:
        self.world.put(move.key, dict(move.status))
        return state, None

    def _created(self, state: State, move: Create) -> tuple[State, Fired | None]:
        return self._create(state, move), None

    def _observe(self, state: State, move: Observe) -> tuple[State, Fired | None]:
        at = state.now if move.at is None else min(move.at, state.now)
        _, resource = state.find(move.key)
        return state.put(_observed(resource, freeze(move.status), at, move.source)), None

    def _updated(self, state: State, move: Update) -> tuple[State, Fired | None]:
        return self._update(state, move), None

    def _fire(self, state: State, move: Fire) -> tuple[State, Fired | None]:
        return self.fire(state, move.key, move.trigger, dict(move.payload))

    def _step(self, state: State, move: Step) -> tuple[State, Fired | None]:
        return self.fire(state, move.key, EVENTLESS, {})

    def _run(self, state: State, move: RunEffect) -> tuple[State, Fired | None]:
        return self.run_effect(state, move.key), None

    def _begin(self, state: State, move: Begin) -> tuple[State, Fired | None]:
        return self.begin(state, move.key), None

    def _finish(self, state: State, move: Finish) -> tuple[State, Fired | None]:
        return self.finish(state, move.key), None

    def _timers(self, state: State, move: FireTimers) -> tuple[State, Fired | None]:
        return self.fire_timers(state, move.key), None

    def _retry(self, state: State, move: Retry) -> tuple[State, Fired | None]:
        _, resource = state.find(move.key)
        return state.put(resource.with_effects(tuple(
            replace(e, failed=False, attempts=0, due=state.now) if e.failed else e
            for e in resource.effects))), None

    def _crash(self, state: State, move: Crash) -> tuple[State, Fired | None]:
        _, resource = state.find(move.key)
        head = resource.head()
        assert head is not None
        self._call(resource, head, state.now, state.world)  # its outcome dies with it
        return state, None

    def _enter(self, state: State, world: bool = True) -> None:
        """Set the world the handlers and probes see to the state's (``world``: a move that
        calls no handler nor probe needs none)."""
        if world:
            self.world.load(state.world)
        self.world.actions = []
        self.clock.at = self.time(state.now)

    def _create(self, state: State, move: Create) -> State:
        spec = self.spec
        dest = spec.graph.enter(move.state if move.state is not None else spec.initial)
        data = validated_data(spec, move.key, dict(move.data))
        resource = Res(move.key, dest, 1, freeze(data), state.now)
        entered = list(reversed(spec.graph.ancestors(dest)))
        # (the creation's journal row carries the data as its payload, as its effects see it)
        resource = self._entered(resource, (), entered, [], None, 1, None, freeze(data),
                                 state.now)
        return state.put(resource)

    def _update(self, state: State, move: Update) -> State:
        _, resource = state.find(move.key)
        merged = validated_data(self.spec, move.key, {**thaw(resource.data), **move.data})
        return state.put(replace(resource, data=freeze(merged), version=resource.version + 1))

    # -- deciding, as Engine._attempt does -----------------------------------------------

    def fire(self, state: State, key: str, trigger: str,
             payload: dict[str, Any]) -> tuple[State, Fired]:
        """Decide ``trigger`` (or a step) on ``key`` and write what it decides; a risky edge
        held back by its freshness rule alone asks its probe once, and is decided again on
        the answer (refused when the probe failed or its answer is not fresh either)."""
        _, resource = state.find(key)
        if trigger != EVENTLESS and trigger not in self.compiled.triggers:
            raise CheckError(f"machine {self.spec.name} has no trigger {trigger!r}")
        decision, context = self._decide(resource, trigger, payload, state.now)
        probed = False
        if context.stale:
            rule = next((edge.fresh for edge, _ in context.stale
                         if edge.fresh is not None and edge.fresh.probe in self.probes), None)
            if rule is not None and rule.probe is not None:
                probed = True
                answer = self._probe(rule.probe, resource, state.now)
                if answer is not None:
                    resource = answer
                    state = state.put(resource)
                    decision, context = self._decide(resource, trigger, payload, state.now)
        if not decision.fired:
            return state, Fired(False, reason=decision.reason, probed=probed)
        assert decision.edge is not None and decision.dest is not None
        moved = self._transition(resource, trigger, payload, decision, state.now)
        return state.put(moved), Fired(True, decision.dest, probed=probed)

    def _decide(self, resource: Res, trigger: str, payload: dict[str, Any],
                now: float) -> tuple[Decision, GuardContext]:
        context = GuardContext(self.spec.name, resource.key, resource.state, resource.version,
                               thaw(resource.data), payload, self.time(now),
                               self._observation(resource.seen), self.time(resource.since))
        return self.compiled.decide(resource.state, trigger, context), context

    def _observation(self, seen: Seen | None) -> Observation | None:
        if seen is None:
            return None
        at = self.time(seen.at)
        return Observation(0, thaw(seen.status), at, at, seen.source)

    def _probe(self, name: str, resource: Res, now: float) -> Res | None:
        """Ask probe ``name`` about ``resource`` (the world is the state's): the resource
        with the answer as its observation, or None when the probe failed."""
        request = ProbeRequest(self.spec.name, resource.key, resource.state, resource.version,
                               thaw(resource.data), self._observation(resource.seen))
        try:
            status, observed_at = checked_answer(name, run_to_end(self.probes[name](request)))
        except ProbeFailed:
            return None
        except Exception:  # a probe that raised failed, as call_probe says
            return None
        at = now if observed_at is None else min(
            (observed_at - self.start).total_seconds(), now)
        return _observed(resource, freeze(status), at, name)

    def _transition(self, resource: Res, trigger: str, payload: dict[str, Any],
                    decision: Decision, now: float) -> Res:
        """The resource after the transition decided (Engine._transition, in memory)."""
        edge, dest = decision.edge, decision.dest
        assert edge is not None and dest is not None
        frozen = resource.data  # kept as it is unless the payload or the model changes it
        if (payload and edge.merge_payload) or self._follows:
            data = thaw(resource.data)
            merged = {**data, **payload} if edge.merge_payload else data
            frozen = freeze(validated_data(self.spec, resource.key, merged, {
                "trigger": trigger, "source": resource.state, "dest": dest,
                "payload": payload, "now": self.time(now), "seq": resource.version + 1}
                if self._follows else None))
        fence = (fence_for(edge, self._observation(resource.seen))
                 if edge.fresh is not None else None)
        exited, entered = ([], []) if not self.compiled.on_entry else \
            self.compiled.crossed(resource.state, dest, edge.dest)
        version = resource.version + 1
        moved = Res(resource.key, dest, version, frozen, now, resource.seen,
                    resource.effects, resource.timers)
        return self._entered(moved, edge.effects, entered, exited, fence, version,
                             None if trigger == EVENTLESS else trigger, freeze(payload), now)

    def _entered(self, resource: Res, effects: tuple[EffectSpec, ...], entered: list[str],
                 exited: list[str], fence: dict[str, Any] | None, seq: int,
                 trigger: str | None, payload: Frozen, now: float) -> Res:
        """The effects a transition and the states it enters ask for, appended to the
        resource's queue; the timers of the states left cancelled, of those entered set."""
        if entered:
            entry = self.compiled.entry_effects
            asked = (*effects, *(e for s in entered for e in entry.get(s, ())))
        else:
            asked = effects
        queue = resource.effects
        if asked:
            frozen_fence = freeze(fence) if fence is not None else None
            queue += tuple(Pending(e.name, self._args(e), frozen_fence, seq, i, trigger,
                                   payload, e.on_failure, due=now)
                           for i, e in enumerate(asked))
        timers = (tuple(t for t in resource.timers if t.state not in exited) if exited
                  else resource.timers)
        for name in entered:
            timeout = self.compiled.timeouts.get(name)
            if timeout is not None:
                after = timeout.after
                seconds = float(thaw(resource.data).get(after, 0) if isinstance(after, str)
                                else after)
                timers += (Timer(name, timeout.trigger, now + seconds),)
        return Res(resource.key, resource.state, resource.version, resource.data,
                   resource.since, resource.seen, queue, timers)

    def _args(self, effect: EffectSpec) -> Frozen:
        """An effect's arguments, frozen once (the spec's effects live as long as it)."""
        found = self._frozen_args.get(id(effect))
        if found is None or found[0] is not effect:
            found = self._frozen_args[id(effect)] = (effect, freeze(effect.args))
        return found[1]

    # -- the worker, one effect or one resource's due timers at a time -------------------

    def run_effect(self, state: State, key: str) -> State:
        """Run the head effect of ``key`` and record its outcome, as the worker does."""
        _, resource = state.find(key)
        head = resource.head()
        assert head is not None
        progress, outcome = self._call(resource, head, state.now, state.world)
        return self._record(state, key, head, progress, outcome)

    def begin(self, state: State, key: str) -> State:
        """Start the head effect of ``key``: its handler is called (what it does to the world
        happens now), with the run listed in the world's running entry
        (:data:`~lifecycle.scenario.RUNNING`), where what it holds stays until
        :meth:`finish`; the call is kept in the head (``begun``). The scenario step
        ``begin_effect``."""
        _, resource = state.find(key)
        head = resource.head()
        assert head is not None and head.begun is None
        begun(self.world, key)
        world = self.world.frozen()
        self._call(resource, head, state.now, world)
        started = replace(head, begun=_memo(resource, head, state.now, world))
        return state.put(resource.with_effects((started, *resource.effects[1:])))

    def finish(self, state: State, key: str) -> State:
        """End ``key``'s begun run: what its handler held is let go (its running entry
        dropped), and the outcome of its call is recorded. The scenario step
        ``finish_effect``."""
        _, resource = state.find(key)
        head = resource.head()
        assert head is not None and head.begun is not None
        progress, outcome = self._calls[head.begun][:2]
        finished(self.world, key)
        return self._record(state, key, replace(head, begun=None), progress, outcome)

    def _record(self, state: State, key: str, head: Pending, progress: Frozen,
                outcome: FollowUp | BaseException | None) -> State:
        """Record the outcome of a call of ``key``'s head, as the worker does."""
        _, resource = state.find(key)
        progressed = Pending(head.name, head.args, head.fence, head.seq, head.position,
                             head.trigger, head.payload, head.on_failure, head.attempts + 1,
                             progress, head.due, head.failed, head.begun)
        state = state.put(resource.with_effects((progressed, *resource.effects[1:])))
        if not isinstance(outcome, BaseException):
            try:
                return self._done(state, key, outcome)
            except LifecycleError as failure:  # recording the success failed
                outcome = failure
        return self._failed(state, key, progressed, outcome)

    def _call(self, resource: Res, head: Pending, now: float,
              world: Frozen) -> tuple[Frozen, FollowUp | BaseException | None]:
        """Call the handler of ``head`` as the worker does, in ``world`` (the state's, which
        ``self.world`` holds): the progress it saved, and its answer or failure. A handler is
        a function of its call, the world and the clock: called once per distinct
        (resource, effect, data, world, time), what it did is remembered, so that the many
        paths that reach one effect in one world run its handler once."""
        memo = _memo(resource, head, now, world)
        done = self._calls.get(memo)
        if done is None:
            call, outcome = self._handle(resource, head, now)
            done = (freeze(call.progress), outcome, self.world.frozen(),
                    tuple(self.world.actions))
            self._calls[memo] = done
        else:
            self.world.load(done[2])
            self.world.actions.extend(done[3])
        return done[0], done[1]

    def _handle(self, resource: Res, head: Pending,
                now: float) -> tuple[EffectCall, FollowUp | BaseException | None]:
        call = EffectCall(0, head.name, self.spec.name, resource.key, thaw(head.args),
                          f"{self.spec.name}:{resource.key}:{head.seq}:{head.position}:"
                          f"{head.name}", thaw(head.fence) if head.fence is not None else None,
                          head.attempts + 1, head.seq, head.trigger, thaw(head.payload),
                          thaw(resource.data), thaw(head.progress), self.time(now))
        effect = self.handlers.get(head.name)
        if effect is None:
            return call, PermanentError(f"no handler for effect {head.name!r}")
        try:
            answer = run_to_end(effect.handler(call))
        except Exception as exc:  # the handler's failure is recorded, not raised
            return call, exc
        return call, answer

    def _done(self, state: State, key: str, follow_up: FollowUp | None) -> State:
        """The head is done (the queue goes on); its follow-up fired in the same write, with
        the handler's own database writes, which commit here and only here: they are not run
        (there is no database), but recorded as a ``committed`` action of the resource, so
        that invariants can count them."""
        _, resource = state.find(key)
        head = resource.head()
        state = state.put(resource.with_effects(resource.effects[1:]))
        if follow_up is not None and follow_up.writes is not None and head is not None:
            self.world.actions.append((COMMITTED, key, {"effect": head.name}))
        if follow_up is not None:
            state, _ = self.fire(state, key, follow_up.trigger, dict(follow_up.payload))
        return state

    def _failed(self, state: State, key: str, head: Pending, failure: BaseException) -> State:
        """A failed attempt: retried after the backoff's longest delay, or failed for good
        (its ``on_failure`` fired: given up if that asked for effects, else it holds the
        queue)."""
        effect = self.handlers.get(head.name) or Effect(lambda c: None)
        limit = effect.retry.max_attempts
        _, resource = state.find(key)
        if not isinstance(failure, PermanentError) and (limit is None or head.attempts < limit):
            delay = effect.retry.delay(head.attempts, _NO_JITTER)
            retried = replace(head, due=state.now + delay)
            return state.put(resource.with_effects((retried, *resource.effects[1:])))
        rest = resource.effects[1:]
        if head.on_failure is None:
            return state.put(resource.with_effects((replace(head, failed=True), *rest)))
        before = state.put(resource.with_effects(rest))
        after, fired = self.fire(before, key, head.on_failure, {
            "effect": head.name, "error": f"{type(failure).__name__}: {failure}"})
        _, moved = after.find(key)
        if fired.fired and len(moved.effects) > len(rest):
            return after  # given up: the machine went another way
        return after.put(moved.with_effects((replace(head, failed=True), *moved.effects)))

    def fire_timers(self, state: State, key: str) -> State:
        """``key``'s due timers, soonest first (one a transition cancelled is not fired)."""
        _, resource = state.find(key)
        for timer in sorted((t for t in resource.timers if t.due <= state.now),
                            key=lambda t: t.due):
            _, resource = state.find(key)
            if timer not in resource.timers:
                continue  # cancelled by an earlier timer's transition
            state = state.put(resource.with_timers(tuple(
                t for t in resource.timers if t != timer)))
            state, _ = self.fire(state, key, timer.trigger, {})
        return state

    # what each kind of move does, in the order a move's kind is looked for among them
    _ORDER: ClassVar[tuple[tuple[type, _Do], ...]] = (
        (Advance, _advance), (Note, _note), (SetWorld, _set_world), (Create, _created),
        (Observe, _observe), (Update, _updated), (Fire, _fire), (Step, _step),
        (RunEffect, _run), (Begin, _begin), (Finish, _finish), (FireTimers, _timers),
        (Retry, _retry), (Crash, _crash))
    _KINDS: ClassVar[dict[type, tuple[_Do, bool, bool]]] = {}
    """Each kind of move met: what it does, whether it reads the state's world (a handler or
    a probe may run) and whether it writes it. Moves are classes with abstract methods, whose
    ``isinstance`` is slow, and a check applies hundreds of thousands of moves."""

    @classmethod
    def _kind(cls, kind: type) -> tuple[_Do, bool, bool] | None:
        do = next((d for base, d in cls._ORDER if issubclass(kind, base)), None)
        if do is None:
            return None
        found = cls._KINDS[kind] = (
            do, not issubclass(kind, Advance | Note | Observe | Update | Retry),
            issubclass(kind, SetWorld | RunEffect | Crash | Begin | Finish))
        return found


class _NoJitter(random.Random):
    """The backoff's longest delay: a retry is due no later in the checker than in the
    worker."""

    def random(self) -> float:
        return 0.0


_NO_JITTER = _NoJitter()


Calls = dict[tuple[Any, ...], tuple[Frozen, Any, Frozen, tuple[Any, ...]]]
"""What each handler call did, by :func:`_memo`: the progress it saved, its answer or
failure, the world's status after it and what it did in the world."""

_CALLS: dict[int, dict[dt.datetime, Calls]] = {}
"""The calls of each machine (by its identity, while it lives) from each start."""


def _calls_of(machine: Playable, start: dt.datetime) -> Calls:
    """The calls remembered for ``machine`` from ``start`` (a machine that cannot be
    referred to weakly gets a memory of its own)."""
    key = id(machine)
    kept = _CALLS.get(key)
    if kept is None:
        try:
            weakref.finalize(machine, _CALLS.pop, key, None)
        except TypeError:
            return {}
        kept = _CALLS[key] = {}
    return kept.setdefault(start, {})


def _memo(resource: Res, head: Pending, now: float, world: Frozen) -> tuple[Any, ...]:
    """What a handler's call is remembered by: a handler is a function of these, what
    :meth:`Memory._handle` makes its call of. Not of when the attempt fell due: two heads
    that differ only there (a retry due at 60 s run at 90 s, one due at 90 s run then) make
    the same call, which runs once."""
    return (resource.key, head.name, head.args, head.fence, head.position, head.trigger,
            head.payload, head.attempts, head.progress, resource.data, world, now)


def _observed(resource: Res, status: Frozen, at: float, source: str) -> Res:
    """The resource after an observation: it becomes the newest unless an observation true
    later is already held (a tie goes to the new one, as the store does)."""
    if resource.seen is not None and resource.seen.at > at:
        return resource
    return resource.with_seen(Seen(status, at, source))



