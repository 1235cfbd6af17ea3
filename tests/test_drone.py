"""The drone machine's options and its pool: the release policy, the start gate, the
reconcile loop against a site that is down, and the simulation's determinism."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from lifecycle import Engine, PermanentError, SimulatedClock, Store, Worker
from lifecycle.adapters.sites import UNKNOWN, Drone, SiteError, Terminated
from lifecycle.cli import main
from lifecycle.machines import drone
from lifecycle.machines.drone_sim import ScenarioBatch, ScenarioSite
from lifecycle.outbox_admin import effect_records
from lifecycle.scenario import World
from lifecycle.sim.drone_race import simulate


def fake(key: str, state: str, minutes_old: int, demand: int = 1) -> Any:
    created = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=60 - minutes_old)
    return SimpleNamespace(key=key, state=state, created_at=created, data={"demand": demand})


def test_release_policy_established_idle_first_booting_last() -> None:
    pool = [fake("boot-old", "booting", 50), fake("idle-young", "available", 10),
            fake("idle-old", "available", 40), fake("joining", "integrating", 30),
            fake("boot-young", "booting", 5), fake("leaving", "draining", 45),
            fake("released", "available", 55, demand=0)]
    order = [d.key for d in drone.release_order(pool)]
    assert order == ["idle-old", "idle-young", "joining", "boot-old", "boot-young"]
    newest = [d.key for d in drone.release_order(pool, "newest_first")]
    assert newest == ["boot-young", "idle-young", "joining", "idle-old", "boot-old"]
    with pytest.raises(ValueError, match="unknown release policy 'random'"):
        drone.release_order(pool, "random")


def test_cobalds_release_order_lowest_supply_times_utilisation_first_ties_unordered() -> None:
    import random

    pool = [fake("boot-old", "booting", 50), fake("idle-young", "available", 10),
            fake("busy", "available", 40), fake("half", "available", 35),
            fake("leaving", "draining", 45), fake("released", "available", 55, demand=0)]
    used = {"busy": 1.0, "half": 0.5, "boot-old": 1.0}   # a booting drone supplies nothing
    orders = {tuple(d.key for d in drone.release_order(
        pool, "cobald", cores=8, utilisation=used, rng=random.Random(seed)))
        for seed in range(20)}
    for order in orders:   # COBalD: supply x utilisation, lowest first; its children a set
        assert order[-2:] == ("half", "busy")
        assert sorted(order[:-2]) == ["boot-old", "idle-young", "leaving"]
    assert len({order[:-2] for order in orders}) > 1    # the ties in no particular order


def test_start_gate_is_opened_by_the_integrate_effect(store: Store) -> None:
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    for gate in (False, True):
        spec = drone.drone_spec(start_gate=gate)
        engine = Engine(Store(store.url), [spec], guards=guards, effects=effects,
                        probes=probes, clock=clock)
        key = f"gate-{gate}"
        engine.create("drone", key, state="integrate")
        Worker(engine).run_until_idle()
        assert engine.get(key).state == "integrating"
        [(action, name, args)] = [a for a in world.actions if a[1] == key]
        assert (action, name, args) == ("integrate", key, {"open_gate": gate})


class DownSite:
    def __init__(self) -> None:
        self.calls = 0

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        self.calls += 1
        raise SiteError("squeue: slurm_load_jobs error: Unable to contact slurm controller")

    def deploy(self, drone_: Drone) -> str:
        raise SiteError("down")

    def stop(self, drone_: Drone) -> None:
        raise SiteError("down")

    def terminate(self, drone_: Drone, expect: str | None) -> Terminated:
        raise SiteError("down")


def _booting_drones(store: Store, count: int) -> tuple[Engine, World, SimulatedClock]:
    """The drone machine on the scenario site and pool, with drones d0, d1, ... booting."""
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    for i in range(count):
        engine.create("drone", f"d{i}", state="booting", data={"remote_id": f"job-{i}"})
    return engine, world, clock


def test_reconcile_steps_every_drone_on_one_status_call(store: Store) -> None:
    engine, world, clock = _booting_drones(store, 3)
    world.status.update({"d0": {"resource_status": "Running"},
                         "d1": {"resource_status": "Booting"},
                         "d2": {"resource_status": "Deleted"}})
    clock.advance(10)
    calls: list[int] = []
    site = ScenarioSite(world)
    original = site.status
    site.status = lambda drones: calls.append(len(drones)) or original(drones)  # type: ignore[method-assign]
    report = drone.reconcile(engine, site, ScenarioBatch(world))
    assert calls == [3]
    assert report["moved"] == {"booting -> integrate": 1, "booting -> down": 1}
    assert [engine.get(f"d{i}").state for i in range(3)] == ["integrate", "booting", "down"]


def test_reconcile_survives_a_site_that_is_down(store: Store) -> None:
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    engine.create("drone", "d1", state="booting", data={"demand": 0, "remote_id": "17"})
    clock.advance(100)
    site = DownSite()
    report = drone.reconcile(engine, site, ScenarioBatch(world))
    assert report["site_error"].startswith("squeue: slurm_load_jobs error")
    assert site.calls == 1
    assert engine.get("d1").state == "booting"
    assert [e.kind for e in engine.history("d1")] == ["adopt"]


SEED_7 = {"drones": 12, "hours": 0.5}


@pytest.fixture(scope="module")
def seed_7() -> dict[str, Any]:
    """The drone race's report for seed 7 and :data:`SEED_7`, without its ``timing``: run
    once for the module; the tests only read it."""
    report = simulate(seed=7, **SEED_7)
    report.pop("timing")
    return report


def test_simulation_is_deterministic_and_the_guard_saves_the_payloads(
        seed_7: dict[str, Any]) -> None:
    first = seed_7
    second = simulate(seed=7, **SEED_7)
    second.pop("timing")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["after"]["payloads_killed"] == 0
    assert first["after"]["removed_while_running"] == 0
    third = simulate(seed=8, **SEED_7)
    third.pop("timing")
    assert third != first


# What the simulation reported for seed 7, 12 drones, half an hour, when its controller still
# read every drone ever made each minute: reading only the drones in the pool's states (so
# the run is linear in simulated time) must not change a single figure.
SEED_7_REPORT = {
    "before": {"drone_hours": 5.165, "drones": 42, "example": "d00008",
               "fenced_terminates_refused": 0, "machine": "drone_tardis",
               "payloads_killed": 3, "probe_calls": 0, "removed_while_running": 5},
    "after": {"drone_hours": 5.928, "drones": 37, "example": "d00016",
              "fenced_terminates_refused": 3, "machine": "drone", "payloads_killed": 0,
              "probe_calls": 12, "removed_while_running": 0},
}


def test_simulation_reports_what_it_did_before_it_read_only_live_drones(
        seed_7: dict[str, Any]) -> None:
    assert {k: seed_7[k] for k in SEED_7_REPORT} == SEED_7_REPORT


def test_simulate_cli_json_is_reproducible() -> None:
    runner = CliRunner()
    args = ["simulate", "drone-race", "--seed", "3", "--set", "drones=8", "--set", "hours=0.25",
            "--json"]
    one = runner.invoke(main, args)
    two = runner.invoke(main, args)
    assert one.exit_code == 0, one.output
    assert one.output == two.output
    assert json.loads(one.output)["options"]["drones"] == 8
    bad = runner.invoke(main, ["simulate", "drone-race", "--set", "drones=many"])
    assert bad.exit_code == 2 and "drones takes an int, 1 or more" in bad.output
    listing = runner.invoke(main, ["simulate"])
    assert "drone-race" in listing.output and "--set site_lag=" in listing.output


def test_reconcile_cli(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    db = str(tmp_path / "pool.db")
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade", "--db", db]).exit_code == 0
    result = runner.invoke(main, ["reconcile", "--db", db])
    assert result.exit_code == 1 and "no drone site is configured" in result.output
    world = tmp_path / "world.json"
    world.write_text(json.dumps({"d1": {"resource_status": "Running"}}))
    monkeypatch.setenv("DRONE_WORLD", str(world))
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "procs"))
    monkeypatch.setenv("LIFECYCLE_PLUGINS", "drone_plugin")
    created = runner.invoke(main, ["create", "drone", "d1", "--db", db])
    assert created.exit_code == 0, created.output
    first = runner.invoke(main, ["reconcile", "--db", db])
    assert first.exit_code == 0, first.output
    # the deploy ran first; the site says Running: the drone integrates (an effect, run too)
    assert "1 drone: 1 booting -> integrate" in first.output
    world.write_text(json.dumps({"d1": {"resource_status": "Running",
                                        "machine_status": "Available"}}))
    monkeypatch.delitem(__import__("sys").modules, "drone_plugin")
    second = runner.invoke(main, ["reconcile", "--db", db, "--json"])
    assert json.loads(second.output.splitlines()[-1])["moved"] == {
        "integrating -> available": 1}


# -- around the table, as TARDIS does it -------------------------------------------------------


class SlowSite(ScenarioSite):
    """A site (and a pool) whose answers take simulated time to come."""

    def __init__(self, world: World, clock: SimulatedClock, seconds: float) -> None:
        super().__init__(world)
        self.clock = clock
        self.seconds = seconds
        self.asked_at: list[dt.datetime] = []

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        self.asked_at.append(self.clock.now())
        answer = super().status(drones)
        self.clock.advance(self.seconds)
        return answer


class SlowPool(ScenarioBatch):
    def __init__(self, world: World, clock: SimulatedClock, seconds: float) -> None:
        super().__init__(world)
        self.clock = clock
        self.seconds = seconds

    def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        answer = super().machine_status(drones)
        self.clock.advance(self.seconds)
        return answer


def test_reconcile_stamps_each_observation_with_the_time_it_asked(store: Store) -> None:
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    engine.create("drone", "d1", state="booting", data={"remote_id": "job-d1"})
    world.status["d1"] = {"resource_status": "Booting"}
    clock.advance(10)
    site = SlowSite(world, clock, 8.0)
    drone.reconcile(engine, site, SlowPool(world, clock, 7.0))
    [observation] = engine.observations("d1")
    # the site and the pool are asked at once: either may answer first
    assert observation.observed_at == dt.datetime(2026, 1, 1, 0, 0, 10, tzinfo=dt.UTC)
    assert observation.observed_at <= site.asked_at[0]     # not 00:00:25, when both answered
    assert clock.now() - observation.observed_at == dt.timedelta(seconds=15)


def test_cleanup_terminates_again_on_every_heartbeat_each_time_fenced(store: Store) -> None:
    """Each heartbeat in cleanup on a Booting, Stopped or Error status asks the site to
    terminate again, fenced on the status that heartbeat saw."""
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    engine.create("drone", "d1", state="cleanup", data={"remote_id": "job-d1", "demand": 0})
    worker = Worker(engine)
    for status in ("Booting", "Stopped", "Error", "Booting", "Running"):
        world.status["d1"] = {"resource_status": status}   # the job is (back) in this status
        drone.reconcile(engine, ScenarioSite(world), ScenarioBatch(world))
        worker.run_until_idle()
        clock.advance(60)
    terminates = [args["expect"] for action, _, args in world.actions if action == "terminate"]
    # adopted in cleanup: its entry effect, on no observation; then one for each heartbeat,
    # fenced on the status that heartbeat saw
    assert terminates == [None, "Booting", "Stopped", "Error", "Booting"]
    assert engine.get("d1").state == "draining"            # and Running drains it
    kinds = [(e.source, e.dest) for e in engine.history("d1") if e.kind == "transition"]
    assert kinds.count(("cleanup", "cleanup")) == 4
    tardis = drone.drone_spec(race_guard=False)
    [self_loop] = [e for e in tardis.eventless if e.source == "cleanup" and e.dest == "cleanup"
                   and e.guards == ("rs_booting",)]
    assert self_loop.fresh is None       # TARDIS: on whatever status it holds, unfenced


def test_a_drone_that_goes_down_asks_for_nothing(store: Store) -> None:
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    sources = {"booting": "Deleted", "integrating": "Deleted", "available": "Deleted",
               "draining": "Deleted", "shutdown": "Deleted", "shutting_down": "Deleted",
               "cleanup": "Deleted"}
    for state, status in sources.items():
        engine.create("drone", state, state=state, data={"remote_id": f"job-{state}"})
        engine.observe(state, {"resource_status": status})
        assert engine.step(state).dest == "down", state
    Worker(engine).run_until_idle()
    for state in sources:
        assert engine.get(state).data["demand"] == 0, state
        assert engine.history(state)[-1].trigger == "released"


# -- COBalD drives the pool --------------------------------------------------------------------


class Figures:
    def __init__(self, allocation: dict[str, float], utilisation: dict[str, float]) -> None:
        self.figures = {"allocation": allocation, "utilisation": utilisation}
        self.asked: list[list[str]] = []

    def allocation(self, drones: Sequence[Drone]) -> dict[str, float]:
        self.asked.append([d.name for d in drones])
        return {d.name: self.figures["allocation"].get(d.name, 0.0) for d in drones}

    def utilisation(self, drones: Sequence[Drone]) -> dict[str, float]:
        self.asked.append([d.name for d in drones])
        return {d.name: self.figures["utilisation"].get(d.name, 0.0) for d in drones}


def test_drone_pool_reports_what_tardis_drones_report(store: Store) -> None:
    pytest.importorskip("cobald")
    from cobald.interfaces import Pool

    from lifecycle.machines.drone_pool import DronePool

    clock = SimulatedClock("2026-01-01T00:00:00Z")
    engine = Engine(store, [drone.SPEC], guards=drone.GUARDS, clock=clock, strict=False)
    for key, state, demand in [("p-00001", "available", 1), ("p-00002", "available", 1),
                               ("p-00003", "available", 0), ("p-00004", "booting", 1),
                               ("p-00005", "draining", 0), ("p-00006", "down", 0),
                               ("other-00001", "available", 1)]:
        engine.create("drone", key, state=state, data={"demand": demand})
        clock.advance(1)
    figures = Figures({"p-00001": 1.0, "p-00002": 0.5, "other-00001": 1.0},
                      {"p-00001": 0.75, "p-00002": 0.25, "other-00001": 1.0})
    pool = DronePool(engine, figures, prefix="p-", cores=8)
    assert isinstance(pool, Pool)
    assert pool.supply == 0.0 and figures.asked == []   # nothing asked before a refresh
    pool.refresh()
    assert pool.supply == 16.0                  # two available drones still wanted, 8 cores each
    assert pool.demand == 24.0                  # and the booting one, wanted too
    assert pool.allocation == 0.75 and pool.utilisation == 0.5
    assert figures.asked[-1] == ["p-00001", "p-00002"]
    pool.demand = 40                            # recorded; the adjustment spawns two more
    assert len(pool.wanted()) == 3
    assert pool.adjust() == {"created": ["p-00007", "p-00008"], "released": []}
    assert sorted(d.key for d in pool.wanted()) == [
        "p-00001", "p-00002", "p-00004", "p-00007", "p-00008"]
    assert engine.get("p-00008").data["demand"] == 1
    pool.demand = 3   # supply 16 > 3: release 37 of the 40 wanted, in the policy's order
    pool.adjust()
    released = [e.key for e in pool.drones() if e.data["demand"] == 0 and e.version > 1]
    assert sorted(released) == ["p-00001", "p-00002", "p-00004", "p-00007"]
    assert [d.key for d in pool.wanted()] == ["p-00008"]   # 8 cores more than 5: kept
    assert engine.get("other-00001").version == 1    # another pool's drone: untouched
    pool.demand = -5
    assert pool.demand == 0.0
    pool.refresh()
    assert pool.supply == 0.0 and pool.allocation == 1.0 and pool.utilisation == 1.0
    with pytest.raises(ValueError, match="unknown release policy"):
        DronePool(engine, figures, policy="oldest")


def drive_with_cobald(path: Path, *, race_guard: bool, seed: int) -> dict[str, Any]:
    """COBalD's LinearController regulates a DronePool over the simulated site and pool of
    the drone race, every minute, for two hours; payload comes for the first hour."""
    from cobald.controller.linear import LinearController

    from lifecycle.machines.drone_pool import DronePool
    from lifecycle.sim.drone_race import START, SimulatedPool
    from lifecycle.sim.loop import EventLoop

    store = Store.new_sqlite(path)
    clock = SimulatedClock(START)
    loop = EventLoop(clock, seed)
    world = SimulatedPool(loop, {
        "boot_time": (30.0, 300.0), "payload_delay": (3.0, 30.0), "payload_length": 600.0,
        "start_gate": False, "site_lag": 10.0, "minimum_lifetime": None,
        "payload_until": 3600.0})
    spec = drone.drone_spec(race_guard=race_guard)
    engine = Engine(store, [spec], guards=drone.GUARDS, effects=drone.effects(world, world),
                    probes={"site": drone.probe(world, world)}, clock=clock)
    worker = Worker(engine, seed=seed)
    pool = DronePool(engine, world, machine=spec.name, prefix="cobald-", policy="cobald",
                     seed=seed)   # COBalD's own release order, as a TARDIS site has it
    controller = LinearController(pool, low_utilisation=0.5, high_allocation=0.5,
                                  rate=1 / 60, interval=60)
    demands: list[float] = []
    released_running: list[str] = []

    def regulate() -> None:
        before = {d.key for d in pool.wanted()}
        controller.regulate(controller.interval)   # COBalD's own rule, as its run() does
        pool.adjust()                               # FactoryPool's, on the same interval
        for key in before - {d.key for d in pool.wanted()}:
            if world.payload_running(key):
                released_running.append(key)
        worker.run_until_idle()
        demands.append(pool.demand)

    def heartbeat() -> None:
        drone.reconcile(engine, world, world, machine=spec.name)
        worker.run_until_idle()
        pool.refresh()                              # what the drones report, as TARDIS's do

    loop.every(60, heartbeat, until=7200)
    loop.every(60, regulate, until=7200, offset=30)
    loop.run(7200)
    drones = engine.resources(spec.name)
    released = [d.key for d in drones if any(
        e.kind == "update" and (e.actor or "").startswith("cobald:") and e.payload == {"demand": 0}
        for e in engine.history(f"{spec.name}:{d.key}"))]
    store.dispose()
    return {"demands": demands, "drones": [d.key for d in drones], "deployed": len(world.jobs),
            "released": released, "released_running": released_running,
            "killed": world.killed_payloads, "removed_running": world.removed_running}


def test_cobalds_linear_controller_drives_a_drone_pool(tmp_path: Path) -> None:
    pytest.importorskip("cobald")
    run = drive_with_cobald(tmp_path / "pool.db", race_guard=True, seed=1)
    demands = run["demands"]
    peak = demands.index(max(demands))
    assert max(demands) >= 8 and demands[0] < max(demands)        # demand rises ...
    assert min(demands[peak:]) <= max(demands) / 4                 # ... and falls
    assert all(key.startswith("cobald-") for key in run["drones"])
    assert run["deployed"] == len(run["drones"]) > max(demands)    # each drone deployed
    assert len(run["released"]) >= 10                              # and released by COBalD
    assert run["killed"] == 0 and run["removed_running"] == 0      # none removed running
    again = drive_with_cobald(tmp_path / "again.db", race_guard=True, seed=1)
    assert again == run                                            # the same seed, the same run
    tardis = drive_with_cobald(tmp_path / "tardis.db", race_guard=False, seed=1)
    assert tardis["demands"][:20] == demands[:20]   # the same controller's decisions ...
    assert tardis["removed_running"] > 0    # ... on TARDIS's machine remove a running drone


def test_the_deploy_brings_the_sites_minimum_lifetime_along(store: Store) -> None:
    import subprocess

    from lifecycle.adapters.slurm import SlurmSite

    def sbatch(argv: Sequence[str], timeout: float,
               env: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 0, "4242\n", "")

    site = SlurmSite(wrap="start-drone", runner=sbatch, drone_minimum_lifetime=3600)
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    pool = ScenarioBatch(World())
    engine = Engine(store, [drone.SPEC], guards=drone.GUARDS, effects=drone.effects(site, pool),
                    probes={"site": drone.probe(site, pool)}, clock=clock)
    engine.create("drone", "d1")
    Worker(engine).run_until_idle()
    assert engine.get("d1").data["remote_id"] == "4242"
    assert engine.get("d1").data["minimum_lifetime"] == 3600.0
    with pytest.raises(ValueError, match="drone_minimum_lifetime is a positive number"):
        SlurmSite(wrap="x", drone_minimum_lifetime=0)


def test_a_deploy_that_fails_for_good_by_surprise_still_releases_the_demand(
        store: Store) -> None:
    """A site that breaks in a way it does not say (not a SiteError) fails the deploy for
    good after its attempts; ``deploy_failed`` takes the drone down, and down's ``release``
    runs behind the failed deploy instead of waiting for a retry that would deploy again."""
    class Broken:
        def deploy(self, drone_: Drone) -> str:
            raise PermanentError("the site's client crashed")

    clock = SimulatedClock("2026-01-01T00:00:00Z")
    pool = ScenarioBatch(World())
    engine = Engine(store, [drone.SPEC], guards=drone.GUARDS,
                    effects=drone.effects(Broken(), pool),  # type: ignore[arg-type]
                    probes={"site": drone.probe(Broken(), pool)},  # type: ignore[arg-type]
                    clock=clock)
    engine.create("drone", "d1", {"demand": 1})
    Worker(engine).run_until_idle()
    assert engine.get("d1").state == "down"
    assert engine.get("d1").data["demand"] == 0
    assert [e.trigger for e in engine.history("d1")][1:] == ["deploy_failed", "released"]
    assert [(e.name, e.status) for e in effect_records(engine)] == [
        ("deploy", "gave_up"), ("release", "done")]


class OneUnknown(ScenarioSite):
    """The scenario site, but one drone's own status call failed."""

    def status(self, drones: Any) -> dict[str, str]:
        return {**super().status(drones), "d1": UNKNOWN}


def test_the_heartbeat_neither_observes_nor_steps_a_drone_it_could_not_ask(
        store: Store) -> None:
    """A drone the site answered Unknown for (its own status call failed) is not observed
    and stays where it is, while the others move: left out of the answer, it would have read
    as Deleted."""
    engine, world, clock = _booting_drones(store, 3)
    for i in range(3):
        world.status[f"d{i}"] = {"resource_status": "Deleted"}
    clock.advance(10)
    report = drone.reconcile(engine, OneUnknown(world), ScenarioBatch(world))
    assert report["errors"] == 1
    assert [engine.get(f"d{i}").state for i in range(3)] == ["down", "booting", "down"]
    assert engine.observations("drone:d1") == []
