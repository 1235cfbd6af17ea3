"""Simulations of the incidents the built-in machines exist for: each drives the real
machine through the real engine and store with simulated adapters, once as the incident
happened (a variant of the machine with its guard switched off, or the old procedure) and
once with the project's machine, and reports what went wrong in each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .loop import EventLoop, Progress


@dataclass(frozen=True)
class Simulation:
    name: str
    summary: str
    run: Callable[..., dict[str, Any]]
    """``run(seed=, progress=, **options) -> report``: a JSON-able report, the same for
    the same seed and options (but for its ``timing``), with ``measures``: a list of
    ``{"what", "before", "after"}``, the lines of the demo's table."""
    options: Mapping[str, tuple[type, Any, str]] = field(default_factory=dict)
    """name -> (type, default, help)"""
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Options for the quick run `lifecycle demo` makes."""


def simulations() -> dict[str, Simulation]:
    """Every simulation, by name."""
    from . import drone_race, job_exit_crash

    found: list[Simulation] = [drone_race.SIMULATION, job_exit_crash.SIMULATION]
    return {s.name: s for s in found}


__all__ = ["EventLoop", "Progress", "Simulation", "simulations"]
