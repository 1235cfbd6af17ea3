"""Case 12: a simulation's cost as it grows, in simulated time and in resources.

``lifecycle simulate drone-race`` (both variants, each on a SQLite file of its own, as the
command runs it) at a base size, at four times the simulated hours and at four times the
drones, each one whole simulation in this process with the same seed, timed per simulated
drone-hour (both variants' drone-hours, as the report counts them). A cost linear in the
work stays flat, about 1x the base's. (The whole run is not the measure: the simulated pool
starts empty and grows with demand, so four times the hours is about six times the
drone-hours, and the run's time grows with the work, not with the hours.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lifecycle.sim import drone_race

from .harness import Bench, BenchError, Case, Settings, Workspace

DRONES, HOURS = 30, 0.5
"""The base: 30 drones for half a simulated hour (about 5 s on an idle 2-core machine)."""
GROWTH = 4
SIZES = {"base": (DRONES, HOURS), "hours": (DRONES, HOURS * GROWTH),
         "drones": (DRONES * GROWTH, HOURS)}


def settings(rounds: int | None, quick: bool) -> Settings:
    """One simulation per round and no warm-up run: each is seconds long and starts from
    nothing (fresh databases), so a first run is no colder than the others."""
    return Settings(rounds=rounds or (1 if quick else 2), round_seconds=0.0,
                    warmup_seconds=0.0, min_warmup_ops=0, ops=1)


def _case(name: str) -> Case:
    drones, hours = SIZES[name]

    @contextmanager
    def open_(_workspace: Workspace) -> Iterator[Bench]:
        done = [0.0]

        def op() -> None:
            report = drone_race.simulate(seed=1, drones=drones, hours=hours)
            if report["after"]["payloads_killed"]:
                raise BenchError(f"drone-race {name}: the machine let payloads be killed: "
                                 f"{report['after']}")
            done[0] += report["before"]["drone_hours"] + report["after"]["drone_hours"]

        def units() -> float:
            since, done[0] = done[0], 0.0
            return since

        yield Bench(op, units=units)

    return Case(f"sim.drone_race.{name}",
                f"simulate drone-race, {drones} drones, {hours:g} h", open_)


CASES = [_case(name) for name in SIZES]
