"""The two interfaces a drone talks through, as in TARDIS: the *site* that runs the drone's
own job (Slurm, HTCondor, a cloud) and the overlay *batch system* the drone joins as a
machine (an HTCondor pool). Status calls take many drones at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import OutsideError


class SiteError(OutsideError):
    """A drone's site could not be asked or refused (timeout, authentication, quota).
    Retryable."""

# ResourceStatus, from the site about the drone's job
BOOTING, RUNNING, STOPPED, DELETED, ERROR = "Booting", "Running", "Stopped", "Deleted", "Error"
RESOURCE_STATUSES = (BOOTING, RUNNING, STOPPED, DELETED, ERROR)

UNKNOWN = "Unknown"
"""Not a ResourceStatus: what a site answers for a drone whose own status call failed or
hung while the others' did not. The drone is not observed this time (no risky edge fires on
it), which is not at all what a drone missing from the answer means (Deleted)."""

# MachineStatus, from the overlay pool about the drone as a machine
AVAILABLE, DRAINING, DRAINED, NOT_AVAILABLE = "Available", "Draining", "Drained", "NotAvailable"
MACHINE_STATUSES = (AVAILABLE, DRAINING, DRAINED, NOT_AVAILABLE)


@dataclass(frozen=True, slots=True)
class Drone:
    """What an adapter needs to know of a drone."""

    name: str
    remote_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Terminated:
    """The outcome of a fenced terminate: whether the site acted, and if not, why."""

    acted: bool
    detail: str = ""


class DroneCrashed(SiteError):
    """Raised by a site's ``deploy`` when the drone crashed while it was being deployed
    (TARDIS's ``TardisDroneCrashed``): the drone goes to ``cleanup``, which removes whatever
    the site left of it (``remote_id``, when the site knows one), instead of to ``down``."""

    def __init__(self, message: str, remote_id: str | None = None) -> None:
        super().__init__(message)
        self.remote_id = remote_id


class Site(Protocol):
    """A drone's site. It may also have a ``drone_minimum_lifetime`` attribute (seconds, or
    None), TARDIS's site setting: an available drone is drained once it has been available
    for longer; the deploy effect copies it into each drone's data."""

    def deploy(self, drone: Drone) -> str:
        """Submit the drone's job; its id at the site. Raise :class:`DroneCrashed` when the
        drone crashed on the way (it is then cleaned up), or another ``SiteError`` when the
        site refused it (the deploy is retried, then the drone goes down)."""
        ...

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """The ResourceStatus of each drone (by name), in as few calls as the site allows;
        a drone the site no longer knows is Deleted (or left out); a drone whose own call
        failed while the others' did not is :data:`UNKNOWN`. Raise ``SiteError`` when the
        site could not be asked at all."""
        ...

    def stop(self, drone: Drone) -> None:
        """Ask the drone's job to stop gracefully."""
        ...

    def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        """Remove the drone's job, but only if it is still in the ResourceStatus ``expect``
        (None: whatever it is). A job that moved on (a booting job that started running)
        is left alone: ``acted`` is False."""
        ...


class BatchSystem(Protocol):
    def integrate(self, drone: Drone, *, open_gate: bool) -> None:
        """Let the drone's machine into the pool (with ``open_gate``: let it take payload)."""
        ...

    def drain(self, drone: Drone) -> None:
        ...

    def disintegrate(self, drone: Drone) -> None:
        ...

    def machine_status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """The MachineStatus of each drone (by name); a machine the pool does not know is
        NotAvailable."""
        ...


class PoolFigures(Protocol):
    """What the overlay pool says of how its drones are used, as TARDIS's batch system
    adapters report it: per drone, the largest (allocation) and the smallest (utilisation)
    of the ratios of requested to total resources (CPU, memory, disk), from 0 to 1; a drone
    the pool does not know is 0. A ``DronePool`` (COBalD's pool interface) reads them."""

    def allocation(self, drones: Sequence[Drone]) -> dict[str, float]:
        ...

    def utilisation(self, drones: Sequence[Drone]) -> dict[str, float]:
        ...
