"""Simulations of the incidents the built-in machines exist for: each drives the real
machine through the real engine and store with simulated adapters, once as the incident
happened (a variant of the machine with its guard switched off, or the old procedure) and
once with the project's machine, and reports what went wrong in each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .loop import EventLoop, Progress


@dataclass(frozen=True, slots=True)
class Measure:
    """One line of the demo's table: what was measured, before and after."""

    what: str
    before: float
    after: float


@dataclass(frozen=True)
class Simulation:
    name: str
    summary: str
    run: Callable[..., dict[str, Any]]
    """``run(seed=, progress=, **options) -> report``: a JSON-able report, the same for
    the same seed and options, with ``measures``: a list of Measure as dicts."""
    options: Mapping[str, tuple[type, Any, str]] = field(default_factory=dict)
    """name -> (type, default, help)"""
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Options for the quick run `lifecycle demo` makes."""


def simulations() -> dict[str, Simulation]:
    """Every simulation, by name."""
    found: list[Simulation] = []
    return {s.name: s for s in found}


__all__ = ["EventLoop", "Measure", "Progress", "Simulation", "simulations"]
