"""Simulations of the incidents the built-in machines exist for: each drives the real
machine through the real engine and store with simulated adapters, once as the incident
happened (a variant of the machine with its guard switched off, or the old procedure) and
once with the project's machine, and reports what went wrong in each."""

from __future__ import annotations

from .loop import EventLoop, Progress
from .simulation import Simulation


def simulations() -> dict[str, Simulation]:
    """Every simulation, by name."""
    from . import drone_race, job_exit_crash, scancel_flood, startd_fetch

    found: list[Simulation] = [drone_race.SIMULATION, job_exit_crash.SIMULATION,
                             scancel_flood.SIMULATION, startd_fetch.SIMULATION]
    return {s.name: s for s in found}


__all__ = ["EventLoop", "Progress", "Simulation", "simulations"]
