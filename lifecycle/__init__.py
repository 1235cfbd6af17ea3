"""lifecycle: explicit, persisted finite-state machines of computing resources."""

from .clock import Clock, SimulatedClock, SystemClock
from .engine import Engine, FireResult, JournalEntry, Mismatch, Resource
from .errors import (
    AmbiguousKey,
    ConcurrencyError,
    DatabaseError,
    InvalidData,
    LifecycleError,
    Problem,
    ResourceExists,
    SchemaOutOfDate,
    SpecError,
    StrandedResources,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)
from .runner import GuardContext, GuardError
from .spec import (
    EventlessSpec,
    Freshness,
    MachineSpec,
    StateSpec,
    TransitionSpec,
    load_spec,
)
from .store import Store

__all__ = [
    "AmbiguousKey",
    "Clock",
    "ConcurrencyError",
    "DatabaseError",
    "Engine",
    "EventlessSpec",
    "FireResult",
    "Freshness",
    "GuardContext",
    "GuardError",
    "InvalidData",
    "JournalEntry",
    "LifecycleError",
    "MachineSpec",
    "Mismatch",
    "Problem",
    "Resource",
    "ResourceExists",
    "SchemaOutOfDate",
    "SimulatedClock",
    "SpecError",
    "StateSpec",
    "Store",
    "StrandedResources",
    "SystemClock",
    "TransitionSpec",
    "UnknownMachine",
    "UnknownResource",
    "UnknownState",
    "UnknownTrigger",
    "load_spec",
]
