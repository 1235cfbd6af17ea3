"""Simulations: the same seed gives the same JSON, bit for bit; the event loop; and what
each one shows."""

from __future__ import annotations

import json

import pytest

from lifecycle import SimulatedClock
from lifecycle.sim import simulations
from lifecycle.sim.loop import EventLoop

SMALL = {"drone-race": {"drones": 10, "hours": 0.5}, "job-exit-crash": {"jobs": 40},
         "scancel-flood": {"containers": 50}, "startd-fetch": {"slots": 2, "hours": 0.1}}


def test_every_simulation_has_a_small_setting() -> None:
    assert set(simulations()) == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_same_seed_gives_identical_json(name: str) -> None:
    simulation = simulations()[name]
    runs = [simulation.run(seed=11, **SMALL[name]) for _ in range(2)]
    for run in runs:
        run.pop("timing")
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)
    other = simulation.run(seed=12, **SMALL[name])
    other.pop("timing")
    assert other != runs[0]


def test_job_exit_crash_before_and_after() -> None:
    report = simulations()["job-exit-crash"].run(seed=3, jobs=80, crashes=0.3)
    before, after = report["before"], report["after"]
    assert report["plan"]["deaths"] > 10
    assert before["jobs_with_duplicate_events"] > 0 and before["reruns"] > 0
    assert after["jobs_done"] == 80
    for what in ("jobs_with_duplicate_events", "jobs_with_duplicate_ads", "lost_mails",
                 "reruns"):
        assert after[what] == 0, what
    assert after["restarts"] > 0  # the worker really died and was replaced


def test_event_loop_runs_in_time_order_and_moves_the_clock() -> None:
    clock = SimulatedClock("2026-01-01T00:00:00Z")
    loop = EventLoop(clock, seed=1)
    seen: list[tuple[str, float]] = []
    loop.at(10, lambda: seen.append(("b", loop.elapsed)))
    loop.at(5, lambda: seen.append(("a", loop.elapsed)))
    loop.at(10, lambda: seen.append(("c", loop.elapsed)))
    loop.every(4, lambda: seen.append(("tick", loop.elapsed)), until=9)
    loop.run(20)
    assert seen == [("tick", 0), ("tick", 4), ("a", 5), ("tick", 8), ("b", 10), ("c", 10)]
    assert loop.elapsed == 20
