"""A scenario's worker running several effects at once: ``begin_effect`` starts a resource's
queue head (its handler runs, its claim is held, its outcome kept) and ``finish_effect``
records it later, so that runs overlap; what is recorded is what the worker records."""

from __future__ import annotations

import datetime as dt
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lifecycle import Engine, FollowUp, MachineSpec, Worker
from lifecycle.clock import SimulatedClock
from lifecycle.outbox_admin import effect_records
from lifecycle.results import RUNNING
from lifecycle.scenario import (
    RUNNING as RUNS,
)
from lifecycle.scenario import (
    Run,
    World,
    begin_effect,
    finish_effect,
    replay,
)
from lifecycle.store import Store

pytestmark = pytest.mark.integration  # scenarios replay on a SQLite file

SPEC = MachineSpec.model_validate({
    "name": "press", "initial": "idle", "states": ["idle", "pressing", "pressed"],
    "final": ["pressed"],
    "transitions": [{"trigger": "press", "source": "idle", "dest": "pressing",
                     "effects": ["stamp"]},
                    {"trigger": "stamped", "source": "pressing", "dest": "pressed"}]})


def _simulation(world: World) -> tuple[Any, Any, Any]:
    def stamp(call: Any) -> FollowUp:  # stamps in the ink the world has when it runs
        world.actions.append(("stamp", call.key, {"ink": world.status[call.key]["ink"]}))
        return FollowUp("stamped")
    return {}, {"stamp": stamp}, {}


@dataclass(frozen=True)
class Press:
    """The machine, as a scenario names it: its spec, no guards, its simulated handler."""

    spec: MachineSpec
    guards: Mapping[str, Any]
    simulation: Any


PRESS = Press(SPEC, {}, _simulation)


def test_a_hand_written_scenario_overlaps_two_runs(tmp_path: Path) -> None:
    """a's run begins, b's begins and ends while a's is in flight, then a's ends: each
    handler ran at its begin, on the world as it was then; each outcome (the follow-up) is
    recorded at its finish, in the order the runs finished."""
    path = tmp_path / "overlap.yaml"
    path.write_text(textwrap.dedent("""\
        machine: press
        steps:
          - create: {key: a}
          - create: {key: b}
          - world: {key: a, status: {ink: blue}}
          - world: {key: b, status: {ink: blue}}
          - fire: {key: a, trigger: press}
          - fire: {key: b, trigger: press}
          - begin_effect: a
          - expect_actions: {key: a, actions: [stamp]}
          - expect: {key: a, state: pressing}
          - expect_world: {key: $running, status: {a: {}}}
          - begin_effect: b
          - expect_world: {key: $running, status: {a: {}, b: {}}}
          - finish_effect: b
          - expect: {key: b, state: pressed}
          - expect: {key: a, state: pressing}
          - expect_world: {key: $running, status: {a: {}, b: <missing>}}
          - finish_effect: a
          - expect: {key: a, state: pressed}
          - expect_world: {key: $running, status: {a: <missing>}}
          - expect_actions: {key: a, actions: [stamp]}
        """))
    result = replay(path, {"press": PRESS})
    assert result.passed, result.failure
    assert result.steps == 20


def test_a_scenario_that_expects_a_begun_runs_outcome_fails_on_it(tmp_path: Path) -> None:
    """Not a pass for want of trying: a begun run's follow-up is not recorded before its
    finish, and a run can be finished only once."""
    path = tmp_path / "early.yaml"
    base = textwrap.dedent("""\
        machine: press
        steps:
          - create: {key: a}
          - world: {key: a, status: {ink: blue}}
          - fire: {key: a, trigger: press}
          - begin_effect: a
        """)
    path.write_text(base + "  - expect: {key: a, state: pressed}\n")
    failure = replay(path, {"press": PRESS}).failure
    assert failure is not None and (failure.step, failure.kind) == (5, "expect")
    assert failure.found == {"state": "pressing"}
    path.write_text(base + "  - finish_effect: a\n  - finish_effect: a\n")
    failure = replay(path, {"press": PRESS}).failure
    assert failure is not None and (failure.step, failure.kind) == (6, "finish_effect")
    assert failure.found == "ValueError: a has no run begun"
    path.write_text(base + "  - begin_effect: a\n")
    failure = replay(path, {"press": PRESS}).failure
    assert failure is not None and (failure.step, failure.kind) == (5, "begin_effect")
    assert failure.found == "ValueError: a has a run begun and not finished"


def _engine(tmp_path: Path, name: str) -> tuple[Engine, World]:
    clock = SimulatedClock(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    world = World(clock=clock)
    guards, effects, probes = _simulation(world)
    store = Store(f"sqlite:///{tmp_path / name}", upgrade=True)
    engine = Engine(store, [SPEC], clock=clock, guards=guards, effects=effects,
                    probes=probes)
    for key in ("a", "b"):
        engine.create("press", key, actor="test")
        world.status[key] = {"ink": "blue"}
        engine.fire(key, "press", actor="test")
    return engine, world


def _recorded(engine: Engine) -> dict[str, Any]:
    """What the outbox and the journal hold of each resource, as the worker left them."""
    return {key: ([(e.name, e.status, e.attempts, e.last_error)
                   for e in effect_records(engine, key)],
                  [(j.kind, j.trigger, j.source, j.dest, j.version, j.actor)
                   for j in engine.history(key)],
                  engine.get(key).state)
            for key in ("a", "b")}


def test_begun_runs_record_what_the_worker_records(tmp_path: Path) -> None:
    """Overlapping runs, a's begun first and finished last, leave the outbox and the
    journals as the worker's own loop leaves them; while begun, a run's effect is held
    (running, claimed) and its handler has run on the world as it was then."""
    engine, world = _engine(tmp_path, "overlap.db")
    worker_engine, _ = _engine(tmp_path, "worker.db")
    try:
        runs: dict[str, Run] = {"a": begin_effect(engine, "a", world)}
        assert [(e.status, e.claimed_by is not None) for e in effect_records(engine, "a")] \
            == [(RUNNING, True)]
        world.status["b"] = {"ink": "red"}
        runs["b"] = begin_effect(engine, "b", world)
        assert world.status[RUNS] == {"a": {}, "b": {}}
        assert finish_effect(runs, "b", world) == "stamp"
        assert engine.get("b").state == "pressed" and engine.get("a").state == "pressing"
        assert finish_effect(runs, "a", world) == "stamp"
        assert RUNS not in world.status and runs == {}
        assert world.actions == [("stamp", "a", {"ink": "blue"}),
                                 ("stamp", "b", {"ink": "red"})]
        Worker(worker_engine, seed=0, concurrency=2).run_until_idle()
        assert _recorded(engine) == _recorded(worker_engine)
    finally:
        engine.store.dispose()
        worker_engine.store.dispose()
