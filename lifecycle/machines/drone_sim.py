"""Simulated sites and pools for the drone: one that answers what a scenario file's world
says, and one with a life of its own for the simulation of the boot race."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..adapters.sites import DELETED, NOT_AVAILABLE, Drone, Terminated


class ScenarioSite:
    """Answers from ``world.status[key]`` and records what it is asked to do."""

    def __init__(self, world: Any) -> None:
        self.world = world

    def _status(self, name: str) -> str:
        return str(self.world.status.get(name, {}).get("resource_status", DELETED))

    def deploy(self, drone: Drone) -> str:
        self.world.actions.append(("deploy", drone.name, {}))
        return f"job-{drone.name}"

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        return {d.name: self._status(d.name) for d in drones}

    def stop(self, drone: Drone) -> None:
        self.world.actions.append(("stop", drone.name, {}))

    def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        now = self._status(drone.name)
        acted = expect is None or now == expect
        self.world.actions.append(("terminate", drone.name, {"expect": expect, "acted": acted}))
        return Terminated(acted, "" if acted else f"the job is {now}, not {expect}")


class ScenarioBatch:
    """A pool whose machine status is ``world.status[key]["machine_status"]``."""

    def __init__(self, world: Any) -> None:
        self.world = world

    def integrate(self, drone: Drone, *, open_gate: bool) -> None:
        self.world.actions.append(("integrate", drone.name, {"open_gate": open_gate}))

    def drain(self, drone: Drone) -> None:
        self.world.actions.append(("drain", drone.name, {}))

    def disintegrate(self, drone: Drone) -> None:
        self.world.actions.append(("disintegrate", drone.name, {}))

    def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        return {d.name: str(self.world.status.get(d.name, {}).get("machine_status",
                                                                    NOT_AVAILABLE))
                for d in drones}
