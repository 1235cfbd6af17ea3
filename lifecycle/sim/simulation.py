"""What a simulation is: a name, a summary, a run and its options; and the new database a
run makes for itself."""

from __future__ import annotations

import math
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ..store import Store

RANGES = {">0": "more than 0", ">=0": "0 or more", ">=1": "1 or more", "0..1": "from 0 to 1"}


class Option(NamedTuple):
    """An option of a simulation: its type, default and help, and for a number the values
    that make sense (a key of :data:`RANGES`; empty: any). A value out of range is refused
    before anything runs: a negative count or a zero interval would give an empty report or
    a loop that never ends, not an error."""

    kind: type
    default: Any
    help: str
    range: str = ""
    choices: tuple[str, ...] = ()

    def parse(self, raw: str) -> Any:
        """``raw`` as this option's value; ValueError saying what it takes."""
        if self.kind is bool:
            if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError("true or false")
            return raw.lower() in ("1", "true", "yes")
        if self.choices and raw not in self.choices:
            raise ValueError(f"one of {', '.join(self.choices)}")
        what = f"a{' finite' if self.kind is float else 'n'} {self.kind.__name__}"
        if self.range:
            what += f", {RANGES[self.range]}"
        try:
            value = self.kind(raw)
        except ValueError:
            raise ValueError(what) from None
        if self.kind is float and not math.isfinite(value):
            raise ValueError(what)
        low = {">0": 0, ">=0": 0, ">=1": 1, "0..1": 0}.get(self.range)
        if low is not None and (value < low or (self.range == ">0" and value == 0)
                                or (self.range == "0..1" and value > 1)):
            raise ValueError(what)
        return value


@dataclass(frozen=True)
class Simulation:
    name: str
    summary: str
    run: Callable[..., dict[str, Any]]
    """``run(seed=, progress=, **options) -> report``: a JSON-able report, the same for
    the same seed and options (but for its ``timing``), with ``measures``: a list of
    ``{"what", "before", "after"}``, the lines of the demo's table."""
    options: Mapping[str, Option] = field(default_factory=dict)
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Options for the quick run `lifecycle demo` makes."""


_empty: tempfile.TemporaryDirectory[str] | None = None
"""The folder of ``empty.db``: a database at the code's schema revision, migrated once per
process (removed when the process ends)."""
_empty_lock = threading.Lock()


def new_database(path: Path) -> Store:
    """A store on a new SQLite database at ``path``, at the code's schema revision, for a
    run's own use: a copy of an empty database this process migrated once. Alembic's upgrade
    of an empty database costs about a third of a second, as much as a small run; a run of
    ``startd-fetch`` makes four databases, and the tests run the simulations again and
    again."""
    global _empty
    with _empty_lock:
        if _empty is None:
            folder = tempfile.TemporaryDirectory(prefix="lifecycle-sim-schema-")
            Store(f"sqlite:///{Path(folder.name) / 'empty.db'}", upgrade=True).dispose()
            _empty = folder
        with closing(sqlite3.connect(Path(_empty.name) / "empty.db")) as source, \
                closing(sqlite3.connect(path)) as copy:
            source.backup(copy)
    return Store(f"sqlite:///{path}")
