"""The index of machines: each machine's entry point, spec version and handlers' names, kept
in a cache file so that ``lifecycle show`` knows them without importing a machine (with
pydantic and ``transitions``: about 90 ms) or reading the installed packages' metadata
(importing ``importlib.metadata`` and reading every package's entry points: tens of ms).

It is written whenever every machine has been loaded (:func:`lifecycle.machines.builtins`),
with what it was computed from: the modification times of the Python files of the machines'
packages that were loaded, and of the directories packages are installed in (installing or
removing a package changes them). It is stale, and not used, as soon as one of them differs,
as Python's own ``__pycache__`` is; a machine missing from it is looked up in the entry
points. Beside it, the machines' own commands (entry-point group ``lifecycle.commands``)
are kept the same way the first time they are read, so that ``lifecycle --help`` lists them
without reading the packages' metadata. Both live in ``$XDG_CACHE_HOME/lifecycle``
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

Entry = tuple[str, str, tuple[str, ...]]
"""A machine's entry point (``module:attribute``), spec version and handlers' names."""

VERSION = 1
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
            name: (target, version, tuple(handlers))
            for name, (target, version, handlers) in stored["machines"].items()}
    except (AttributeError, ValueError, KeyError, TypeError):
        return None


def fresh_commands() -> dict[str, str] | None:
    """The machines' own commands (name -> ``module:function``) as last read from the
    installed packages' entry points, if nothing they were read from has changed (the
    module search path included: a package on another path may ship more), else None."""
    stored = _fresh("commands")
    try:
        if stored is None or stored["path"] != sys.path:
            return None
        return {str(name): str(target) for name, target in stored["commands"].items()}
    except (AttributeError, KeyError, TypeError):
        return None


def write(machines: Mapping[str, Entry], directories: Iterable[str]) -> None:
    """Keep ``machines``, with the stamps of what they were computed from: ``directories``
    (where the packages that ship them are installed) and the site's package directories,
    and every loaded module of the packages their entry points name."""
    packages = {target.partition(":")[0].split(".")[0] for target, _, _ in machines.values()}
    files = {getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.split(".")[0] in packages}
    _write("machines", {"machines": {name: list(entry) for name, entry in machines.items()}},
           {*(f for f in files if f), *directories})


def write_commands(commands: Mapping[str, str], directories: Iterable[str]) -> None:
    """Keep the machines' ``commands``, read from the entry points of packages installed in
    ``directories``, with the module search path they were read on."""
    _write("commands", {"path": sys.path, "commands": dict(commands)}, set(directories))


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
