"""What a built-in machine is: its spec, the guards and handlers it needs, and how it runs
with simulated adapters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (scenario brings the worker; a spec, pydantic and transitions: a command
    # that reads a resource from the database's own driver needs none of them)
    from ..compiled import GuardContext
    from ..scenario import Simulated
    from ..spec import MachineSpec


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
