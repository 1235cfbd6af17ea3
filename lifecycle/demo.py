"""``lifecycle demo``: each built-in machine's race, first as the incident happened and then
with the project's machine, on the embedded database; one table of what went wrong."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .engine import Engine
from .render import dot_program
from .sim import simulations


def run_demo(engine: Engine, out: Console, *, seed: int = 1) -> list[dict[str, Any]]:
    started = time.perf_counter()
    store = engine.store
    out.print(f"[bold]lifecycle demo[/] on {store.display_url}: each incident's race, as it "
              "happened and with lifecycle's machine\n", soft_wrap=False)
    # each run's resources under keys of their own (demo1-..., demo2-...): a simulation reads
    # and changes only the resources it created, so every run prints the same figures
    earlier = {r.key.split("-", 1)[0] for r in engine.resources()
               if re.fullmatch(r"demo\d+-.*", r.key)}
    prefix = f"demo{len(earlier) + 1}-"
    reports = []
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), TimeElapsedColumn(),
                  console=out, transient=True) as progress:
        for simulation in simulations().values():
            task = progress.add_task(f"{simulation.name}", total=1.0)

            def report(done: float, total: float, task: Any = task) -> None:
                progress.update(task, completed=done / total if total else 1.0)

            reports.append(simulation.run(seed=seed, progress=report, store=store,
                                          prefix=prefix, **simulation.demo))
    table = Table("scenario", "what was measured", "before", "after", box=box.SIMPLE_HEAD,
                  title="what each race cost", title_justify="left")
    table.columns[0].no_wrap = True
    for column in table.columns[2:]:
        column.justify = "right"
    for simulation, result in zip(simulations().values(), reports, strict=True):
        table.add_row(simulation.name, Text(simulation.summary, style="dim italic"), "", "")
        for i, measure in enumerate(result["measures"]):
            table.add_row("", measure["what"], _number(measure["before"]),
                          _number(measure["after"]),
                          end_section=i == len(result["measures"]) - 1)
    out.print(table)
    out.print(f"done in {time.perf_counter() - started:.1f} s. Look further with:")
    hints = [hint for result in reports for hint in result.get("hints", [])]
    picture = ("lifecycle diagram drone -o drone.svg   the same, as a picture: drone.svg, "
               "for a browser" if dot_program() is not None else
               "lifecycle diagram drone -o drone.mmd   the same, as Mermaid (paste into "
               "https://mermaid.live); with Graphviz installed, -o drone.svg draws it")
    hints += ["lifecycle simulate                   the simulations and their options, for "
              "a run of your own",
              "lifecycle describe drone             the machine's states and risky edges",
              picture]
    command = command_name()
    for hint in hints:
        # "COMMAND   what it shows": the command on a line of its own, runnable as printed
        # (never wrapped, however long the program's path: a terminal shows it whole)
        shown, *about = re.split(r" {2,}", hint.strip(), maxsplit=1)
        out.print(f"  {_runnable(shown, command)}", highlight=False, markup=False,
                  soft_wrap=True)
        if about:
            out.print(Padding(Text(about[0], style="dim"), (0, 0, 0, 6), expand=False),
                      soft_wrap=False)
    activate = Path(command).parent / "activate"
    if command != "lifecycle" and activate.exists():
        out.print(Text(f"(`. {shlex.quote(str(activate))}` puts lifecycle on your PATH, for "
                       "this shell)", style="dim"), soft_wrap=True)
    return reports


def command_name(argv0: str | None = None, path: str | None = None) -> str:
    """How to run this ``lifecycle`` from the current directory: ``lifecycle`` when that name
    on $PATH is this program, else the program's own path (``.venv/bin/lifecycle`` after
    ``make demo``), relative to the current directory when that is the shorter (below it,
    or beside it: ``../.venv/bin/lifecycle``), absolute otherwise; not quoted."""
    program = Path(argv0 if argv0 is not None else sys.argv[0])
    if program.name != "lifecycle":  # run as python -m lifecycle, or from a test
        return "lifecycle"
    found = shutil.which("lifecycle", path=path)
    if found is not None and Path(found).resolve() == program.resolve():
        return "lifecycle"
    absolute = str(program.resolve())
    relative = os.path.relpath(absolute, Path.cwd())
    if os.sep not in relative:  # in the current directory: ./lifecycle, not a $PATH lookup
        relative = os.path.join(os.curdir, relative)
    return min(relative, absolute, key=len)


def _runnable(hint: str, command: str) -> str:
    """The hint with its commands spelt as they run here (quoted for the shell if need be:
    a path with a space in it)."""
    return hint.replace("lifecycle ", f"{shlex.quote(command)} ") if command != "lifecycle" \
        else hint


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)
