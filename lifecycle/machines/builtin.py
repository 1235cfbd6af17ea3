"""What a built-in machine is: its spec, the guards and handlers it needs, and how it runs
with simulated adapters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..compiled import GuardContext
from ..spec import MachineSpec

if TYPE_CHECKING:  # (scenario brings the worker: a command about one resource needs neither)
    from ..scenario import Simulated


@dataclass(frozen=True)
class Builtin:
    """A machine that ships with lifecycle."""

    spec: MachineSpec
    guards: Mapping[str, Callable[[GuardContext], bool]] = field(default_factory=dict)
    effects: Mapping[str, Any] = field(default_factory=dict)
    probes: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    simulation: Simulated | None = None
    """``World -> (guards, effects, probes)``: the machine with simulated adapters, for
    scenario files and simulations (see lifecycle.scenario.World)."""
