"""``replay``, ``simulate`` and ``demo``: scenarios and the incidents' races."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import Progress as Bar
from rich.table import Table
from rich.text import Text

from ..demo import run_demo
from ..errors import LifecycleError, NotFound
from ..machines import builtins
from ..scenario import SCENARIO_SUFFIXES
from ..scenario import replay as replay_one
from ..sim import simulations
from ..sim.simulation import RANGES
from ..story import plural
from . import layout
from .common import (
    db_option,
    err,
    escape,
    json_option,
    out,
)
from .context import make_engine


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=True))
@json_option
def replay(files: tuple[str, ...], as_json: bool) -> None:
    """Replay scenario FILES (or every *.yaml/*.yml/*.json in a directory), each on a fresh
    database with a simulated clock; exit 1 at the first failing expectation of any."""
    paths: list[Path] = []
    for name in files:
        path = Path(name)
        if path.is_dir():
            paths += sorted(p for p in path.rglob("*") if p.suffix in SCENARIO_SUFFIXES)
        else:
            paths.append(path)
    machines = builtins()
    results = [replay_one(path, _with_checked_variant(path, machines)) for path in paths]
    failed = [r for r in results if not r.passed]
    if as_json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        for result in failed:
            out.print(f"[red]FAILED[/] {escape(result.file)}: {escape(str(result.failure))}")
        steps = sum(r.steps for r in results)
        verdict = "all passed" if not failed else f"{len(failed)} failed"
        out.print(f"{plural(len(results), 'scenario')}, {plural(steps, 'step')}, {verdict}")
    if failed:
        sys.exit(1)


def _with_checked_variant(path: Path, machines: dict[str, Any]) -> dict[str, Any]:
    """``machines``, and the machine of the world model the scenario names when it is no
    built-in (``lifecycle check drone_without_probe --write-scenario`` names the variant
    it checked)."""
    from ..scenario import load

    try:
        name = load(path).machine
    except LifecycleError:
        return machines  # (the replay says what is wrong with the file)
    if name in machines or Path(name).suffix:
        return machines
    from ..check.worlds import world_model

    model = world_model(name)
    return machines if model is None else {**machines, name: model.machine}


# -- simulations ---------------------------------------------------------------------------


@click.command()
@click.argument("name", required=False)
@click.option("--seed", default=1, show_default=True, help="The random seed: the same seed "
              "gives the same result.")
@click.option("--set", "settings", multiple=True, metavar="OPTION=VALUE",
              help="An option of the simulation (see the list without NAME).")
@click.option("--timing", is_flag=True, help="With --json, include the wall-clock timing "
              "(which differs between runs).")
@json_option
def simulate(name: str | None, seed: int, settings: tuple[str, ...], timing: bool,
             as_json: bool) -> None:
    """Run simulation NAME: the incident's race as it happened and with lifecycle's
    machine, on temporary databases. Without NAME, list the simulations and their options."""
    known = simulations()
    if name is None:
        for simulation in known.values():
            out.print(layout.block(Text.assemble((simulation.name, "bold"), ": ",
                                                 simulation.summary), [], indent=0),
                      soft_wrap=False)
            for option, spec in simulation.options.items():
                kind = spec.kind.__name__ + (f", {RANGES[spec.range]}" if spec.range else "")
                out.print(layout.block(f"  --set {option}={spec.default} ({kind})",
                                       [spec.help], indent=6), soft_wrap=False)
        return
    if name not in known:
        raise NotFound(f"unknown simulation {name!r}; known: {', '.join(known)}")
    simulation = known[name]
    options: dict[str, Any] = {}
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or key not in simulation.options:
            raise click.BadParameter(f"{setting!r}: options of {name} are "
                                     f"{', '.join(simulation.options)}", param_hint="--set")
        try:
            options[key] = simulation.options[key].parse(raw)
        except ValueError as exc:
            raise click.BadParameter(f"{setting!r}: {key} takes {exc}",
                                     param_hint="--set") from None
    with Bar(console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(name, total=1.0)
        report = simulation.run(seed=seed, progress=lambda done, total: bar.update(
            task, completed=done / total if total else 1.0), **options)
    if as_json:
        if not timing:
            report = {k: v for k, v in report.items() if k != "timing"}
        print(json.dumps({k: v for k, v in report.items() if k != "hints"}, indent=2))
        return
    columns = report.get("columns") or {"before": "before", "after": "after"}
    table = Table("what was measured", *columns.values(),
                  title=f"{name}, seed {seed}", title_justify="left")
    for column in table.columns[1:]:
        column.justify = "right"
    for measure in report["measures"]:
        table.add_row(measure["what"], *(str(measure[key]) for key in columns))
    out.print(table)
    if "timing" in report:
        speed = report["timing"]
        out.print(f"simulated in {speed['seconds']} s"
                  + (f", {speed['drone_hours_per_second']} drone-hours per second"
                     if "drone_hours_per_second" in speed else ""))


@click.command()
@db_option
def demo(db_url: str | None) -> None:
    """Run each built-in machine's incident, as it happened and with lifecycle's machine,
    on the embedded database (or --db), and show what each race cost."""
    run_demo(make_engine(db_url, upgrade=True), out)


