"""Simulated sites and pools for the drone: one that answers what a scenario file's world
says, and one with a life of its own for the simulation of the boot race."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..adapters import slurm
from ..adapters.sites import DELETED, NOT_AVAILABLE, Drone, DroneCrashed, SiteError, Terminated

SITE = "site"
"""The world's key for the site's own settings: ``world: {key: site, status:
{drone_minimum_lifetime: 600}}``."""


class ScenarioSite:
    """Answers from ``world.status[key]`` and records what it is asked to do.

    A drone's world status may give a Slurm job state instead (``slurm_state: TIMEOUT``),
    read through the Slurm site's mapping. It may also say that the site fails an action:
    ``fail: [stop]`` (or ``deploy``, ``terminate``) raises a ``SiteError``, and ``fail:
    [deploy_crashed]`` makes the deploy raise :class:`DroneCrashed`. The site's
    ``drone_minimum_lifetime`` is ``world.status["site"]["drone_minimum_lifetime"]``."""

    def __init__(self, world: Any) -> None:
        self.world = world

    @property
    def drone_minimum_lifetime(self) -> float | None:
        value = self.world.status.get(SITE, {}).get("drone_minimum_lifetime")
        return None if value is None else float(value)

    def _status(self, name: str) -> str:
        said = self.world.status.get(name, {})
        if "slurm_state" in said:  # as a Slurm site reads squeue's job state
            return slurm.resource_status(str(said["slurm_state"]))
        return str(said.get("resource_status", DELETED))

    def _fails(self, name: str, action: str) -> bool:
        return action in self.world.status.get(name, {}).get("fail", ())

    def deploy(self, drone: Drone) -> str:
        if self._fails(drone.name, "deploy_crashed"):
            self.world.actions.append(("deploy", drone.name, {"crashed": True}))
            raise DroneCrashed(f"drone {drone.name} crashed while it was deployed",
                               remote_id=f"job-{drone.name}")
        if self._fails(drone.name, "deploy"):
            raise SiteError(f"the site refused drone {drone.name}")
        self.world.actions.append(("deploy", drone.name, {}))
        return f"job-{drone.name}"

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        return {d.name: self._status(d.name) for d in drones}

    def stop(self, drone: Drone) -> None:
        if self._fails(drone.name, "stop"):
            self.world.actions.append(("stop", drone.name, {"failed": True}))
            raise SiteError(f"the site could not stop drone {drone.name}")
        self.world.actions.append(("stop", drone.name, {}))

    def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        if self._fails(drone.name, "terminate"):
            raise SiteError(f"the site could not terminate drone {drone.name}")
        now = self._status(drone.name)
        acted = expect is None or now == expect
        self.world.actions.append(("terminate", drone.name, {"expect": expect, "acted": acted}))
        if acted:  # the job is gone: the site says Deleted from now on
            said = self.world.status.get(drone.name, {})
            self.world.status[drone.name] = {
                **{k: v for k, v in said.items() if k != "slurm_state"},
                "resource_status": DELETED}
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
