"""Case 7: the command line's start-up, against ``python -c pass``.

Each operation starts a fresh interpreter and waits for it: ``python -c pass`` (what any
Python command costs), ``lifecycle --help``, and ``lifecycle show KEY`` of a batch job in a
SQLite file (opening the database, reading the resource, its machine's triggers, timers
and effects, printing the table). The interpreter is the one running the benchmarks, the
command the ``lifecycle`` module of it (``python -m lifecycle``, what the installed
``lifecycle`` script runs), with lifecycle's bytecode compiled first, as pip compiles an
installed package's (an editable checkout under ``PYTHONDONTWRITEBYTECODE`` would otherwise
compile every module it imports at every start, and the case would time the compiler).
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .harness import Bench, BenchError, Case, Workspace

_PREPARED: dict[int, str] = {}


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")}


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=_environment(), check=False)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(args)} exited {done.returncode}: "
                         f"{done.stderr.decode(errors='replace').strip()[-300:]}")


def _database(workspace: Workspace) -> str:
    """A SQLite file with one batch job in it (made once per workspace, untimed); lifecycle's
    bytecode compiled."""
    if id(workspace) not in _PREPARED:
        import lifecycle

        compileall.compile_dir(os.path.dirname(lifecycle.__file__), quiet=1)
        url = f"sqlite:///{workspace.sqlite_path('startup')}"
        _run("-m", "lifecycle", "db", "upgrade", "--db", url)
        _run("-m", "lifecycle", "create", "batch_job", "job-1", "--db", url)
        _PREPARED[id(workspace)] = url
    return _PREPARED[id(workspace)]


def _case(name: str, label: str, *args: str) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        url = _database(workspace)
        path = url.removeprefix("sqlite:///")
        command = [arg.replace("{db}", url).replace("{path}", path) for arg in args]
        yield Bench(lambda: _run(*command))

    return Case(f"startup.{name}", label, open_)


FLOOR = """
import json, sqlite3, sys
import click
from rich.console import Console
from rich.table import Table
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
row = db.execute('SELECT machine, "key", state, version, spec_version, data FROM '
                 'lifecycle_resources WHERE "key" = ?', (sys.argv[2],)).fetchone()
table = Table(show_header=False, box=None)
table.add_column(no_wrap=True)
table.add_column(overflow="fold")
for name, value in zip(("machine", "key", "state", "version", "spec version"), row):
    table.add_row(name, str(value))
for name, value in sorted(json.loads(row[5]).items()):
    table.add_row(name, json.dumps(value))
Console().print(table)
"""
"""The floor of ``show`` on the libraries the command is built on: click (imported, as a
command line needs it), rich, and one row read read-only through sqlite3, printed."""

CASES = [
    _case("pass", "python -c pass", "-c", "pass"),
    _case("floor", "click + rich + sqlite3: one row", "-c", FLOOR, "{path}", "job-1"),
    _case("help", "lifecycle --help", "-m", "lifecycle", "--help"),
    _case("show", "lifecycle show KEY", "-m", "lifecycle", "show", "job-1", "--db", "{db}"),
]
