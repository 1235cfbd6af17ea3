"""``lifecycle machines``, ``describe``, ``diagram`` and ``diagrams``: the machines, as
tables and as pictures."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from ..engine import Engine
from ..errors import SetupError
from ..machines import builtins, listed
from ..render import (
    EVENTLESS_COLOR,
    FORMATS,
    GRAPHVIZ_INSTALL,
    RISKY_COLOR,
    SUFFIXES,
    Diagram,
    dot,
    dot_program,
    dot_to_svg,
    mermaid,
    render,
)
from ..spec import MachineSpec, StateSpec
from ..story import plural
from . import layout
from .common import (
    PLUGINS_VARIABLE,
    db_option,
    err,
    escape,
    json_option,
    out,
)
from .context import make_engine, resolve


@click.command()
@db_option
@json_option
def machines(db_url: str | None, as_json: bool) -> None:
    """List the built-in machines and those the database knows."""
    engine = make_engine(db_url, as_met=True)
    counts = engine.counts()
    known = listed()  # (from the machines' index: no machine imported)
    names = sorted({*known, *engine.machine_names()})
    rows = []
    for name in names:
        if name in known:
            version, summary = known[name]
        else:
            spec = engine.spec(name)
            version, summary = spec.version, spec.description or ""
        rows.append({
            "name": name, "kind": "built-in" if name in known else "stored",
            "spec_version": version, "resources": sum(counts.get(name, {}).values()),
            "summary": summary,
        })
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = layout.table("machine", "kind", "spec version", "resources", "about",
                         free=("about",))
    blocks = []
    for r in rows:
        name, summary, count = str(r["name"]), str(r["summary"]), int(r["resources"])
        table.add_row(name, str(r["kind"]), str(r["spec_version"]), str(count), Text(summary))
        blocks.append(layout.block(
            Text.assemble((name, "bold"), f" ({r['kind']}, spec version "
                          f"{r['spec_version']}, {plural(count, 'resource')})"),
            [Text(summary)] if summary else []))
    out.print(layout.fitted(out, table, blocks), soft_wrap=False)


@click.command()
@click.argument("machine")
@db_option
@json_option
def describe(machine: str, db_url: str | None, as_json: bool) -> None:
    """Show a machine's states and transitions. MACHINE is a built-in name, a spec file
    (checked without a database when no --db is needed), or a stored machine."""
    engines: list[Engine] = []

    def engine() -> Engine:   # made only when the database is read
        engines[:] = engines or [make_engine(db_url)]
        return engines[0]

    spec = resolve(machine, engine, register=False)
    doc = describe_json(spec)
    # a machine read from the database: say what this process could not decide or run
    missing = engines[0].missing_names(spec.name) if engines else {}
    if as_json:
        print(json.dumps({**doc, **({"not_loaded": missing} if missing else {})}, indent=2))
        return
    out.print(f"[bold]{escape(spec.name)}[/] (spec version {spec.version})")
    if spec.description:
        out.print(Text(spec.description), soft_wrap=False)
    states = layout.table("state", "parent", "final", "on entry", "timeout", "about",
                          free=("about",), title="states")
    state_blocks = []
    specs = _state_specs(spec)
    for s in doc["states"]:
        state = specs[s["name"]]
        initial = " (initial)" if s["name"] == spec.graph.enter(spec.initial) else ""
        if state.initial:
            initial = f" (enters {state.initial})"
        entry = [effect.name for effect in state.effects]
        timeout = ([f"after {_seconds(state.timeout.after)}",
                    f"fires {state.timeout.trigger}"] if state.timeout else [])
        about = state.description or ""
        states.add_row(s["name"] + initial, s["parent"] or "", "yes" if s["final"] else "",
                       layout.lines(entry), layout.lines(timeout), Text(about))
        state_blocks.append(layout.block(
            s["name"] + initial + (", final" if s["final"] else ""),
            [Text(line) for line in (  # the dotted name says the parent
                f"on entry: {', '.join(entry)}" if entry else "",
                f"timeout: {', '.join(timeout)}" if timeout else "",
                about) if line]))
    out.print(layout.fitted(out, layout.drop_empty(states), state_blocks), soft_wrap=False)
    wide = layout.table("trigger", "source", "dest", "guards", "effects", "fresh", "about",
                        free=("about",), title="transitions")
    blocks = []
    for t in doc["transitions"]:
        guards = [*t["guards"], *(f"not {u}" for u in t["unless"])]
        fresh = t["fresh"]
        rule = ([f"{fresh['max_age']:g} s"] + ([f"probe {fresh['probe']}"] if fresh["probe"]
                                                else [])) if fresh else []
        trigger = t["trigger"] or "(eventless)"
        wide.add_row(trigger, layout.lines(t["source"]), t["dest"], layout.lines(guards),
                     layout.lines(t["effects"]), layout.lines(rule),
                     Text(t["description"] or ""))
        details = [f"guards: {', '.join(guards)}" if guards else "",
                   f"effects: {', '.join(t['effects'])}" if t["effects"] else "",
                   f"fresh: {', '.join(rule)}" if rule else "",
                   t["description"] or ""]
        heading = Text.assemble((trigger, "bold"), f": {', '.join(t['source'])} -> {t['dest']}")
        blocks.append(layout.block(heading,
                                   [Text(d) for d in details if d]))
    out.print(layout.fitted(out, layout.drop_empty(wide, keep=3), blocks), soft_wrap=False)
    absent = [f"{kind} {', '.join(names)}" for kind, names in missing.items() if names]
    if absent:
        out.print(Text(f"not loaded in this process: {'; '.join(absent)}. Reading needs "
                       "none of them; `lifecycle fire`, `step` and `worker` do (name the "
                       f"module that defines them in {PLUGINS_VARIABLE})."), soft_wrap=False)


def _state_specs(spec: MachineSpec) -> dict[str, StateSpec]:
    """Every state of the spec by its full dotted name, nested states too."""
    found: dict[str, StateSpec] = {}

    def walk(states: tuple[StateSpec, ...], parent: str) -> None:
        for state in states:
            name = f"{parent}.{state.name}" if parent else state.name
            found[name] = state
            walk(state.states, name)

    walk(spec.states, "")
    return found


def _seconds(after: float | str) -> str:
    """A timeout's delay: seconds, or the data field that holds them."""
    return f"{after:g} s" if isinstance(after, int | float) else f"data.{after} s"


def describe_json(spec: MachineSpec) -> dict[str, Any]:
    graph = spec.graph
    edges: list[tuple[str | None, Any]] = [(t.trigger, t) for t in spec.transitions]
    edges += [(None, e) for e in spec.eventless]
    return {
        "name": spec.name,
        "version": spec.version,
        "initial": spec.initial,
        "states": [
            {"name": n, "parent": graph.parent[n],
             "final": graph.is_leaf(n) and graph.is_final(n, spec.final)}
            for n in graph.names
        ],
        "transitions": [
            {"trigger": trigger, "source": list(e.sources), "dest": e.dest,
             "guards": list(e.guards), "unless": list(e.unless),
             "effects": [f.name for f in e.effects],
             "fresh": e.fresh.model_dump() if e.fresh else None, "ref": e.ref,
             "description": e.description}
            for trigger, e in edges
        ],
    }


_FORMAT_OF_SUFFIX = {".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot", ".gv": "dot",
                     ".svg": "svg"}


@click.command()
@click.argument("machine")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="mermaid (stateDiagram-v2), dot (Graphviz) or svg (drawn by Graphviz's "
                   "dot). Default: from the suffix of -o (.mmd, .dot, .svg), else mermaid.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file instead of standard output.")
@click.option("--no-guards", is_flag=True, help="Leave guards out of the edge labels.")
@click.option("--no-effects", is_flag=True, help="Leave effects out of the labels.")
@click.option("--counts", is_flag=True,
              help="Show in each state how many resources of the machine are in it now "
                   "(from the database).")
@db_option
def diagram(machine: str, fmt: str | None, output: Path | None, no_guards: bool,
            no_effects: bool, counts: bool, db_url: str | None) -> None:
    """Draw MACHINE (a built-in name, a spec file, or a stored machine) as a state diagram.
    Risky edges (those with a freshness rule) are red and dashed, eventless ones blue and
    dotted; guards are in brackets, effects after a slash."""
    if fmt is None:
        fmt = _FORMAT_OF_SUFFIX.get(output.suffix.lower(), "mermaid") if output else "mermaid"
    engines: list[Engine] = []

    def engine() -> Engine:
        if not engines:
            engines.append(make_engine(db_url))
        return engines[0]

    spec = resolve(machine, engine, register=False)
    drawn = Diagram.from_spec(
        spec, engine().counts(spec.name).get(spec.name, {}) if counts else None)
    text = render(drawn, fmt, guards=not no_guards, effects=not no_effects)
    if output is None:
        sys.stdout.write(text)
    else:
        _write(output, text)
        err.print(f"wrote {output}")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SetupError(f"cannot write {path}: {exc.strerror}") from None


# -- the checked-in diagrams of the built-in machines ---------------------------------------


@dataclass(frozen=True)
class _Planned:
    path: Path
    text: str | None
    """The expected content; ``None`` for an SVG, which is drawn from ``source`` to compare
    (see :func:`_svg_differs`)."""
    source: str | None = None
    """For an SVG: the DOT it is drawn from."""


def _plan(directory: Path) -> list[_Planned]:
    planned: list[_Planned] = []
    known = builtins()
    blocks = []
    for name in sorted(known):
        drawn = Diagram.from_spec(known[name].spec)
        mmd, gv = mermaid(drawn), dot(drawn)
        planned.append(_Planned(directory / f"{name}{SUFFIXES['mermaid']}", mmd))
        planned.append(_Planned(directory / f"{name}{SUFFIXES['dot']}", gv))
        planned.append(_Planned(directory / f"{name}{SUFFIXES['svg']}", None, gv))
        about = known[name].summary or known[name].spec.description or ""
        blocks.append(f"## {name}\n\n{about}\n\n"
                      f"[SVG]({name}.svg) · [Graphviz DOT]({name}.dot) · "
                      f"[Mermaid]({name}.mmd)\n\n```mermaid\n{mmd}```\n")
    planned.append(_Planned(directory / "README.md", _README + "\n" + "\n".join(blocks)))
    return planned


_README = f"""\
# Diagrams of the built-in machines

Generated from the machines' specs by `lifecycle diagrams` (`make diagrams`); do not edit.
The test suite fails when one of them is stale. `lifecycle diagram MACHINE` draws any machine,
also from a spec file, with live counts from a database (`--counts`), or in a compact form
(`--no-guards`, `--no-effects`).

How to read them:

- A transition's label is `trigger [guards] / effects`; `not g` is an unless guard.
- **Risky edges**, those that fire only on a fresh observation, are red
  (<code>{RISKY_COLOR}</code>) and dashed, and carry their rule:
  `release [fresh 30 s, probe site]`.
- Eventless edges (taken by `step` when their guards hold) are blue
  (<code>{EVENTLESS_COLOR}</code>) and dotted, labelled `(eventless) [guards]`.
- A composite state encloses its children and is entered through its start point. An
  edge from a composite state applies in each of its children.
- A state's timeout reads `after 120 s / match_timeout`, and the edge it fires
  `match_timeout (after 120 s)`; `entry / effect` is asked for on every entry.
- Final states have a double (DOT) or thick (Mermaid) border; *any state* stands for a
  transition from every state.
"""


def _differs(planned: _Planned, *, draw: bool = False) -> str | None:
    """Why the file is out of date, or ``None``. An SVG is compared only with ``draw``."""
    if not planned.path.exists():
        return "missing"
    if planned.text is None:
        return _svg_differs(planned) if draw else None
    try:
        current = planned.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({exc})"
    return None if current == planned.text else "stale"


_SVG_TEXT = re.compile(r"<(text|title)\b[^>]*>(.*?)</\1>", re.DOTALL)


def _svg_differs(planned: _Planned) -> str | None:
    """Whether the SVG says what its DOT says: every text and title, in order, as Graphviz
    draws them now. (Coordinates are left out: another Graphviz release lays the same graph
    out a pixel apart, and the SVG is only redrawn when its DOT changes.)"""
    assert planned.source is not None
    try:
        current = planned.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({exc})"
    wanted = _SVG_TEXT.findall(dot_to_svg(planned.source))
    return None if _SVG_TEXT.findall(current) == wanted else "stale (its text differs)"


def _leftovers(directory: Path, planned: list[_Planned]) -> list[Path]:
    """Diagram files of machines that are no longer built in."""
    if not directory.is_dir():
        return []
    expected = {p.path.name for p in planned}
    return sorted(p for p in directory.iterdir()
                  if p.suffix in SUFFIXES.values() and p.name not in expected)


@click.command()
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 naming each missing or stale file (.mmd, .dot and "
                   "README.md are compared; an SVG's texts are compared with what Graphviz "
                   "draws from the DOT, or only its existence without Graphviz).")
@click.option("--dir", "directory", default="diagrams", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the diagrams are.")
def diagrams(check: bool, directory: Path) -> None:
    """Write diagrams/<machine>.mmd, .dot and .svg for every built-in machine, and
    diagrams/README.md showing each Mermaid diagram."""
    planned = _plan(directory)
    leftovers = _leftovers(directory, planned)
    if check:
        draw = dot_program() is not None
        problems = [(p.path, why) for p in planned if (why := _differs(p, draw=draw))]
        problems += [(path, "not a built-in machine's diagram") for path in leftovers]
        for path, why in problems:
            err.print(f"{why}: {path}")
        if problems:
            err.print(f"{len(problems)} diagram file{'s are' if len(problems) > 1 else ' is'} "
                      "out of date; run `lifecycle diagrams` (or `make diagrams`)")
            sys.exit(1)
        out.print(f"{directory}: {plural(len(planned), 'file')} up to date"
                  + ("" if draw else " (SVGs only checked to exist: Graphviz's dot is not "
                     "installed)"))
        return
    directory.mkdir(parents=True, exist_ok=True)
    written: set[Path] = set()
    unchanged = 0
    undrawn: list[Path] = []
    for item in planned:
        if item.text is not None:
            if _differs(item) is None:
                unchanged += 1
                continue
            _write(item.path, item.text)
        else:
            # An SVG is drawn again only when its DOT changed or it is missing, so that
            # another Graphviz version does not rewrite every file.
            assert item.source is not None
            if item.path.exists() and item.path.with_suffix(SUFFIXES["dot"]) not in written:
                unchanged += 1
                continue
            if dot_program() is None:
                item.path.unlink(missing_ok=True)  # stale: drawn from an older DOT
                undrawn.append(item.path)
                continue
            _write(item.path, dot_to_svg(item.source))
        written.add(item.path)
        out.print(f"wrote {item.path}")
    for path in leftovers:
        path.unlink()
        out.print(f"removed {path} (not a built-in machine)")
    out.print(f"{directory}: {len(written)} written, {unchanged} unchanged")
    if undrawn:
        err.print(f"[bold red]error:[/] cannot draw {', '.join(map(str, undrawn))}: "
                  f"Graphviz's 'dot' is not on PATH; {GRAPHVIZ_INSTALL}")
        sys.exit(1)
