"""A spec compiled into a ``transitions`` machine, once, and asked for decisions.

:class:`CompiledMachine` decides; the engine commits what it decided. It runs nothing.

The machine is built once per spec; light model objects are attached once and reused from a
pool, so a decision costs one ``set_state`` and one trigger. Specs without nested states run
on the plain ``Machine``, which is several times faster than the hierarchical one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transitions import Machine
from transitions.extensions.nesting import HierarchicalMachine, NestedState

from .errors import GuardError
from .fresh import staleness
from .records import Observation
from .spec import ANY, EVENTLESS, SEPARATOR, Edge, MachineSpec, StateSpec


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

    @property
    def status(self) -> Mapping[str, Any]:
        """The newest observation's status, or an empty mapping when there is none."""
        return self.observation.status if self.observation is not None else {}


@dataclass(frozen=True, slots=True)
class Decision:
    fired: bool
    dest: str | None
    edge: Edge | None
    guards: dict[str, bool]
    reason: str | None = None


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
        edges: list[tuple[str, Edge]] = [(t.trigger, t) for t in spec.transitions]
        edges += [(EVENTLESS, e) for e in spec.eventless]
        self._candidates: dict[tuple[str, str], tuple[Edge, ...]] = {}
        for trigger, edge in edges:
            for leaf in graph.covered_leaves(edge.sources):
                self._candidates[leaf, trigger] = (
                    *self._candidates.get((leaf, trigger), ()), edge)
        self._from: dict[str, frozenset[str]] = {
            leaf: frozenset(t for (state, t) in self._candidates if state == leaf)
            for leaf in graph.leaves
        }
        self.risky = any(edge.fresh for _, edge in edges)
        self.timeouts = {state: timeout for state, (_, timeout) in graph.timeouts.items()}
        self.entry_effects = dict(graph.entry_effects)
        self.on_entry = bool(self.timeouts or self.entry_effects)
        """Whether crossing into a state can ask for anything (timers, entry effects)."""
        definitions = []
        for trigger, edge in edges:
            # The freshness rule is the last condition: it is asked only of an edge whose
            # guards all hold on the held observation, so a probe is made only when its answer
            # could let a risky edge fire. (An edge held back by a stale observation is safe:
            # the next fresh one decides.) An unless-condition comes after the others.
            stale = [_stale(edge)] if edge.fresh else []
            definitions.append({
                "trigger": trigger,
                "source": ANY if ANY in edge.sources else list(edge.sources),
                "dest": edge.dest,
                "conditions": [_check(n, guards.get(n), True) for n in edge.guards],
                "unless": [*(_check(n, guards.get(n), False) for n in edge.unless), *stale],
                "after": [_chosen(edge)],
            })
        options: dict[str, Any] = {
            "model": None, "transitions": definitions, "initial": None,
            "auto_transitions": False, "send_event": True, "ignore_invalid_triggers": False,
        }
        if nested:
            self._machine: Machine = _Hierarchical(states=_tree(spec.states), **options)
        else:
            self._machine = Machine(states=list(graph.names), **options)
        # A flat machine is asked through its own tables (event -> source -> transitions, each
        # with its conditions), which is what a trigger does, without the model round trip,
        # the callbacks and the logging: half the cost of a decision. Nested machines take
        # the trigger path, which resolves parents the way HierarchicalMachine does.
        self._table: dict[tuple[str, str], list[Any]] | None = None
        if not nested:
            self._table = {
                (trigger, source): list(transitions)
                for trigger, event in self._machine.events.items()
                for source, transitions in event.transitions.items()
            }
        self._initial = graph.enter(spec.initial)
        self._pool: list[_Model] = []

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
        return self._candidates.get((state, trigger), ())

    def triggers_from(self, state: str) -> frozenset[str]:
        return self._from.get(state, frozenset()) - {EVENTLESS}

    def decide(self, state: str, trigger: str, context: GuardContext) -> Decision:
        if trigger not in self._from.get(state, ()):
            if trigger == EVENTLESS:
                reason = f"no eventless transition from {state!r}"
            else:
                options = ", ".join(sorted(self.triggers_from(state))) or "none"
                reason = f"no transition for {trigger!r} from {state!r} (triggers here: {options})"
            return Decision(False, None, None, {}, reason)
        if self._table is not None:
            return self._decide_flat(state, trigger, context)
        pool = self._pool
        model = pool.pop() if pool else self._new_model()
        try:
            self._machine.set_state(state, model)
            fired = model.trigger(trigger, ctx=context)  # type: ignore[attr-defined]
            dest: str = model.state
        finally:
            pool.append(model)
        if fired:
            return Decision(True, dest, context.edge, context.guards)
        return Decision(False, None, None, context.guards, _why(context.guards, self.spec,
                                                                state, trigger))

    def _decide_flat(self, state: str, trigger: str, context: GuardContext) -> Decision:
        assert self._table is not None
        event = _Event(context)
        for transition in self._table.get((trigger, state), ()):
            if all(c.func(event) == c.target for c in transition.conditions):
                edge = transition.after[0].edge
                return Decision(True, transition.dest, edge, context.guards)
        return Decision(False, None, None, context.guards,
                        _why(context.guards, self.spec, state, trigger))

    def _new_model(self) -> _Model:
        model = _Model()
        self._machine.add_model(model, initial=self._initial)
        return model


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
           wanted: bool) -> Callable[[Any], bool]:
    def condition(event: Any) -> bool:
        context: GuardContext = event.kwargs["ctx"]
        if guard is None:
            raise GuardError(f"machine {context.machine!r}: guard {name!r} is not registered "
                             "in this process")
        try:
            verdict = bool(guard(context))
        except Exception as exc:
            raise GuardError(f"{context.machine}:{context.key}: guard {name!r} raised "
                             f"{type(exc).__name__}: {exc}") from exc
        context.guards[name] = verdict
        return verdict

    return condition


def _stale(edge: Edge) -> Callable[[Any], bool]:
    """The implicit last condition of a risky edge (an unless-condition): its freshness
    rule is not met."""
    rule = edge.fresh
    assert rule is not None

    def condition(event: Any) -> bool:
        context: GuardContext = event.kwargs["ctx"]
        assert context.last_transition_at is not None
        problem = staleness(rule, context.observation, context.last_transition_at, context.now)
        context.guards["fresh"] = problem is None
        if problem is not None:
            context.stale.append((edge, problem))
        return problem is not None

    return condition


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


def _why(verdicts: dict[str, bool], spec: MachineSpec, state: str, trigger: str) -> str:
    reasons = []
    edges = spec.eventless if trigger == EVENTLESS else [
        t for t in spec.transitions if t.trigger == trigger]
    for edge in edges:
        if state not in spec.graph.covered_leaves(edge.sources):
            continue
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
