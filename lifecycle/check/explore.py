"""Breadth-first, exhaustive exploration of a machine composed with a model of its world.

From the state a model's setup leaves, every enabled move is tried: each world action the
model declares, the engine's step of each resource that has eventless edges (asking its
probe when a risky edge wants a fresh observation), the worker running one resource's due
effect (or dying after its handler, before recording it; or, where the model's worker runs
several at once, starting it and, a move of its own, finishing it), a resource's due timers
firing,
the clock moving by each of the model's ticks (up to the horizon). States are
deduplicated by value (:mod:`lifecycle.check.state`), and every move is checked against the
model's invariants, also when it leads to a state already seen: breadth first, the first
violation of an invariant is a shortest one. A move that raises (invalid data, an unknown
trigger) is a violation too: ``replay`` would stop there. After the exploration, each
liveness property (:class:`Eventually`) is checked on the explored graph: whether it can
still be met from every state where it is owed, and whether a run fair to the fair moves
(weak fairness) can loop for ever where it is owed and never met.
"""

from __future__ import annotations

import copy
import datetime as dt
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import LifecycleError
from ..graph import EVENTLESS
from ..scenario import Playable, Simulated
from ..spec import MachineSpec
from .memory import Actions, Fired, Memory
from .moves import Action, Advance, Begin, Crash, Finish, FireTimers, Move, RunEffect, Step
from .state import EMPTY, Frozen, State, View, freeze

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

Check = Callable[[View, View, Actions], str | None]
"""An invariant's test of one move: the state before and after, what effect handlers did in
the world meanwhile; a sentence saying what went wrong, or None."""
Expect = Callable[[View, Actions, Actions], list[dict[str, Any]]]
"""The scenario steps that fail where the invariant was broken, given the state after the
move, what handlers did in the world before it along the path, and what they did in it."""


@dataclass(frozen=True)
class Invariant:
    """What must hold on every move, and how a scenario file says it."""

    name: str
    text: str
    check: Check
    expect: Expect


@dataclass(frozen=True)
class Eventually:
    """A liveness property: wherever ``owed`` holds, a state where ``met`` holds must stay
    reachable by some moves of the machine and its world (every drone with demand 0 can
    still leave ``booting``). Checked on the whole explored graph; a state from which
    nothing reaches it is reported with the shortest path to it."""

    name: str
    text: str
    owed: Callable[[View], bool]
    met: Callable[[View], bool]

    def as_invariant(self) -> Invariant:
        return Invariant(self.name, self.text, lambda before, after, actions: None,
                         lambda view, before, actions: [])


@dataclass(frozen=True)
class Model:
    """A machine composed with a model of its world.

    ``setup(resources)`` gives the moves that make the starting state (creating that many
    resources, and what the world and the controller first know of them); ``actions(view)``
    the world actions enabled in a state; ``ticks`` how far the clock may move in one move.
    ``steps``: whether the engine's steps are moves (a machine driven by triggers alone
    has none)."""

    machine: Playable
    setup: Callable[[int], Sequence[Move]]
    actions: Callable[[View], Iterable[Action]] = lambda view: ()
    invariants: Sequence[Invariant] = ()
    ticks: tuple[float, ...] = ()
    start: dt.datetime = START
    steps: bool = True
    resources: int = 1
    """How many resources the setup makes unless the bounds say."""
    label: str | None = None
    """What reports call it (default: the machine's name), when the world differs."""
    eventually: Sequence[Eventually] = ()
    """Liveness properties, checked on the whole explored graph."""
    tally: Callable[[View, Actions], Mapping[str, Any]] | None = None
    """After each move, the model's own values that what handlers did changes (when a job
    was last cancelled, say): invariants read them from ``View.extra``."""
    overlap: bool = False
    """The worker runs several effects at once (its ``concurrency``): an effect's run is two
    moves, :class:`~lifecycle.check.moves.Begin` and :class:`~lifecycle.check.moves.
    Finish`, and any other move may fall between them (a global limit on what is in flight,
    a pool of commands, is then something to check). False: one move, ``RunEffect``."""

    @property
    def name(self) -> str:
        return self.label or self.machine.spec.name


@dataclass(frozen=True)
class Bounds:
    depth: int = 8
    """Moves from the starting state."""
    resources: int | None = None
    """Resources the setup makes (None: the model's own number)."""
    horizon: float = 300.0
    """Seconds the clock may move from the start."""
    crashes: bool = True
    """Whether the worker may die between a handler's end and its outcome's record."""
    queue: int = 3
    """Open effects a resource may have: a state with more is not explored further (a
    machine whose steps queue an effect each, never run, would grow without end)."""


@dataclass(frozen=True)
class Hop:
    """One move of a path: what it was, and the state after it."""

    label: str
    moves: tuple[Move, ...]
    actions: Actions
    fired: Fired | None
    state: State


@dataclass(frozen=True)
class Counterexample:
    """A shortest path from the starting state to a move that breaks ``invariant``."""

    invariant: Invariant
    message: str
    setup: tuple[Move, ...]
    initial: State
    hops: tuple[Hop, ...]
    start: dt.datetime
    machine: str
    """The machine's name, as a scenario names it."""
    model: str
    """The model's name, as ``lifecycle check`` names it."""
    loop: int = 0
    """For a liveness property's run that never meets it: how many of the last hops form the
    loop it repeats for ever (they end in the state the hops before them reached)."""

    def __len__(self) -> int:
        return len(self.hops)


@dataclass
class Report:
    """What an exploration found: the states it explored, how deep it went, and for each
    invariant broken its shortest counterexample."""

    machine: str
    bounds: Bounds
    invariants: list[str]
    eventually: list[str] = field(default_factory=list)
    states: int = 0
    moves: int = 0
    depth: int = 0
    exhausted: bool = False
    """Every state reachable within the horizon was explored before the depth bound (but
    those past the queue bound: ``cut``)."""
    cut: int = 0
    """States with more open effects than the queue bound, not explored further."""
    violations: dict[str, Counterexample] = field(default_factory=dict)
    stuck: dict[str, Counterexample] = field(default_factory=dict)
    """For each liveness property that can stop being reachable, the shortest path to a
    state from which it never happens."""
    loops: dict[str, Counterexample] = field(default_factory=dict)
    """For each liveness property a fair run can miss for ever, that run: a path to a loop
    in which it is owed and never met, and the loop (``Counterexample.loop`` hops)."""

    @property
    def passed(self) -> bool:
        return not self.violations and not self.stuck and not self.loops


@dataclass(frozen=True)
class Machine:
    """A machine to check (a ``Playable``, as a built-in is): its spec, its guards, and its
    ``simulation``: given the :class:`~lifecycle.scenario.World`, the guards, effect
    handlers and probes it runs with (handlers record what they did in
    ``world.actions``)."""

    spec: MachineSpec
    guards: Mapping[str, Any] = field(default_factory=dict)
    simulation: Simulated | None = None


def variant(machine: Playable, name: str, edit: Callable[[dict[str, Any]], None]) -> Machine:
    """``machine`` with its spec document changed by ``edit`` (given the document as
    ``MachineSpec.to_json`` writes it, to change in place), named ``name``."""
    document = copy.deepcopy(machine.spec.to_json())
    edit(document)
    spec = MachineSpec.model_validate({**document, "name": name,
                                       "data_model": machine.spec.data_model})
    return Machine(spec, machine.guards, machine.simulation)


RAISED = Invariant(
    "raises", "no move raises an error (replay would stop there)",
    lambda before, after, actions: None, lambda view, before, actions: [])


def check(model: Model, bounds: Bounds | None = None, *,
          until_all: bool = True) -> Report:
    """Explore ``model`` within ``bounds``; with ``until_all``, stop once every invariant has
    its counterexample (the liveness properties, which need the whole exploration, are then
    not checked: the report lists none).

    The cyclic garbage collector is off meanwhile (as it was before, after): the states
    explored are many small tuples that all stay alive, which it would walk again and again
    to free none (it took about 40 % of an exploration's time); what is freed is freed by
    its references, as ever, and a cycle made meanwhile is collected afterwards."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _explore(model, bounds or Bounds(), until_all)
    finally:
        if collecting:
            gc.enable()


def _explore(model: Model, bounds: Bounds, until_all: bool) -> Report:
    memory = Memory(model.machine, model.start)
    setup = tuple(model.setup(bounds.resources or model.resources))
    initial = State(0.0, (), EMPTY)
    for move in setup:
        initial, _, _ = memory.apply(initial, move)
    report = Report(model.name, bounds, [i.name for i in model.invariants],
                    [e.name for e in model.eventually])
    parents: dict[State, tuple[State, Hop] | None] = {initial: None}
    graph = _Graph()
    frontier: list[State] = [initial]
    partial: set[State] = set()
    """States whose future the horizon cut: something was due after it."""
    early = until_all and bool(model.invariants)
    while frontier and report.depth < bounds.depth:
        report.depth += 1
        reached: list[State] = []
        for state in frontier:
            after = graph.following.setdefault(state, set())
            edges = graph.edges.setdefault(state, [])
            if _waiting(state) and any(state.now + t > bounds.horizon for t in model.ticks):
                partial.add(state)
            moves_here = enabled(model, memory, state, bounds)
            graph.fair[state] = frozenset(f for _, _, f in moves_here if f is not None)
            busy = False
            for label, moves, fair in moves_here:
                report.moves += 1
                clock = bool(moves) and all(isinstance(m, Advance) for m in moves)
                hop, broken = _try(model, memory, state, label, moves, behind=clock and busy)
                if not clock and fair is not None and hop.state != state:
                    busy = True  # a fair move (the engine's, the worker's) would do something
                after.add(hop.state)
                edges.append((hop.state, fair, label, moves, clock and busy))
                for invariant, message in broken:
                    if invariant.name not in report.violations:
                        report.violations[invariant.name] = _example(
                            model, invariant, message, setup, initial,
                            (*_path(parents, state), hop))
                if hop.state not in parents:
                    parents[hop.state] = (state, hop)
                    if all(len(r.effects) <= bounds.queue for r in hop.state.resources):
                        reached.append(hop.state)
                    else:
                        report.cut += 1
            if early and all(i.name in report.violations for i in model.invariants):
                report.states, report.eventually = len(parents), []
                return report
        frontier = reached
    report.states = len(parents)
    report.exhausted = not frontier
    for property_ in model.eventually:
        stuck = _never_reached(model, property_, parents, graph.following, partial)
        if stuck is not None:
            report.stuck[property_.name] = _example(
                model, property_.as_invariant(), f"after this, {property_.text} can no "
                "longer happen: no move of the machine or its world leads there",
                setup, initial, tuple(_path(parents, stuck)))
        loop = _fair_loop(model, memory, property_, parents, graph, partial)
        if loop is not None:
            entry, cycle, names = loop
            fair = (f"; every fair move enabled all along it is taken in it ({names})"
                    if names else "; no fair move is enabled all along it")
            report.loops[property_.name] = _example(
                model, property_.as_invariant(), f"{property_.text} never happens on a "
                f"run that comes here and then repeats the last {len(cycle)} moves for "
                f"ever{fair}", setup, initial, (*_path(parents, entry), *cycle),
                loop=len(cycle))
    return report


Edge = tuple[State, str | None, str, tuple[Move, ...], bool]
"""An explored move: the state after it, its fairness name (None: not fair), its label and
moves, and whether it was the clock moving while the engine or the worker lagged."""


@dataclass
class _Graph:
    """The explored graph: each explored state's moves (the state after, the move's
    fairness name, its label and moves, whether it was the clock moving while the engine or
    the worker lagged) and the fairness names of the moves enabled in it."""

    following: dict[State, set[State]] = field(default_factory=dict)
    edges: dict[State, list[Edge]] = field(default_factory=dict)
    fair: dict[State, frozenset[str]] = field(default_factory=dict)


STUTTER = "nothing more happens"
"""The label of a loop's move in which nothing happens: a run may stop doing anything where
no fair move is enabled (the world is not bound to act)."""


def _fair_loop(model: Model, memory: Memory, property_: Eventually,
               parents: dict[State, tuple[State, Hop] | None], graph: _Graph,
               partial: set[State]) -> tuple[State, list[Hop], str] | None:
    """A run on which ``property_`` is owed and never met, fair to every fair move (weak
    fairness: a fair move enabled all along the loop is taken in it): the loop's first
    state (the earliest found, breadth first), its moves, and the fair moves it takes.

    Only states whose moves were all explored count (not past the depth, the queue bound or
    the horizon, with nothing due after it), so a loop found is a run of the machine and its
    world, not of the bounds; each may also stay as it is (stutter), which is fair only
    where no fair move is enabled. The loops are the strongly connected components of the
    states where the property is owed and not met; a component is fair when every fair
    move enabled in all its states is taken on one of its own moves."""
    start = model.start
    nodes = {s for s in graph.edges if s not in partial and property_.owed(View(s, start))
             and not property_.met(View(s, start))}
    if not nodes:
        return None
    order = {state: index for index, state in enumerate(parents)}
    inner = {s: [e for e in graph.edges[s] if e[0] in nodes] for s in nodes}
    best: tuple[int, list[State]] | None = None
    for component in _components(nodes, inner):
        members = set(component)
        always = frozenset.intersection(*(graph.fair[s] for s in component))
        taken = {e[1] for s in component for e in inner[s] if e[0] in members}
        if always <= taken:
            first = min(order[s] for s in component)
            if best is None or first < best[0]:
                best = (first, component)
    if best is None:
        return None
    members = set(best[1])
    entry = min(best[1], key=order.__getitem__)
    path = _witness(entry, members, inner, graph.fair)
    cycle: list[Hop] = []
    for state, edge in path:
        if edge is None:
            cycle.append(Hop(STUTTER, (), [], None, state))
        else:
            hop, _ = _try(model, memory, state, edge[2], edge[3], behind=edge[4])
            cycle.append(hop)
    names = sorted({e[1] for _, e in path if e is not None and e[1] is not None})
    return entry, cycle, ", ".join(names)


def _witness(entry: State, members: set[State], inner: dict[State, list[Edge]],
             fair: dict[State, frozenset[str]]) -> list[tuple[State, Edge | None]]:
    """A loop from ``entry`` through ``members`` (a fair component) that is fair itself:
    until every fair move enabled all along it so far is taken on it (or is not enabled in
    one of its states), walk on to the nearest move or state that settles one, then back.
    Each item: the state a move leaves and the move (None: it stays as it is)."""
    walked: list[tuple[State, Edge | None]] = []
    here = entry
    always: set[str | None] = set(fair[entry])
    taken: set[str | None] = set()
    while always - taken:
        steps = _nearest(here, members, inner, _settling(always - taken, fair))
        for state, edge in steps:
            walked.append((state, edge))
            always &= fair[state]
            if edge is not None:
                always &= fair[edge[0]]
                taken.add(edge[1])
                here = edge[0]
    if here != entry or not walked:
        back = _nearest(here, members, inner, lambda s, e: e is not None and e[0] == entry) \
            if here != entry else []
        walked += back
        if not walked:
            walked.append((entry, None))  # no fair move enabled: it may stay so for ever
    return walked


def _settling(need: set[str | None], fair: dict[State, frozenset[str]]
              ) -> Callable[[State, Edge | None], bool]:
    """A goal for :func:`_nearest`: a move that takes one of ``need``, or a state in which
    one of them is not enabled (so it is no longer enabled all along)."""
    def goal(state: State, edge: Edge | None) -> bool:
        return (edge is not None and edge[1] in need) or bool(need - fair[state])
    return goal


def _nearest(origin: State, members: set[State], inner: dict[State, list[Edge]],
             goal: Callable[[State, Edge | None], bool]) -> list[tuple[State, Edge | None]]:
    """The shortest walk within ``members`` from ``origin`` whose last move (or last state,
    with no move) meets ``goal``."""
    if goal(origin, None):
        return []
    came: dict[State, tuple[State, Edge] | None] = {origin: None}
    todo = [origin]
    while todo:
        following: list[State] = []
        for state in todo:
            for edge in inner[state]:
                if edge[0] not in members:
                    continue
                if goal(state, edge):
                    walk: list[tuple[State, Edge | None]] = [(state, edge)]
                    link = came[state]
                    while link is not None:
                        walk.append((link[0], link[1]))
                        link = came[link[0]]
                    return walk[::-1]
                if edge[0] not in came:
                    came[edge[0]] = (state, edge)
                    following.append(edge[0])
                    if goal(edge[0], None):
                        walk = []
                        link = came[edge[0]]
                        while link is not None:
                            walk.append((link[0], link[1]))
                            link = came[link[0]]
                        return walk[::-1]
        todo = following
    raise AssertionError("a strongly connected component reaches all its states")


def _components(nodes: set[State], inner: dict[State, list[Edge]]) -> list[list[State]]:
    """Tarjan's strongly connected components of ``nodes`` (iteratively: a graph may be
    deeper than Python's stack)."""
    index: dict[State, int] = {}
    low: dict[State, int] = {}
    stack: list[State] = []
    on: set[State] = set()
    out: list[list[State]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, position = work[-1]
            edges = inner[node]
            if position < len(edges):
                work[-1] = (node, position + 1)
                successor = edges[position][0]
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on.add(successor)
                    work.append((successor, 0))
                elif successor in on:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
    return out


def _example(model: Model, invariant: Invariant, message: str, setup: tuple[Move, ...],
             initial: State, hops: tuple[Hop, ...], loop: int = 0) -> Counterexample:
    return Counterexample(invariant, message, setup, initial, hops, model.start,
                          model.machine.spec.name, model.name, loop)


def _never_reached(model: Model, property_: Eventually,
                   parents: dict[State, tuple[State, Hop] | None],
                   following: dict[State, set[State]], partial: set[State]) -> State | None:
    """The first state (breadth first) where ``property_`` is owed and from which no
    explored path reaches a state where it is met. A state not all of whose moves were
    explored (at the depth bound, past the queue bound, its clock stopped by the horizon)
    is taken to reach it: nothing is claimed beyond the bounds. (Time that would only pass,
    with nothing due, is no way out.)"""
    start = model.start
    meets = {s for s in parents if s not in following or s in partial
             or property_.met(View(s, start))}
    before: dict[State, list[State]] = {}
    for state, after in following.items():
        for successor in after:
            before.setdefault(successor, []).append(state)
    reach, todo = set(meets), list(meets)
    while todo:
        for previous in before.get(todo.pop(), ()):
            if previous not in reach:
                reach.add(previous)
                todo.append(previous)
    for state in parents:  # in the order found: breadth first
        if state not in reach and property_.owed(View(state, start)):
            return state
    return None


CLOCK = "the clock"
"""The fairness name of the clock's moves: time does not stop."""


def enabled(model: Model, memory: Memory, state: State,
            bounds: Bounds) -> list[tuple[str, tuple[Move, ...], str | None]]:
    """The moves enabled in ``state``: the world's actions, each resource's step, the
    worker's run (or start, and finish) and crash of each due queue head, each resource's
    due timers, the
    clock's ticks within the horizon; each with the name weak fairness knows it by (None:
    not fair). The engine's steps, the worker's runs, timers and the clock are fair; a
    worker's death is not; the world's actions are as the model declares them."""
    view = View(state, model.start)
    out = [(action.label, action.moves, action.fairness) for action in model.actions(view)]
    compiled = memory.compiled
    final = set(compiled.spec.final)
    if model.steps:
        out += [(f"step {r.key}", (Step(r.key),), f"step {r.key}") for r in state.resources
                if r.state not in final and compiled.candidates(r.state, EVENTLESS)]
    for r in state.resources:
        head = r.head()
        if head is not None and head.begun is not None:
            out.append((f"{r.key}'s {head.name} ends", (Finish(r.key),),
                        f"the worker runs {r.key}'s queue"))
        elif head is not None and not head.failed and head.due <= state.now:
            out.append((f"the worker starts {r.key}'s {head.name}", (Begin(r.key),),
                        f"the worker starts {r.key}'s queue") if model.overlap else
                       (f"the worker runs {r.key}'s {head.name}", (RunEffect(r.key),),
                        f"the worker runs {r.key}'s queue"))
            if bounds.crashes:
                out.append((f"the worker runs {r.key}'s {head.name} and dies before "
                            "recording it", (Crash(r.key),), None))
        due = [t.trigger for t in r.timers if t.due <= state.now]
        if due:
            out.append((f"{r.key}'s timer fires ({', '.join(due)})", (FireTimers(r.key),),
                        f"{r.key}'s timers"))
    out += [(f"{tick:g} s pass", (Advance(tick),), CLOCK) for tick in model.ticks
            if state.now + tick <= bounds.horizon]
    return out


def _waiting(state: State) -> bool:
    """Whether an effect's retry or a timer falls due after now."""
    return any(t.due > state.now for r in state.resources for t in r.timers) or any(
        e.due > state.now and not e.failed and e.begun is None
        for r in state.resources for e in r.effects)


def _try(model: Model, memory: Memory, state: State, label: str, moves: tuple[Move, ...],
         behind: bool = False) -> tuple[Hop, list[tuple[Invariant, str]]]:
    """Do one hop's moves; the hop and the invariants it breaks (with what went wrong).
    ``behind``: the clock moves while the engine or the worker had a move to make."""
    after, actions, fired = state, [], None
    try:
        for move in moves:
            after, done, fired = memory.apply(after, move)
            actions += done
    except LifecycleError as exc:
        hop = Hop(label, moves, actions, fired, state)
        return hop, [(RAISED, f"{label}: {type(exc).__name__}: {exc}")]
    if model.tally is not None:
        counted = model.tally(View(after, model.start, behind=behind), actions)
        if counted:
            after = _counted(after, counted)
    hop = Hop(label, moves, actions, fired, after)
    before_view = View(state, model.start)
    after_view = View(after, model.start, behind=behind)
    broken = []
    for invariant in model.invariants:
        message = invariant.check(before_view, after_view, actions)
        if message is not None:
            broken.append((invariant, message))
    return hop, broken


_NONE = object()


def _counted(state: State, counted: Mapping[str, Any]) -> State:
    """``state`` with the model's values ``counted`` written in its extra values (itself when
    they are there already, as they mostly are)."""
    merged = None
    extras = state.extras()
    for name, value in counted.items():
        name = name if type(name) is str else str(name)
        frozen = freeze(value)
        held = extras.get(name, _NONE)
        if held is _NONE or type(held) is not type(frozen) or held != frozen:
            if merged is None:
                merged = dict(extras)
            merged[name] = frozen
    if merged is None:
        return state
    return state.but(extra=Frozen(sorted(merged.items())))


def _path(parents: dict[State, tuple[State, Hop] | None], state: State) -> list[Hop]:
    hops: list[Hop] = []
    link = parents[state]
    while link is not None:
        previous, hop = link
        hops.append(hop)
        link = parents[previous]
    return hops[::-1]
