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

    python -m benchmarks.sqlite_instructions [--fires 200] [--warm 50]
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

    @property
    def ratio(self) -> float:
        """lifecycle over raw sqlite3 running lifecycle's statements."""
        return self.per_fire["lifecycle"] / self.per_fire["statements"]

    @property
    def floor_ratio(self) -> float:
        """lifecycle over the ``--only sqlite`` floor (three statements of its own)."""
        return self.per_fire["lifecycle"] / self.per_fire["floor"]


def available() -> str | None:
    """Why the count cannot run here (None: it can)."""
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _opener(who: str, directory: Path) -> AbstractContextManager[Bench]:
    from . import persisted

    path = directory / f"{who}.db"
    if who == "floor":
        return persisted.sqlite_floor(path)
    if who == "statements":
        return statements(path)
    return persisted.lifecycle_fire(f"sqlite:///{path}", guarded=False)


@contextmanager
def statements(path: Path) -> Iterator[Bench]:
    """Raw sqlite3 running the statements a lifecycle fire runs, as lifecycle sends them
    (its catalogue's text, named parameters, the times as lifecycle stores them), on a file
    lifecycle created, with lifecycle's pragmas: what is left between this and lifecycle is
    lifecycle's own Python."""
    import datetime as dt
    import sqlite3

    from lifecycle import Engine, Store
    from lifecycle.store.schema import sqlite_time

    from . import toggle

    store = Store(f"sqlite:///{path}", upgrade=True)
    try:
        Engine(store, [toggle.spec(guarded=False)]).create(toggle.MACHINE, toggle.KEY)
        read, journal = store.sql.resource_by_key, store.sql.insert_journal
        move = store.sql.move[False, False]
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
        cursor.execute(read, {"key": key})
        row = cursor.fetchall()[0]
        rid, state, version, seq, spec_version = row[0], row[3], row[4], row[5], row[7]
        dest = "b" if state == "a" else "a"
        at = sqlite_time(dt.datetime.now(utc))
        cursor.execute(move, {
            "id_": rid, "version_": version, "seq_": seq, "observation_id_": row[10],
            "new_state": dest, "new_version": version + 1, "new_seq": seq + 1,
            "new_spec_version": spec_version, "now": at})
        if cursor.rowcount != 1:
            raise BenchError("statements: the compare-and-swap lost with no other writer")
        cursor.execute(journal, {
            "resource_id": rid, "seq": seq + 1, "kind": "transition", "trigger": trigger,
            "source": state, "dest": dest, "version": version + 1,
            "spec_version": spec_version, "actor": None, "at": at, "payload": None,
            "guards": None, "observation_id": None, "fence": None})
        connection.commit()

    try:
        yield Bench(op)
    finally:
        connection.close()


def _child(who: str, fires: int, warm: int) -> None:
    """Set a case up, fire ``warm`` times, then ``fires`` times inside ``starmap`` (what
    callgrind counts)."""
    with tempfile.TemporaryDirectory(prefix="lifecycle-instr-") as directory, \
            _opener(who, Path(directory)) as bench:
        op = bench.op
        for _ in range(warm):
            op()
        deque(starmap(op, repeat((), fires)), maxlen=0)
        if bench.verify is not None:
            bench.verify(warm + fires)


def _command(who: str, fires: int, warm: int, out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--collect-atstart=no", "--toggle-collect=starmap_next",
            sys.executable, "-m", "benchmarks.sqlite_instructions", "--child", who,
            "--fires", str(fires), "--warm", str(warm)]


def count(fires: int = 200, warm: int = 50,
          progress: Callable[[str], None] = lambda _: None) -> Count:
    """Instructions per fire of lifecycle and of the two floors (a process each under
    callgrind, at once)."""
    if fires < 1 or warm < 0:
        raise ValueError("fires: at least 1; warm: 0 or more")
    with tempfile.TemporaryDirectory(prefix="lifecycle-callgrind-") as directory:
        outs = {who: Path(directory) / f"{who}.callgrind" for who in WHO}
        progress(f"callgrind: lifecycle and raw sqlite3 (two floors), {fires} fires each")
        running = {who: subprocess.Popen(
            _command(who, fires, warm, outs[who]), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "PYTHONHASHSEED": "0"}) for who in WHO}
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
    return Count(fires, per_fire)


def report(counted: Count) -> str:
    n = counted.per_fire
    return (f"SQLite persisted fire, instructions per fire (callgrind, {counted.fires} fires "
            f"each, after warming up): lifecycle {n['lifecycle']:,.0f}; raw sqlite3 running "
            f"lifecycle's statements {n['statements']:,.0f}: {counted.ratio:.2f}x (goal 1.3x); "
            f"the three-statement floor {n['floor']:,.0f}: {counted.floor_ratio:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sqlite_instructions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=200)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--child", choices=WHO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.fires, args.warm)
        return 0
    problem = available()
    if problem is not None:
        print(f"skipped: {problem}", file=sys.stderr)
        return 1
    print(report(count(args.fires, args.warm,
                       lambda message: print(message, file=sys.stderr))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
