"""The checker on generated machines and worlds: every counterexample it reports replays on
the real engine and worker to the same violation (each state it found along the way, then
the broken invariant's own expectation, which fails); a bad state planted k moves from the
start is found at exactly k moves, and not within k - 1.

A generated machine has states ``s0``..``sN``; triggers between them; eventless edges
guarded by the newest observation's value (some risky, with a freshness rule); and an
effect, ``poke``, on some edges, whose handler records itself in the world and fires the
follow-up ``poked``. Its world sets the value the world has, reports it (as of now), fires
the triggers, and lets time pass. The examples are bounded (no deadline: a busy machine only
makes them slower)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle.check import (
    Action,
    Bounds,
    Create,
    Eventually,
    Fire,
    Invariant,
    Model,
    Observe,
    SetWorld,
    View,
    check,
    text,
    write_scenario,
)
from lifecycle.check.explore import STUTTER, Machine, enabled
from lifecycle.check.memory import Memory
from lifecycle.effects import FollowUp
from lifecycle.scenario import replay
from lifecycle.spec import MachineSpec

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
VALUES = (0, 1, 2)


def _is(value: int) -> Any:
    return lambda c: c.status.get("v") == value


GUARDS = {f"is_{v}": _is(v) for v in VALUES}


def _simulation(world: Any) -> tuple[Any, Any, Any]:
    def poke(call: Any) -> FollowUp:
        world.actions.append(("poke", call.key, {"v": world.status.get(call.key, {}).get("v")}))
        return FollowUp("poked")
    return GUARDS, {"poke": poke}, {}


@st.composite
def machines(draw: st.DrawFn, planted: int | None = None) -> Machine:
    """A machine of ``s0``..``sN``; with ``planted`` = k, ``bad`` is reached only from
    ``s{k-1}`` and no edge skips ahead, so its shortest path is k moves of the world."""
    count = draw(st.integers(2, 5)) if planted is None else planted
    states = [f"s{i}" for i in range(count)]

    def reach(source: int) -> st.SearchStrategy[int]:
        top = count - 1 if planted is None else min(source + 1, count - 1)
        return st.integers(0, top)

    # a chain s0 -go-> s1 -go-> ... keeps every state reachable; the drawn edges go anywhere
    # (planted: back, to itself or one ahead, so no path to bad is shorter than the chain)
    transitions: list[dict[str, Any]] = [
        {"trigger": "go", "source": states[i], "dest": states[i + 1]} for i in range(count - 1)]
    eventless = []
    for i in range(count):
        for n in range(draw(st.integers(0, 2))):
            edge: dict[str, Any] = {"trigger": f"t{n}", "source": states[i],
                                    "dest": states[draw(reach(i))]}
            if draw(st.booleans()):
                edge["effects"] = ["poke"]
            transitions.append(edge)
        if draw(st.booleans()):
            guarded: dict[str, Any] = {"source": states[i], "dest": states[draw(reach(i))],
                                       "guards": [f"is_{draw(st.sampled_from(VALUES))}"]}
            if draw(st.booleans()):
                guarded["fresh"] = {"max_age": 10}
            eventless.append(guarded)
    transitions.append({"trigger": "poked", "source": states, "dest": states[0]}
                       if planted is None else
                       {"trigger": "poked", "source": states[0], "dest": states[0]})
    if planted is not None:
        transitions.append({"trigger": "go_bad", "source": states[-1], "dest": "bad"})
    spec = MachineSpec.model_validate({
        "name": "generated", "initial": "s0",
        "states": [*states, *(["bad"] if planted is not None else [])],
        "transitions": _distinct(transitions), "eventless": eventless})
    return Machine(spec, GUARDS, _simulation)


def _distinct(transitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One edge per (trigger, source): the spec refuses overlapping ones."""
    seen, out = set(), []
    for t in transitions:
        sources = t["source"] if isinstance(t["source"], list) else [t["source"]]
        if any((t["trigger"], s) in seen for s in sources):
            continue
        seen.update((t["trigger"], s) for s in sources)
        out.append(t)
    return out


def _world(machine: Machine, fair: frozenset[str] = frozenset()) -> Model:
    """The world of a generated machine; ``fair``: the triggers it is bound to fire (and
    "report": the report), the others it may never fire."""
    triggers = sorted(machine.spec.triggers - {"poked"})

    def setup(resources: int) -> list[Any]:
        return [Create("r1"), SetWorld("r1", {"v": 0})]

    def actions(view: View) -> list[Action]:
        value = view.world("r1").get("v")
        out = [Action(f"the world's value becomes {v}", (SetWorld("r1", {"v": v}),))
               for v in VALUES if v != value]
        out.append(Action(f"r1 is reported {value}", (Observe("r1", {"v": value}),),
                          fair="report" if "report" in fair else False))
        here = view.machine_state("r1")
        out += [Action(f"fire {t}", (Fire("r1", t),), fair=t in fair) for t in triggers
                if any(e.trigger == t and here in e.sources for e in machine.spec.transitions)]
        return out

    # the last state: "bad" when one was planted, else the end of the chain
    last = machine.spec.states[-1].name
    return Model(machine, setup, actions, (_never(last), _no_poke_at(2)), ticks=(15.0,))


def _never(state: str) -> Invariant:
    def broken(before: View, after: View, actions: Any) -> str | None:
        return f"r1 entered {state}" if after.machine_state("r1") == state else None

    def expect(view: View, done: Any, hop: Any) -> list[dict[str, Any]]:
        return [{"expect": {"key": "r1", "state": "not " + state}}]
    return Invariant("never_" + state, f"r1 never enters {state}", broken, expect)


def _no_poke_at(value: int) -> Invariant:
    def broken(before: View, after: View, actions: Any) -> str | None:
        hit = any(name == "poke" and d["v"] == value for name, _, d in actions)
        return f"poked while the world's value was {value}" if hit else None

    def expect(view: View, done: Any, hop: Any) -> list[dict[str, Any]]:
        return [{"expect_actions": {"key": "r1", "actions": [
            name for name, _, d in [*done, *hop] if not (name == "poke" and d["v"] == value)]}}]
    return Invariant(f"no_poke_at_{value}", f"no poke while the value is {value}", broken,
                     expect)


@SETTINGS
@given(machine=machines())
def test_every_counterexample_replays_to_its_violation(machine: Machine,
                                                       tmp_path_factory: Any) -> None:
    report = check(_world(machine), Bounds(depth=5, horizon=30))
    assert report.violations or report.states > 1
    directory = Path(tmp_path_factory.mktemp("replays"))
    for name, example in report.violations.items():
        path = write_scenario(example, directory / f"{name}.yaml")
        result = replay(path, {"generated": machine})
        assert not result.passed and result.failure is not None, name
        # the last step is the invariant's own expectation: every state before it matched
        assert result.failure.kind == ("expect" if name.startswith("never_") else
                                       "expect_actions")
        assert result.failure.step == result.steps, (name, result.failure)


@SETTINGS
@given(data=st.data(), k=st.integers(1, 4))
def test_a_bad_state_planted_at_depth_k_is_found_at_depth_k(data: st.DataObject,
                                                            k: int) -> None:
    """``bad`` is k moves away: k - 1 ``go`` along the chain, then ``go_bad``; nothing the
    machine or its world does is a shortcut."""
    model = _world(data.draw(machines(planted=k)))
    found = check(model, Bounds(depth=k, horizon=30)).violations.get("never_bad")
    assert found is not None and len(found) == k
    assert "never_bad" not in check(model, Bounds(depth=k - 1, horizon=30)).violations


@pytest.mark.parametrize("k", [1, 3])
def test_a_chain_of_k_triggers_is_found_at_k(k: int) -> None:
    chain = [{"trigger": "go", "source": f"s{i}", "dest": f"s{i + 1}"} for i in range(k - 1)]
    spec = MachineSpec.model_validate({
        "name": "generated", "initial": "s0", "states": [*(f"s{i}" for i in range(k)), "bad"],
        "transitions": [*chain, {"trigger": "go_bad", "source": f"s{k - 1}", "dest": "bad"},
                        {"trigger": "poked", "source": "s0", "dest": "s0"}]})
    model = _world(Machine(spec, GUARDS, _simulation))
    assert len(check(model, Bounds(depth=k, horizon=0)).violations["never_bad"]) == k
    assert "never_bad" not in check(model, Bounds(depth=k - 1, horizon=0)).violations


def test_every_fair_loop_reported_is_a_fair_loop_that_never_meets_it(slow: bool) -> None:
    """``r1`` must come to the chain's last state. Each loop reported ends where it began,
    the property is not met on it, and every fair move enabled in all its states is taken
    on it; a state from which the last state cannot be reached has such a loop after it.

    Six machines by default (``--slow``: 15): a checker that takes a component whose fair
    moves are not all taken, or whose loop skips a fair move, fails within the first four,
    derandomized and with seeds 1, 2 and 3."""
    @settings(SETTINGS, max_examples=15 if slow else 6)
    @given(machine=machines(), data=st.data())
    def run(machine: Machine, data: st.DataObject) -> None:
        fair = frozenset(data.draw(st.sets(st.sampled_from(
            ["report", *sorted(machine.spec.triggers - {"poked"})]))))
        last = machine.spec.states[-1].name
        reach = Eventually("reach", f"r1 comes to {last}", lambda view: True,
                           lambda view: view.machine_state("r1") == last)
        model = _world(machine, fair)
        model = Model(model.machine, model.setup, model.actions, eventually=[reach],
                      ticks=model.ticks)
        bounds = Bounds(depth=8, horizon=15)
        report = check(model, bounds)
        if "reach" in report.stuck:
            assert "reach" in report.loops
        example = report.loops.get("reach")
        if example is None:
            return
        hops = example.hops
        cycle = hops[len(hops) - example.loop:]
        entry = hops[len(hops) - example.loop - 1].state if len(hops) > example.loop \
            else example.initial
        assert cycle[-1].state == entry
        memory = Memory(model.machine, model.start)
        states = [entry, *(h.state for h in cycle)]
        assert all(s.resources[0].state != last for s in states)
        moves = {state: enabled(model, memory, state, bounds) for state in states}
        taken = set()
        for before, hop in zip(states, cycle, strict=False):
            if hop.label == STUTTER:
                assert not any(f for _, _, f in moves[before])  # only where nothing fair is
                continue
            names = {f for label, moved, f in moves[before] if (label, moved) == (hop.label,
                                                                                  hop.moves)}
            assert names, hop.label  # a move enabled where it was taken
            taken |= names
        always = set.intersection(*({f for _, _, f in moves[s] if f is not None} for s in states))
        assert always <= taken

    run()


def _poked_back() -> Invariant:
    """A begun run of ``poke`` finishes, and its follow-up takes r1 back to s0 from
    elsewhere."""
    def broken(before: View, after: View, actions: Any) -> str | None:
        head = before.resource("r1").head()
        if head is None or head.begun is None or after.resource("r1").head() == head:
            return None
        moved = before.machine_state("r1") != "s0" == after.machine_state("r1")
        return "r1's poke finished and took it back to s0" if moved else None

    return Invariant("poked_back", "no poke's run takes r1 back to s0", broken, _unfinished)


def _spanned() -> Invariant:
    """A begun run finishes after the clock moved since it began (another move fell between
    its begin and its finish); ``begun_at`` is the model's tally of when it began."""
    def broken(before: View, after: View, actions: Any) -> str | None:
        head = before.resource("r1").head()
        if head is None or head.begun is None or after.resource("r1").head() == head:
            return None
        began = before.extra("begun_at")
        return f"r1's run began at {began:g} s and finished at {after.now:g} s" \
            if after.now > began else None

    return Invariant("spanned", "no run spans a move of the clock", broken, _unfinished)


def _unfinished(view: View, done: Any, hop: Any) -> list[dict[str, Any]]:
    """r1 as it was before the run finished: the replay, which records the run there (its
    follow-up, ``poked``, moves r1 to s0 and counts a version), fails on it."""
    previous = view.previous
    assert previous is not None
    before = previous.resource("r1")
    return [{"expect": {"key": "r1", "state": before.state, "version": before.version}}]


def _begun_at(view: View, actions: Any) -> dict[str, Any]:
    head = view.resource("r1").head()
    return {"begun_at": view.now} if head is not None and head.begun is not None \
        and actions else {}


@SETTINGS
@given(machine=machines())
def test_runs_begun_and_finished_replay_as_the_checker_ran_them(machine: Machine,
                                                                tmp_path_factory: Any) -> None:
    """A worker that runs effects at once (``overlap``): each run is two moves, begun and
    finished, with any other move between them (the world's value changing too); the
    scenario begins the run where the checker did (``begin_effect``: the handler sees the
    world as it was then) and records it at its finish (``finish_effect``), and every state
    the checker found after each move, the real engine and worker find too, up to the broken
    invariant's own expectation."""
    never = _never(machine.spec.states[-1].name)
    model = dataclasses.replace(_world(machine), overlap=True, tally=_begun_at,
                                invariants=(never, _poked_back(), _spanned(),
                                            _no_poke_at(2)))
    report = check(model, Bounds(depth=5, horizon=30))
    directory = Path(tmp_path_factory.mktemp("overlapping"))
    for name, example in report.violations.items():
        path = write_scenario(example, directory / f"{name}.yaml")
        result = replay(path, {"generated": machine})
        kind = "expect_actions" if name == "no_poke_at_2" else "expect"
        assert result.failure is not None and result.failure.kind == kind, name
        assert result.failure.step == result.steps, (name, result.failure)


def test_checking_a_machine_again_reuses_its_handlers_calls_and_finds_the_same() -> None:
    """The checker remembers what each handler call did with the machine (a handler is a
    function of its call, the world and the clock): checking the same machine again calls
    no handler and reports the same; from another start time, the calls are other calls."""
    calls = []

    def simulation(world: Any) -> tuple[Any, Any, Any]:
        guards, effects, probes = _simulation(world)

        def poke(call: Any) -> Any:
            calls.append(call.key)
            return effects["poke"](call)
        return guards, {"poke": poke}, probes

    spec = MachineSpec.model_validate({
        "name": "generated", "initial": "s0", "states": ["s0", "s1", "s2"],
        "transitions": [{"trigger": "go", "source": "s0", "dest": "s1", "effects": ["poke"]},
                        {"trigger": "go", "source": "s1", "dest": "s2"},
                        {"trigger": "poked", "source": ["s0", "s1", "s2"], "dest": "s0"}]})
    model = _world(Machine(spec, GUARDS, simulation))
    bounds = Bounds(depth=5, horizon=30)
    first = check(model, bounds, until_all=False)
    made = len(calls)
    assert made > 0 and "no_poke_at_2" in first.violations
    again = check(model, bounds, until_all=False)
    assert len(calls) == made
    assert text(again) == text(first) and again.states == first.states
    later = check(dataclasses.replace(model, start=model.start + dt.timedelta(hours=1)),
                  bounds, until_all=False)
    assert len(calls) == 2 * made and later.states == first.states
