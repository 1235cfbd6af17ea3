"""lifecycle: explicit, persisted finite-state machines of computing resources.

Everything an application uses is importable from here: machine specs, the engine and what
it returns, observations and probes, effects and the worker that runs them, the outbox's
listings, clocks, and every exception lifecycle raises on purpose.
"""

import logging

from .aio import AsyncEngine, AsyncWorker
from .clock import Clock, SimulatedClock, SystemClock
from .compiled import GuardContext
from .effects import Effect, EffectCall, FollowUp, Handler, Retry
from .engine import Engine, Guard, OnStale, SpecFor
from .errors import (
    AmbiguousKey,
    ConcurrencyError,
    DatabaseError,
    EffectError,
    GuardError,
    InvalidData,
    LifecycleError,
    LostClaim,
    MailConfigError,
    PermanentError,
    ProbeFailed,
    Problem,
    RendererMissing,
    RenderFailed,
    ResourceExists,
    RetryableError,
    ScenarioError,
    SchemaOutOfDate,
    SiteError,
    SpecError,
    StaleObservation,
    StrandedResources,
    UnknownMachine,
    UnknownResource,
    UnknownState,
    UnknownTrigger,
)
from .fresh import Probe, ProbeCall, ProbeRequest
from .outbox import (
    EffectRecord,
    TimerRecord,
    effect_records,
    outbox_counts,
    retry_failed,
    timer_records,
)
from .records import FireResult, JournalEntry, Mismatch, Observation, Resource
from .spec import (
    Edge,
    EffectSpec,
    EventlessSpec,
    Freshness,
    MachineSpec,
    StateSpec,
    Timeout,
    TransitionSpec,
    load_spec,
)
from .store import Store
from .transaction import Within
from .worker import Worker, WorkerStats

# a library logs, the application decides where to: nothing is printed unless it configures
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AmbiguousKey",
    "AsyncEngine",
    "AsyncWorker",
    "Clock",
    "ConcurrencyError",
    "DatabaseError",
    "Edge",
    "Effect",
    "EffectCall",
    "EffectError",
    "EffectRecord",
    "EffectSpec",
    "Engine",
    "EventlessSpec",
    "FireResult",
    "FollowUp",
    "Freshness",
    "Guard",
    "GuardContext",
    "GuardError",
    "Handler",
    "InvalidData",
    "JournalEntry",
    "LifecycleError",
    "LostClaim",
    "MachineSpec",
    "MailConfigError",
    "Mismatch",
    "Observation",
    "OnStale",
    "PermanentError",
    "Probe",
    "ProbeCall",
    "ProbeFailed",
    "ProbeRequest",
    "Problem",
    "RenderFailed",
    "RendererMissing",
    "Resource",
    "ResourceExists",
    "Retry",
    "RetryableError",
    "ScenarioError",
    "SchemaOutOfDate",
    "SimulatedClock",
    "SiteError",
    "SpecError",
    "SpecFor",
    "StaleObservation",
    "StateSpec",
    "Store",
    "StrandedResources",
    "SystemClock",
    "Timeout",
    "TimerRecord",
    "TransitionSpec",
    "UnknownMachine",
    "UnknownResource",
    "UnknownState",
    "UnknownTrigger",
    "Within",
    "Worker",
    "WorkerStats",
    "effect_records",
    "load_spec",
    "outbox_counts",
    "retry_failed",
    "timer_records",
]
