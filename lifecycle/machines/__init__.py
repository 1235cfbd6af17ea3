"""Built-in machines. Each module declares a spec and the guards (and, later, effect
handlers) it needs; it uses nothing but the public API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..runner import GuardContext
from ..spec import MachineSpec


@dataclass(frozen=True)
class Builtin:
    spec: MachineSpec
    guards: Mapping[str, Callable[[GuardContext], bool]] = field(default_factory=dict)
    effects: Mapping[str, Any] = field(default_factory=dict)
    probes: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    simulation: Any = None
    """``World -> (guards, effects, probes)``: the machine with simulated adapters, for
    scenario files and simulations (see lifecycle.scenario.World)."""


def builtins() -> dict[str, Builtin]:
    """Every built-in machine, by name."""
    from . import batch_job, drone, job_exit

    found = [batch_job.BUILTIN, drone.BUILTIN, drone.TARDIS_BUILTIN, job_exit.BUILTIN]
    return {b.spec.name: b for b in found}
