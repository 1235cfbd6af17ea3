"""The index of machines: each machine's entry point, spec version and handlers' names, kept
in a cache file so that ``lifecycle show`` knows them without importing a machine (with
pydantic and ``transitions``: about 90 ms) or reading the installed packages' metadata
(importing ``importlib.metadata`` and reading every package's entry points: tens of ms).

It is written whenever every machine has been loaded (:func:`lifecycle.machines.builtins`),
with what it was computed from: the modification times of the Python files of the machines'
packages that were loaded, and of the directories packages are installed in (installing or
removing a package changes them). It is stale, and not used, as soon as one of them differs,
as Python's own ``__pycache__`` is; a machine missing from it is looked up in the entry
points. It lives in ``$XDG_CACHE_HOME/lifecycle`` (``~/.cache/lifecycle``), one file per
Python environment; when it cannot be written, nothing is cached."""

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


def path() -> str:
    """The index's file for this Python environment."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    prefix = format(zlib.crc32(sys.prefix.encode()), "08x")
    return os.path.join(cache, "lifecycle", f"machines-{prefix}.json")


def fresh() -> dict[str, Entry] | None:
    """The machines of the index if nothing it was computed from has changed, else None."""
    try:
        with open(path(), encoding="utf-8") as file:
            stored = json.load(file)
        if stored["format"] != VERSION or stored["python"] != sys.version or \
                any(_stamp(name) != stamp for name, stamp in stored["files"]):
            return None
        return {name: (target, version, tuple(handlers))
                for name, (target, version, handlers) in stored["machines"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(machines: Mapping[str, Entry], directories: Iterable[str]) -> None:
    """Keep ``machines``, with the stamps of what they were computed from: ``directories``
    (where the packages that ship them are installed) and the site's package directories,
    and every loaded module of the packages their entry points name."""
    packages = {target.partition(":")[0].split(".")[0] for target, _, _ in machines.values()}
    files = {getattr(module, "__file__", None) for name, module in list(sys.modules.items())
             if name.split(".")[0] in packages}
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    watched = sorted({*(f for f in files if f), *directories, *sites})
    document = {"format": VERSION, "python": sys.version,
                "files": [[name, _stamp(name)] for name in watched],
                "machines": {name: list(entry) for name, entry in machines.items()}}
    import threading

    target = path()
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
