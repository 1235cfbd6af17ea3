"""A persisted SQLite fire counted in CPU instructions, lifecycle against raw sqlite3.

Time on a shared machine moves with its load; the instructions a program runs do not.
This runs the two cases of ``--only sqlite`` (:func:`persisted.lifecycle_fire` and
:func:`persisted.sqlite_floor`: the same file, pragmas and ``BEGIN IMMEDIATE``) under
``valgrind --tool=callgrind``, each in a process of its own (the two at once). Each sets
itself up and fires ``warm`` times uncounted (statements compiled, caches filled), then
``fires`` times counted: callgrind collects only inside ``itertools.starmap``'s C function
(``--toggle-collect=starmap_next``), which runs those fires and nothing else. The count
divided by ``fires`` is one fire's instructions; lifecycle's over the floor's is the figure
issue 31 sets at 1.3x.

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
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import repeat, starmap
from pathlib import Path

from .harness import Bench, BenchError

WHO = ("lifecycle", "floor")
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Count:
    """Instructions per fire of each of :data:`WHO`, and their ratio."""

    fires: int
    per_fire: dict[str, float]

    @property
    def ratio(self) -> float:
        return self.per_fire["lifecycle"] / self.per_fire["floor"]


def available() -> str | None:
    """Why the count cannot run here (None: it can)."""
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _opener(who: str, directory: Path) -> AbstractContextManager[Bench]:
    from . import persisted

    path = directory / f"{who}.db"
    if who == "floor":
        return persisted.sqlite_floor(path)
    return persisted.lifecycle_fire(f"sqlite:///{path}", guarded=False)


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
    """Instructions per fire of lifecycle and of the floor (two processes under callgrind,
    at once)."""
    if fires < 1 or warm < 0:
        raise ValueError("fires: at least 1; warm: 0 or more")
    with tempfile.TemporaryDirectory(prefix="lifecycle-callgrind-") as directory:
        outs = {who: Path(directory) / f"{who}.callgrind" for who in WHO}
        progress(f"callgrind: lifecycle and raw sqlite3, {fires} fires each")
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
    return (f"SQLite persisted fire, instructions per fire (callgrind, {counted.fires} fires "
            f"each, after warming up): lifecycle {counted.per_fire['lifecycle']:,.0f}, raw sqlite3 "
            f"{counted.per_fire['floor']:,.0f}: {counted.ratio:.2f}x (goal 1.3x)")


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
