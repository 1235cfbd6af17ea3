"""Machine specs: pure data, validated as a whole.

A spec is written in Python (pydantic models), or loaded from a dict, a YAML file or a
JSON file. ``MachineSpec.problems()`` reports every problem at once, each with its location
and, where one exists, a suggestion; ``load_spec`` and ``Engine.register`` raise
``SpecError`` with all of them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import storable
from .errors import Problem, SpecError
from .graph import ANY, EVENTLESS, SEPARATOR, StateGraph, sources
from .graph import NAME as _NAME
from .user_documents import DocumentError, load_json, load_yaml, read_text

_TRIGGER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_RESERVED_TRIGGERS = frozenset({"trigger", "state", "step"})


Seconds = Annotated[float, Field(gt=0, le=10 * 365 * 86400, allow_inf_nan=False)]
"""A positive, finite number of seconds of at most ten years (a time the clock can add)."""


def _as_state(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EffectSpec(_Strict):
    """A side effect a transition asks for, run after the transition committed by a worker:
    handler ``name`` with ``args``. When it fails for good, ``on_failure`` (a trigger) is
    fired on the resource; without one the resource is marked stuck."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    on_failure: str | None = None


def _as_effect(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class Timeout(_Strict):
    """Entering the state schedules ``trigger`` ``after`` seconds later (a number, or the name
    of a data field holding one); leaving the state first cancels it."""

    after: Seconds | str
    trigger: str


class StateSpec(_Strict):
    """A state; with ``states`` it is a composite state entered through its ``initial`` child."""

    name: str
    states: tuple[StateSpec, ...] = ()
    initial: str | None = None
    timeout: Timeout | None = None
    effects: tuple[EffectSpec, ...] = ()
    """Asked for on every entry into the state (after the entering transition's own)."""
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _children_as_dicts(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and isinstance(value.get("states"), list | tuple):
            value = {**value, "states": [_as_state(s) for s in value["states"]]}
        if isinstance(value, Mapping) and isinstance(value.get("effects"), list | tuple):
            value = {**value, "effects": [_as_effect(e) for e in value["effects"]]}
        return value


class Freshness(_Strict):
    """The rule of a risky edge: fire only on an observation at most ``max_age`` seconds old,
    made after the resource's last transition; ask ``probe`` for one when none is held."""

    max_age: Seconds
    probe: str | None = None


class Edge(_Strict):
    source: str | tuple[str, ...]
    dest: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    effects: tuple[EffectSpec, ...] = ()
    fresh: Freshness | None = None
    fence: dict[str, Any] | None = None
    """What the effects of a risky edge may still assume of the world (for example
    ``{"expect_job_status": 1}``); by default, the observed status itself."""
    description: str | None = None
    ref: str | None = None
    merge_payload: bool = True

    @model_validator(mode="before")
    @classmethod
    def _effects_as_dicts(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and isinstance(value.get("effects"), list | tuple):
            value = {**value, "effects": [_as_effect(e) for e in value["effects"]]}
        return value

    @property
    def sources(self) -> tuple[str, ...]:
        return sources(self.source)


class TransitionSpec(Edge):
    """``trigger`` takes the resource from ``source`` to ``dest`` when every guard holds and no
    ``unless`` guard does. When it fires, the payload's keys are merged into the resource's
    data (unless ``merge_payload`` is false) and ``effects`` are asked for."""

    trigger: str


class EventlessSpec(Edge):
    """A transition without a trigger, taken by ``Engine.step`` when its guards hold."""


class CheckWhen(_Strict):
    """A resource's condition, for ``lifecycle check``: it is in ``state`` (or a state
    within it), its data has ``data``'s values, the world says ``world``'s of it, and the
    controller's newest observation has ``believed``'s."""

    state: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    world: dict[str, Any] = Field(default_factory=dict)
    believed: dict[str, Any] = Field(default_factory=dict)


class CheckNever(CheckWhen):
    """What must never happen: a resource in this condition after any move; with ``effect``,
    that effect's handler running while the resource was in it."""

    name: str | None = None
    effect: str | None = None


class CheckAction(_Strict):
    """What the world may do to each resource at any time (while ``when`` holds): ``set``
    what it says of it, ``report`` that to the controller as of now, ``fire`` a trigger
    (with ``payload``), or ``update`` its data. Exactly one of the four."""

    set: dict[str, Any] | None = None
    report: bool = False
    fire: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    update: dict[str, Any] | None = None
    when: CheckWhen | None = None

    @model_validator(mode="after")
    def _one(self) -> CheckAction:
        done = [k for k in ("set", "report", "fire", "update") if getattr(self, k)]
        if len(done) != 1:
            raise ValueError(f"a world action does one of set, report, fire, update, not "
                             f"{' and '.join(done) or 'none'}")
        return self


class CheckResource(_Strict):
    key: str
    state: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    world: dict[str, Any] = Field(default_factory=dict)


class CheckSpec(_Strict):
    """A spec's ``check:`` section: the world ``lifecycle check`` explores the machine in
    (see docs/check.md). Not part of the machine: left out of its stored document and
    its version."""

    resources: tuple[CheckResource, ...] = Field(min_length=1)
    world: tuple[CheckAction, ...] = ()
    never: tuple[CheckNever, ...] = ()
    ticks: tuple[Seconds, ...] = ()


class MachineSpec(_Strict):
    """A whole machine. Pure data: nothing here runs.

    When several edges can take the same trigger from a state, they are tried innermost
    source first (an edge from the resource's own leaf state, or from ``*``, before one from
    a parent state), then in the order they are declared; the first whose guards hold fires.
    That is how ``transitions``' hierarchical machine resolves them."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str
    description: str | None = None
    states: tuple[StateSpec, ...]
    initial: str
    final: tuple[str, ...] = ()
    transitions: tuple[TransitionSpec, ...] = ()
    eventless: tuple[EventlessSpec, ...] = ()
    data_model: type[BaseModel] | None = Field(default=None, exclude=True)
    """A pydantic model the resource's data must fit (Python only; its JSON schema is kept)."""
    data_schema: dict[str, Any] | None = None
    check: CheckSpec | None = Field(default=None, exclude=True)
    """The world ``lifecycle check`` explores it in; not part of the machine."""

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            value = dict(value)
            if isinstance(value.get("states"), list | tuple):
                value["states"] = [_as_state(s) for s in value["states"]]
            if isinstance(value.get("final"), str):
                value["final"] = [value["final"]]
            model = value.get("data_model")
            if isinstance(model, type) and issubclass(model, BaseModel):
                value.setdefault("data_schema", model.model_json_schema())
        return value

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> MachineSpec:
        """A copy, changed by ``update``, that works out its derived views (its graph, its
        version, its problems) anew: pydantic's copy would carry the original's."""
        copied = super().model_copy(update=update, deep=deep)
        for name, value in vars(MachineSpec).items():
            if isinstance(value, cached_property):
                copied.__dict__.pop(name, None)
        return copied

    # -- derived views -------------------------------------------------------------------

    @cached_property
    def graph(self) -> SpecGraph:
        return SpecGraph.build(self)

    @cached_property
    def version(self) -> str:
        """The content hash: the same spec always has the same version."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True)

    @property
    def triggers(self) -> frozenset[str]:
        return frozenset(t.trigger for t in self.transitions)

    def guard_names(self) -> set[str]:
        return {g for e in self.edges() for g in (*e.guards, *e.unless)}

    def effect_names(self) -> set[str]:
        on_entry = {e.name for effects in self.graph.entry_effects.values() for e in effects}
        return {effect.name for e in self.edges() for effect in e.effects} | on_entry

    def probe_names(self) -> set[str]:
        return {e.fresh.probe for e in self.edges() if e.fresh and e.fresh.probe}

    def edges(self) -> Iterable[Edge]:
        yield from self.transitions
        yield from self.eventless

    def uses(self, kind: str) -> dict[str, list[str]]:
        """Where the spec names each guard, effect or probe (``kind``): name -> locations."""
        return {name: list(where) for name, where in self.named[kind].items()}

    @cached_property
    def named(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """Where the spec names each guard, effect and probe: kind -> name -> locations,
        worked out once per spec (every engine that registers it asks)."""
        where: dict[str, dict[str, list[str]]] = {"guard": {}, "effect": {}, "probe": {}}
        for located in _Located.of(self):
            edge = located.edge
            names = {"guard": (*edge.guards, *edge.unless),
                     "effect": tuple(effect.name for effect in edge.effects),
                     "probe": (edge.fresh.probe,) if edge.fresh and edge.fresh.probe else ()}
            for kind, named in names.items():
                for name in dict.fromkeys(named):
                    where[kind].setdefault(name, []).append(located.location)
        for state, effects in self.graph.entry_effects.items():
            for name in dict.fromkeys(effect.name for effect in effects):
                where["effect"].setdefault(name, []).append(self.graph.effect_locations[state])
        return {kind: {name: tuple(locations) for name, locations in named.items()}
                for kind, named in where.items()}

    def unregistered(self, **registered: Mapping[str, Any]) -> list[Problem]:
        """The guards, effects and probes the spec names that are not among those
        ``registered`` (``guards=``, ``effects=``, ``probes=``), each with where it is
        named."""
        problems = []
        for plural, known in registered.items():
            kind = plural.removesuffix("s")
            for name, where in sorted(self.named[kind].items()):
                if name not in known:
                    problems.append(Problem(
                        ", ".join(where), f"{kind} {name!r} is not registered with this engine",
                        f"pass it in Engine({plural}={{{name!r}: ...}})",
                        f"name a module in LIFECYCLE_PLUGINS that defines "
                        f"{plural} = {{{name!r}: ...}}"))
        return problems

    # -- validation -----------------------------------------------------------------------

    def problems(self) -> list[Problem]:
        """Every problem of this spec, in order of location."""
        return list(self.checked)

    @cached_property
    def checked(self) -> tuple[Problem, ...]:
        """:meth:`problems`, found once per spec (a spec is immutable, and every engine
        that registers it validates it)."""
        return tuple(_check(self))

    def validated(self) -> MachineSpec:
        problems = self.problems()
        if problems:
            raise SpecError(self.name, problems)
        return self


@dataclass(slots=True)
class SpecGraph(StateGraph[StateSpec]):
    """The spec's :class:`~lifecycle.graph.StateGraph`, with what entering each state asks
    for (its timeout, its entry effects) and where the spec declares it."""

    timeouts: dict[str, tuple[str, Timeout]] = field(default_factory=dict)
    entry_effects: dict[str, tuple[EffectSpec, ...]] = field(default_factory=dict)
    effect_locations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, spec: MachineSpec) -> SpecGraph:
        graph = cls()
        graph.walk(spec.states, _fields)
        for full, (loc, state) in graph.declared.items():
            if state.timeout is not None:
                graph.timeouts[full] = (f"{loc}.timeout", state.timeout)
            if state.effects:
                graph.entry_effects[full] = state.effects
                graph.effect_locations[full] = f"{loc}.effects"
        return graph


def _fields(state: StateSpec) -> tuple[str, tuple[StateSpec, ...], str | None]:
    return state.name, state.states, state.initial


def suggest(name: str, options: Iterable[str]) -> str | None:
    """``did you mean ...?`` for a name that is not one of ``options``, or None."""
    options = list(options)
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    if not close:
        # a bare child name where the full dotted name is needed
        close = [o for o in options if o.rsplit(SEPARATOR, 1)[-1] == name][:1]
    return f"did you mean {close[0]!r}?" if close else None


def _check(spec: MachineSpec) -> list[Problem]:
    """Every problem of ``spec``, in order of location."""
    graph = spec.graph
    edges = _Located.of(spec)
    problems = [*_check_states(spec), *_check_edges(spec, edges), *_check_effects(spec, edges),
                *_check_timeouts(spec, edges), *_check_overlaps(edges), *_check_values(spec)]
    if spec.initial in graph.parent and not graph.duplicates:
        problems += _check_reachable(spec, edges)
    problems.sort(key=lambda p: _location_order(p.location))
    return problems


@dataclass(frozen=True, slots=True)
class _Located:
    """An edge with its location in the spec, its trigger (EVENTLESS for an eventless edge)
    and the leaves it covers."""

    location: str
    trigger: str
    edge: Edge
    covered: frozenset[str]

    @staticmethod
    def of(spec: MachineSpec) -> list[_Located]:
        graph = spec.graph
        edges: list[tuple[str, str, Edge]] = [
            *((f"transitions[{i}]", t.trigger, t) for i, t in enumerate(spec.transitions)),
            *((f"eventless[{i}]", EVENTLESS, e) for i, e in enumerate(spec.eventless))]
        return [_Located(loc, trigger, edge, frozenset(graph.covered_leaves(edge.sources)))
                for loc, trigger, edge in edges]


def _state_ref(graph: SpecGraph, loc: str, name: str, allow_any: bool = False) -> list[Problem]:
    if name in graph.parent or (allow_any and name == ANY):
        return []
    return [Problem(loc, f"{name!r} is not a state", suggest(name, graph.names))]


def _check_states(spec: MachineSpec) -> Iterator[Problem]:
    graph = spec.graph
    if not _NAME.match(spec.name):
        yield Problem("name", f"{spec.name!r} is not a valid machine name",
                      "use letters, digits, '_' and '-'")
    for loc, name in graph.bad_names:
        yield Problem(f"{loc}.name", f"{name!r} is not a valid state name",
                      "use letters, digits, '_' and '-' (no '.')")
    for loc, full in graph.duplicates:
        yield Problem(f"{loc}.name", f"duplicate state {full!r}")
    for loc, full, initial in graph.bad_initials:
        kids = [c.rsplit(SEPARATOR, 1)[-1] for c in graph.children[full]]
        if not kids:
            yield Problem(f"{loc}.initial", f"state {full!r} has no children, so it cannot "
                          f"have an initial child ({initial!r})")
        elif initial is None:
            yield Problem(f"{loc}.initial", f"composite state {full!r} needs an initial child",
                          f"add `initial: {kids[0]}`")
        else:
            yield Problem(f"{loc}.initial", f"{initial!r} is not a child of {full!r}",
                          suggest(initial, kids))
    if not spec.states:
        yield Problem("states", "a machine needs at least one state")
    yield from _state_ref(graph, "initial", spec.initial)
    for i, name in enumerate(spec.final):
        yield from _state_ref(graph, f"final[{i}]", name)


def _check_edges(spec: MachineSpec, edges: list[_Located]) -> Iterator[Problem]:
    graph = spec.graph
    for located in edges:
        loc, trigger, edge = located.location, located.trigger, located.edge
        eventless = isinstance(edge, EventlessSpec)
        if not eventless and (not _TRIGGER.match(trigger) or trigger in _RESERVED_TRIGGERS):
            yield Problem(f"{loc}.trigger", f"{trigger!r} is not a valid trigger name",
                          "start with a letter; use letters, digits and '_'; "
                          f"{', '.join(sorted(_RESERVED_TRIGGERS))} are reserved")
        if not edge.sources:
            yield Problem(f"{loc}.source", "a transition needs at least one source")
        for j, source in enumerate(edge.sources):
            where = f"{loc}.source" if isinstance(edge.source, str) else f"{loc}.source[{j}]"
            yield from _state_ref(graph, where, source, allow_any=True)
        yield from _state_ref(graph, f"{loc}.dest", edge.dest)
        if edge.fence is not None and edge.fresh is None:
            yield Problem(f"{loc}.fence", "a fence needs a freshness rule: it is what the "
                          "effects may assume of the observation",
                          "add `fresh: {max_age: SECONDS}`")
        for kind in ("guards", "unless"):
            names = getattr(edge, kind)
            for name in sorted({n for n in names if names.count(n) > 1}):
                yield Problem(f"{loc}.{kind}", f"guard {name!r} is named twice")


def _check_effects(spec: MachineSpec, edges: list[_Located]) -> Iterator[Problem]:
    """An effect's ``on_failure`` names a trigger of the machine."""
    triggers = spec.triggers
    asked = [(f"{e.location}.effects", e.edge.effects) for e in edges]
    asked += [(spec.graph.effect_locations[state], effects)
              for state, effects in spec.graph.entry_effects.items()]
    for where, effects in asked:
        for i, effect in enumerate(effects):
            if effect.on_failure is not None and effect.on_failure not in triggers:
                yield Problem(f"{where}[{i}].on_failure", f"{effect.on_failure!r} is not a "
                              "trigger", suggest(effect.on_failure, triggers))


def _check_values(spec: MachineSpec) -> Iterator[Problem]:
    """What the spec holds as free values (effect args, fences, the data schema, texts) is
    what the database keeps as it is (see :mod:`lifecycle.storable`): no NaN, no NUL."""
    free: list[tuple[str, Any]] = [("description", spec.description),
                                   ("data_schema", spec.data_schema)]
    for kind, listed in (("transitions", spec.transitions), ("eventless", spec.eventless)):
        for i, edge in enumerate(listed):
            free += [(f"{kind}[{i}].{name}", getattr(edge, name))
                     for name in ("fence", "description", "ref")]
            free += [(f"{kind}[{i}].effects[{j}].args", e.args)
                     for j, e in enumerate(edge.effects)]
    states = [(f"states[{i}]", state) for i, state in enumerate(spec.states)]
    while states:
        where, state = states.pop()
        free.append((f"{where}.description", state.description))
        free += [(f"{where}.effects[{j}].args", e.args) for j, e in enumerate(state.effects)]
        states += [(f"{where}.states[{i}]", child) for i, child in enumerate(state.states)]
    for where, value in free:
        if value is not None:
            yield from (Problem(p.path, p.reason) for p in storable.problems(value, where))


def _check_timeouts(spec: MachineSpec, edges: list[_Located]) -> Iterator[Problem]:
    """A state's timeout fires a trigger that leaves the state."""
    graph = spec.graph
    for state, (loc, timeout) in graph.timeouts.items():
        inside = set(graph.descendants(state))
        if not any(e.trigger == timeout.trigger and inside & e.covered for e in edges):
            yield Problem(f"{loc}.trigger", f"no transition for {timeout.trigger!r} leaves "
                          f"{state!r}, so its timeout could never fire",
                          suggest(timeout.trigger, spec.triggers))
        if isinstance(timeout.after, str) and not _NAME.match(timeout.after):
            yield Problem(f"{loc}.after", f"{timeout.after!r} is neither a number of seconds "
                          "nor a data field name")


def _check_overlaps(edges: list[_Located]) -> Iterator[Problem]:
    """Two edges with the same trigger from an overlapping source that no guard tells
    apart. Edges are grouped by trigger and guards, and each group keeps which edge first
    covered each leaf, so a machine of many edges is not compared pair by pair."""
    first: dict[tuple[str, frozenset[str], frozenset[str]], dict[str, int]] = {}
    for index, located in enumerate(edges):
        edge = located.edge
        claimed = first.setdefault(
            (located.trigger, frozenset(edge.guards), frozenset(edge.unless)), {})
        earlier = [claimed[leaf] for leaf in located.covered if leaf in claimed]
        if earlier:
            taken = edges[min(earlier)]
            overlap = taken.covered & located.covered
            what = ("eventless" if located.trigger == EVENTLESS
                    else f"trigger {located.trigger!r}")
            yield Problem(
                located.location,
                f"{what} from {', '.join(sorted(overlap)[:3])} is already taken by "
                f"{taken.location}, and no guard tells them apart",
                "give one of them a guard (or an unless guard), or merge them")
        for leaf in located.covered:
            claimed.setdefault(leaf, index)


def _check_reachable(spec: MachineSpec, edges: list[_Located]) -> Iterator[Problem]:
    """Every state is reachable from the initial state, and every non-final one has a way
    out."""
    graph = spec.graph
    leaving: dict[str, list[str]] = {}
    for located in edges:
        for leaf in located.covered:
            dests = leaving.setdefault(leaf, [])
            if located.edge.dest in graph.parent:
                dests.append(located.edge.dest)
    reached: set[str] = set()
    todo = [graph.enter(spec.initial)]
    while todo:
        leaf = todo.pop()
        if leaf in reached:
            continue
        reached.update(graph.ancestors(leaf))
        todo.extend(graph.enter(dest) for dest in leaving.get(leaf, ()))
    for name in graph.names:
        if name not in reached:
            yield Problem(f"states.{name}", f"state {name!r} is unreachable from the initial "
                          f"state {spec.initial!r}", "add a transition into it, or remove it")
    for leaf in graph.leaves:
        if leaf in reached and leaf not in leaving and not graph.is_final(leaf, spec.final):
            yield Problem(f"states.{leaf}", f"state {leaf!r} is not final and no transition "
                          "leaves it", "add a transition from it, or list it in `final`")


def _location_order(location: str) -> tuple[int, str]:
    order = ["name", "states", "initial", "final", "transitions", "eventless"]
    head = re.split(r"[.\[]", location, maxsplit=1)[0]
    rank = order.index(head) if head in order else len(order)
    return rank, re.sub(r"\d+", lambda m: m.group().zfill(8), location)


# -- loading ------------------------------------------------------------------------------

SpecSource = MachineSpec | Mapping[str, Any] | str | Path


def load_spec(source: SpecSource) -> MachineSpec:
    """A validated spec from a ``MachineSpec``, a dict, or a YAML/JSON file path."""
    if isinstance(source, MachineSpec):
        return source.validated()
    origin = "<dict>"
    if isinstance(source, str | Path):
        origin = str(source)
        source = _read_file(Path(source))
    if not isinstance(source, Mapping):
        raise SpecError(origin, [Problem("", f"a machine spec must be a mapping, not "
                                         f"{type(source).__name__}")])
    name = str(source.get("name", origin))
    try:
        spec = MachineSpec.model_validate(source)
    except ValidationError as exc:
        raise SpecError(name, [_from_pydantic(e) for e in exc.errors()]) from None
    return spec.validated()


def _read_file(path: Path) -> Any:
    try:
        text = read_text(path)
        if path.suffix.lower() == ".json":
            return load_json(text, str(path))
        return load_yaml(text, str(path))
    except DocumentError as exc:
        raise SpecError(str(path), [Problem(exc.where, exc.what)]) from None


def _from_pydantic(error: Mapping[str, Any]) -> Problem:
    loc = ""
    for part in error["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        field_name = str(error["loc"][-1])
        known = _known_fields(error["loc"][:-1])
        return Problem(loc, "unknown field", suggest(field_name, known))
    if error["type"] == "missing":
        return Problem(loc, "required field is missing")
    if "input" in error and not isinstance(error["input"], Mapping | list):
        message = f"{message} (got {error['input']!r})"
    return Problem(loc, message)


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    names = [p for p in loc if isinstance(p, str)]
    nested: dict[str, type[BaseModel]] = {
        "states": StateSpec, "transitions": TransitionSpec, "eventless": EventlessSpec,
        "fresh": Freshness}
    model: type[BaseModel] = MachineSpec
    for name in names:
        model = nested.get(name, model)
    return list(model.model_fields)
