"""The engine a command works with: every built-in machine's guards, handlers and probes,
what $LIFECYCLE_PLUGINS adds, and the one resolver of a machine named on the command line
(a built-in name, a spec file, or a machine the database knows)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..engine import Engine
from ..errors import LifecycleError, UnknownMachine
from ..machines import builtins, drone
from ..spec import MachineSpec, load_spec
from ..store import Store

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def open_store(db_url: str | None, *, upgrade: bool = False, check: bool = True) -> Store:
    """The command's database; its connections close when the command ends."""
    store = Store(db_url, upgrade=upgrade, check=check)
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(store.dispose)
    return store


def make_engine(db_url: str | None, *, upgrade: bool = False) -> Engine:
    """An engine with every built-in machine's guards and handlers; the built-in specs are
    registered as they are used, machines from files as the database stored them."""
    guards: dict[str, Any] = {}
    effects: dict[str, Any] = {}
    probes: dict[str, Any] = {}
    for provider in [*builtins().values(), *plugins()]:
        guards.update(getattr(provider, "guards", None) or {})
        effects.update(getattr(provider, "effects", None) or {})
        probes.update(getattr(provider, "probes", None) or {})
        if hasattr(provider, "drone_site"):  # a site and a pool for the built-in drones
            site, batch = provider.drone_site, provider.drone_batch_system
            effects.update(drone.effects(site, batch))
            probes["site"] = drone.probe(site, batch)
    # not strict: a built-in drone is recorded, observed and moved without a site's adapters;
    # its effects wait for a worker that has them, a risky edge without its probe is refused
    return Engine(open_store(db_url, upgrade=upgrade), guards=guards, effects=effects,
                  probes=probes, spec_for=builtin_spec, strict=False)


PLUGINS_VARIABLE = "LIFECYCLE_PLUGINS"


def plugins() -> list[Any]:
    """Modules named in $LIFECYCLE_PLUGINS (comma-separated): each may define ``guards``,
    ``effects`` and ``probes`` dicts, for machines declared in spec files."""
    names = [n.strip() for n in os.environ.get(PLUGINS_VARIABLE, "").split(",") if n.strip()]
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise LifecycleError(f"{PLUGINS_VARIABLE}: cannot import {name!r}: {exc}") from None
    return modules


def builtin_spec(machine: str) -> MachineSpec | None:
    """A built-in machine runs with the code's spec, not the copy stored in the database."""
    builtin = builtins().get(machine)
    return builtin.spec if builtin is not None else None


def resolve(name_or_path: str, engine: Callable[[], Engine], *,
            register: bool = True) -> MachineSpec:
    """The machine a command names: a built-in name, a spec file, or a machine the database
    knows. ``engine`` makes the engine only when one is needed; with ``register`` a built-in
    or a file is registered with it (``create``), without it the spec is only read
    (``describe`` and ``diagram`` read a file without touching a database)."""
    builtin = builtins().get(name_or_path)
    path = Path(name_or_path)
    if builtin is not None:
        spec = builtin.spec
    elif path.suffix.lower() in SPEC_SUFFIXES or path.exists():
        spec = load_spec(path)
    else:
        try:
            return engine().spec(name_or_path)
        except UnknownMachine:
            raise UnknownMachine(name_or_path, [*builtins(), *engine().machine_names()]) \
                from None
    return engine().register(spec) if register else spec
