"""``check``: explore a machine with its world, breadth first, within bounds."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import time as timing
from pathlib import Path
from typing import Any

import click

from ..check import Bounds, Model, Report, declared, output
from ..check import check as explore
from ..check.memory import CheckError
from ..check.worlds import names, world_model
from ..spec import load_spec
from .common import json_option

SPEC_FILES = (".yaml", ".yml", ".json")


def _model(name: str) -> Model:
    """A built-in machine's model, a spec file with a ``check:`` section, or
    ``FILE.py:NAME`` / ``MODULE:NAME``: a Model (or a function that makes one) of the user's
    own."""
    found = world_model(name)
    if found is not None:
        return found
    if Path(name).suffix in SPEC_FILES and Path(name).is_file():
        try:
            return declared(load_spec(name))
        except CheckError as exc:
            raise click.BadParameter(str(exc), param_hint="MACHINE") from None
    where, _, attribute = name.rpartition(":")
    if not where or not attribute:
        raise click.BadParameter(
            f"{name!r} is neither a built-in machine with a world model "
            f"({', '.join(names())}), a spec file, nor FILE.py:NAME or MODULE:NAME",
            param_hint="MACHINE")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None or not Path(where).is_file():
            raise click.BadParameter(f"no Python file {where}", param_hint="MACHINE")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    value = getattr(module, attribute, None)
    value = value() if callable(value) and not isinstance(value, Model) else value
    if not isinstance(value, Model):
        raise click.BadParameter(f"{name}: {attribute} is not a lifecycle.check.Model",
                                 param_hint="MACHINE")
    return value


@click.command()
@click.argument("machine")
@click.option("--depth", type=click.IntRange(0), default=8, show_default=True,
              help="Moves from the starting state.")
@click.option("--resources", type=click.IntRange(1), default=None,
              help="Resources the world starts with (default: the model's).")
@click.option("--horizon", type=click.FloatRange(0), default=300.0, show_default=True,
              help="Seconds the clock may move.")
@click.option("--invariant", "invariants", multiple=True, metavar="NAME",
              help="Check only this invariant (again for more).")
@click.option("--write-scenario", "scenario_path", type=click.Path(dir_okay=False),
              help="Write each counterexample as a scenario file here (PATH, or PATH's name "
                   "with the invariant's when there are several).")
@json_option
def check(machine: str, depth: int, resources: int | None, horizon: float,
          invariants: tuple[str, ...], scenario_path: str | None, as_json: bool) -> None:
    """Explore every interleaving of MACHINE with its world, breadth first, up to the
    bounds; print each broken invariant's shortest counterexample; exit 1 if any."""
    model = _model(machine)
    if invariants:
        known = {i.name: i for i in model.invariants}
        unknown = [n for n in invariants if n not in known]
        if unknown:
            raise click.BadParameter(f"unknown invariant {', '.join(unknown)} (the model has "
                                     f"{', '.join(known) or 'none'})", param_hint="--invariant")
        model = dataclasses.replace(model, invariants=[known[n] for n in invariants])
    began = timing.perf_counter()
    report = explore(model, Bounds(depth=depth, resources=resources, horizon=horizon))
    seconds = timing.perf_counter() - began
    written = _write(report, scenario_path,
                     Path(machine) if Path(machine).suffix in SPEC_FILES else None)
    if as_json:
        print(json.dumps(_json(report, seconds, written), indent=2))
    else:
        click.echo(output.text(report))
        click.echo(f"{report.states:,} states in {seconds:.2f} s")
        for name, path in written.items():
            click.echo(f"{name}: scenario written to {path}; `lifecycle replay {path}` fails "
                      "on it")
    if not report.passed:
        sys.exit(1)


def _write(report: Report, where: str | None, spec_file: Path | None) -> dict[str, str]:
    """Each counterexample's scenario; one of a spec file names the file as its machine."""
    if where is None or not report.violations:
        return {}
    path = Path(where)
    machine = (os.path.relpath(spec_file.resolve(), path.resolve().parent)
               if spec_file is not None else None)
    several = len(report.violations) > 1
    written = {}
    for name, example in report.violations.items():
        target = path.with_name(f"{path.stem}_{name}{path.suffix or '.yaml'}") if several \
            else path
        written[name] = str(output.write_scenario(example, target, machine))
    return written


def _json(report: Report, seconds: float, written: dict[str, str]) -> dict[str, Any]:
    return {
        "machine": report.machine, "passed": report.passed, "states": report.states,
        "moves": report.moves, "depth": report.depth, "exhausted": report.exhausted,
        "seconds": round(seconds, 3), "bounds": dataclasses.asdict(report.bounds),
        "cut": report.cut, "invariants": report.invariants, "eventually": report.eventually,
        "violations": {name: {**_example(example), "scenario": written.get(name)}
                       for name, example in report.violations.items()},
        "stuck": {name: _example(example) for name, example in report.stuck.items()},
        "loops": {name: {**_example(example), "loop": example.loop}
                  for name, example in report.loops.items()},
    }


def _example(example: Any) -> dict[str, Any]:
    return {"text": example.invariant.text, "message": example.message,
            "length": len(example),
            "timeline": [dict(zip(output.HEADER, row, strict=True))
                         for row in output.timeline(example)]}
