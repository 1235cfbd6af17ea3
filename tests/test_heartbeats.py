"""``Engine.observe_many`` and ``Engine.step_many``: many resources per transaction, each
with its own compare-and-swap and journal row; a conflict, a refusal or an error on one never
loses the others; risky edges keep their freshness rule per resource; probes asked at once.
On SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from lifecycle import (
    Engine,
    FireResult,
    GuardContext,
    InvalidInput,
    LifecycleError,
    Observation,
    SimulatedClock,
    Store,
)
from lifecycle.errors import (
    ConcurrencyError,
    GuardError,
    InvalidData,
    StaleObservation,
    UnknownResource,
)
from lifecycle.freshness import ProbeRequest
from lifecycle.machines import drone
from lifecycle.machines.drone_sim import ScenarioBatch, ScenarioSite
from lifecycle.scenario import World

FLIP = {"name": "t", "states": ["a", "b"], "initial": "a",
        "eventless": [{"source": "a", "dest": "b", "guards": ["ok"]},
                      {"source": "b", "dest": "a", "guards": ["ok"]}]}


def _ok(context: GuardContext) -> bool:
    if context.key == "bad":
        raise RuntimeError("this guard cannot decide about 'bad'")
    return True


def _journal(engine: Engine, key: str) -> list[tuple[str, str | None, str]]:
    return [(e.kind, e.source, e.dest) for e in engine.history(key)]


def test_step_many_writes_each_resource_as_step_does(store: Store) -> None:
    engine = Engine(store, [FLIP], guards={"ok": _ok})
    for key in ("k0", "k1", "k2", "k3", "k4"):
        engine.create("t", key)
    results = engine.step_many([f"t:k{i}" for i in range(5)], batch=2)
    assert [(r.key, r.source, r.dest, r.version) for r in results
            if isinstance(r, FireResult)] == [(f"k{i}", "a", "b", 2) for i in range(5)]
    single = engine.step("t:k0")
    assert (single.source, single.dest, single.version) == ("b", "a", 3)
    assert _journal(engine, "t:k0") == [("create", None, "a"), ("transition", "a", "b"),
                                        ("transition", "b", "a")]
    assert _journal(engine, "t:k4") == [("create", None, "a"), ("transition", "a", "b")]


def test_an_error_on_one_resource_loses_none_of_the_others(store: Store) -> None:
    engine = Engine(store, [FLIP], guards={"ok": _ok})
    for key in ("k0", "bad", "k1"):
        engine.create("t", key)
    results = engine.step_many(["t:k0", "t:bad", "t:nope", "k1"])
    assert isinstance(results[1], GuardError)
    assert isinstance(results[2], UnknownResource)
    assert [engine.get(k).state for k in ("k0", "bad", "k1")] == ["b", "a", "b"]
    assert _journal(engine, "t:bad") == [("create", None, "a")]
    observed = engine.observe_many([("t:k0", {"up": True}), ("t:bad", {"x": float("nan")}),
                                    ("t:nope", {}), ("t:k1", {"up": False})])
    assert isinstance(observed[0], Observation) and isinstance(observed[3], Observation)
    assert isinstance(observed[1], InvalidData) and isinstance(observed[2], UnknownResource)
    assert engine.get("k1").observation.status == {"up": False}  # type: ignore[union-attr]
    assert engine.observations("t:bad") == []


def test_a_batch_of_observations_of_several_machines_finds_each_resource(
        store: Store) -> None:
    """Machines interleaved in one batch (the write names each row's machine, made text once
    per run of one machine): each observation lands on its own machine's resource."""
    engine = Engine(store, [FLIP, {**FLIP, "name": "u"}], guards={"ok": _ok})
    for machine in ("t", "u"):
        engine.create(machine, "k")
    observed = engine.observe_many([("t:k", {"n": 1}), ("u:k", {"n": 2}), ("t:k", {"n": 3}),
                                    ("u:k", {"n": 4}), ("u:k", {"n": 5})])
    assert all(isinstance(o, Observation) for o in observed)
    assert [o.status for o in engine.observations("t:k")] == [{"n": 1}, {"n": 3}]
    assert [o.status for o in engine.observations("u:k")] == [{"n": 2}, {"n": 4}, {"n": 5}]


def test_observations_find_their_resources_by_key_whatever_the_key_holds(
        store: Store) -> None:
    """On PostgreSQL a batch of observations is one statement that finds each resource by
    (machine, key) from a JSON document: keys with quotes, backslashes and letters outside
    ASCII come back as themselves, two observations of one resource in a batch are both kept
    (the later given is the newest at one time), times keep their microseconds and offset,
    and a key that names no resource is refused alone, as one observe refuses it."""
    engine = Engine(store, [FLIP], guards={"ok": _ok},
                    clock=SimulatedClock("2026-06-01T00:00:00Z"))
    keys = ['q"uote', "back\\slash", "naïve-ü", "plain"]
    for key in keys:
        engine.create("t", key)
    at = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    observed = engine.observe_many(
        [(f"t:{key}", {"n": i}) for i, key in enumerate(keys)]
        + [("t:gone", {"n": 9}), ("plain", {"n": 7}), ("t:plain", {"n": 8})], at)
    assert isinstance(observed[4], UnknownResource) and observed[4].machine == "t"
    assert all(isinstance(o, Observation) for i, o in enumerate(observed) if i != 4)
    ids = [o.id for o in observed if isinstance(o, Observation)]
    assert len(set(ids)) == len(ids) and 0 not in ids
    for i, key in enumerate(keys[:3]):
        seen = engine.get(f"t:{key}").observation
        assert seen is not None and seen.status == {"n": i} and seen.observed_at == at
    newest = engine.get("t:plain").observation
    assert newest is not None and newest.status == {"n": 8} and newest.id == ids[-1]
    assert [o.status for o in engine.observations("t:plain")] == [{"n": 3}, {"n": 7}, {"n": 8}]
    with pytest.raises(UnknownResource, match="of machine 't' with key 'gone'"):
        engine.observe("t:gone", {"n": 1})
    assert engine.observe('t:q"uote', {"n": 5}).id > max(ids)


def test_a_conflict_within_the_batch_is_decided_again_or_reported(store: Store) -> None:
    """The same resource twice in one batch: the second read is the batch's, made before the
    first wrote; its compare-and-swap fails, and the others are committed."""
    engine = Engine(store, [FLIP], guards={"ok": _ok})
    for key in ("k0", "k1"):
        engine.create("t", key)
    results = engine.step_many(["t:k0", "t:k1", "t:k0"], retry_conflicts=False)
    assert isinstance(results[2], ConcurrencyError)
    assert [(r.source, r.dest) for r in results[:2]] == [("a", "b"), ("a", "b")]  # type: ignore[union-attr]
    assert engine.get("k0").version == 2 and engine.get("k1").version == 2
    results = engine.step_many(["t:k0", "t:k1", "t:k0"])
    assert [(r.source, r.dest) for r in results] == [  # type: ignore[union-attr]
        ("b", "a"), ("b", "a"), ("a", "b")]
    assert len(engine.history("t:k0")) == 4


def test_another_writer_between_read_and_write_loses_none_of_the_others(
        postgres_url: str) -> None:
    """On PostgreSQL another process may commit a change of a resource after the batch read
    it and before its compare-and-swap: that one is reported (or decided again on what the
    other wrote), the others are committed with their own journal rows."""
    store, other_store = Store(postgres_url, upgrade=True), Store(postgres_url)
    try:
        interfered: list[str] = []

        def ok(context: GuardContext) -> bool:
            if context.key == "k1" and not interfered:
                interfered.append(context.key)  # another writer, another connection, now
                other.update("t:k1", {"by": "other"})
            return True

        engine = Engine(store, [FLIP], guards={"ok": ok})
        other = Engine(other_store, [FLIP], guards={"ok": ok})
        for key in ("k0", "k1", "k2"):
            engine.create("t", key)
        results = engine.step_many(["t:k0", "t:k1", "t:k2"], retry_conflicts=False)
        assert interfered == ["k1"]
        assert isinstance(results[1], ConcurrencyError)
        assert [engine.get(k).state for k in ("k0", "k1", "k2")] == ["b", "a", "b"]
        assert _journal(engine, "t:k1") == [("create", None, "a"), ("update", "a", "a")]
        interfered.clear()
        results = engine.step_many(["t:k1", "t:k2"])  # decided again on what was written
        assert interfered == ["k1"]
        assert [(r.source, r.dest) for r in results] == [  # type: ignore[union-attr]
            ("a", "b"), ("b", "a")]
        assert engine.get("k1").data == {"by": "other"}
    finally:
        store.dispose()
        other_store.dispose()


def _drones(store: Store, world: World, *, probes: bool) -> tuple[Engine, SimulatedClock]:
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, site_probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects,
                    probes=site_probes if probes else {}, clock=clock, strict=probes)
    for i in range(4):
        engine.create("drone", f"d{i}", state="booting", data={"remote_id": f"job-{i}"})
    return engine, clock


@pytest.mark.parametrize("probes", [False, True])
def test_freshness_holds_per_resource_in_a_batch(store: Store, probes: bool) -> None:
    """A risky edge (booting -> cleanup on Stopped) fires for the drones whose observation is
    fresh and is refused, journaled, for the one whose observation predates its last
    transition, unless a probe answers afresh; the others are not held back."""
    world = World()
    engine, clock = _drones(store, world, probes=probes)
    created = clock.now()
    clock.advance(10)
    world.status.update({f"d{i}": {"resource_status": "Stopped"} for i in range(4)})
    stopped = {"resource_status": "Stopped"}
    observed = engine.observe_many([("drone:d0", stopped), ("drone:d2", stopped)])
    assert all(isinstance(o, Observation) for o in observed)
    engine.observe("drone:d1", stopped, created - dt.timedelta(seconds=5))  # too old
    results = engine.step_many([f"drone:d{i}" for i in range(3)], on_stale="return")
    assert all(isinstance(r, FireResult) for r in results)
    assert [(r.fired, r.dest, r.error) for r in results] == [  # type: ignore[union-attr]
        (True, "cleanup", None),
        (True, "cleanup", None) if probes else (False, None, "StaleObservation"),
        (True, "cleanup", None)]
    assert results[1].probed is probes  # type: ignore[union-attr]
    kinds = [e.kind for e in engine.history("drone:d1")]
    assert kinds == (["adopt", "transition"] if probes else ["adopt", "refusal"])
    if not probes:
        [raised] = engine.step_many(["drone:d1"], on_stale="raise")
        assert isinstance(raised, StaleObservation)


def test_probes_of_a_batch_are_asked_at_once(store: Store) -> None:
    """Every drone of the batch needs a probe: they are asked concurrently (all of them
    are in the probe at one moment), and each drone is decided on its own answer."""
    world = World()
    engine, clock = _drones(store, world, probes=True)
    world.status.update({f"d{i}": {"resource_status": "Stopped"} for i in range(4)})
    created = clock.now()
    clock.advance(10)
    engine.observe_many([(f"drone:d{i}", {"resource_status": "Stopped"}) for i in range(4)],
                        created - dt.timedelta(seconds=5))  # held, but older than the drones
    inside = threading.Barrier(4, timeout=30)
    asked = engine.probes["site"]

    def probe(request: ProbeRequest) -> Any:
        inside.wait()  # four at once, or the barrier breaks
        return asked(request)

    engine.probes["site"] = probe
    results = engine.step_many([f"drone:d{i}" for i in range(4)], probes=4)
    assert [(r.dest, r.probed) for r in results] == [  # type: ignore[union-attr]
        ("cleanup", True)] * 4


def test_reconcile_with_a_site_and_pool_asked_at_once(store: Store) -> None:
    world = World()
    engine, clock = _drones(store, world, probes=True)
    world.status.update({"d0": {"resource_status": "Running"},
                         "d1": {"resource_status": "Booting"},
                         "d2": {"resource_status": "Deleted"}})  # d3: unknown -> Deleted
    clock.advance(10)
    both = threading.Barrier(2, timeout=30)

    class Site(ScenarioSite):
        def status(self, drones: Any) -> dict[str, str]:
            both.wait()
            return super().status(drones)

    class Pool(ScenarioBatch):
        def machine_status(self, drones: Any) -> dict[str, str]:
            both.wait()
            return super().machine_status(drones)

    report = drone.reconcile(engine, Site(world), Pool(world))
    assert report == {"drones": 4, "moved": {"booting -> integrate": 1, "booting -> down": 2},
                      "refused": 0, "errors": 0, "site_error": None}


def test_batch_arguments_are_checked(store: Store) -> None:
    engine = Engine(store, [FLIP], guards={"ok": _ok})
    with pytest.raises(ValueError, match="at least 1"):
        engine.step_many(["t:x"], batch=0)
    engine.create("t", "x")
    [refused] = engine.step_many(["t:x"], actor="\x00")
    assert isinstance(refused, LifecycleError) and engine.get("x").version == 1


def test_the_heartbeat_lists_live_drones_with_a_job_in_one_read(store: Store) -> None:
    """The drones a heartbeat asks the site about: those of the machine named, in a live
    state, with a job at the site (a remote_id), in key order, with their data."""
    from sqlalchemy import insert

    from lifecycle.store import resources

    past = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [("drone", "d3", "available", {"remote_id": "j3", "demand": 1}),
            ("drone", "d1", "booting", {"remote_id": "j1"}),
            ("drone", "d2", "request", {}),  # not deployed yet: nothing to ask about
            ("drone", "d0", "down", {"remote_id": "j0"}),  # gone
            ("drone", "d4", "cleanup", {"remote_id": "j4", "note": 'q"uote ü'}),
            ("drone_tardis", "d5", "available", {"remote_id": "j5"})]  # another machine
    with store.begin() as db:
        db.execute(insert(resources), [
            {"machine": machine, "key": key, "spec_version": drone.SPEC.version, "state": state,
             "version": 1, "seq": 1, "data": data, "created_at": past, "updated_at": past,
             "last_transition_at": past} for machine, key, state, data in rows])
    engine = Engine(store, [drone.SPEC], guards=drone.GUARDS, strict=False)
    assert drone.heartbeat_drones(engine) == [
        drone.Drone("d1", "j1", {"remote_id": "j1"}),
        drone.Drone("d3", "j3", {"remote_id": "j3", "demand": 1}),
        drone.Drone("d4", "j4", {"remote_id": "j4", "note": 'q"uote ü'})]
    assert [d.name for d in drone.heartbeat_drones(engine, "drone_tardis")] == ["d5"]
    with pytest.raises(InvalidInput, match="machine name"):
        drone.heartbeat_drones(engine, "drone\x00")


def test_a_batch_of_observations_is_refused_whole_for_its_source_or_time(
        store: Store) -> None:
    """observe_many checks the source and the time once for the batch: a bad one refuses
    every observation, each with its own key; a time ahead of the clock is taken as now."""
    engine = Engine(store, [FLIP], guards={"ok": _ok},
                    clock=SimulatedClock("2026-06-01T00:00:00Z"))
    engine.create("t", "x")
    engine.create("t", "y")
    batch = [("t:x", {"n": 1}), ("t:y", {"n": 2}), ("t:\x00", {"n": 3})]
    naive = dt.datetime(2026, 5, 1)
    for observed_at, source, problem in ((naive, "api", "has no time zone"),
                                         (None, "s\x00", "source contains a NUL")):
        refused = engine.observe_many(batch, observed_at, source=source)
        assert [type(r) for r in refused[:2]] == [InvalidData, InvalidData]
        assert problem in str(refused[0]) and "x" in str(refused[0])
        assert problem in str(refused[1]) and "y" in str(refused[1])
        assert "invalid key" in str(refused[2])
    assert engine.observations("t:x") == []
    ahead = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    seen = engine.observe_many(batch[:2], ahead, source="site")
    now = engine.clock.now()
    assert [(o.observed_at, o.recorded_at) for o in seen  # type: ignore[union-attr]
            ] == [(now, now), (now, now)]


def test_refusals_in_one_batch_each_say_their_own_reason(store: Store) -> None:
    """Refusal reasons are worded once per machine, state and guards' verdicts: resources
    held back by different guards keep their own reasons within one batch."""
    spec = {"name": "held", "states": ["a", "b"], "initial": "a", "final": ["b"],
            "eventless": [{"source": "a", "dest": "b", "guards": ["p"], "unless": ["q"]}]}
    guards = {"p": lambda c: bool(c.data.get("p")), "q": lambda c: bool(c.data.get("q"))}
    engine = Engine(store, [spec], guards=guards)
    for key, data in (("r1", {"p": False}), ("r2", {"p": True, "q": True}),
                      ("r3", {"p": False, "q": True})):
        engine.create("held", key, data)
    results = engine.step_many(["held:r1", "held:r2", "held:r3", "held:r2"])
    assert [(r.fired, r.reason) for r in results] == [  # type: ignore[union-attr]
        (False, "guard 'p' is false"), (False, "unless guard 'q' is true"),
        (False, "guard 'p' is false"), (False, "unless guard 'q' is true")]


def test_a_batch_records_its_observations_in_the_order_given_whatever_the_join(
        postgres_url: str) -> None:
    """The batch finds its resources by a join whose plan depends on the table's statistics:
    a hash join built on the batch's side hands back one resource's rows last given first.
    The observations' ids (the order they were recorded) still follow the batch."""
    import psycopg
    from databases import libpq

    store = Store(postgres_url, upgrade=True)
    try:
        engine = Engine(store, [FLIP], guards={"ok": _ok},
                        clock=SimulatedClock("2026-06-01T00:00:00Z"))
        for key in ("k0", "k1"):
            engine.create("t", key)
        with psycopg.connect(libpq(postgres_url), autocommit=True) as admin:
            # the resources look huge, and only a hash join is allowed: the planner hashes
            # the batch and probes it with the resources (this database is not reused)
            admin.execute("UPDATE pg_class SET reltuples = 1e7, relpages = 1 "
                          "WHERE relname = 'lifecycle_resources'")
            name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
            for setting in ("enable_nestloop", "enable_mergejoin"):
                admin.execute(f'ALTER DATABASE "{name}" SET {setting} = off')
        store.dispose()
        at = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
        given = [("t:k0", {"n": n}) for n in range(6)] + [("t:k1", {"n": 9})]
        observed = engine.observe_many(given, at)
        ids = [o.id for o in observed if isinstance(o, Observation)]
        assert ids == sorted(ids), ids
        assert [o.status for o in engine.observations("t:k0")] == [{"n": n} for n in range(6)]
        assert engine.get("t:k0").observation.status == {"n": 5}  # type: ignore[union-attr]
    finally:
        store.dispose()
