"""The index of machines: each machine's entry point, spec version, handlers' names and
summary, kept in a cache file so that ``lifecycle show`` and ``lifecycle machines`` know
them without importing a machine (with
pydantic and ``transitions``: about 90 ms) or reading the installed packages' metadata
(importing ``importlib.metadata`` and reading every package's entry points: tens of ms).

It is written whenever every machine has been loaded (:func:`lifecycle.machines.builtins`),
with what it was computed from: the modification times of the Python files of the machines'
packages that were loaded, and of the directories packages are installed in (installing or
removing a package changes them). It is stale, and not used, as soon as one of them differs,
as Python's own ``__pycache__`` is; a machine missing from it is looked up in the entry
points. Beside it, the machines' own commands (entry-point group ``lifecycle.commands``)
are kept the same way the first time they are read, with each command's help once
``lifecycle --help`` has made the command (stamped then by the files of the modules that
made it), so that ``lifecycle --help`` lists them without reading the packages' metadata
or importing a command's module. Both live in ``$XDG_CACHE_HOME/lifecycle``
(``~/.cache/lifecycle``), a file each per Python environment; when they cannot be written,
nothing is cached."""

from __future__ import annotations

import contextlib
import json
import os
import site
import sys
import zlib
from collections.abc import Iterable, Mapping

Entry = tuple[str, str, tuple[str, ...], str]
"""A machine's entry point (``module:attribute``), spec version, handlers' names and
summary."""

Command = tuple[str, str | None, str | None]
"""A machine's command: its entry point (``module:function``), and its short help and help
as click gives them (None, None: not read yet)."""

VERSION = 3
"""The index's format; an index of another format is stale."""


def path(kind: str = "machines") -> str:
    """The index's file (``kind``: ``machines``, or ``commands`` for the machines' own
    commands) for this Python environment."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    prefix = format(zlib.crc32(sys.prefix.encode()), "08x")
    return os.path.join(cache, "lifecycle", f"{kind}-{prefix}.json")


def fresh() -> dict[str, Entry] | None:
    """The machines of the index if nothing it was computed from has changed, else None."""
    stored = _fresh("machines")
    try:
        return None if stored is None else {
            name: (target, version, tuple(handlers), summary)
            for name, (target, version, handlers, summary) in stored["machines"].items()}
    except (AttributeError, ValueError, KeyError, TypeError):
        return None


def fresh_commands() -> dict[str, Command] | None:
    """The machines' own commands (name -> entry point, short help, help) as last read from
    the installed packages' entry points, if nothing they were read from has changed (the
    module search path included: a package on another path may ship more), else None."""
    return _commands(_fresh("commands"))


def _commands(stored: dict | None) -> dict[str, Command] | None:  # type: ignore[type-arg]
    try:
        if stored is None or stored["path"] != sys.path:
            return None
        return {str(name): (str(target), _text(short), _text(help_))
                for name, (target, short, help_) in stored["commands"].items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _text(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(value)
    return value


def write(machines: Mapping[str, Entry], directories: Iterable[str]) -> None:
    """Keep ``machines``, with the stamps of what they were computed from: ``directories``
    (where the packages that ship them are installed) and the site's package directories,
    and every loaded module of the packages their entry points name."""
    _write("machines", {"machines": {name: list(entry) for name, entry in machines.items()}},
           {*_loaded_files(target for target, _, _, _ in machines.values()), *directories})


def write_commands(commands: Mapping[str, Command], directories: Iterable[str]) -> None:
    """Keep the machines' ``commands``, read from the entry points of packages installed in
    ``directories``, with the module search path they were read on and every loaded module
    of the packages their entry points name (what made the helps that are known)."""
    _write("commands", {"path": sys.path,
                        "commands": {name: list(entry) for name, entry in commands.items()}},
           {*_loaded_files(target for target, _, _ in commands.values()), *directories})


def add_command_helps(helps: Mapping[str, tuple[str | None, str | None]]) -> None:
    """Keep the short help and help of the machines' commands in ``helps`` (as the commands
    their modules made say), beside the commands the index holds; the index stays stamped by
    what it was, and now by the modules that made the commands too."""
    stored = _fresh("commands")
    known = _commands(stored)
    if stored is None or known is None:
        return
    commands = {name: (target, *helps.get(name, (short, help_)))
                for name, (target, short, help_) in known.items()}
    _write("commands", {"path": sys.path,
                        "commands": {name: list(entry) for name, entry in commands.items()}},
           {*(name for name, _ in stored["files"]),
            *_loaded_files(target for target, _, _ in commands.values())})


def _loaded_files(targets: Iterable[str]) -> set[str]:
    """The files of every loaded module of the packages that ``targets`` (``module:name``)
    are in."""
    packages = {target.partition(":")[0].split(".")[0] for target in targets}
    files = {getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.split(".")[0] in packages}
    return {file for file in files if file}


def _fresh(kind: str) -> dict | None:  # type: ignore[type-arg]
    """The index file of ``kind`` if nothing it was computed from has changed."""
    try:
        with open(path(kind), encoding="utf-8") as file:
            stored = json.load(file)
        if stored["format"] != VERSION or stored["python"] != sys.version or \
                any(_stamp(name) != stamp for name, stamp in stored["files"]):
            return None
        return stored if isinstance(stored, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(kind: str, content: dict, watched: set[str]) -> None:  # type: ignore[type-arg]
    """``content`` kept in the index file of ``kind``, with the stamps of ``watched`` and
    of the site's package directories (installing or removing a package changes them)."""
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    document = {"format": VERSION, "python": sys.version,
                "files": [[name, _stamp(name)] for name in sorted({*watched, *sites})],
                **content}
    import threading

    target = path(kind)
    temporary = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(document, file)
        os.replace(temporary, target)
    except OSError:  # (a read-only home: nothing is cached, every show loads the machines)
        with contextlib.suppress(OSError):
            os.remove(temporary)


def _stamp(name: str) -> list[int] | None:
    """What changes when the file or directory ``name`` does (None: it does not exist)."""
    try:
        found = os.stat(name)
    except OSError:
        return None
    return [found.st_mtime_ns, found.st_size, found.st_ino]
