"""lifecycle: explicit, persisted finite-state machines of computing resources.

What an application that declares and runs machines needs is importable from here (``PUBLIC``):
a machine's spec, the store, the engine and the worker (and their asyncio twins), what an
effect handler, a guard and a probe are given and return, the results the engine hands back,
the clocks, and the exception groups by cause with the two errors a handler raises.
Everything else lives in its own module: each specific exception in ``lifecycle.errors``,
the spec's parts in ``lifecycle.spec``, the outbox's listings in ``lifecycle.outbox_admin``;
asking ``lifecycle`` for one of those names says where it lives (``MOVED``).

Names are imported on first use (PEP 562), so that a program (the ``lifecycle`` command
among them) pays only for what it uses: ``import lifecycle`` loads neither SQLAlchemy nor
pydantic until a name that needs them is asked for.
"""

import importlib
import sys
from typing import TYPE_CHECKING, Any

PUBLIC: dict[str, tuple[str, ...]] = {
    "spec": ("MachineSpec", "load_spec"),
    "store": ("Store",),
    "engine": ("Engine",),
    "worker": ("Worker",),
    "aio": ("AsyncEngine", "AsyncWorker"),
    "effects": ("Effect", "EffectCall", "FollowUp", "Retry"),
    "compiled": ("GuardContext",),
    "freshness": ("ProbeRequest",),
    "results": ("FireResult", "JournalEntry", "Observation", "Resource"),
    "clock": ("SimulatedClock", "SystemClock"),
    "errors": ("Conflict", "EffectError", "InvalidInput", "LifecycleError", "NotFound",
        "OutsideError", "PermanentError", "RetryableError", "SetupError", "StorageError"),
}
"""Every public name, by the module it comes from: the one list the lazy imports, ``dir()``
and ``__all__`` follow (``tests/test_api.py`` checks that the imports below say the same)."""

MOVED: dict[str, tuple[str, ...]] = {
    "lifecycle.spec": ("Edge", "EffectSpec", "EventlessSpec", "Freshness", "StateSpec",
        "Timeout", "TransitionSpec"),
    "lifecycle.engine": ("Guard", "OnStale", "SpecFor"),
    "lifecycle.results": ("EffectRecord", "Mismatch", "TimerRecord"),
    "lifecycle.freshness": ("Probe", "ProbeBatch", "ProbeCall"),
    "lifecycle.effects": ("Handler",),
    "lifecycle.within": ("Within",),
    "lifecycle.worker": ("WorkerStats",),
    "lifecycle.outbox_admin": ("effect_records", "outbox_counts", "retry_failed",
        "timer_records"),
    "lifecycle.clock": ("Clock",),
    "lifecycle.errors": ("AmbiguousKey", "ConcurrencyError", "DatabaseError", "GuardError",
        "InvalidData", "LostClaim", "ProbeFailed", "Problem", "RenderFailed", "RendererMissing",
        "ResourceExists", "ScenarioError", "SchemaOutOfDate", "SpecError", "StaleObservation",
        "StrandedResources", "UnknownMachine", "UnknownResource", "UnknownState",
        "UnknownTrigger"),
    "lifecycle.adapters.sites": ("SiteError",),
    "lifecycle.adapters.smtp": ("MailConfigError",),
}
"""Names that were importable from ``lifecycle`` once, by the module that holds them now:
asking ``lifecycle`` for one raises an error that says where to import it from."""

_WHERE = {name: module for module, names in PUBLIC.items() for name in names}
_MOVED = {name: module for module, names in MOVED.items() for name in names}

if TYPE_CHECKING:  # what a type checker sees (explicit re-exports): the names of PUBLIC
    from .aio import AsyncEngine as AsyncEngine
    from .aio import AsyncWorker as AsyncWorker
    from .clock import SimulatedClock as SimulatedClock
    from .clock import SystemClock as SystemClock
    from .compiled import GuardContext as GuardContext
    from .effects import Effect as Effect
    from .effects import EffectCall as EffectCall
    from .effects import FollowUp as FollowUp
    from .effects import Retry as Retry
    from .engine import Engine as Engine
    from .errors import Conflict as Conflict
    from .errors import EffectError as EffectError
    from .errors import InvalidInput as InvalidInput
    from .errors import LifecycleError as LifecycleError
    from .errors import NotFound as NotFound
    from .errors import OutsideError as OutsideError
    from .errors import PermanentError as PermanentError
    from .errors import RetryableError as RetryableError
    from .errors import SetupError as SetupError
    from .errors import StorageError as StorageError
    from .freshness import ProbeRequest as ProbeRequest
    from .results import FireResult as FireResult
    from .results import JournalEntry as JournalEntry
    from .results import Observation as Observation
    from .results import Resource as Resource
    from .spec import MachineSpec as MachineSpec
    from .spec import load_spec as load_spec
    from .store import Store as Store
    from .worker import Worker as Worker


def _importing_from(frame: Any) -> bool:
    """Whether the caller of ``frame`` (``__getattr__``'s) is running ``from lifecycle import
    NAME`` (and not ``getattr``)."""
    import dis

    caller = frame.f_back if frame is not None else None
    return caller is not None and caller.f_code.co_code[caller.f_lasti] == dis.opmap[
        "IMPORT_FROM"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        home = _MOVED.get(name)
        if home is None:
            raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
        import inspect

        message = (f"module 'lifecycle' has no attribute {name!r}: it lives in {home} "
                   f"(from {home} import {name})")
        if _importing_from(inspect.currentframe()):
            # Python would replace an AttributeError's message by its own "cannot import
            # name"; an ImportError goes through as it is
            raise ImportError(message, name=__name__)
        raise AttributeError(message, name=name, obj=sys.modules[__name__])
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = sorted(_WHERE)
