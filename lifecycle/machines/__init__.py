"""Machines that come as code: lifecycle's own and those any installed package ships.

Each is a :class:`Builtin` named by an entry point of the group ``lifecycle.machines`` (the
entry point's name is the machine's, its value ``module:attribute``); lifecycle declares its
own in its ``pyproject.toml`` like any other package, so a machine in a third party's package
is found, listed, registered and run by the command line, the dashboard, scenarios and the
worker the same way, once that package is installed. One machine is loaded without the
others: a command about one resource imports its machine's module alone.

What ``lifecycle show`` needs of a machine without importing it (its spec version and the
effects it has handlers for) is kept in the index (:mod:`.index`), a cache written whenever
every machine has been loaded and thrown away when a file they were loaded from changes."""

from __future__ import annotations

import functools
import importlib
import sys

from ..errors import SetupError
from . import index
from .builtin import Builtin, CommandLine

GROUP = "lifecycle.machines"
COMMANDS_GROUP = "lifecycle.commands"
"""The entry-point group a package names its machines' commands in: the entry point's name
is the command's, its value a function ``(lifecycle.cli.kit) -> click.Command``."""
"""The entry-point group a package names its machines in."""


def entry_points() -> dict[str, str]:
    """Every machine's ``module:attribute`` by name, from the installed packages' entry
    points (reading every installed package's metadata takes tens of milliseconds, once per
    process)."""
    return {name: target for name, (target, _) in _points().items()}


def _points() -> dict[str, tuple[str, str | None]]:
    """Each machine's entry point and the directory its package's metadata is in, read once
    per process and module search path."""
    return _read_points(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _read_points(search_path: tuple[str, ...]) -> dict[str, tuple[str, str | None]]:
    """(``search_path``, the modules' search path, is the key of what was read.)"""
    found: dict[str, tuple[str, str | None]] = {}
    for name, value, where in _installed(GROUP):
        if found.setdefault(name, (value, where))[0] != value:
            raise SetupError(f"two installed packages ship a machine {name!r} "
                             f"({found[name][0]} and {value}); uninstall one")
    if not any(value.startswith(f"{__name__}.") for value, _ in found.values()):
        raise SetupError(
            f"lifecycle's own machines are not among the installed entry points of "
            f"{GROUP!r}: this installation predates them or is broken; install lifecycle "
            "again (pip install -e . in a clone, or make .venv/.installed)")
    return found


def load(name: str, target: str) -> Builtin:
    """The machine ``name`` that ``target`` (``module:attribute``) names, checked."""
    module, _, attribute = target.partition(":")
    try:
        value: object = importlib.import_module(module)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise SetupError(f"machine {name!r}: its entry point {target!r} cannot be loaded: "
                         f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(value, Builtin):
        kind = type(value).__name__
        raise SetupError(f"machine {name!r}: its entry point {target!r} gives "
                         f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a "
                         "lifecycle.machines.Builtin")
    if value.spec.name != name:
        raise SetupError(f"machine {name!r}: its entry point {target!r} gives the machine "
                         f"{value.spec.name!r}; the entry point's name must be the spec's")
    return value


def commands() -> dict[str, index.Command]:
    """Every machine's own command by name: its entry point (``module:function``) and, once
    ``lifecycle --help`` has made it, its short help and help (else None, None); from the
    index when it is fresh, else from the installed packages' entry points (group
    ``lifecycle.commands``), which are then kept in the index."""
    known = index.fresh_commands()
    if known is None:
        read = _read_commands(tuple(sys.path))
        known = {name: (target, None, None) for name, (target, _) in read.items()}
        index.write_commands(known, {where for _, where in read.values() if where})
    return known


@functools.lru_cache(maxsize=8)
def _read_commands(search_path: tuple[str, ...]) -> dict[str, tuple[str, str | None]]:
    """Each command's entry point and the directory its package's metadata is in.
    (``search_path``, the modules' search path, is the key of what was read.)"""
    found: dict[str, tuple[str, str | None]] = {}
    for name, value, where in _installed(COMMANDS_GROUP):
        found.setdefault(name, (value, where))
    return found


def _installed(group: str) -> list[tuple[str, str, str | None]]:
    """The installed packages' entry points of ``group``: each one's name, value and the
    directory its package's metadata is in (None if unknown)."""
    from importlib import metadata

    return [(point.name, point.value,
             None if point.dist is None else str(point.dist.locate_file("")))
            for point in metadata.entry_points(group=group)]


def builtin(name: str) -> Builtin | None:
    """The machine ``name`` (importing its module only), or None if no package ships one."""
    known = index.fresh() or {}
    target = known[name][0] if name in known else entry_points().get(name)
    return load(name, target) if target is not None else None


def builtins() -> dict[str, Builtin]:
    """Every machine an installed package ships, by name (importing them all); keeps the
    index that :func:`shipped` reads up to date."""
    points = _points()
    found = {name: load(name, points[name][0]) for name in sorted(points)}
    table = {name: (points[name][0], machine.spec.version, tuple(sorted(machine.effects)),
                    machine.summary) for name, machine in found.items()}
    if index.fresh() != table:
        index.write(table, {where for _, where in points.values() if where is not None})
    return found


def shipped() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each machine's spec version and the effects it has handlers for, by name: from the
    index without importing a machine, or, when the index is missing or stale, by loading
    every machine (which writes it again)."""
    known = index.fresh()
    if known is None:
        return {name: (machine.spec.version, tuple(sorted(machine.effects)))
                for name, machine in builtins().items()}
    return {name: (version, handlers) for name, (_, version, handlers, _) in known.items()}


def listed() -> dict[str, tuple[str, str]]:
    """Each machine's spec version and summary, by name: from the index without importing
    a machine, or, when the index is missing or stale, by loading every machine (which
    writes it again)."""
    known = index.fresh()
    if known is None:
        return {name: (machine.spec.version, machine.summary)
                for name, machine in builtins().items()}
    return {name: (version, summary) for name, (_, version, _, summary) in known.items()}


__all__ = ["COMMANDS_GROUP", "GROUP", "Builtin", "CommandLine", "builtin", "builtins", "commands",
           "entry_points", "listed", "load", "shipped"]
