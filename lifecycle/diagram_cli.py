"""The ``lifecycle diagram`` and ``lifecycle diagrams`` commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from .cli import _engine, _machine, db_option, err, out
from .engine import Engine
from .errors import LifecycleError
from .machines import builtins
from .render import (
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
from .spec import MachineSpec, load_spec

_SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_FORMAT_OF_SUFFIX = {".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot", ".gv": "dot",
                     ".svg": "svg"}


def _spec(machine: str, engine: Callable[[], Engine]) -> MachineSpec:
    """A built-in name or a spec file (read without a database, and not registered), else a
    machine the database knows."""
    if machine in builtins():
        return builtins()[machine].spec
    if Path(machine).suffix.lower() in _SPEC_SUFFIXES:
        return load_spec(machine)
    return _machine(engine(), machine)


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
            engines.append(_engine(db_url))
        return engines[0]

    spec = _spec(machine, engine)
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
        raise LifecycleError(f"cannot write {path}: {exc.strerror}") from None


# -- the checked-in diagrams of the built-in machines ---------------------------------------


@dataclass(frozen=True)
class _Planned:
    path: Path
    text: str | None
    """The expected content; ``None`` for an SVG, which is only checked to exist."""
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


def _differs(planned: _Planned) -> str | None:
    """Why the file is out of date, or ``None``."""
    if not planned.path.exists():
        return "missing"
    if planned.text is None:
        return None
    try:
        current = planned.path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({exc})"
    return None if current == planned.text else "stale"


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
                   "README.md are compared; an SVG is only checked to exist).")
@click.option("--dir", "directory", default="diagrams", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the diagrams are.")
def diagrams(check: bool, directory: Path) -> None:
    """Write diagrams/<machine>.mmd, .dot and .svg for every built-in machine, and
    diagrams/README.md showing each Mermaid diagram."""
    planned = _plan(directory)
    leftovers = _leftovers(directory, planned)
    if check:
        problems = [(p.path, why) for p in planned if (why := _differs(p))]
        problems += [(path, "not a built-in machine's diagram") for path in leftovers]
        for path, why in problems:
            err.print(f"{why}: {path}")
        if problems:
            err.print(f"{len(problems)} diagram file{'s are' if len(problems) > 1 else ' is'} "
                      "out of date; run `lifecycle diagrams` (or `make diagrams`)")
            sys.exit(1)
        out.print(f"{directory}: {len(planned)} files up to date")
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
