"""lifecycle: explicit, persisted finite-state machines of computing resources.

Everything an application uses is importable from here: machine specs, the engine and what
it returns, observations and probes, effects and the worker that runs them, the outbox's
listings, clocks, and every exception lifecycle raises on purpose.

Names are imported on first use (PEP 562), so that a program (the ``lifecycle`` command
among them) pays only for what it uses: ``import lifecycle`` loads neither SQLAlchemy nor
pydantic until a name that needs them is asked for.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from .fresh import Probe, ProbeBatch, ProbeCall, ProbeRequest
    from .outbox import effect_records, outbox_counts, retry_failed, timer_records
    from .records import (
        EffectRecord,
        FireResult,
        JournalEntry,
        Mismatch,
        Observation,
        Resource,
        TimerRecord,
    )
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

_WHERE: dict[str, str] = {
    "AmbiguousKey": "errors",
    "AsyncEngine": "aio",
    "AsyncWorker": "aio",
    "Clock": "clock",
    "ConcurrencyError": "errors",
    "DatabaseError": "errors",
    "Edge": "spec",
    "Effect": "effects",
    "EffectCall": "effects",
    "EffectError": "errors",
    "EffectRecord": "records",
    "EffectSpec": "spec",
    "Engine": "engine",
    "EventlessSpec": "spec",
    "FireResult": "records",
    "FollowUp": "effects",
    "Freshness": "spec",
    "Guard": "engine",
    "GuardContext": "compiled",
    "GuardError": "errors",
    "Handler": "effects",
    "InvalidData": "errors",
    "JournalEntry": "records",
    "LifecycleError": "errors",
    "LostClaim": "errors",
    "MachineSpec": "spec",
    "MailConfigError": "errors",
    "Mismatch": "records",
    "Observation": "records",
    "OnStale": "engine",
    "PermanentError": "errors",
    "Probe": "fresh",
    "ProbeBatch": "fresh",
    "ProbeCall": "fresh",
    "ProbeFailed": "errors",
    "ProbeRequest": "fresh",
    "Problem": "errors",
    "RenderFailed": "errors",
    "RendererMissing": "errors",
    "Resource": "records",
    "ResourceExists": "errors",
    "Retry": "effects",
    "RetryableError": "errors",
    "ScenarioError": "errors",
    "SchemaOutOfDate": "errors",
    "SimulatedClock": "clock",
    "SiteError": "errors",
    "SpecError": "errors",
    "SpecFor": "engine",
    "StaleObservation": "errors",
    "StateSpec": "spec",
    "Store": "store",
    "StrandedResources": "errors",
    "SystemClock": "clock",
    "Timeout": "spec",
    "TimerRecord": "records",
    "TransitionSpec": "spec",
    "UnknownMachine": "errors",
    "UnknownResource": "errors",
    "UnknownState": "errors",
    "UnknownTrigger": "errors",
    "Within": "transaction",
    "Worker": "worker",
    "WorkerStats": "worker",
    "effect_records": "outbox",
    "load_spec": "spec",
    "outbox_counts": "outbox",
    "retry_failed": "outbox",
    "timer_records": "outbox",
}
"""The module of each public name."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


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
    "ProbeBatch",
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
