"""The engine a command works with: every built-in machine's guards, handlers and probes,
what $LIFECYCLE_PLUGINS adds, and the one resolver of a machine named on the command line
(a built-in name, a spec file, or a machine the database knows)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from ..effects import as_effect
from ..engine import Engine
from ..errors import SetupError, UnknownMachine
from ..machines import Builtin, builtin, builtins
from ..spec import MachineSpec, load_spec
from ..store import Store
from .common import PLUGINS_VARIABLE, plugin_names

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def open_store(db_url: str | None, *, upgrade: bool = False, check: bool = True,
               branches: Iterable[str] = ()) -> Store:
    """The command's database (with the migration ``branches`` of the machines it loads);
    its connections close when the command ends."""
    store = Store(db_url, upgrade=upgrade, check=check, branches=list(branches))
    context = click.get_current_context(silent=True)
    if context is not None:
        context.call_on_close(store.dispose)
    return store


def make_engine(db_url: str | None, *, upgrade: bool = False,
                machines: Iterable[str] | None = None, store: Store | None = None,
                as_met: bool = False) -> Engine:
    """An engine with every built-in machine's guards and handlers (or, given ``machines``,
    those of these built-in machines alone: a command about one resource loads no other;
    with ``as_met``, those of each built-in machine the engine meets, loaded when it first
    meets it, and every one's as soon as it meets a machine that is not built in); the
    built-in specs are registered as they are used, machines from files as the database
    stored them."""
    modules = plugins()
    wiring = Wiring(modules)
    if not as_met:
        wiring.add(builtins().values() if machines is None else [
            found for name in machines if (found := builtin(name)) is not None])
    # not strict: a built-in machine is recorded, observed and moved without its adapters;
    # its effects wait for a worker that has them, a risky edge without its probe is refused
    # upgrading (`lifecycle demo`) applies the chosen machines' branches with the core's
    branches = [m.migrations for m in wiring.chosen.values() if m.migrations] \
        if upgrade else []
    engine = Engine(store or open_store(db_url, upgrade=upgrade, branches=branches),
                    guards=wiring.guards, effects=wiring.effects, probes=wiring.probes,
                    spec_for=CommandSpecs(wiring if as_met else None), strict=False)
    wiring.engine = engine
    return engine


class Wiring:
    """The guards, effects and probes of the chosen built-in machines and of the plugins,
    merged as the command line merges them: every chosen machine's (in the order of their
    names), then the plugins' over them, then what the plugins' settings give each chosen
    machine (:meth:`Builtin.configured`). Machines chosen after the engine was made (as it
    meets them) are merged into the engine's own dicts."""

    def __init__(self, modules: list[Any]) -> None:
        self.modules = modules
        self.chosen: dict[str, Builtin] = {}
        self.met: set[str] = set()
        self.everything = False
        self.engine: Engine | None = None
        self.guards: dict[str, Any] = {}
        self.effects: dict[str, Any] = {}
        self.probes: dict[str, Any] = {}
        self.add(())

    def add(self, machines: Iterable[Builtin]) -> None:
        self.chosen.update((machine.spec.name, machine) for machine in machines)
        guards: dict[str, Any] = {}
        effects: dict[str, Any] = {}
        probes: dict[str, Any] = {}
        chosen = [self.chosen[name] for name in sorted(self.chosen)]
        for provider in [*chosen, *self.modules]:
            guards.update(getattr(provider, "guards", None) or {})
            effects.update(getattr(provider, "effects", None) or {})
            probes.update(getattr(provider, "probes", None) or {})
        for machine in chosen:  # what the plugins' settings give a machine (Builtin.configure)
            for module in self.modules:
                try:
                    wired_effects, wired_probes = machine.configured(module)
                except SetupError as exc:
                    raise SetupError(f"{PLUGINS_VARIABLE}: {exc}") from None
                effects.update(wired_effects)
                probes.update(wired_probes)
        if self.engine is not None:  # (the compiled machines hold the engine's guards)
            engine = self.engine
            engine.guards.update(_changed(self.guards, guards))
            engine.handlers.update((name, as_effect(handler))
                                   for name, handler in _changed(self.effects, effects))
            engine.probes.update(_changed(self.probes, probes))
        self.guards, self.effects, self.probes = guards, effects, probes

    def meet(self, machine: str) -> Builtin | None:
        """The built-in machine ``machine`` (None if it is not one), its guards, effects
        and probes now the engine's; meeting a machine that is not built in gives the
        engine every built-in machine's, as the command line gives them all (a spec file's
        machine may name theirs)."""
        if machine not in self.met:
            self.met.add(machine)
            found = builtin(machine)
            if found is not None and found.spec.name not in self.chosen:
                self.add([found])
            elif found is None and not self.everything:
                self.everything = True
                self.add(builtins().values())
        return self.chosen.get(machine)


def _changed(given: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The entries of ``now`` that ``given`` does not hold as they are."""
    return [(name, value) for name, value in now.items() if given.get(name) is not value]


class CommandSpecs:
    """The engine's ``spec_for``: a built-in machine runs with the code's spec, a machine
    named by a file on this command line with the file's; both are registered when the
    engine first needs them, so a command refused before (a bad key, bad data) writes
    nothing. Given the engine's ``wiring``, a machine the engine meets is wired first."""

    def __init__(self, wiring: Wiring | None = None) -> None:
        self.named: dict[str, MachineSpec] = {}
        self.wiring = wiring

    def __call__(self, machine: str) -> MachineSpec | None:
        if self.wiring is not None:
            found = self.wiring.meet(machine)
            return self.named.get(machine) or (found.spec if found is not None else None)
        return self.named.get(machine) or builtin_spec(machine)


def plugins() -> list[Any]:
    """Modules named in $LIFECYCLE_PLUGINS (comma-separated): each may define ``guards``,
    ``effects`` and ``probes`` dicts, for machines declared in spec files. A module in the
    current directory is found without PYTHONPATH; a module that fails to import (whatever
    it raises) is an error naming it, where it failed and why."""
    names = plugin_names()
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # after everything installed: it shadows nothing
    modules = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name != exc.name and not name.startswith(
                    exc.name + "."):
                raise SetupError(f"{PLUGINS_VARIABLE}: module {name!r} imports "
                                     f"{exc.name!r}, which is not installed") from None
            raise SetupError(
                f"{PLUGINS_VARIABLE}: no module {name!r} (looked in the current directory "
                f"{os.getcwd()!r} and the installed packages; is it {name}.py?)") from None
        except Exception as exc:
            raise SetupError(f"{PLUGINS_VARIABLE}: module {name!r} failed to import: "
                                 f"{type(exc).__name__}: {exc}{_where(exc)}") from None
        for attribute in ("guards", "effects", "probes"):
            value = getattr(module, attribute, None)
            if value is not None and not isinstance(value, Mapping):
                raise SetupError(
                    f"{PLUGINS_VARIABLE}: module {name!r} defines {attribute} as "
                    f"{type(value).__name__}; it must be a dict of name -> function")
        modules.append(module)
    return modules


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: the innermost line of the plugin's own code that raised."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def builtin_spec(machine: str) -> MachineSpec | None:
    """A built-in machine runs with the code's spec, not the copy stored in the database."""
    found = builtin(machine)
    return found.spec if found is not None else None


def resolve(name_or_path: str, engine: Callable[[], Engine], *,
            register: bool = True) -> MachineSpec:
    """The machine a command names: a built-in name, a spec file, or a machine the database
    knows. ``engine`` makes the engine only when one is needed; with ``register`` a built-in
    or a file is registered with it when first used (``create``), without it the spec is only
    read
    (``describe`` and ``diagram`` read a file without touching a database)."""
    if "\x00" in name_or_path:  # neither a file nor a machine's name
        raise UnknownMachine(name_or_path, [*builtins()])
    shipped = builtin(name_or_path)
    path = Path(name_or_path)
    if shipped is not None:
        spec = shipped.spec
    elif path.suffix.lower() in SPEC_SUFFIXES or path.exists():
        spec = load_spec(path)
    else:
        try:
            return engine().spec(name_or_path)
        except UnknownMachine:
            raise UnknownMachine(name_or_path, [*builtins(), *engine().machine_names()]) \
                from None
    if register:
        made = engine()
        if isinstance(made.spec_for, CommandSpecs) and made.spec_for.wiring is not None:
            made.spec_for.wiring.meet(spec.name)
        made.check_names(spec)  # what it lacks is said now; it is stored when first used
        if isinstance(made.spec_for, CommandSpecs):
            made.spec_for.named[spec.name] = spec
        else:
            made.register(spec)
    return spec
