"""The engine against a plain in-memory model of its specs, on random sequences of operations.

Two machines run side by side in one store: ``job`` (nested states, so the engine runs it on the
hierarchical machine) and ``light`` (flat). Both have guards reading the resource's data and
the event's payload, unless guards, eventless transitions, a ``*`` source and a transition that
does not merge its payload. The model below interprets the same spec dicts with code of its
own: which edges apply to a state, in which order they are tried, which guard verdicts that
produces, where a composite destination is entered, how payloads merge into data, and what the
journal says. Every create, fire, step, get, available_triggers and history is compared.

Priority between edges, as the model states it: the edges whose source is the state itself
(or ``*``) are tried first, in the order the spec lists them; then those whose source is the
state's parent, and so on outwards. Within one edge the guards are asked in order until one is
false, then the unless guards until one is true.
"""

from __future__ import annotations

import datetime as dt
import itertools
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from databases import Templates, require_postgres
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lifecycle import Engine, GuardContext, LifecycleError, SimulatedClock, Store
from lifecycle.errors import (
    AmbiguousKey,
    ResourceExists,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)

# -- the specs -------------------------------------------------------------------------------

JOB: dict[str, Any] = {
    "name": "job",
    "states": [
        "idle",
        {"name": "running", "initial": "starting", "states": ["starting", "busy"]},
        "held",
        "done",
    ],
    "initial": "idle",
    "final": ["done"],
    "transitions": [
        {"trigger": "start", "source": "idle", "dest": "running", "guards": ["enough_cpus"],
         "unless": ["on_hold"]},
        {"trigger": "pause", "source": "running", "dest": "held"},
        {"trigger": "resume", "source": "held", "dest": "running.busy",
         "guards": ["enough_cpus", "forced"]},
        {"trigger": "resume", "source": "held", "dest": "running", "guards": ["enough_cpus"]},
        {"trigger": "resume", "source": "held", "dest": "idle", "guards": ["forced"]},
        {"trigger": "annotate", "source": "running.busy", "dest": "running.busy"},
        {"trigger": "restart", "source": "running", "dest": "running"},
        # the parent's edge is listed first; the child's applies first from running.starting
        {"trigger": "poke", "source": "running", "dest": "held", "guards": ["enough_cpus"]},
        {"trigger": "poke", "source": "running.starting", "dest": "done", "guards": ["finished"]},
        {"trigger": "note", "source": "idle", "dest": "idle", "merge_payload": False},
        {"trigger": "abort", "source": "*", "dest": "done", "guards": ["forced"]},
        {"trigger": "cancel", "source": ["idle", "held"], "dest": "done", "unless": ["on_hold"]},
        {"trigger": "reopen", "source": "done", "dest": "idle", "unless": ["finished"]},
    ],
    "eventless": [
        {"source": "running", "dest": "done", "guards": ["finished"]},
        {"source": "running.starting", "dest": "running.busy", "guards": ["enough_cpus"]},
        {"source": "held", "dest": "idle", "unless": ["on_hold"]},
    ],
}

LIGHT: dict[str, Any] = {
    "name": "light",
    "states": ["off", "on", "broken"],
    "initial": "off",
    "transitions": [
        {"trigger": "switch", "source": "off", "dest": "on", "guards": ["enough_cpus"]},
        {"trigger": "switch", "source": "on", "dest": "off"},
        {"trigger": "smash", "source": ["off", "on"], "dest": "broken", "unless": ["on_hold"]},
        {"trigger": "repair", "source": "broken", "dest": "on",
         "guards": ["forced", "enough_cpus"]},
        {"trigger": "repair", "source": "broken", "dest": "off", "guards": ["forced"]},
        {"trigger": "reset", "source": "*", "dest": "off", "guards": ["forced"],
         "unless": ["finished"]},
        {"trigger": "note", "source": ["off", "on"], "dest": "on", "merge_payload": False},
    ],
    "eventless": [
        {"source": "on", "dest": "off", "unless": ["enough_cpus"]},
        {"source": "broken", "dest": "off", "guards": ["finished"], "unless": ["on_hold"]},
    ],
}

SPECS = {"job": JOB, "light": LIGHT}


# Guards are predicates over (data, payload); the engine gets them wrapped, the model calls
# them as they are. What is under test is when and in what order they are asked.
def _enough_cpus(data: dict[str, Any], payload: dict[str, Any]) -> bool:
    return int(payload.get("cpus", data.get("cpus", 0))) >= 2


def _forced(data: dict[str, Any], payload: dict[str, Any]) -> bool:
    return bool(payload.get("force"))


def _on_hold(data: dict[str, Any], payload: dict[str, Any]) -> bool:
    return bool(data.get("hold"))


def _finished(data: dict[str, Any], payload: dict[str, Any]) -> bool:
    return bool(data.get("done"))


PREDICATES: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    "enough_cpus": _enough_cpus, "forced": _forced, "on_hold": _on_hold, "finished": _finished,
}


def _engine_guard(predicate: Callable[[dict[str, Any], dict[str, Any]], bool]
                  ) -> Callable[[GuardContext], bool]:
    def guard(context: GuardContext) -> bool:
        return predicate(dict(context.data), dict(context.payload))

    return guard


ENGINE_GUARDS = {name: _engine_guard(p) for name, p in PREDICATES.items()}


# -- the model -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelEdge:
    index: int
    trigger: str | None  # None: eventless
    sources: tuple[str, ...]
    dest: str
    guards: tuple[str, ...]
    unless: tuple[str, ...]
    merge_payload: bool


class SpecModel:
    """A spec dict, interpreted independently of lifecycle.spec and lifecycle.compiled."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name: str = spec["name"]
        self.parent: dict[str, str | None] = {}
        self.initial_child: dict[str, str] = {}
        self._walk(spec["states"], None)
        self.leaves = [s for s in self.parent if s not in self.initial_child]
        self.initial = spec["initial"]
        self.edges: list[ModelEdge] = []
        raw = [(t["trigger"], t) for t in spec["transitions"]]
        raw += [(None, e) for e in spec.get("eventless", [])]
        for index, (trigger, edge) in enumerate(raw):
            source = edge["source"]
            self.edges.append(ModelEdge(
                index, trigger, (source,) if isinstance(source, str) else tuple(source),
                edge["dest"], tuple(edge.get("guards", ())), tuple(edge.get("unless", ())),
                edge.get("merge_payload", True)))
        self.triggers = {e.trigger for e in self.edges if e.trigger is not None}

    def _walk(self, states: list[Any], parent: str | None) -> None:
        for state in states:
            if isinstance(state, str):
                state = {"name": state}
            full = f"{parent}.{state['name']}" if parent else state["name"]
            self.parent[full] = parent
            if state.get("states"):
                self.initial_child[full] = f"{full}.{state['initial']}"
                self._walk(state["states"], full)

    def enter(self, state: str) -> str:
        while state in self.initial_child:
            state = self.initial_child[state]
        return state

    def outwards(self, leaf: str) -> list[str]:
        chain: list[str] = []
        current: str | None = leaf
        while current is not None:
            chain.append(current)
            current = self.parent[current]
        return chain

    def _level(self, edge: ModelEdge, leaf: str) -> int | None:
        """How far out from ``leaf`` the edge's source is (0: the leaf itself or ``*``);
        None when the edge does not apply to ``leaf``."""
        if "*" in edge.sources:
            return 0
        levels = [i for i, s in enumerate(self.outwards(leaf)) if s in edge.sources]
        return min(levels) if levels else None

    def candidates(self, leaf: str, trigger: str | None) -> list[ModelEdge]:
        found = [(level, e.index, e) for e in self.edges
                 if e.trigger == trigger and (level := self._level(e, leaf)) is not None]
        return [e for _, _, e in sorted(found, key=lambda item: (item[0], item[1]))]

    def triggers_from(self, leaf: str) -> list[str]:
        return sorted({e.trigger for e in self.edges
                       if e.trigger is not None and self._level(e, leaf) is not None})

    def decide(self, leaf: str, trigger: str | None, data: dict[str, Any],
               payload: dict[str, Any]) -> tuple[ModelEdge | None, dict[str, bool], bool]:
        """(the edge taken or None, the guard verdicts asked for, whether any edge applied)."""
        verdicts: dict[str, bool] = {}
        edges = self.candidates(leaf, trigger)
        for edge in edges:
            passed = True
            for name in edge.guards:
                verdicts[name] = PREDICATES[name](data, payload)
                if not verdicts[name]:
                    passed = False
                    break
            if not passed:
                continue
            for name in edge.unless:
                verdicts[name] = PREDICATES[name](data, payload)
                if verdicts[name]:
                    passed = False
                    break
            if passed:
                return edge, verdicts, True
        return None, verdicts, bool(edges)


MODELS = {name: SpecModel(spec) for name, spec in SPECS.items()}


@dataclass
class ModelEntry:
    seq: int
    kind: str
    trigger: str | None
    source: str | None
    dest: str
    version: int
    actor: str | None
    at: dt.datetime
    payload: dict[str, Any] | None
    guards: dict[str, bool] | None


@dataclass
class ModelResource:
    machine: str
    key: str
    state: str
    data: dict[str, Any]
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    journal: list[ModelEntry] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"<{self.machine}:{self.key} in {self.state!r}, version {self.version}, "
                f"data {self.data}>")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Short, in hypothesis's account of a failing run (not every field and entry)."""
        printer.text(repr(self))


# -- strategies ------------------------------------------------------------------------------

KEYS = st.sampled_from(["k0", "k1", "k2"])
BAD_KEYS = st.sampled_from(["", " k0", "k0 ", "job:k0", "a:b", "x" * 256])
MACHINE_OR_PLAIN = st.sampled_from([None, "job", "light"])
ACTORS = st.sampled_from([None, "alice", "worker-1"])
DATA = st.fixed_dictionaries({}, optional={
    "cpus": st.integers(0, 4), "hold": st.booleans(), "done": st.booleans(),
    "owner": st.sampled_from(["ann", "bo"]),
})
PAYLOAD = st.fixed_dictionaries({}, optional={
    "cpus": st.integers(0, 4), "force": st.booleans(), "hold": st.booleans(),
    "done": st.booleans(), "note": st.sampled_from(["x", "ünï", ""]),
})
TRIGGERS = st.sampled_from(sorted(MODELS["job"].triggers | MODELS["light"].triggers | {"nope"}))
ADOPT_STATES = {name: [None, *model.parent, "nowhere"] for name, model in MODELS.items()}


def _order(resource: ModelResource) -> tuple[str, str]:
    return resource.machine, resource.key


# -- the state machine -----------------------------------------------------------------------

StoreOpener = Callable[[], tuple[Store, Callable[[], None]]]


class EngineMatchesModel(RuleBasedStateMachine):
    """Every operation runs on the engine and on the model; the answers must agree."""

    def __init__(self, open_store: StoreOpener) -> None:
        super().__init__()
        self.store, self._cleanup = open_store()
        self.clock = SimulatedClock("2026-03-01T08:00:00Z")
        try:
            self.engine = Engine(self.store, [JOB, LIGHT], guards=ENGINE_GUARDS,
                                 clock=self.clock)
        except BaseException:
            self.store.dispose()
            self._cleanup()
            raise
        self.model: dict[tuple[str, str], ModelResource] = {}

    # -- model helpers -----------------------------------------------------------------

    def _name(self, machine: str | None, key: str) -> str:
        return key if machine is None else f"{machine}:{key}"

    def _locate(self, machine: str | None, key: str) -> ModelResource | type[Exception]:
        if machine is not None:
            return self.model.get((machine, key), UnknownResource)
        found = [r for (_, k), r in self.model.items() if k == key]
        if not found:
            return UnknownResource
        if len(found) > 1:
            return AmbiguousKey
        return found[0]

    def _tick(self) -> dt.datetime:
        return self.clock.advance(1.25)

    # -- rules -------------------------------------------------------------------------

    @rule(machine=st.sampled_from(["job", "light"]), key=KEYS, data=DATA, actor=ACTORS,
          state=st.data())
    def create(self, machine: str, key: str, data: dict[str, Any], actor: str | None,
               state: st.DataObject) -> None:
        adopt = state.draw(st.sampled_from(ADOPT_STATES[machine]), label="state")
        self._create(machine, key, data, adopt, actor)

    def _create(self, machine: str, key: str, data: dict[str, Any], adopt: str | None,
                actor: str | None = None) -> None:
        now = self._tick()
        model = MODELS[machine]
        expected: type[Exception] | None = None
        if adopt is not None and adopt not in model.parent:
            expected = UnknownState
        elif (machine, key) in self.model:
            expected = ResourceExists
        if expected is not None:
            with pytest.raises(expected):
                self.engine.create(machine, key, data, state=adopt, actor=actor)
            return
        resource = self.engine.create(machine, key, data, state=adopt, actor=actor)
        dest = model.enter(model.initial if adopt is None else adopt)
        kind = "create" if adopt is None else "adopt"
        assert (resource.machine, resource.key, resource.state, resource.version,
                resource.seq, resource.data) == (machine, key, dest, 1, 1, data), resource
        entry = ModelEntry(1, kind, None, None, dest, 1, actor, now, dict(data) or None, None)
        self.model[machine, key] = ModelResource(machine, key, dest, dict(data), 1, now, now,
                                                 [entry])

    @initialize(job_key=KEYS, light_key=KEYS, job_data=DATA, light_data=DATA, state=st.data())
    def seed(self, job_key: str, light_key: str, job_data: dict[str, Any],
             light_data: dict[str, Any], state: st.DataObject) -> None:
        """Every run starts with one resource of each machine (hypothesis switches rules off
        at random, ``create`` among them)."""
        self.create("job", job_key, job_data, None, state)
        self.create("light", light_key, light_data, None, state)

    @rule(key=st.one_of(BAD_KEYS, KEYS), machine=st.sampled_from(["job", "light", "nosuch"]))
    def create_refused(self, key: str, machine: str) -> None:
        """A key that is not a key, or a machine nobody registered: an error, nothing
        written."""
        if machine == "nosuch":
            # a bad key is refused first, before a machine could be loaded (and stored)
            good = key in ("k0", "k1", "k2")
            with pytest.raises(UnknownMachine if good else LifecycleError,
                               match=None if good else "invalid key"):
                self.engine.create(machine, key)
        elif key in ("k0", "k1", "k2"):
            return  # a good key in a known machine: ``create`` covers it
        else:
            with pytest.raises(LifecycleError, match="invalid key"):
                self.engine.create(machine, key)

    @rule(machine=MACHINE_OR_PLAIN, key=KEYS, trigger=st.one_of(st.none(), TRIGGERS),
          payload=PAYLOAD, actor=ACTORS)
    def fire_or_step(self, machine: str | None, key: str, trigger: str | None,
                     payload: dict[str, Any], actor: str | None) -> None:
        """Any trigger (None: a step) at any key, as ``MACHINE:KEY`` or plain: missing
        resources, ambiguous keys, triggers the machine does not have."""
        self._fire_or_step(machine, key, trigger, payload if trigger else {}, actor)

    # The rules above mostly hit missing resources and triggers with no edge from the state;
    # these pick a resource that exists and, mostly, a trigger that has an edge from its
    # state, so that guards decide.
    @precondition(lambda self: self.model)
    @rule(data=st.data(), payload=PAYLOAD, actor=ACTORS)
    def fire_existing(self, data: st.DataObject, payload: dict[str, Any],
                      actor: str | None) -> None:
        target = data.draw(st.sampled_from(sorted(self.model.values(), key=_order)),
                           label="resource")
        model = MODELS[target.machine]
        here = model.triggers_from(target.state)
        trigger = data.draw(st.sampled_from(here) if here else TRIGGERS, label="trigger")
        self._fire_or_step(target.machine, target.key, trigger, payload, actor)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), actor=ACTORS)
    def step_existing(self, data: st.DataObject, actor: str | None) -> None:
        target = data.draw(st.sampled_from(sorted(self.model.values(), key=_order)),
                           label="resource")
        self._fire_or_step(target.machine, target.key, None, {}, actor)

    def _fire_or_step(self, machine: str | None, key: str, trigger: str | None,
                      payload: dict[str, Any], actor: str | None) -> None:
        name = self._name(machine, key)
        now = self._tick()
        target = self._locate(machine, key)

        def act() -> Any:
            if trigger is None:
                return self.engine.step(name, actor=actor)
            return self.engine.fire(name, trigger, payload, actor=actor)

        if not isinstance(target, ModelResource):
            with pytest.raises(target):
                act()
            return
        model = MODELS[target.machine]
        if trigger is not None and trigger not in model.triggers:
            with pytest.raises(UnknownTrigger):
                act()
            return
        edge, verdicts, applied = model.decide(target.state, trigger, target.data, payload)
        result = act()
        shown = "(step)" if trigger is None else trigger
        got = (result.fired, result.machine, result.key, result.trigger, result.source,
               result.dest, result.version, result.guards)
        want: tuple[Any, ...]
        if edge is None:
            want = (False, target.machine, key, shown, target.state, None, target.version,
                    verdicts)
            assert got == want, (
                f"{name} {shown} from {target.state!r} with data {target.data} and payload "
                f"{payload}: the model refuses (edges applied: {applied}), the engine says "
                f"{result}")
            # the reason names what refused: a guard asked, else the missing transition
            assert result.reason, result
            if verdicts:
                assert any(repr(g) in result.reason for g in verdicts), result
            elif trigger is not None:
                assert repr(trigger) in result.reason, result
            else:
                assert "eventless" in result.reason, result
            return
        dest = model.enter(edge.dest)
        want = (True, target.machine, key, shown, target.state, dest, target.version + 1,
                verdicts)
        assert got == want, (
            f"{name} {shown} from {target.state!r} with data {target.data} and payload "
            f"{payload}: the model takes edge #{edge.index} to {dest!r} with verdicts "
            f"{verdicts}, the engine says {result}")
        assert result.reason is None, result
        source = target.state
        target.state, target.version, target.updated_at = dest, target.version + 1, now
        if payload and edge.merge_payload:
            target.data = {**target.data, **payload}
        target.journal.append(ModelEntry(
            target.version, "transition", trigger, source, dest, target.version, actor, now,
            dict(payload) or None, dict(verdicts) or None))

    @rule(machine=MACHINE_OR_PLAIN, key=KEYS)
    def available_triggers(self, machine: str | None, key: str) -> None:
        target = self._locate(machine, key)
        name = self._name(machine, key)
        if not isinstance(target, ModelResource):
            with pytest.raises(target):
                self.engine.available_triggers(name)
            return
        assert self.engine.available_triggers(name) == MODELS[target.machine].triggers_from(
            target.state), f"{name} in {target.state!r}"

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def check_one(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(sorted(self.model.values(), key=_order)),
                           label="resource")
        self._check_resource(target)

    # -- whole-store checks ------------------------------------------------------------

    def _check_resource(self, expected: ModelResource) -> None:
        name = f"{expected.machine}:{expected.key}"
        got = self.engine.get(name)
        assert (got.machine, got.key, got.state, got.version, got.seq, got.data,
                got.created_at, got.updated_at) == (
            expected.machine, expected.key, expected.state, expected.version,
            len(expected.journal), expected.data, expected.created_at, expected.updated_at,
        ), f"get({name!r}) = {got}, the model has {expected}"
        history = self.engine.history(name)
        as_model = [ModelEntry(e.seq, e.kind, e.trigger, e.source, e.dest, e.version, e.actor,
                               e.at, e.payload, e.guards) for e in history]
        if as_model != expected.journal:
            lines = [f"history({name!r}) differs from the model:"]
            for a, b in itertools.zip_longest(as_model, expected.journal):
                mark = "  " if a == b else "!!"
                lines.append(f"{mark} engine {a}\n{mark} model  {b}")
            raise AssertionError("\n".join(lines))

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is not None:
                return  # a step failed: that is the error to report, not what follows from it
            for expected in self.model.values():
                self._check_resource(expected)
            listed = [(r.machine, r.key, r.state, r.version) for r in self.engine.resources()]
            assert listed == sorted((r.machine, r.key, r.state, r.version)
                                    for r in self.model.values())
            counts: dict[str, dict[str, int]] = {}
            for r in self.model.values():
                counts.setdefault(r.machine, {}).setdefault(r.state, 0)
                counts[r.machine][r.state] += 1
            assert self.engine.counts() == counts
            assert self.engine.verify() == []
        finally:
            self.store.dispose()
            self._cleanup()
            # Hypothesis keeps the exception of every failing example it tries while it
            # shrinks, and through its traceback this object: let go of the database objects,
            # or a failing run grows by an engine per attempt (gigabytes, and minutes of GC).
            for name in ("engine", "store", "model", "clock"):
                self.__dict__.pop(name, None)


# -- running it ------------------------------------------------------------------------------

def _settings(max_examples: int, steps: int) -> settings:
    # No explain phase: its line tracing makes shrinking a failure take minutes and
    # gigabytes here (every step runs SQLAlchemy and transitions under the tracer).
    return settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                    phases=[p for p in Phase if p is not Phase.explain],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@contextmanager
def _sqlite_stores(templates: Templates) -> Iterator[StoreOpener]:
    """A fresh SQLite file for each example: a copy of the session's migrated template
    (migrating costs more than a short example)."""
    directory = Path(tempfile.mkdtemp(prefix="lifecycle-model-"))
    names = itertools.count()

    def open_store() -> tuple[Store, Callable[[], None]]:
        path = directory / f"example-{next(names)}.db"
        store = Store(templates.sqlite(path))

        def cleanup() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        return store, cleanup

    try:
        yield open_store
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def _postgres_stores(templates: Templates) -> Iterator[StoreOpener]:
    """A fresh database for each example, made from the session's migrated template and
    dropped afterwards as conftest's are (a connection left open fails the example)."""

    def open_store() -> tuple[Store, Callable[[], None]]:
        database = ExitStack()
        url = database.enter_context(templates.postgres())
        try:
            store = Store(url)
        except BaseException:
            database.close()
            raise
        return store, database.close

    yield open_store


def _on(open_store: StoreOpener) -> type[EngineMatchesModel]:
    class EngineMatchesModelOnStore(EngineMatchesModel):
        def __init__(self) -> None:
            super().__init__(open_store)

    return EngineMatchesModelOnStore


def test_engine_matches_model_on_sqlite(templates: Templates, slow: bool) -> None:
    with _sqlite_stores(templates) as open_store:
        run_state_machine_as_test(_on(open_store), settings=_settings(
            max_examples=250 if slow else 50, steps=40))


def test_engine_matches_model_on_postgresql(templates: Templates, slow: bool) -> None:
    require_postgres()
    with _postgres_stores(templates) as open_store:
        run_state_machine_as_test(_on(open_store), settings=_settings(
            max_examples=40 if slow else 10, steps=30))


# Runs the random search reaches only now and then, written out, each step checked against
# the model exactly as in the random runs.
SCRIPTS: dict[str, list[tuple[Any, ...]]] = {
    # from running.starting the child's poke (listed second) is tried before the parent's
    "child edge before parent edge": [
        ("create", "job", "k0", {"done": True, "cpus": 3}, "running"),
        ("fire", "job", "k0", "poke", {}),
        ("expect", "job", "k0", "done"),
    ],
    "parent edge when the child's guard is false": [
        ("create", "job", "k0", {"cpus": 3}, "running"),
        ("fire", "job", "k0", "poke", {}),
        ("expect", "job", "k0", "held"),
    ],
    "eventless: child before parent, then parent": [
        ("create", "job", "k0", {"done": True, "cpus": 3}, "running"),
        ("step", "job", "k0"),
        ("expect", "job", "k0", "running.busy"),
        ("step", "job", "k0"),
        ("expect", "job", "k0", "done"),
        ("step", "job", "k0"),
    ],
    "composite self-loop re-enters the initial child": [
        ("create", "job", "k0", {"cpus": 2}, None),
        ("fire", None, "k0", "start", {"owner": "ann"}),
        ("step", None, "k0"),
        ("expect", "job", "k0", "running.busy"),
        ("fire", None, "k0", "restart", {}),
        ("expect", "job", "k0", "running.starting"),
        ("fire", "job", "k0", "pause", {"hold": True}),
        ("step", "job", "k0"),
        ("expect", "job", "k0", "held"),
        ("fire", "job", "k0", "resume", {"cpus": 4, "force": True}),
        ("expect", "job", "k0", "running.busy"),
    ],
    "resume falls through to the forced edge": [
        ("create", "job", "k0", {"cpus": 0}, "held"),
        ("fire", "job", "k0", "resume", {"force": True}),
        ("expect", "job", "k0", "idle"),
    ],
    "unless guards, a * source and a payload that is not merged": [
        ("create", "light", "k1", {"hold": True, "cpus": 1}, None),
        ("fire", None, "k1", "smash", {}),
        ("expect", "light", "k1", "off"),
        ("fire", None, "k1", "note", {"hold": False, "note": "not merged"}),
        ("expect", "light", "k1", "on"),
        ("step", None, "k1"),
        ("expect", "light", "k1", "off"),
        # the note's hold=False was not merged, so the unless guard still holds
        ("fire", None, "k1", "smash", {"hold": False}),
        ("expect", "light", "k1", "off"),
        ("fire", None, "k1", "switch", {"cpus": 2, "hold": False}),
        ("fire", None, "k1", "smash", {}),
        ("expect", "light", "k1", "broken"),
        ("step", None, "k1"),
        ("fire", None, "k1", "reset", {"force": True}),
        ("expect", "light", "k1", "off"),
        ("fire", None, "k1", "switch", {"cpus": 2}),
        ("step", None, "k1"),
        ("expect", "light", "k1", "on"),
    ],
    "the same key in two machines": [
        ("create", "job", "k0", {}, None),
        ("create", "light", "k0", {}, None),
        ("fire", None, "k0", "note", {}),
        ("fire", "light", "k0", "note", {}),
        ("step", None, "k0"),
        ("fire", "job", "k0", "note", {}),
        ("expect", "job", "k0", "idle"),
        ("expect", "light", "k0", "on"),
    ],
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_engine_matches_model_on_scripted_runs(name: str, templates: Templates) -> None:
    with _sqlite_stores(templates) as open_store:
        run = EngineMatchesModel(open_store)
        try:
            for op, machine, key, *rest in SCRIPTS[name]:
                if op == "create":
                    data, adopt = rest
                    run._create(machine, key, data, adopt)
                elif op == "expect":
                    (state,) = rest
                    assert run.engine.get(f"{machine}:{key}").state == state
                    assert run.model[machine, key].state == state
                elif op == "fire":
                    trigger, payload = rest
                    run._fire_or_step(machine, key, trigger, payload, "script")
                else:
                    run._fire_or_step(machine, key, None, {}, "script")
                for resource in run.model.values():
                    run._check_resource(resource)
        finally:
            run.teardown()
