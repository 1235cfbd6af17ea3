"""A counterexample as a timeline (time, move, state, what the controller believed, what the
world was, what handlers did) and as a scenario file that ``lifecycle replay`` fails on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .explore import Counterexample, Report
from .memory import Actions
from .state import Res, State, View, thaw

HEADER = ("#", "time", "move", "resource", "state", "controller believed", "world",
          "handlers did")


def timeline(example: Counterexample) -> list[tuple[str, ...]]:
    """The rows of the timeline: the starting state (row 0), then one row per resource per
    move (the move on its first row)."""
    rows = _rows("0", example.start, "start", example.initial, [])
    for number, hop in enumerate(example.hops, start=1):
        rows += _rows(str(number), example.start, hop.label, hop.state, hop.actions)
    return rows


def _rows(number: str, start: dt.datetime, label: str, state: State,
          actions: Actions) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    world = {k: thaw(v) for k, v in state.world}
    for index, resource in enumerate(state.resources or (None,)):
        first = index == 0
        key = resource.key if resource is not None else ""
        did = "; ".join(_action(a) for a in actions if a[1] == key)
        out.append((number if first else "", _clock(start, state.now) if first else "",
                    label if first else "", key,
                    resource.state if resource is not None else "",
                    _belief(resource, state.now) if resource is not None else "",
                    _status(world.get(key, {})), did))
    return out


def _clock(start: dt.datetime, seconds: float) -> str:
    return (start + dt.timedelta(seconds=seconds)).strftime("%H:%M:%S")


def _belief(resource: Res, now: float) -> str:
    seen = resource.seen
    if seen is None:
        return "nothing"
    age = now - seen.at
    return f"{_status(thaw(seen.status))} ({age:g} s old)"


def _status(status: Mapping[str, Any]) -> str:
    return ", ".join(str(v) for v in status.values()) or "-"


def _action(action: tuple[str, str, dict[str, Any]]) -> str:
    name, _, details = action
    said = ", ".join(f"{k}={v}" for k, v in details.items())
    return f"{name}({said})" if said else name


def text(report: Report) -> str:
    """The report as a person reads it: the figures, then each counterexample's timeline."""
    b = report.bounds
    lines = [f"{report.machine}: {report.states} states, {report.moves} moves, depth "
             f"{report.depth}{' (every state within the horizon)' if report.exhausted else ''}"
             f"{f', {report.cut} past the queue bound' if report.cut else ''}"
             f"; bounds: depth {b.depth}, resources {b.resources or 'the model' + chr(39) + 's'}"
             f", horizon {b.horizon:g} s"]
    if report.passed:
        checked = [*report.invariants, *report.eventually]
        lines.append(f"no violation of: {', '.join(checked)}")
    for name, example in report.violations.items():
        lines += ["", f"VIOLATED {name}: {example.invariant.text}",
                  f"  {example.message}",
                  f"  shortest counterexample: {len(example)} moves", ""]
        lines += _table(timeline(example))
    for name, example in report.stuck.items():
        lines += ["", f"NEVER {name}: {example.invariant.text}", f"  {example.message}",
                  f"  shortest path there: {len(example)} moves", ""]
        lines += _table(timeline(example))
    for name, example in report.loops.items():
        first = len(example) - example.loop + 1
        lines += ["", f"NEVER (fair loop) {name}: {example.invariant.text}",
                  f"  {example.message}",
                  f"  {first - 1} moves to the loop, then moves {first}-{len(example)} "
                  "again and again", ""]
        lines += _table(timeline(example))
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    def line(row: tuple[str, ...]) -> str:
        return "  " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
    return [line(HEADER), "  " + "-+-".join("-" * w for w in widths), *map(line, rows)]


def scenario(example: Counterexample, machine: str | None = None) -> dict[str, Any]:
    """The counterexample as a scenario document: the setup, each move with the states the
    checker found after it (so a replay that parts from the checker fails there), and the
    invariant's own expectation last, which fails. ``machine``: what the scenario names as
    its machine (a spec file, relative to the scenario's), if not the machine's name."""
    start = example.start
    steps = [step for move in example.setup for step in move.scenario(start)]
    done: Actions = []
    for hop in example.hops[:-1]:
        steps += [step for move in hop.moves for step in move.scenario(start)]
        done += hop.actions
        steps += [{"expect": {"key": r.key, "state": r.state}} for r in hop.state.resources]
    last = example.hops[-1]
    steps += [step for move in last.moves for step in move.scenario(start)]
    previous = example.hops[-2].state if len(example.hops) > 1 else example.initial
    steps += example.invariant.expect(View(last.state, start, View(previous, start)), done,
                                      last.actions)
    return {
        "machine": machine or example.machine,
        "description": f"Found by `lifecycle check {example.model}`: {example.invariant.text}"
                       f" is broken in {len(example)} moves: {example.message}",
        "start": start.isoformat().replace("+00:00", "Z"),
        "steps": steps,
    }


def write_scenario(example: Counterexample, path: str | Path,
                   machine: str | None = None) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(scenario(example, machine), sort_keys=False, width=100),
                    encoding="utf-8")
    return path
