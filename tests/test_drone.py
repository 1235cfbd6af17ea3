"""The drone machine's options and its pool: the release policy, the start gate, the
reconcile loop against a site that is down, and the simulation's determinism."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from lifecycle import Engine, SimulatedClock, SiteError, Store, Worker
from lifecycle.adapters.sites import Drone, Terminated
from lifecycle.cli import main
from lifecycle.machines import drone
from lifecycle.machines.drone_sim import ScenarioBatch, ScenarioSite
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


def test_reconcile_steps_every_drone_on_one_status_call(store: Store) -> None:
    world = World()
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    guards, effects, probes = drone.BUILTIN.simulation(world)
    engine = Engine(store, [drone.SPEC], guards=guards, effects=effects, probes=probes,
                    clock=clock)
    for i in range(3):
        engine.create("drone", f"d{i}", state="booting", data={"remote_id": f"job-{i}"})
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


def test_simulation_is_deterministic_and_the_guard_saves_the_payloads() -> None:
    options = {"drones": 12, "hours": 0.5}
    first = simulate(seed=7, **options)
    second = simulate(seed=7, **options)
    first.pop("timing")
    second.pop("timing")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert first["after"]["payloads_killed"] == 0
    assert first["after"]["removed_while_running"] == 0
    third = simulate(seed=8, **options)
    third.pop("timing")
    assert third != first


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
    assert bad.exit_code == 2 and "drones takes a int" in bad.output
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
