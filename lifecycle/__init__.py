"""lifecycle: explicit, persisted finite-state machines of computing resources."""

import logging

from .clock import Clock, SimulatedClock, SystemClock
from .engine import Engine
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
    StaleObservation,
    StrandedResources,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)
from .fresh import Probe, ProbeRequest
from .records import FireResult, JournalEntry, Mismatch, Observation, Resource
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

# a library logs, the application decides where to: nothing is printed unless it configures
logging.getLogger(__name__).addHandler(logging.NullHandler())

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
    "Observation",
    "Probe",
    "ProbeRequest",
    "Problem",
    "Resource",
    "ResourceExists",
    "SchemaOutOfDate",
    "SimulatedClock",
    "SpecError",
    "StaleObservation",
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
