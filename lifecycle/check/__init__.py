"""``lifecycle check``: every interleaving of a machine with a model of its world, up to
bounds, breadth first, on the machine's own decision code; the shortest path to each broken
invariant, as a timeline and as a scenario file that ``lifecycle replay`` fails on."""

from __future__ import annotations

from .declared import declared, recording
from .explore import (
    Bounds,
    Counterexample,
    Eventually,
    Invariant,
    Machine,
    Model,
    Report,
    check,
    variant,
)
from .memory import Actions, Memory
from .moves import (
    Action,
    Advance,
    Begin,
    Crash,
    Create,
    Finish,
    Fire,
    FireTimers,
    Move,
    Note,
    Observe,
    Retry,
    RunEffect,
    SetWorld,
    Step,
    Update,
)
from .output import scenario, text, timeline, write_scenario
from .state import State, View

__all__ = ["Action", "Actions", "Advance", "Begin", "Bounds", "Counterexample", "Crash",
           "Create", "Eventually", "Finish", "Fire", "FireTimers", "Invariant",
           "Machine", "Memory", "Model", "Move", "Note", "Observe", "Report", "Retry",
           "RunEffect", "SetWorld", "State", "Step", "Update", "View", "check",
           "declared", "recording", "scenario", "text", "timeline", "variant",
           "write_scenario"]
