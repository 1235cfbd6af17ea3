"""A persisted SQLite fire counted in CPU instructions, lifecycle against raw sqlite3.

Time on a shared machine moves with its load; the instructions a program runs do not.
This runs the two cases of ``--only sqlite`` (:func:`persisted.lifecycle_fire` and
:func:`persisted.sqlite_floor`: the same file, pragmas and ``BEGIN IMMEDIATE``) under
``valgrind --tool=callgrind``, each in a process of its own, twice: with ``fires`` fires and
with ``base`` fires. The difference, divided by ``fires - base``, is what one fire costs
past the setup, the imports and the first fires (whose statements are compiled then); the
ratio of lifecycle's to the floor's is the figure issue 31 sets at 1.3x.

    python -m benchmarks.sqlite_instructions [--fires 300] [--base 50]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
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


def _child(who: str, fires: int) -> None:
    """Set a case up and fire ``fires`` times (what valgrind counts)."""
    with tempfile.TemporaryDirectory(prefix="lifecycle-instr-") as directory, \
            _opener(who, Path(directory)) as bench:
        op = bench.op
        for _ in range(fires):
            op()
        if bench.verify is not None:
            bench.verify(fires)


def _instructions(who: str, fires: int, directory: Path) -> int:
    out = directory / f"{who}-{fires}.callgrind"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               sys.executable, "-m", "benchmarks.sqlite_instructions", "--child", who,
               "--fires", str(fires)]
    done = subprocess.run(command, capture_output=True, timeout=1800,
                          cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    if done.returncode != 0:
        raise BenchError(f"{who} under callgrind exited {done.returncode}:\n"
                         f"{done.stderr.decode(errors='replace')[-2000:]}")
    found = _TOTALS.search(out.read_bytes())
    if found is None:
        raise BenchError(f"no instruction total in {out}")
    return int(found.group(1))


def count(fires: int = 300, base: int = 50,
          progress: Callable[[str], None] = lambda _: None) -> Count:
    """Instructions per fire of lifecycle and of the floor (4 runs under callgrind)."""
    if fires <= base:
        raise ValueError("fires must be more than base")
    per_fire: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lifecycle-callgrind-") as directory:
        for who in WHO:
            counts = []
            for n in (base, fires):
                progress(f"callgrind: {who}, {n} fires")
                counts.append(_instructions(who, n, Path(directory)))
            per_fire[who] = (counts[1] - counts[0]) / (fires - base)
    return Count(fires - base, per_fire)


def report(counted: Count) -> str:
    return (f"SQLite persisted fire, instructions per fire (callgrind, {counted.fires} fires "
            f"past the first): lifecycle {counted.per_fire['lifecycle']:,.0f}, raw sqlite3 "
            f"{counted.per_fire['floor']:,.0f}: {counted.ratio:.2f}x (goal 1.3x)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sqlite_instructions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fires", type=int, default=300)
    parser.add_argument("--base", type=int, default=50)
    parser.add_argument("--child", choices=WHO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.fires)
        return 0
    problem = available()
    if problem is not None:
        print(f"skipped: {problem}", file=sys.stderr)
        return 1
    print(report(count(args.fires, args.base,
                       lambda message: print(message, file=sys.stderr))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
