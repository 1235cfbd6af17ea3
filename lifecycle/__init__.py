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

PUBLIC: dict[str, tuple[str, ...]] = {
    "spec": ("Edge", "EffectSpec", "EventlessSpec", "Freshness", "MachineSpec", "StateSpec",
        "Timeout", "TransitionSpec", "load_spec"),
    "engine": ("Engine", "Guard", "OnStale", "SpecFor"),
    "store": ("Store",),
    "results": ("EffectRecord", "FireResult", "JournalEntry", "Mismatch", "Observation",
        "Resource", "TimerRecord"),
    "compiled": ("GuardContext",),
    "freshness": ("Probe", "ProbeRequest"),
    "effects": ("Effect", "EffectCall", "FollowUp", "Handler", "Retry"),
    "within": ("Within",),
    "worker": ("Worker", "WorkerStats"),
    "aio": ("AsyncEngine", "AsyncWorker"),
    "outbox_admin": ("effect_records", "outbox_counts", "retry_failed", "timer_records"),
    "clock": ("Clock", "SimulatedClock", "SystemClock"),
    "errors": ("AmbiguousKey", "ConcurrencyError", "Conflict", "DatabaseError", "EffectError",
        "GuardError", "InvalidData", "InvalidInput", "LifecycleError", "LostClaim", "NotFound",
        "OutsideError", "PermanentError", "ProbeFailed", "Problem", "RenderFailed",
        "RendererMissing", "ResourceExists", "RetryableError", "ScenarioError", "SchemaOutOfDate",
        "SetupError", "SpecError", "StaleObservation", "StorageError", "StrandedResources",
        "UnknownMachine", "UnknownResource", "UnknownState", "UnknownTrigger"),
}
"""Every public name, by the module it comes from: the one list the lazy imports, ``dir()``
and ``__all__`` follow (``tests/test_api.py`` checks that the imports below say the same)."""

_WHERE = {name: module for module, names in PUBLIC.items() for name in names}

if TYPE_CHECKING:  # what a type checker sees (explicit re-exports): the names of PUBLIC
    from .aio import AsyncEngine as AsyncEngine
    from .aio import AsyncWorker as AsyncWorker
    from .clock import Clock as Clock
    from .clock import SimulatedClock as SimulatedClock
    from .clock import SystemClock as SystemClock
    from .compiled import GuardContext as GuardContext
    from .effects import Effect as Effect
    from .effects import EffectCall as EffectCall
    from .effects import FollowUp as FollowUp
    from .effects import Handler as Handler
    from .effects import Retry as Retry
    from .engine import Engine as Engine
    from .engine import Guard as Guard
    from .engine import OnStale as OnStale
    from .engine import SpecFor as SpecFor
    from .errors import AmbiguousKey as AmbiguousKey
    from .errors import ConcurrencyError as ConcurrencyError
    from .errors import Conflict as Conflict
    from .errors import DatabaseError as DatabaseError
    from .errors import EffectError as EffectError
    from .errors import GuardError as GuardError
    from .errors import InvalidData as InvalidData
    from .errors import InvalidInput as InvalidInput
    from .errors import LifecycleError as LifecycleError
    from .errors import LostClaim as LostClaim
    from .errors import NotFound as NotFound
    from .errors import OutsideError as OutsideError
    from .errors import PermanentError as PermanentError
    from .errors import ProbeFailed as ProbeFailed
    from .errors import Problem as Problem
    from .errors import RendererMissing as RendererMissing
    from .errors import RenderFailed as RenderFailed
    from .errors import ResourceExists as ResourceExists
    from .errors import RetryableError as RetryableError
    from .errors import ScenarioError as ScenarioError
    from .errors import SchemaOutOfDate as SchemaOutOfDate
    from .errors import SetupError as SetupError
    from .errors import SpecError as SpecError
    from .errors import StaleObservation as StaleObservation
    from .errors import StorageError as StorageError
    from .errors import StrandedResources as StrandedResources
    from .errors import UnknownMachine as UnknownMachine
    from .errors import UnknownResource as UnknownResource
    from .errors import UnknownState as UnknownState
    from .errors import UnknownTrigger as UnknownTrigger
    from .freshness import Probe as Probe
    from .freshness import ProbeRequest as ProbeRequest
    from .outbox_admin import effect_records as effect_records
    from .outbox_admin import outbox_counts as outbox_counts
    from .outbox_admin import retry_failed as retry_failed
    from .outbox_admin import timer_records as timer_records
    from .results import EffectRecord as EffectRecord
    from .results import FireResult as FireResult
    from .results import JournalEntry as JournalEntry
    from .results import Mismatch as Mismatch
    from .results import Observation as Observation
    from .results import Resource as Resource
    from .results import TimerRecord as TimerRecord
    from .spec import Edge as Edge
    from .spec import EffectSpec as EffectSpec
    from .spec import EventlessSpec as EventlessSpec
    from .spec import Freshness as Freshness
    from .spec import MachineSpec as MachineSpec
    from .spec import StateSpec as StateSpec
    from .spec import Timeout as Timeout
    from .spec import TransitionSpec as TransitionSpec
    from .spec import load_spec as load_spec
    from .store import Store as Store
    from .within import Within as Within
    from .worker import Worker as Worker
    from .worker import WorkerStats as WorkerStats

def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = sorted(_WHERE)
