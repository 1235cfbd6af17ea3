"""The engine on a SQLite file and on PostgreSQL: create, fire, refusals, nested states,
eventless steps, history, keys, data, and specs stored in the database."""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncio_kinds import KINDS, closing, engine_of
from databases import round_trips
from pydantic import BaseModel

from lifecycle import Engine, GuardContext, LifecycleError, SimulatedClock, Store
from lifecycle.errors import (
    AmbiguousKey,
    GuardError,
    InvalidData,
    ResourceExists,
    SpecError,
    StrandedResources,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)

SLOT: dict[str, Any] = {
    "name": "slot",
    "initial": "unclaimed",
    "final": ["gone"],
    "states": [
        "unclaimed",
        {"name": "claimed", "initial": "idle", "states": ["idle", "busy"]},
        "cleanup",
        "gone",
    ],
    "transitions": [
        {"trigger": "claim", "source": "unclaimed", "dest": "claimed", "guards": ["has_claim_id"]},
        {"trigger": "activate", "source": "claimed.idle", "dest": "claimed.busy"},
        {"trigger": "deactivate", "source": "claimed.busy", "dest": "claimed.idle"},
        {"trigger": "release", "source": "claimed", "dest": "cleanup"},
        {"trigger": "finish", "source": "cleanup", "dest": "gone", "unless": ["busy_elsewhere"]},
        {"trigger": "retire", "source": "*", "dest": "gone", "merge_payload": False},
    ],
    "eventless": [
        {"source": "cleanup", "dest": "unclaimed", "guards": ["recycle"]},
    ],
}

GUARDS = {
    "has_claim_id": lambda c: bool(c.payload.get("claim_id")),
    "busy_elsewhere": lambda c: bool(c.data.get("busy_elsewhere")),
    "recycle": lambda c: bool(c.data.get("recycle")),
}


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock("2026-03-01T12:00:00Z")


@pytest.fixture(params=KINDS)
def engine(store: Store, clock: SimulatedClock, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The Engine, and the same engine driven as an AsyncEngine (tests/asyncio_kinds.py)."""
    engine = engine_of(request.param, store, [SLOT], guards=GUARDS, clock=clock)
    yield engine
    closing(engine)()


def test_create_and_fire_through_nested_states(engine: Engine, clock: SimulatedClock) -> None:
    created = engine.create("slot", "slot1@host", {"memory": 2048})
    assert (created.state, created.version) == ("unclaimed", 1)
    clock.advance(5)
    result = engine.fire("slot1@host", "claim", {"claim_id": "<1.2.3.4:9618>#1"}, actor="schedd")
    assert result.fired and (result.source, result.dest, result.version) == (
        "unclaimed", "claimed.idle", 2)
    assert engine.fire("slot1@host", "activate").dest == "claimed.busy"
    # a transition declared on the parent applies to its children
    released = engine.fire("slot1@host", "release")
    assert (released.source, released.dest, released.version) == ("claimed.busy", "cleanup", 4)
    resource = engine.get("slot1@host")
    assert resource.state == "cleanup"
    assert resource.data == {"memory": 2048, "claim_id": "<1.2.3.4:9618>#1"}
    assert resource.updated_at == clock.now()


def test_refused_fire_says_why_and_writes_nothing(engine: Engine) -> None:
    engine.create("slot", "s")
    refused = engine.fire("s", "claim", {"claim_id": ""})
    assert not refused.fired
    assert refused.reason == "guard 'has_claim_id' is false"
    assert refused.guards == {"has_claim_id": False}
    wrong_state = engine.fire("s", "activate")
    assert not wrong_state
    assert wrong_state.reason == (
        "no transition for 'activate' from 'unclaimed' (triggers here: claim, retire)")
    assert engine.get("s").version == 1
    assert [e.kind for e in engine.history("s")] == ["create"]


def test_unless_guard_refuses(engine: Engine) -> None:
    engine.create("slot", "s", {"busy_elsewhere": True}, state="cleanup")
    refused = engine.fire("s", "finish")
    assert refused.reason == "unless guard 'busy_elsewhere' is true"


def test_unknown_trigger_raises(engine: Engine) -> None:
    engine.create("slot", "s")
    with pytest.raises(UnknownTrigger, match="machine 'slot' has no trigger 'clam'"):
        engine.fire("s", "clam")


def test_eventless_step(engine: Engine) -> None:
    engine.create("slot", "s", {"recycle": False}, state="cleanup")
    assert not engine.step("s")
    engine.create("slot", "t", {"recycle": True}, state="cleanup")
    stepped = engine.step("t")
    assert stepped and (stepped.source, stepped.dest) == ("cleanup", "unclaimed")
    assert engine.step("t").reason == "no eventless transition from 'unclaimed'"
    entries = engine.history("t")
    assert entries[-1].trigger is None and entries[-1].guards == {"recycle": True}


def test_an_unconditional_eventless_step_journals_no_trigger(store: Store) -> None:
    """A step whose edge has no condition at all (decided before the row is read, on SQLite
    in one pass): shown as ``(step)``, journaled with no trigger, as a guarded step is."""
    engine = Engine(store, [{"name": "hop", "initial": "a", "states": ["a", "b"], "final": ["b"],
                             "eventless": [{"source": "a", "dest": "b"}]}])
    engine.create("hop", "h")
    stepped = engine.step("hop:h", actor="me")
    assert stepped and (stepped.trigger, stepped.source, stepped.dest) == ("(step)", "a", "b")
    assert [(e.kind, e.trigger, e.actor) for e in engine.history("hop:h")] == [
        ("create", None, None), ("transition", None, "me")]


def test_history_records_every_transition(engine: Engine, clock: SimulatedClock) -> None:
    engine.create("slot", "s", {"memory": 1}, actor="admin")
    clock.advance(1)
    engine.fire("s", "claim", {"claim_id": "c1"}, actor="schedd")
    clock.advance(1)
    engine.fire("s", "retire", {"why": "decommissioned"}, actor="admin")
    entries = engine.history("s")
    assert [(e.seq, e.kind, e.trigger, e.source, e.dest, e.version, e.actor) for e in entries] == [
        (1, "create", None, None, "unclaimed", 1, "admin"),
        (2, "transition", "claim", "unclaimed", "claimed.idle", 2, "schedd"),
        (3, "transition", "retire", "claimed.idle", "gone", 3, "admin"),
    ]
    assert entries[1].guards == {"has_claim_id": True}
    assert entries[2].payload == {"why": "decommissioned"}
    assert entries[2].at == clock.now()
    # merge_payload: false keeps the payload out of the data
    assert "why" not in engine.get("s").data
    assert all(e.spec_version == engine.spec("slot").version for e in entries)


def test_adopting_a_resource_in_a_state(engine: Engine) -> None:
    adopted = engine.create("slot", "s", state="claimed")
    assert adopted.state == "claimed.idle"
    assert engine.history("s")[0].kind == "adopt"
    with pytest.raises(UnknownState, match="machine 'slot' has no state 'claimd'"):
        engine.create("slot", "t", state="claimd")


def test_keys(engine: Engine, store: Store) -> None:
    other = copy.deepcopy(SLOT)
    other["name"] = "slot2"
    engine.register(other)
    engine.create("slot", "shared")
    engine.create("slot2", "shared")
    with pytest.raises(AmbiguousKey, match="slot2:shared"):
        engine.fire("shared", "retire")
    assert engine.fire("slot2:shared", "retire").machine == "slot2"
    assert engine.get("slot:shared").state == "unclaimed"
    with pytest.raises(ResourceExists):
        engine.create("slot", "shared")
    with pytest.raises(UnknownResource, match="no resource with key 'nope'"):
        engine.fire("nope", "claim")
    with pytest.raises(UnknownMachine, match="unknown machine 'slto'"):
        engine.create("slto", "x")
    for bad in ("", " padded", "a:b"):
        with pytest.raises(LifecycleError, match="invalid key"):
            engine.create("slot", bad)


class SlotData(BaseModel):
    memory: int
    owner: str = "condor"


def test_data_model_validates_create_and_payload(store: Store) -> None:
    spec = {**SLOT, "data_model": SlotData}
    engine = Engine(store, [spec], guards=GUARDS)
    assert engine.create("slot", "s", {"memory": "2048"}).data == {"memory": 2048,
                                                                  "owner": "condor"}
    with pytest.raises(InvalidData, match="memory: Input should be a valid integer"):
        engine.create("slot", "t", {"memory": "lots"})
    with pytest.raises(InvalidData, match="memory"):
        engine.fire("s", "claim", {"claim_id": "c", "memory": "lots"})
    assert engine.get("s").version == 1


def test_guard_that_raises_is_reported_and_nothing_is_written(store: Store) -> None:
    def broken(_: GuardContext) -> bool:
        raise KeyError("claim_id")

    engine = Engine(store, [SLOT], guards={**GUARDS, "has_claim_id": broken})
    engine.create("slot", "s")
    with pytest.raises(GuardError, match="guard 'has_claim_id' raised KeyError"):
        engine.fire("s", "claim")
    assert engine.get("s").version == 1


def test_unregistered_guard_names_are_refused_at_registration(store: Store) -> None:
    with pytest.raises(SpecError) as caught:
        Engine(store, [SLOT], guards={"recycle": GUARDS["recycle"]})
    text = str(caught.value)
    assert "transitions[0]: guard 'has_claim_id' is not registered with this engine" in text
    assert "transitions[4]: guard 'busy_elsewhere' is not registered" in text


def test_specs_are_stored_and_found_by_another_engine(engine: Engine, store: Store) -> None:
    engine.create("slot", "s")
    # another process knows nothing but the key: the machine comes from the database
    other = Engine(Store(store.url), guards=GUARDS)
    assert other.fire("s", "retire").dest == "gone"
    assert other.spec("slot").version == engine.spec("slot").version
    assert other.history("s")[1].spec_version == engine.spec("slot").version


def test_changed_spec_keeps_running_resources(engine: Engine, store: Store) -> None:
    engine.create("slot", "s")
    old_version = engine.spec("slot").version
    changed = copy.deepcopy(SLOT)
    changed["transitions"].append({"trigger": "drain", "source": "unclaimed", "dest": "cleanup"})
    spec = engine.register(changed)
    assert spec.version != old_version
    assert engine.fire("s", "drain").dest == "cleanup"
    assert [e.spec_version for e in engine.history("s")] == [old_version, spec.version]
    assert engine.verify() == []


def test_changed_spec_that_strands_live_resources_is_refused(engine: Engine) -> None:
    engine.create("slot", "live", state="cleanup")
    engine.create("slot", "dead", state="cleanup")
    engine.fire("dead", "finish")
    changed = copy.deepcopy(SLOT)
    changed["states"] = [s for s in changed["states"] if s != "cleanup"]
    changed["transitions"] = [t for t in changed["transitions"]
                              if "cleanup" not in (t["source"], t["dest"])]
    changed["transitions"].append({"trigger": "release", "source": "claimed", "dest": "gone"})
    changed["eventless"] = []
    with pytest.raises(StrandedResources, match=r"1 live resources .*live \(in 'cleanup'\)"):
        engine.register(changed)
    assert engine.spec("slot").version == Engine(engine.store, guards=GUARDS).spec("slot").version


def test_machines_registered_together_stop_at_one_that_strands_resources(
        store: Store) -> None:
    """An engine's machines are registered as each on its own would be, in order: the specs
    before a refused one are registered, the refused one and those after it are not."""
    first = Engine(store, [SLOT], guards=GUARDS)
    first.create("slot", "live", state="cleanup")
    before, after = copy.deepcopy(SLOT), copy.deepcopy(SLOT)
    before["name"], after["name"] = "before", "after"
    changed = copy.deepcopy(SLOT)
    changed["states"] = [s for s in changed["states"] if s != "cleanup"]
    changed["transitions"] = [t for t in changed["transitions"]
                              if "cleanup" not in (t["source"], t["dest"])]
    changed["eventless"] = []
    with pytest.raises(StrandedResources, match=r"live \(in 'cleanup'\)"):
        Engine(store, [before, changed, after], guards=GUARDS)
    again = Engine(store, guards=GUARDS)
    assert again.machine_names() == ["before", "slot"]
    assert again.spec("slot").version == first.spec("slot").version


def test_an_engine_of_machines_the_database_runs_starts_with_one_read(counted: Any) -> None:
    """On a database whose machines run the engine's specs already (every process's
    start after the first), building the engine is one statement: no write transaction, no
    lock. A spec that changed is registered, and runs."""
    with Store(counted.url) as store:
        Engine(store, [SLOT, TIMED], guards={**GUARDS, "back": lambda c: True},
               strict=False)
        trips = round_trips(counted, lambda: Engine(
            store, [SLOT, TIMED], guards={**GUARDS, "back": lambda c: True}, strict=False))
        assert trips == 1
        changed = copy.deepcopy(SLOT)
        changed["transitions"].append({"trigger": "drain", "source": "unclaimed",
                                       "dest": "cleanup"})
        engine = Engine(store, [changed, TIMED], guards={**GUARDS, "back": lambda c: True},
                        strict=False)
        assert Engine(store).spec("slot").version == engine.spec("slot").version
        engine.create("slot", "s")
        assert engine.fire("s", "drain").dest == "cleanup"


def test_verify_finds_a_tampered_resource(engine: Engine, store: Store) -> None:
    from sqlalchemy import update

    from lifecycle.store import resources

    engine.create("slot", "s")
    engine.fire("s", "retire")
    assert engine.verify() == []
    with store.begin() as db:
        db.execute(update(resources).where(resources.c.key == "s").values(state="cleanup",
                                                                          version=7))
    found = [str(m) for m in engine.verify()]
    assert "slot:s: journal replays to state 'gone' but the resource is in 'cleanup'" in found
    assert "slot:s: journal replays to version 2 but the resource has 7" in found


def test_available_triggers(engine: Engine) -> None:
    engine.create("slot", "s", state="claimed.busy")
    assert engine.available_triggers("s") == ["deactivate", "release", "retire"]


def test_payload_json_cannot_hold_is_refused(engine: Engine) -> None:
    engine.create("slot", "s")
    with pytest.raises(InvalidData, match=r"payload\.load: is nan, not a finite number"):
        engine.fire("s", "claim", {"claim_id": "c", "load": float("nan")})
    with pytest.raises(InvalidData, match=r"payload\.when: is a Python object, not a JSON value"):
        engine.fire("s", "claim", {"claim_id": "c", "when": object()})
    with pytest.raises(InvalidData, match=r"data\.x: is inf, not a finite number"):
        engine.create("slot", "t", {"x": float("inf")})
    assert engine.get("s").version == 1
    assert [r.key for r in engine.resources("slot")] == ["s"]


def test_update_changes_data_not_state(engine: Engine, clock: SimulatedClock) -> None:
    created = engine.create("slot", "s", {"memory": 1})
    clock.advance(5)
    updated = engine.update("s", {"memory": 2, "owner": "alice"}, actor="admin")
    assert (updated.state, updated.version, updated.data) == (
        "unclaimed", 2, {"memory": 2, "owner": "alice"})
    # the resource was created when it was created, and updated now
    assert updated.created_at == created.created_at == engine.get("s").created_at
    assert updated.updated_at == clock.now() > created.created_at
    last = engine.history("s")[-1]
    assert (last.kind, last.source, last.dest, last.version, last.payload, last.actor) == (
        "update", "unclaimed", "unclaimed", 2, {"memory": 2, "owner": "alice"}, "admin")
    assert engine.fire("s", "claim", {"claim_id": "c"}).version == 3
    assert engine.verify() == []


def test_a_threads_connection_goes_back_to_the_pool_when_the_thread_ends(
        store: Store, clock: SimulatedClock) -> None:
    import threading

    engine = Engine(store, [SLOT], guards=GUARDS, clock=clock)  # threads: the sync engine's

    engine.create("slot", "s")
    # more threads than the pool holds (5 + 10 overflow): each fires once and ends, and its
    # end alone gives its connection back (no garbage collection: a full one of this test
    # process's heap, once a round, cost seconds)
    for round_ in range(20):
        thread = threading.Thread(target=lambda: engine.fire("s", "retire"))
        thread.start()
        thread.join()
        assert store.engine.pool.checkedout() <= 1, f"round {round_}"
    assert len(store._held._held) <= 1  # the main thread's, from create()


def test_the_eventless_name_fired_at_a_missing_resource_says_the_resource_is_missing(
        engine: Engine) -> None:
    """`_eventless` is no trigger (eventless edges are stepped), but a key that names no
    resource is the first thing wrong, as for any trigger; on a resource, the refusal names
    its machine, its triggers, and step()."""
    with pytest.raises(UnknownResource, match="no resource with key 'nowhere'"):
        engine.fire("nowhere", "_eventless")
    engine.create("slot", "slot1@host", {"memory": 2048})
    with pytest.raises(UnknownTrigger, match=r"machine 'slot' has no trigger '_eventless' "
                                             r"\(eventless edges are taken by step\(\), "
                                             r"not fired\); its triggers: .*claim"):
        engine.fire("slot1@host", "_eventless")
    with pytest.raises(UnknownMachine) as known:
        engine.create("door", "d1")
    assert known.value.known.count("slot") == 1          # each machine named once


# -- round trips on PostgreSQL ------------------------------------------------------------

TIMED: dict[str, Any] = {
    "name": "timed",
    "initial": "a",
    "final": ["c"],
    "states": [{"name": "a", "timeout": {"after": 60, "trigger": "expire"}}, "b", "c"],
    "transitions": [
        {"trigger": "flip", "source": "a", "dest": "b", "effects": ["ping"]},
        {"trigger": "flip", "source": "b", "dest": "a"},
        {"trigger": "expire", "source": "a", "dest": "c"},
    ],
    "eventless": [{"source": "b", "dest": "a", "guards": ["back"]}],
}



def test_a_write_on_postgresql_costs_two_round_trips(counted: Any) -> None:
    """Its read, then its writes (with the BEGIN and COMMIT when there are several); a
    create, which reads nothing, one; an observation, or a batch of them, one (its statement
    finds the resources by key); a batch two, whatever its size, and one when it writes
    nothing (the step_many here moves none)."""
    with Store(counted.url) as store:
        engine = Engine(store, [TIMED], guards={"back": lambda c: True},
                        effects={"ping": lambda call: None})
        trips: dict[str, list[int]] = {}

        def count(what: str, times: int, op: Any) -> None:
            for i in range(times):
                trips.setdefault(what, []).append(round_trips(counted, lambda i=i: op(i)))

        for i in range(6):  # psycopg prepares a statement on its sixth run (once
            engine.create("timed", f"p{i}")  # per connection): a round trip of its own
            engine.fire(f"timed:p{i}", "flip")  # when sent alone; not counted below
            engine.step(f"timed:p{i}")
            engine.observe(f"timed:p{i}", {"n": i})
            engine.update(f"timed:p{i}", {"n": i})
            engine.observe_many([(f"timed:p{j}", {"n": i}) for j in range(i + 1)])
            engine.step_many([f"timed:p{j}" for j in range(i + 1)])
        count("create", 6, lambda i: engine.create("timed", f"r{i}"))
        count("fire", 6, lambda i: engine.fire(f"timed:r{i}", "flip"))  # with an effect
        count("step", 6, lambda i: engine.step(f"timed:r{i}"))
        count("observe", 6, lambda i: engine.observe(f"timed:r{i}", {"n": i}))
        count("update", 6, lambda i: engine.update(f"timed:r{i}", {"n": i}))
        count("observe_many", 3, lambda i: engine.observe_many(
            [(f"timed:r{j}", {"n": i}) for j in range(6)]))
        count("step_many", 2, lambda i: engine.step_many(
            [f"timed:r{j}" for j in range(6)]))
        with store.read() as db:
            from sqlalchemy import select

            from lifecycle.store import resources, timers
            due = db.execute(select(timers.c.id, resources.c.key).join(
                resources, resources.c.id == timers.c.resource_id).where(
                timers.c.status == "pending", resources.c.key.like("r%")).order_by(
                timers.c.id)).all()

        def fire_timer(i: int) -> None:
            result = engine.fire_timer(due[i][0], f"timed:{due[i][1]}", "expire")
            assert result is not None and result.dest == "c"
        count("timer", 3, fire_timer)
    assert trips == {"create": [1] * 6, "fire": [2] * 6, "step": [2] * 6,
                     "observe": [1] * 6, "update": [2] * 6, "observe_many": [1] * 3,
                     "step_many": [1] * 2, "timer": [2] * 3}, trips


def test_compiling_a_machine_writes_nothing_and_a_write_stores_it_first(
        store: Store, clock: SimulatedClock) -> None:
    """``compiled`` (and ``spec``) read a machine that ``spec_for`` gives without storing it;
    the first write of one of its resources stores it (outside that write's transaction), so
    no journal row ever names a spec version the database does not hold."""
    engine = Engine(store, guards=GUARDS, clock=clock,
                    spec_for=lambda name: SLOT if name == "slot" else None)
    assert engine.compiled("slot").spec.name == "slot"
    assert engine.spec("slot").name == "slot"
    assert engine.machine_names() == []  # neither kept by this engine nor stored
    engine.create("slot", "s1")
    assert engine.machine_names() == ["slot"]
    [created] = engine.history("s1")
    assert created.spec_version == engine.spec("slot").version
    assert not engine.verify()


def test_a_sqlite_thread_writes_through_one_transaction_object_each_write_its_own(
        sqlite_url: str) -> None:
    """A thread's writes on SQLite share one Writing and Transaction (made once), yet each
    is a transaction of its own: one that raises is rolled back and the next commits; a
    write begun inside another is refused and leaves the outer one to commit."""
    with Store(sqlite_url, upgrade=True) as store:
        engine = Engine(store, [SLOT], guards=GUARDS)
        engine.create("slot", "s1")
        with store.write() as first:
            pass
        with pytest.raises(RuntimeError), store.write() as tx:
            tx.execute("UPDATE lifecycle_resources SET state = 'gone'")
            raise RuntimeError("undone")
        assert engine.get("s1").state == "unclaimed"
        with store.write() as outer:
            assert outer is first
            outer.execute("UPDATE lifecycle_resources SET data = '{\"x\": 1}'")
            with pytest.raises(Exception, match="within a transaction"), store.write():
                pass
        assert engine.get("s1").data == {"x": 1}
        assert engine.fire("s1", "retire").dest == "gone"


def test_the_positional_statements_bind_what_the_named_ones_do(sqlite_url: str) -> None:
    """On SQLite the hot write binds by position: each statement's ``?`` form takes its
    named parameters in the order the named text has them."""
    with Store(sqlite_url, upgrade=True) as store:
        positional = store.sql.positional
        assert store.sql.insert_journal in positional
        assert all(store.sql.move[key] in positional for key in store.sql.move)
        for named, (text, bind) in positional.items():
            names = re.findall(r":(\w+)", named)
            params = {name: f"<{name}>" for name in names}
            assert text.count("?") == len(names)
            assert bind(params) == tuple(params[name] for name in names)
            assert re.sub(r":\w+", "?", named) == text


def test_the_numbered_statements_of_a_sqlite_fire_are_the_catalogues(sqlite_url: str) -> None:
    """A common fire on SQLite runs the catalogue's read, move and journal insert with each
    parameter numbered (``?N``) by its place in the tuple the engine builds: naming each
    number back gives the named text, every name once. A numbering that leaves a name out
    (or adds one) is refused when the statements are compiled."""
    from lifecycle.store.statements import QuickFire
    from lifecycle.store.statements.compiling import numbered

    with Store(sqlite_url, upgrade=True) as store:
        sql, quick = store.sql, store.sql.quick
        assert quick is not None
        for text, named, order in (
                (quick.by_key, sql.resource_by_key, ("key",)),
                (quick.by_machine_key, sql.resource_by_machine_key, ("machine", "key")),
                (quick.move, sql.move[False, False], QuickFire.MOVE),
                (quick.journal, sql.insert_journal, QuickFire.JOURNAL)):
            assert ":" not in re.sub(r"'[^']*'", "", text)
            assert sorted({int(n) for n in re.findall(r"\?(\d+)", text)}) == list(
                range(1, len(order) + 1))
            parts = re.split(r"\?(\d+)", text)  # text, number, text, ...: names put back
            assert "".join(part if i % 2 == 0 else f":{order[int(part) - 1]}"
                           for i, part in enumerate(parts)) == named
        with pytest.raises(ValueError, match="takes"):
            numbered(sql.move[False, False], QuickFire.MOVE[:-1])
        with pytest.raises(ValueError, match="takes"):
            numbered(sql.resource_by_key, ("key", "machine"))


def _loop_only(engine: Engine) -> None:
    """Make ``engine`` fire through the retry loop alone (what it did before the one-pass
    fire), for comparison."""
    engine.fire_once = lambda *_args: None  # type: ignore[method-assign]


@pytest.mark.parametrize("fired", [
    [("s", "activate", None), ("slot:s", "deactivate", None), ("s", "release", None),
     ("s", "retire", None)],
    [("s", "claim", {"claim_id": "c1"}), ("s", "release", {"why": "done"})],
    [("s", "activate", {"n": 1}), ("slot:s", "retire", {"n": 2})],
])
def test_a_sqlite_fire_in_one_pass_writes_what_the_loop_writes(
        sqlite_url: str, fired: list[tuple[str, str, dict[str, Any] | None]]) -> None:
    """The same fires, made in one pass and through the retry loop alone, on two databases
    at the same times: the same results, rows and journals (unguarded edges, whose decision
    is known before the row is read; a guard asked on the row read; payloads; plain and
    ``MACHINE:KEY`` keys; nested states)."""
    seen = []
    fresh = Path(sqlite_url.removeprefix("sqlite:///"))  # at the code's revision, unopened
    for one_pass in (True, False):
        clock = SimulatedClock("2026-03-01T12:00:00Z")
        path = fresh.with_name(f"{fresh.stem}-{one_pass}.db")  # a copy each: not migrated
        shutil.copyfile(fresh, path)                          # again from empty
        with Store(f"sqlite:///{path}") as store:
            engine = Engine(store, [SLOT], guards=GUARDS, clock=clock)
            if not one_pass:
                _loop_only(engine)
            start = "claimed.idle" if fired[0][1] == "activate" else None
            engine.create("slot", "s", {"m": 1}, state=start)
            results = []
            for key, trigger, payload in fired:
                clock.advance(1)
                results.append(engine.fire(key, trigger, payload, actor="me"))
            seen.append((results, engine.get("s"), engine.history("s")))
            assert not engine.verify()
    assert seen[0] == seen[1]
    assert all(result.fired for result in seen[0][0])


def test_a_plain_sqlite_fire_does_not_go_round_the_loop(sqlite_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A fire whose decision needs no probe is made in one pass (without the retry loop's
    generator), whether its machine decides it before the row is read or asks a guard on
    the row: what keeps a SQLite fire's cost near the database's own."""
    with Store(sqlite_url, upgrade=True) as store:
        engine = Engine(store, [SLOT], guards=GUARDS)
        engine.create("slot", "s")

        def looped(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("the fire went round the retry loop")
        monkeypatch.setattr(engine, "firing", looped)
        assert engine.fire("s", "claim", {"claim_id": "c"}).dest == "claimed.idle"
        assert engine.fire("slot:s", "activate").dest == "claimed.busy"
        refused = engine.fire("s", "claim", {"claim_id": "c"})
        assert not refused and refused.reason is not None and "claim" in refused.reason
        # what needs the loop goes round it
        with pytest.raises(AssertionError, match="retry loop"):
            engine.fire("nobody", "activate")


class _MovingClock(SimulatedClock):
    """A clock that, asked the time once (between a fire's read and its write), moves the
    resource underneath in the fire's own transaction: what another writer's commit would
    do between the two, were SQLite's writers not in turn."""

    store: Store | None = None

    def now(self) -> Any:
        store, self.store = self.store, None
        if store is not None:
            with store.reading() as tx:  # inside the thread's write transaction
                tx.execute("UPDATE lifecycle_resources SET version = version + 1, "
                           "seq = seq + 1")
        return super().now()


def test_a_sqlite_fire_whose_row_moved_after_its_read_writes_nothing_and_goes_again(
        sqlite_url: str) -> None:
    """The one-pass fire's compare-and-swap finds the row moved: nothing it did is kept
    (the move underneath with it, in the same transaction), and the fire is made again by
    the retry loop, once, on the row as it is."""
    clock = _MovingClock("2026-03-01T12:00:00Z")
    with Store(sqlite_url, upgrade=True) as store:
        engine = Engine(store, [SLOT], clock=clock, guards=GUARDS)
        engine.create("slot", "s", state="claimed.idle")
        clock.store = store
        result = engine.fire("s", "activate")
        assert clock.store is None  # it did move the row
        assert (result.dest, result.version, result.seq) == ("claimed.busy", 2, 2)
        assert [(e.kind, e.version) for e in engine.history("s")] == [
            ("adopt", 1), ("transition", 2)]
        now = engine.get("s")
        assert (now.state, now.version) == ("claimed.busy", 2) and not engine.verify()


def test_a_machine_plans_only_the_decisions_no_row_can_change(store: Store) -> None:
    """``CompiledMachine.plan``: a trigger whose first edge from a leaf has no guard and no
    freshness rule is decided before the row is read (``plain`` when it writes nothing but
    the move and its journal row); a guarded one, one with no edge from the leaf, or an
    unknown name is not, and an unknown name is not kept."""
    effects = {**SLOT, "name": "with_effects", "transitions": [
        *SLOT["transitions"],
        {"trigger": "go", "source": "unclaimed", "dest": "gone", "effects": ["notify"]}]}
    engine = Engine(store, [SLOT, effects], guards=GUARDS, effects={"notify": lambda _: None})
    slot = engine.compiled("slot")
    plan = slot.plan("claimed.busy", "release")
    assert plan is not None and (plan.dest, plan.plain) == ("cleanup", True)
    assert plan.edge.trigger == "release"
    assert slot.plan("unclaimed", "claim") is None  # guarded: asked on the row
    assert slot.plan("unclaimed", "activate") is None  # no edge from there
    assert slot.plan("unclaimed", "nonsense") is None
    assert ("unclaimed", "claim") in slot.plans and ("unclaimed", "nonsense") not in slot.plans
    go = engine.compiled("with_effects").plan("unclaimed", "go")
    assert go is not None and not go.plain
