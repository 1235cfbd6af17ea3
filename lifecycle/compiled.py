"""A spec compiled into a ``transitions`` machine, once, and asked for decisions.

:class:`CompiledMachine` decides; the engine commits what it decided. It runs nothing.

A decision reads ``transitions``' own transitions from a table (trigger and leaf -> the
transitions to try, in order, each with its conditions): a flat machine's events are that
table; a nested machine's is learnt from its ``HierarchicalMachine``, leaf by leaf, the first
time each leaf and trigger are asked (:class:`_Order`). Either way a decision costs the
conditions it asks and a dictionary look-up, not a trigger.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transitions import Machine
from transitions.core import Condition
from transitions.extensions.nesting import HierarchicalMachine, NestedState

from .errors import GuardError
from .freshness import staleness
from .graph import ANY, EVENTLESS, SEPARATOR, Candidates
from .results import Observation
from .spec import Edge, MachineSpec, StateSpec


@dataclass(slots=True)
class GuardContext:
    """What a guard sees: the resource as read in this transaction, its newest observation,
    the event's payload and the time of the decision. Guards read it; they never do I/O."""

    machine: str
    key: str
    state: str
    version: int
    data: Mapping[str, Any]
    payload: Mapping[str, Any]
    now: dt.datetime
    observation: Observation | None = None
    last_transition_at: dt.datetime | None = None
    guards: dict[str, bool] = field(default_factory=dict)
    edge: Edge | None = None
    stale: list[tuple[Edge, str]] = field(default_factory=list)
    status: Mapping[str, Any] = field(init=False)
    """The newest observation's status, or an empty mapping when there is none (a plain
    attribute, set when the context is made: a status table's guards each read it)."""

    def __post_init__(self) -> None:
        observation = self.observation
        self.status = observation.status if observation is not None else {}


@dataclass(slots=True)
class Decision:
    """What a machine decided for one trigger (not frozen: one is made on every fire, and a
    frozen dataclass sets each field through ``object.__setattr__``)."""

    fired: bool
    dest: str | None
    edge: Edge | None
    guards: dict[str, bool]
    why: Callable[[], str] | None = None
    """Says why nothing fired, when asked: most refusals are never shown (a heartbeat steps
    every drone and most stay), so the sentence is made only for those that are."""

    @property
    def reason(self) -> str | None:
        return self.why() if self.why is not None else None


class _DottedState(NestedState):
    separator = SEPARATOR


class _Hierarchical(HierarchicalMachine):
    state_cls = _DottedState


class _Model:
    """The object ``transitions`` moves: nothing but a state."""

    __slots__ = ("__dict__", "state")
    state: str


class CompiledMachine:
    """One spec compiled into a ``transitions`` machine: decides its transitions."""

    def __init__(self, spec: MachineSpec, guards: Mapping[str, Callable[[GuardContext], bool]]):
        self.spec = spec
        graph = spec.graph
        self.triggers = frozenset(spec.triggers)
        nested = any(state.states for state in spec.states)
        edges = _edges(spec)
        self._candidates = Candidates(graph, edges, lambda edge: edge.sources)
        self.risky = any(edge.fresh for _, edge in edges)
        self.timeouts = {state: timeout for state, (_, timeout) in graph.timeouts.items()}
        self.entry_effects = dict(graph.entry_effects)
        self.on_entry = bool(self.timeouts or self.entry_effects)
        """Whether crossing into a state can ask for anything (timers, entry effects)."""
        self.follows_transitions = getattr(spec.data_model, "follows_transitions",
                                           False) is True
        """Whether the data model computes the data each transition leaves (startd's)."""
        # A machine is asked through tables of ``transitions``' own transitions (trigger and
        # leaf -> the transitions to try, in order, each with its conditions), which is what
        # a trigger does, without the model round trip, the callbacks and the logging. A flat
        # machine's tables are its events'; a nested machine's are learnt from its
        # HierarchicalMachine (see :class:`_Order`), once per leaf and trigger.
        self._table: dict[tuple[str, str], tuple[_Entry, ...]] = {}
        self.plans: dict[tuple[str, str], Plan | None] = {}
        """What :meth:`plan` found, by (leaf, trigger): read by the engine's common fire
        before it asks (a dictionary look-up costs less than a call)."""
        self._order: _Order | None = None
        if nested:
            self._order = _Order(spec, guards)
        else:
            machine = Machine(states=list(graph.names), **_options(edges, _deciding(guards)))
            self._table = {
                (trigger, source): tuple(_flat_entry(t) for t in transitions)
                for trigger, event in machine.events.items()
                for source, transitions in event.transitions.items()
            }

    def crossed(self, old: str, new: str, dest: str) -> tuple[list[str], list[str]]:
        """The states a transition from leaf ``old`` to leaf ``new``, declared to ``dest``,
        leaves (innermost first) and enters (outermost first). A transition to a state the
        resource is already in (or inside) leaves and re-enters it, as ``transitions``
        does."""
        graph = self.spec.graph
        before, after = graph.ancestors(old), graph.ancestors(new)
        redone = []
        if dest in before:
            redone = after[: after.index(dest) + 1]
        exited = [s for s in before if s not in after or s in redone]
        entered = [s for s in reversed(after) if s not in before or s in redone]
        return exited, entered

    def candidates(self, state: str, trigger: str) -> tuple[Edge, ...]:
        """The edges ``trigger`` may take from leaf ``state``, in declaration order."""
        return self._candidates.edges.get((state, trigger), ())

    def triggers_from(self, state: str) -> frozenset[str]:
        return self._candidates.triggers_from(state)

    def decide(self, state: str, trigger: str, context: GuardContext) -> Decision:
        if trigger not in self._candidates.by_leaf.get(state, ()):
            return Decision(False, None, None, {}, _Unknown(self, state, trigger))
        entries = self._table.get((trigger, state))
        if entries is None:
            entries = self._learn(state, trigger)
        # Each edge's conditions in ``transitions``' order, asked directly (no event object,
        # no ``transitions`` call): a named guard is asked at most once per decision (its
        # verdict is kept in ``context.guards``, as it always was), so a status table's edges
        # that share a first guard cost a dictionary look-up each after the first.
        verdicts = context.guards
        for entry in entries:
            for name, ask, target in entry.steps:
                if name is None:  # the freshness rule, or a guard that is never kept
                    verdict = ask(context)
                else:
                    verdict = verdicts.get(name)
                    if verdict is None:
                        try:
                            verdict = bool(ask(context))
                        except Exception as exc:
                            raise _raised(context, name, exc) from exc
                        verdicts[name] = verdict
                if verdict is not target:
                    break
            else:
                return Decision(True, entry.dest, entry.edge, verdicts)
        return Decision(False, None, None, verdicts, _Why(verdicts, self, state, trigger))

    def plan(self, state: str, trigger: str) -> Plan | None:
        """The decision of ``trigger`` from leaf ``state`` when it is the same whatever the
        resource holds: the first edge to try has no condition at all (no guard, no
        freshness rule). None when the decision must be asked (:meth:`decide`). Found once per
        leaf and trigger (kept in :attr:`plans`)."""
        plan = None
        if trigger in self._candidates.by_leaf.get(state, ()):
            entries = self._table.get((trigger, state))
            if entries is None:
                entries = self._learn(state, trigger)
            if entries and not entries[0].conditions:
                first = entries[0]
                edge = first.edge
                plan = Plan(first.dest, edge, not (
                    self.on_entry or edge.effects or self.follows_transitions))
        if trigger in self.triggers or trigger == EVENTLESS:  # (no entry per unknown name)
            self.plans[state, trigger] = plan
        return plan

    def _learn(self, state: str, trigger: str) -> tuple[_Entry, ...]:
        assert self._order is not None
        entries = self._order.entries(state, trigger)
        self._table[trigger, state] = entries
        return entries


@dataclass(frozen=True, slots=True)
class Plan:
    """A decision known before the resource is read (:meth:`CompiledMachine.plan`): the
    transition fires, to ``dest`` by ``edge``, with no guard asked. ``plain``: it writes the
    move and its journal row and nothing else (no effect, no state entered that asks for
    anything, no data the model computes), when the fire has no payload."""

    dest: str
    edge: Edge
    plain: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    """One transition to try: its conditions (``transitions``' ``Condition``s, the
    unless-conditions and the freshness rule last), the edge, and the leaf it ends in;
    ``steps`` are the conditions as :meth:`CompiledMachine.decide` asks them (see
    :func:`_steps`)."""

    conditions: Sequence[Any]
    edge: Edge
    dest: str
    steps: tuple[Step, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", _steps(self.conditions))


Step = tuple[str | None, Callable[[GuardContext], Any], bool]
"""One condition as :meth:`CompiledMachine.decide` asks it: (the guard's name, the guard,
the verdict that lets the edge through); with no name, a callable that keeps its own verdict
(the freshness rule; a guard that is missing or named ``fresh``, the rule's own name)."""


def _steps(conditions: Sequence[Any]) -> tuple[Step, ...]:
    steps: list[Step] = []
    for condition in conditions:
        func, target = condition.func, condition.target
        if type(func) is _Guard and func.guard is not None and func.name != "fresh":
            steps.append((func.name, func.guard, target))
        elif isinstance(func, _Guard | _Stale):
            steps.append((None, func.ask, target))
        else:  # (not made by _deciding: asked as transitions would ask it)
            steps.append((None, _Asked(func), target))
    return tuple(steps)


class _Asked:
    """A condition that is not one of ours, asked with the event it expects."""

    __slots__ = ("func",)

    def __init__(self, func: Callable[[Any], Any]) -> None:
        self.func = func

    def __call__(self, context: GuardContext) -> bool:
        return bool(self.func(_Event(context)))


Conditions = Callable[[Edge], tuple[list[Any], list[Any]]]
"""For an edge, its conditions and its unless-conditions, as ``transitions`` takes them."""


def _flat_entry(transition: Any) -> _Entry:
    chosen: _Chosen = transition.after[0]
    return _Entry(transition.conditions, chosen.edge, transition.dest)


def _deciding(guards: Mapping[str, Callable[[GuardContext], bool]]) -> Conditions:
    def conditions(edge: Edge) -> tuple[list[Any], list[Any]]:
        # The freshness rule is the last condition: it is asked only of an edge whose guards
        # all hold on the held observation, so a probe is made only when its answer could
        # let a risky edge fire. (An edge held back by a stale observation is safe: the next
        # fresh one decides.) An unless-condition comes after the others.
        stale = [_stale(edge)] if edge.fresh else []
        return ([_check(n, guards.get(n), True) for n in edge.guards],
                [*(_check(n, guards.get(n), False) for n in edge.unless), *stale])

    return conditions


def _options(edges: list[tuple[str, Edge]], conditions: Conditions) -> dict[str, Any]:
    """The keyword arguments of a ``transitions`` machine of these edges."""
    definitions = []
    for trigger, edge in edges:
        ifs, unless = conditions(edge)
        definitions.append({
            "trigger": trigger,
            "source": ANY if ANY in edge.sources else list(edge.sources),
            "dest": edge.dest,
            "conditions": ifs,
            "unless": unless,
            "after": [_chosen(edge)],
        })
    return {"model": None, "transitions": definitions, "initial": None,
            "auto_transitions": False, "send_event": True, "ignore_invalid_triggers": False}


def _edges(spec: MachineSpec) -> list[tuple[str, Edge]]:
    edges: list[tuple[str, Edge]] = [(t.trigger, t) for t in spec.transitions]
    return edges + [(EVENTLESS, e) for e in spec.eventless]


def hierarchical(spec: MachineSpec,
                 guards: Mapping[str, Callable[[GuardContext], bool]]) -> HierarchicalMachine:
    """The spec as a ``HierarchicalMachine`` that decides by its trigger path (conditions
    are called with ``ctx=`` a :class:`GuardContext`; the edge taken is left in its
    ``edge``): the reference the tables of a nested machine are checked against."""
    return _Hierarchical(states=_tree(spec.states), **_options(_edges(spec), _deciding(guards)))


class _Order:
    """How a nested machine's tables are learnt from ``transitions`` itself.

    A ``HierarchicalMachine`` tries, for a trigger and a leaf, a fixed sequence of
    transitions (the leaf's, then its parents' and the wildcard's, in its own order),
    stopping at the first whose conditions hold, and ends in the leaf its destination's
    initial children lead to. That sequence is asked of a twin of the machine whose
    conditions only record that they were asked (see :func:`_recording`): once with every
    transition failing, for the order; once per transition, letting it alone pass, for the
    leaf it ends in. The answers become a table like a flat machine's, with each edge's real
    conditions (``transitions``' ``Condition``s, made as its ``Transition`` makes them);
    deciding never enters the hierarchical machine."""

    def __init__(self, spec: MachineSpec,
                 guards: Mapping[str, Callable[[GuardContext], bool]]) -> None:
        deciding = _deciding(guards)
        self._conditions: dict[int, list[Condition]] = {}
        for _, edge in _edges(spec):
            ifs, unless = deciding(edge)
            self._conditions[id(edge)] = [*(Condition(c) for c in ifs),
                                          *(Condition(u, target=False) for u in unless)]
        self._machine = _Hierarchical(states=_tree(spec.states),
                                      **_options(_edges(spec), _recording))
        self._model = _Model()
        self._machine.add_model(self._model, initial=spec.graph.enter(spec.initial))
        self._lock = threading.Lock()

    def entries(self, state: str, trigger: str) -> tuple[_Entry, ...]:
        with self._lock:
            failing = self._ask(state, trigger, None)
            out = []
            for transition in failing.asked:
                passed = self._ask(state, trigger, transition)
                edge = _flat_entry(transition).edge
                assert passed.edge is edge and passed.dest is not None
                out.append(_Entry(self._conditions[id(edge)], edge, passed.dest))
            if failing.edge is not None:  # a transition without conditions took it
                assert failing.dest is not None
                out.append(_Entry(self._conditions[id(failing.edge)], failing.edge,
                                  failing.dest))
            return tuple(out)

    def _ask(self, state: str, trigger: str, passing: Any) -> _Probe:
        probe = _Probe(passing)
        self._machine.set_state(state, self._model)
        if self._model.trigger(trigger, ctx=probe):  # type: ignore[attr-defined]
            probe.dest = self._model.state
        return probe


def _recording(edge: Edge) -> tuple[list[Any], list[Any]]:
    """The conditions of :class:`_Order`'s twin machine: as many as the edge really has,
    each one recording which transition asked it, and passing only for the probe's chosen
    one. (An edge from a leaf and its parent is two transitions, each asked in its turn.)"""

    def condition(wanted: bool) -> Callable[[Any], bool]:
        def asked(event: Any) -> bool:
            probe: _Probe = event.kwargs["ctx"]
            transition = event.transition
            if not any(seen is transition for seen in probe.asked):
                probe.asked.append(transition)
            return wanted if transition is probe.passing else not wanted
        return asked

    unless = len(edge.unless) + (1 if edge.fresh else 0)
    return ([condition(True) for _ in edge.guards], [condition(False) for _ in range(unless)])


class _Probe:
    """What the recording conditions of :class:`_Order`'s machine are called with."""

    __slots__ = ("asked", "dest", "edge", "passing")

    def __init__(self, passing: Any) -> None:
        self.passing = passing
        """The transition whose conditions pass (``transitions``' own object), or None."""
        self.asked: list[Any] = []
        self.edge: Edge | None = None
        self.dest: str | None = None


def _tree(states: tuple[StateSpec, ...]) -> list[Any]:
    out: list[Any] = []
    for state in states:
        if state.states:
            out.append({"name": state.name, "children": _tree(state.states),
                        "initial": state.initial})
        else:
            out.append(state.name)
    return out


def _check(name: str, guard: Callable[[GuardContext], bool] | None,
           wanted: bool) -> _Guard:
    return _Guard(name, guard)


class _Guard:
    """A named guard as a ``transitions`` condition (called with the event) and as
    :meth:`CompiledMachine.decide` asks it (:meth:`ask`, with the context)."""

    __slots__ = ("guard", "name")

    def __init__(self, name: str, guard: Callable[[GuardContext], bool] | None) -> None:
        self.name, self.guard = name, guard

    def __call__(self, event: Any) -> bool:
        return self.ask(event.kwargs["ctx"])

    def ask(self, context: GuardContext) -> bool:
        name, guard = self.name, self.guard
        if guard is None:
            raise GuardError(f"machine {context.machine!r}: guard {name!r} is not registered "
                             "in this process")
        try:
            verdict = bool(guard(context))
        except Exception as exc:
            raise _raised(context, name, exc) from exc
        context.guards[name] = verdict
        return verdict


def _raised(context: GuardContext, name: str, exc: Exception) -> GuardError:
    return GuardError(f"{context.machine}:{context.key}: guard {name!r} raised "
                      f"{type(exc).__name__}: {exc}")


def _stale(edge: Edge) -> _Stale:
    return _Stale(edge)


class _Stale:
    """The implicit last condition of a risky edge (an unless-condition): its freshness
    rule is not met."""

    __slots__ = ("edge", "rule")

    def __init__(self, edge: Edge) -> None:
        assert edge.fresh is not None
        self.edge, self.rule = edge, edge.fresh

    def __call__(self, event: Any) -> bool:
        return self.ask(event.kwargs["ctx"])

    def ask(self, context: GuardContext) -> bool:
        assert context.last_transition_at is not None
        problem = staleness(self.rule, context.observation, context.last_transition_at,
                            context.now)
        context.guards["fresh"] = problem is None
        if problem is not None:
            context.stale.append((self.edge, problem))
        return problem is not None


class _Event:
    """What a condition is called with on the flat path: the part of ``EventData`` it
    reads."""

    __slots__ = ("kwargs",)

    def __init__(self, context: GuardContext) -> None:
        self.kwargs = {"ctx": context}


class _Chosen:
    """The ``after`` callback that tells which edge a trigger took."""

    __slots__ = ("edge",)

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    def __call__(self, event: Any) -> None:
        event.kwargs["ctx"].edge = self.edge


def _chosen(edge: Edge) -> _Chosen:
    return _Chosen(edge)


class _Unknown:
    """Why nothing fired: the trigger has no edge from the state at all."""

    __slots__ = ("compiled", "state", "trigger")

    def __init__(self, compiled: CompiledMachine, state: str, trigger: str) -> None:
        self.compiled, self.state, self.trigger = compiled, state, trigger

    def __call__(self) -> str:
        if self.trigger == EVENTLESS:
            return f"no eventless transition from {self.state!r}"
        options = ", ".join(sorted(self.compiled.triggers_from(self.state))) or "none"
        return (f"no transition for {self.trigger!r} from {self.state!r} (triggers here: "
                f"{options})")


class _Why:
    """Why nothing fired: which guard held each candidate edge back. The sentence depends
    on the machine, the state, the trigger and the guards' verdicts alone, so it is worded
    once for each such case (:attr:`worded`): a heartbeat refuses thousands of resources for
    the same few reasons, and a refusal's result carries its reason."""

    __slots__ = ("compiled", "state", "trigger", "verdicts")
    worded: ClassVar[dict[tuple[Any, ...], str]] = {}
    """Sentences by (machine, state, trigger, verdicts), at most :attr:`WORDED` of them."""
    WORDED: ClassVar[int] = 4096

    def __init__(self, verdicts: dict[str, bool], compiled: CompiledMachine, state: str,
                 trigger: str) -> None:
        self.verdicts, self.compiled, self.state, self.trigger = (
            verdicts, compiled, state, trigger)

    def __call__(self) -> str:
        case = (self.compiled, self.state, self.trigger, *self.verdicts.items())
        worded = _Why.worded
        sentence = worded.get(case)
        if sentence is None:
            if len(worded) >= _Why.WORDED:
                worded.clear()
            sentence = worded[case] = self.word()
        return sentence

    def word(self) -> str:
        verdicts, reasons = self.verdicts, []
        for edge in self.compiled.candidates(self.state, self.trigger):
            if edge.fresh and verdicts.get("fresh") is False:
                reasons.append("the observation is not fresh")
                continue
            for name in edge.guards:
                if verdicts.get(name) is False:
                    reasons.append(f"guard {name!r} is false")
                    break
            else:
                for name in edge.unless:
                    if verdicts.get(name) is True:
                        reasons.append(f"unless guard {name!r} is true")
                        break
        return "; ".join(dict.fromkeys(reasons)) or "no transition's guards held"
