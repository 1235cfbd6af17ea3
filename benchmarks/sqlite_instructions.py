"""A persisted SQLite fire counted in CPU instructions, lifecycle against raw sqlite3.

Time on a shared machine moves with its load; the instructions a program runs do not.
This runs three cases under ``valgrind --tool=callgrind``, each in a process of its own
(all at once): lifecycle's fire (:func:`persisted.lifecycle_fire`), raw sqlite3 running the
statements lifecycle runs, with its pragmas (:func:`statements`: the floor issue 31 sets
1.3x over), and the ``--only sqlite`` floor (:func:`persisted.sqlite_floor`, three
statements of its own). Each sets itself up and fires ``warm`` times uncounted (statements
compiled, caches filled), then ``fires`` times counted: callgrind collects only inside
``itertools.starmap``'s C function (``--toggle-collect=starmap_next``), which runs those
fires and nothing else. The count divided by ``fires`` is one fire's instructions.

With ``--resources N`` (N > 1) the fire is counted on a fleet's database instead: N
resources with ten journal rows each (:func:`fleet._build`, built once, then copied for
each case), lifecycle against raw sqlite3 running its statements (the three-statement
floor has tables of its own, so it is left out). ``--resources 100000`` is issue 31's
100k resources / 1M journal rows.

    python -m benchmarks.sqlite_instructions [--fires 200] [--warm 50] [--resources N]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from itertools import repeat, starmap
from pathlib import Path

from .harness import Bench, BenchError

WHO = ("lifecycle", "statements", "floor")
"""lifecycle's fire; raw sqlite3 running lifecycle's own statements (:func:`statements`);
the ``--only sqlite`` floor (:func:`persisted.sqlite_floor`, its own three statements)."""
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Count:
    """Instructions per fire of each of :data:`WHO`, and their ratio."""

    fires: int
    per_fire: dict[str, float]
    resources: int = 1

    @property
    def ratio(self) -> float:
        """lifecycle over raw sqlite3 running lifecycle's statements."""
        return self.per_fire["lifecycle"] / self.per_fire["statements"]

    @property
    def floor_ratio(self) -> float | None:
        """lifecycle over the ``--only sqlite`` floor (three statements of its own; None on
        a fleet's database, where it is not run)."""
        floor = self.per_fire.get("floor")
        return None if floor is None else self.per_fire["lifecycle"] / floor


def available() -> str | None:
    """Why the count cannot run here (None: it can)."""
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _opener(who: str, directory: Path,
            database: Path | None = None) -> AbstractContextManager[Bench]:
    from . import persisted

    path = directory / f"{who}.db"
    if database is not None:  # a fleet's database, built once: a copy of its own
        shutil.copyfile(database, path)
    if who == "floor":
        return persisted.sqlite_floor(path)
    if who == "statements":
        return statements(path)
    return persisted.lifecycle_fire(f"sqlite:///{path}", guarded=False)


@contextmanager
def statements(path: Path) -> Iterator[Bench]:
    """Raw sqlite3 running the statements a lifecycle fire runs (its catalogue's text, the
    times as lifecycle stores them), on a file lifecycle created, with lifecycle's pragmas,
    its parameters bound as a raw sqlite3 program binds them: by position (``?``, a tuple;
    binding by name costs sqlite3 a string and a lookup per parameter). What is left between
    this and lifecycle is lifecycle's own Python."""
    import datetime as dt
    import sqlite3

    from lifecycle import Engine, Store
    from lifecycle.store.schema import sqlite_time

    from . import toggle

    store = Store(f"sqlite:///{path}", upgrade=True)
    try:
        Engine(store, [toggle.spec(guarded=False)]).create(toggle.MACHINE, toggle.KEY)
        quick = store.sql.quick  # the statements lifecycle's fire runs, numbered (?N)
        if quick is None or quick.MOVE != MOVED or quick.JOURNAL != JOURNALED:
            raise BenchError("statements: lifecycle's fire binds its statements in another "
                             "order now; bind them in that order here")
        read, move, journal = quick.by_key, quick.move, quick.journal
    finally:
        store.dispose()
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    cursor = connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                   "busy_timeout=30000"):
        cursor.execute(f"PRAGMA {pragma}")
    key, trigger, utc = toggle.KEY, toggle.TRIGGER, dt.UTC

    def op() -> None:
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(read, (key,))
        row = cursor.fetchall()[0]
        rid, state, version, seq, spec_version = row[0], row[3], row[4], row[5], row[7]
        dest = "b" if state == "a" else "a"
        at = sqlite_time(dt.datetime.now(utc))
        cursor.execute(move, (rid, version, seq, dest, version + 1, seq + 1, spec_version,
                              at))
        if cursor.rowcount != 1:
            raise BenchError("statements: the compare-and-swap lost with no other writer")
        cursor.execute(journal, (rid, seq + 1, "transition", trigger, state, dest,
                                 version + 1, spec_version, None, at, None, None, None, None))
        connection.commit()

    try:
        yield Bench(op)
    finally:
        connection.close()


MOVED = ("id_", "version_", "seq_", "new_state", "new_version", "new_seq", "new_spec_version",
         "now")
JOURNALED = ("resource_id", "seq", "kind", "trigger", "source", "dest", "version",
             "spec_version", "actor", "at", "payload", "guards", "observation_id", "fence")
_NAMED = re.compile(r":(\w+)")


def _positional(statement: str) -> tuple[str, tuple[str, ...]]:
    """A statement of lifecycle's catalogue (``:name`` parameters) with ``?`` instead, and
    the names of its parameters in order."""
    return _NAMED.sub("?", statement), tuple(_NAMED.findall(statement))


def _child(who: str, fires: int, warm: int, database: Path | None = None) -> None:
    """Set a case up, fire ``warm`` times, then ``fires`` times inside ``starmap`` (what
    callgrind counts)."""
    with tempfile.TemporaryDirectory(prefix="lifecycle-instr-") as directory, \
            _opener(who, Path(directory), database) as bench:
        op = bench.op
        for _ in range(warm):
            op()
        deque(starmap(op, repeat((), fires)), maxlen=0)
        if bench.verify is not None:
            bench.verify(warm + fires)


def _command(who: str, fires: int, warm: int, out: Path,
             database: Path | None) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--collect-atstart=no", "--toggle-collect=starmap_next",
            sys.executable, "-m", "benchmarks.sqlite_instructions", "--child", who,
            "--fires", str(fires), "--warm", str(warm),
            *(() if database is None else ("--database", str(database)))]


def _fleet(path: Path, resources: int) -> None:
    """A fleet's database of ``resources`` toggles, ten journal rows each (built in bulk,
    as ``--only fleet`` builds it)."""
    from lifecycle import Engine, Store

    from . import fleet, toggle

    store = Store(f"sqlite:///{path}", upgrade=True)
    try:
        fleet._build(store, Engine(store, [toggle.spec(guarded=False)]), "sqlite", resources)
    finally:
        store.dispose()


def count(fires: int = 200, warm: int = 50,
          progress: Callable[[str], None] = lambda _: None, resources: int = 1) -> Count:
    """Instructions per fire of lifecycle and of the two floors (a process each under
    callgrind, at once); with ``resources`` > 1, of lifecycle and raw sqlite3 running its
    statements on a fleet's database of that many resources."""
    if fires < 1 or warm < 0 or resources < 1:
        raise ValueError("fires: at least 1; warm: 0 or more; resources: at least 1")
    with tempfile.TemporaryDirectory(prefix="lifecycle-callgrind-") as directory:
        who_runs, database = WHO, None
        if resources > 1:
            who_runs, database = WHO[:2], Path(directory) / "fleet.db"
            progress(f"building a fleet of {resources:,} resources")
            _fleet(database, resources)
        outs = {who: Path(directory) / f"{who}.callgrind" for who in who_runs}
        progress(f"callgrind: lifecycle and raw sqlite3, {fires} fires each")
        running = {who: subprocess.Popen(
            _command(who, fires, warm, outs[who], database), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "PYTHONHASHSEED": "0"}) for who in who_runs}
        per_fire: dict[str, float] = {}
        for who, process in running.items():
            _, stderr = process.communicate(timeout=3600)
            if process.returncode != 0:
                raise BenchError(f"{who} under callgrind exited {process.returncode}:\n"
                                 f"{stderr.decode(errors='replace')[-2000:]}")
            found = _TOTALS.search(outs[who].read_bytes())
            if found is None:
                raise BenchError(f"no instruction total in {outs[who]}")
            per_fire[who] = int(found.group(1)) / fires
    return Count(fires, per_fire, resources)


def report(counted: Count) -> str:
    n = counted.per_fire
    where = "" if counted.resources == 1 else \
        f" among {counted.resources:,} resources and {counted.resources * 10:,} journal rows"
    floor = "" if counted.floor_ratio is None else \
        f"; the three-statement floor {n['floor']:,.0f}: {counted.floor_ratio:.2f}x"
    return (f"SQLite persisted fire{where}, instructions per fire (callgrind, {counted.fires} "
            f"fires each, after warming up): lifecycle {n['lifecycle']:,.0f}; raw sqlite3 "
            f"running lifecycle's statements {n['statements']:,.0f}: {counted.ratio:.2f}x "
            f"(goal 1.3x){floor}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sqlite_instructions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=200)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--resources", type=int, default=1,
                        help="count on a fleet's database of this many resources, ten "
                             "journal rows each (100000: issue 31's large database)")
    parser.add_argument("--child", choices=WHO, help=argparse.SUPPRESS)
    parser.add_argument("--database", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.fires, args.warm, args.database)
        return 0
    problem = available()
    if problem is not None:
        print(f"skipped: {problem}", file=sys.stderr)
        return 1
    print(report(count(args.fires, args.warm,
                       lambda message: print(message, file=sys.stderr), args.resources)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
