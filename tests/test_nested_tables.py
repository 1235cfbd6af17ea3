"""A nested machine decides from tables learnt from ``transitions``' HierarchicalMachine
(``CompiledMachine``); these tests ask both, the tables and the hierarchical machine's own
trigger path, the same questions, and require the same answers: whether it fired, to which
leaf, by which edge, which guards were asked in which order (each once) with which verdicts,
and which risky edges were held back by their freshness rule. On the built-in nested
machines and on generated nested machines (parents' edges inherited by children, ``*``
sources, initial children entered, eventless edges, unless guards, risky edges).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle import MachineSpec
from lifecycle.compiled import CompiledMachine, GuardContext, hierarchical
from lifecycle.machines import builtins
from lifecycle.results import Observation
from lifecycle.spec import EVENTLESS

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
OBSERVATIONS = {
    "none": None,
    "fresh": Observation(1, {"s": 1}, NOW, NOW, "test"),
    "old": Observation(2, {"s": 1}, NOW - dt.timedelta(days=1), NOW, "test"),
}


class Verdicts:
    """Guards that answer from a table (default False) and record the order they were
    asked in."""

    def __init__(self, names: set[str], verdicts: dict[str, bool]) -> None:
        self.verdicts = verdicts
        self.asked: list[str] = []
        self.guards = {name: self._guard(name) for name in names}

    def _guard(self, name: str) -> Any:
        def guard(context: GuardContext) -> bool:
            self.asked.append(name)
            return self.verdicts.get(name, False)
        return guard


def _context(spec: MachineSpec, leaf: str, observed: str) -> GuardContext:
    return GuardContext(spec.name, "k", leaf, 3, {}, {}, NOW, OBSERVATIONS[observed],
                        NOW - dt.timedelta(hours=1))


class _Model:
    state: str


class Pair:
    """A spec's compiled machine and its hierarchical reference, each on guards of its own
    that answer from the verdicts set before each comparison."""

    def __init__(self, spec: MachineSpec) -> None:
        self.tables = Verdicts(spec.guard_names(), {})
        self.reference = Verdicts(spec.guard_names(), {})
        self.compiled = CompiledMachine(spec, self.tables.guards)
        self.machine = hierarchical(spec, self.reference.guards)
        self.model = _Model()
        self.machine.add_model(self.model, initial=spec.graph.enter(spec.initial))


_BUILT: dict[str, Pair] = {}


def built_in(name: str) -> tuple[MachineSpec, Pair]:
    """A built-in machine's spec and its pair, made once for the module: as an engine's
    compiled machine does, one pair decides every question asked of it, on any verdicts
    (building the two machines of startd's spec anew for each hypothesis example was most
    of this module's time)."""
    spec = builtins()[name].spec
    if name not in _BUILT:
        _BUILT[name] = Pair(spec)
    return spec, _BUILT[name]


def _compare(spec: MachineSpec, verdicts: dict[str, bool], observed: str,
             pair: Pair | None = None) -> int:
    """Ask every leaf and every trigger of ``spec`` through both paths; how many fired.
    (``pair``: the machines to ask, if not new ones.)"""
    pair = pair or Pair(spec)
    tables, reference = pair.tables, pair.reference
    tables.verdicts = reference.verdicts = verdicts
    compiled, machine, model = pair.compiled, pair.machine, pair.model
    fired = 0
    for leaf in spec.graph.leaves:
        for trigger in [*sorted(spec.triggers), EVENTLESS]:
            if not compiled.candidates(leaf, trigger):
                continue  # decide() answers these without any machine
            tables.asked.clear()
            reference.asked.clear()
            ours = _context(spec, leaf, observed)
            decision = compiled.decide(leaf, trigger, ours)
            theirs = _context(spec, leaf, observed)
            machine.set_state(leaf, model)
            took = model.trigger(trigger, ctx=theirs)  # type: ignore[attr-defined]
            where = f"{spec.name}: {trigger!r} from {leaf!r} with {verdicts}, {observed}"
            assert decision.fired == took, where
            # each guard asked once per decision, in the order the machine first asks it
            assert tables.asked == list(dict.fromkeys(reference.asked)), where
            assert ours.guards == theirs.guards, where
            assert [(id(e), p) for e, p in ours.stale] == [
                (id(e), p) for e, p in theirs.stale], where
            if took:
                fired += 1
                assert decision.edge is theirs.edge, where
                assert decision.dest == model.state, where
            else:
                assert decision.reason, where
    return fired


NESTED = sorted(name for name, builtin in builtins().items()
                if any(state.states for state in builtin.spec.states))


def test_there_are_nested_builtins() -> None:
    assert "batch_job" in NESTED


@pytest.mark.parametrize("name", NESTED)
@pytest.mark.parametrize("observed", sorted(OBSERVATIONS))
@pytest.mark.parametrize("everything", [False, True])
def test_builtin_nested_tables_match_the_hierarchical_machine(
        name: str, observed: str, everything: bool) -> None:
    spec, pair = built_in(name)
    _compare(spec, dict.fromkeys(spec.guard_names(), everything), observed, pair)


@pytest.mark.parametrize("name", NESTED)
@given(data=st.data())
@SETTINGS
def test_builtin_nested_tables_match_on_any_verdicts(name: str, data: st.DataObject) -> None:
    spec, pair = built_in(name)
    names = sorted(spec.guard_names())
    verdicts = data.draw(st.fixed_dictionaries({n: st.booleans() for n in names}))
    _compare(spec, verdicts, data.draw(st.sampled_from(sorted(OBSERVATIONS))), pair)


# -- generated nested machines ----------------------------------------------------------------

GUARDS = ["g1", "g2", "g3"]
TRIGGERS = ["go", "stop"]


@st.composite
def trees(draw: st.DrawFn, depth: int = 0, prefix: str = "") -> list[Any]:
    count = draw(st.integers(1, 3))
    out: list[Any] = []
    for i in range(count):
        name = f"{'abc'[depth]}{i}"
        if depth < 2 and draw(st.booleans()):
            children = draw(trees(depth + 1, f"{prefix}{name}."))
            initial = draw(st.sampled_from([c if isinstance(c, str) else c["name"]
                                            for c in children]))
            out.append({"name": name, "states": children, "initial": initial})
        else:
            out.append(name)
    return out


def _names(states: list[Any], prefix: str = "") -> list[str]:
    out = []
    for state in states:
        name = state if isinstance(state, str) else state["name"]
        out.append(prefix + name)
        if not isinstance(state, str):
            out += _names(state["states"], f"{prefix}{name}.")
    return out


@st.composite
def nested_specs(draw: st.DrawFn) -> MachineSpec:
    states = draw(trees())
    if all(isinstance(s, str) for s in states):
        states.append({"name": "p", "states": ["x", "y"], "initial": "x"})
    names = _names(states)
    sources = st.sampled_from([*names, "*"])

    def edge() -> dict[str, Any]:
        source = draw(sources | st.lists(st.sampled_from(names), min_size=1, max_size=3,
                                         unique=True))
        out: dict[str, Any] = {
            "source": source, "dest": draw(st.sampled_from(names)),
            "guards": draw(st.lists(st.sampled_from(GUARDS), max_size=2, unique=True)),
            "unless": draw(st.lists(st.sampled_from(GUARDS), max_size=1)),
        }
        if draw(st.integers(0, 3)) == 0:
            out["fresh"] = {"max_age": 60}
        return out

    transitions = [{"trigger": draw(st.sampled_from(TRIGGERS)), **edge()}
                   for _ in range(draw(st.integers(1, 8)))]
    eventless = [edge() for _ in range(draw(st.integers(0, 4)))]
    first = states[0] if isinstance(states[0], str) else states[0]["name"]
    return MachineSpec.model_validate({"name": "generated", "states": states,
                                       "initial": first, "transitions": transitions,
                                       "eventless": eventless})


@given(spec=nested_specs(), verdicts=st.fixed_dictionaries({g: st.booleans() for g in GUARDS}),
       observed=st.sampled_from(sorted(OBSERVATIONS)))
@settings(SETTINGS, max_examples=150)
def test_generated_nested_tables_match_the_hierarchical_machine(
        spec: MachineSpec, verdicts: dict[str, bool], observed: str) -> None:
    _compare(spec, verdicts, observed)


def test_a_parent_edge_is_inherited_and_the_initial_child_entered() -> None:
    spec = MachineSpec.model_validate({
        "name": "m", "initial": "a",
        "states": [{"name": "a", "initial": "x", "states": ["x", "y"]},
                   {"name": "b", "initial": "p", "states": ["q", "p"]}],
        "transitions": [{"trigger": "go", "source": "a", "dest": "b"},
                        {"trigger": "go", "source": "a.y", "dest": "a.x", "guards": ["g1"]}],
    })
    assert _compare(spec, {"g1": False}, "none") == 2  # from a.x and a.y, by the parent's
    compiled = CompiledMachine(spec, Verdicts({"g1"}, {"g1": True}).guards)
    decision = compiled.decide("a.y", "go", _context(spec, "a.y", "none"))
    assert (decision.dest, decision.edge) == ("a.x", spec.transitions[1])
    decision = compiled.decide("a.x", "go", _context(spec, "a.x", "none"))
    assert (decision.dest, decision.edge) == ("b.p", spec.transitions[0])


def test_a_guard_is_asked_once_per_decision_however_many_edges_name_it() -> None:
    """The drone's status table from ``available``: ``rs_running`` is the first guard of
    three edges and is asked once; the verdicts kept are those of every guard asked."""
    from lifecycle.machines import drone

    asked: list[str] = []

    def counting(name: str, guard: Any) -> Any:
        def counted(context: GuardContext) -> bool:
            asked.append(name)
            return bool(guard(context))
        return counted

    compiled = CompiledMachine(drone.SPEC, {name: counting(name, guard)
                                            for name, guard in drone.GUARDS.items()})
    observation = Observation(1, {"resource_status": "Running", "machine_status": "Available"},
                              NOW, NOW, "test")
    context = GuardContext("drone", "d1", "available", 3, {"demand": 1}, {}, NOW, observation,
                           NOW - dt.timedelta(hours=1))
    decision = compiled.decide("available", EVENTLESS, context)
    assert not decision.fired
    assert sorted(asked) == sorted(set(asked)) and asked.count("rs_running") == 1
    assert list(context.guards) == asked
    assert context.guards["rs_running"] is True and context.guards["ms_draining"] is False
    assert decision.reason is not None and "'ms_draining' is false" in decision.reason
