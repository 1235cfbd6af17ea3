"""Diagrams of a machine, drawn from its spec: one intermediate graph, a renderer per format.

``Diagram.from_spec(spec)`` builds the graph: the states with their nesting, the initial and
final states, state timeouts and entry effects, and one edge per (source, transition) with
its trigger, guards, effects and freshness rule. ``mermaid()`` writes a Mermaid
``stateDiagram-v2`` (composite states for nesting), ``dot()`` a Graphviz digraph (clusters for
nesting) and ``svg()`` runs Graphviz's ``dot`` on it. Everything is sorted, so the text
changes only when the machine does.

How an edge reads, in every format::

    trigger (after 120 s) [guard, not unless_guard] [fresh 30 s, probe site] / effect, effect

``(after 120 s)`` when the trigger is the source state's timeout, ``(eventless)`` in place of
a trigger for an eventless edge. Risky edges (those with a freshness rule) are drawn red and
dashed, eventless ones blue and dotted, so they can be told apart at a glance.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .errors import RendererMissing, RenderFailed
from .graph import ANY, SEPARATOR
from .spec import Edge, EffectSpec, Freshness, MachineSpec, StateSpec, Timeout

FORMATS = ("mermaid", "dot", "svg")
SUFFIXES = {"mermaid": ".mmd", "dot": ".dot", "svg": ".svg"}

RISKY_COLOR = "#c62828"
RISKY_BACKGROUND = "#ffebee"
EVENTLESS_COLOR = "#1565c0"
EVENTLESS_BACKGROUND = "#e3f2fd"
OCCUPIED_FILL = "#fff3c4"
ANY_STATE_LABEL = "any state"
_INK = "#263238"
_FONT = "Helvetica,Arial,sans-serif"

GRAPHVIZ_INSTALL = (
    "install Graphviz: `apt-get install graphviz` (Debian, Ubuntu), `dnf install graphviz` "
    "(Fedora), `brew install graphviz` (macOS), or see https://graphviz.org/download/"
)


# -- the intermediate graph ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiagramState:
    """A state as drawn: ``name`` is the full dotted name, ``label`` its last part."""

    name: str
    label: str
    parent: str | None
    children: tuple[str, ...]
    initial_child: str | None
    final: bool
    timeout: str | None
    """``after 120 s / match_timeout``: the state's timeout, if it has one."""
    entry_effects: tuple[str, ...]
    count: int | None
    """Resources in this state (and its children) now; ``None`` when not counted."""
    description: str | None

    @property
    def composite(self) -> bool:
        return bool(self.children)

    def notes(self, *, effects: bool = True) -> list[str]:
        """The lines shown under the state's name."""
        lines = []
        if self.count is not None:
            lines.append(f"{self.count} resource{'' if self.count == 1 else 's'}")
        if self.timeout:
            lines.append(self.timeout)
        if effects and self.entry_effects:
            lines.append("entry / " + ", ".join(self.entry_effects))
        return lines


@dataclass(frozen=True, slots=True)
class DiagramEdge:
    """One arrow: the transitions (or eventless edges) from one source to one destination
    that differ only in their guards. ``source`` is a state's full name, or ``ANY`` (``*``)
    for a transition from every state, drawn once from an "any state" box."""

    source: str
    dest: str
    trigger: str | None
    """``None`` for an eventless edge."""
    guards: tuple[tuple[str, ...], ...]
    """One guard set per transition drawn by this arrow, any of which lets it fire; in a set,
    the guards that must hold, then ``not NAME`` for each unless guard."""
    effects: tuple[str, ...]
    fresh: str | None
    """``fresh 30 s, probe site``: the freshness rule of a risky edge."""
    timer: str | None
    """``after 120 s`` when the trigger is the timeout of the source (or an ancestor)."""
    descriptions: tuple[str, ...] = ()
    refs: tuple[str, ...] = ()

    @property
    def risky(self) -> bool:
        return self.fresh is not None

    @property
    def eventless(self) -> bool:
        return self.trigger is None

    def label_lines(self, *, guards: bool = True, effects: bool = True) -> list[str]:
        head = self.trigger if self.trigger is not None else "(eventless)"
        if self.timer:
            head += f" ({self.timer})"
        if guards and any(self.guards):
            head += " " + " or ".join(f"[{', '.join(g)}]" for g in self.guards)
        lines = [head]
        if self.fresh:
            lines.append(f"[{self.fresh}]")
        if effects and self.effects:
            lines.append("/ " + ", ".join(self.effects))
        return lines

    def label(self, *, guards: bool = True, effects: bool = True) -> str:
        """``release [not_running] [fresh 30 s, probe site] / cancel``."""
        return " ".join(self.label_lines(guards=guards, effects=effects))

    def tooltip(self) -> str:
        refs = f"({', '.join(self.refs)})" if self.refs else ""
        return " ".join(p for p in ("; ".join(self.descriptions), refs) if p)


def _merged(edges: Iterable[DiagramEdge]) -> list[DiagramEdge]:
    """One arrow per (source, dest, trigger, rule, effects, timer); guarded and unguarded
    transitions are kept apart. Sorted by source, trigger, destination and label."""
    groups: dict[tuple[object, ...], list[DiagramEdge]] = {}
    for e in edges:
        key = (e.source, e.trigger or "", e.dest, e.fresh or "", e.effects, e.timer or "",
               bool(any(e.guards)))
        groups.setdefault(key, []).append(e)
    merged = []
    for group in groups.values():
        first = group[0]
        merged.append(replace(
            first,
            guards=tuple(sorted({g for e in group for g in e.guards})),
            descriptions=tuple(dict.fromkeys(d for e in group for d in e.descriptions)),
            refs=tuple(dict.fromkeys(r for e in group for r in e.refs)),
        ))
    merged.sort(key=lambda e: (e.source, e.trigger or "", e.dest, e.label()))
    return merged


@dataclass(frozen=True, slots=True)
class Diagram:
    """Everything a renderer draws, sorted: states depth first with siblings by name, edges
    by source, trigger and destination."""

    machine: str
    description: str | None
    initial: str
    states: tuple[DiagramState, ...]
    edges: tuple[DiagramEdge, ...]
    counted: bool = False

    @classmethod
    def from_spec(cls, spec: MachineSpec, counts: Mapping[str, int] | None = None) -> Diagram:
        """The diagram of ``spec``; with ``counts`` (state -> resources, as from
        ``Engine.counts(machine)[machine]``) each state shows how many resources are in it."""
        graph = spec.graph
        specs = _state_specs(spec)
        finals = set(spec.final)
        states: list[DiagramState] = []

        def add(name: str) -> None:
            state_spec = specs.get(name)
            timeout = graph.timeouts.get(name)
            children = tuple(sorted(graph.children[name]))
            count = None
            if counts is not None:
                count = sum(int(counts.get(n, 0)) for n in graph.descendants(name))
            states.append(DiagramState(
                name=name,
                label=name.rsplit(SEPARATOR, 1)[-1],
                parent=graph.parent[name],
                children=children,
                initial_child=graph.initial_child.get(name),
                final=graph.is_final(name, finals) if not children else name in finals,
                timeout=f"{_after(timeout[1])} / {timeout[1].trigger}" if timeout else None,
                entry_effects=tuple(_effect_names(state_spec.effects if state_spec else ())),
                count=count,
                description=state_spec.description if state_spec is not None else None,
            ))
            for child in children:
                add(child)

        for root in sorted(n for n in graph.names if graph.parent[n] is None):
            add(root)

        edges: list[DiagramEdge] = []
        declared: list[tuple[str | None, Edge]] = [(t.trigger, t) for t in spec.transitions]
        declared += [(None, e) for e in spec.eventless]
        for trigger, edge in declared:
            for source in dict.fromkeys(edge.sources):
                edges.append(DiagramEdge(
                    source=source,
                    dest=edge.dest,
                    trigger=trigger,
                    guards=((*edge.guards, *(f"not {u}" for u in edge.unless)),),
                    effects=tuple(_effect_names(edge.effects)),
                    fresh=_fresh(edge.fresh) if edge.fresh else None,
                    timer=_timer(graph.timeouts, graph.ancestors(source), trigger)
                    if source in graph.parent else None,
                    descriptions=(edge.description,) if edge.description else (),
                    refs=(edge.ref,) if edge.ref else (),
                ))
        return cls(machine=spec.name, description=spec.description, initial=spec.initial,
                   states=tuple(states), edges=tuple(_merged(edges)),
                   counted=counts is not None)

    def state(self, name: str) -> DiagramState:
        for state in self.states:
            if state.name == name:
                return state
        raise KeyError(name)

    def children_of(self, parent: str | None) -> list[DiagramState]:
        return [s for s in self.states if s.parent == parent]

    @property
    def finals(self) -> list[DiagramState]:
        return [s for s in self.states if s.final]


def _state_specs(spec: MachineSpec) -> dict[str, StateSpec]:
    found: dict[str, StateSpec] = {}

    def walk(states: Iterable[StateSpec], parent: str | None) -> None:
        for state in states:
            full = f"{parent}{SEPARATOR}{state.name}" if parent else state.name
            found.setdefault(full, state)
            walk(state.states, full)

    walk(spec.states, None)
    return found


def _effect_names(effects: Iterable[EffectSpec]) -> list[str]:
    return [e.name for e in effects]


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _after(timeout: Timeout) -> str:
    if isinstance(timeout.after, str):
        return f"after data.{timeout.after} s"
    return f"after {_seconds(timeout.after)}"


def _fresh(rule: Freshness) -> str:
    text = f"fresh {_seconds(rule.max_age)}"
    return f"{text}, probe {rule.probe}" if rule.probe else text


def _timer(timeouts: Mapping[str, tuple[str, Timeout]], ancestors: list[str],
           trigger: str | None) -> str | None:
    for state in ancestors:
        found = timeouts.get(state)
        if found is not None and trigger is not None and found[1].trigger == trigger:
            return _after(found[1])
    return None


# -- Mermaid ---------------------------------------------------------------------------------

# words the stateDiagram grammar reads as keywords; a state with such a name gets a prefix
_MERMAID_KEYWORDS = frozenset({
    "accdescr", "acctitle", "as", "class", "classdef", "click", "default", "direction", "end",
    "hide", "href", "left", "note", "right", "root", "scale", "state", "statediagram", "style",
})


def mermaid_ids(diagram: Diagram) -> dict[str, str]:
    """A Mermaid id for each state: its full name with ``.`` as ``__`` and ``-`` as ``_``."""
    ids: dict[str, str] = {}
    taken: set[str] = set()
    for state in diagram.states:
        base = state.name.replace(SEPARATOR, "__").replace("-", "_")
        if base.lower() in _MERMAID_KEYWORDS or base.lower().startswith("root_"):
            base = f"s_{base}"
        candidate, n = base, 2
        while candidate in taken:
            candidate, n = f"{base}_{n}", n + 1
        ids[state.name] = candidate
        taken.add(candidate)
    if any(edge.source == ANY for edge in diagram.edges):
        candidate, n = "any_state", 2
        while candidate in taken:
            candidate, n = f"any_state_{n}", n + 1
        ids[ANY] = candidate
    return ids


_MERMAID_ESCAPES = {"#": "#35;", ";": "#59;", ":": "#58;", '"': "#quot;"}


def _mermaid_text(text: str) -> str:
    """Text safe in a Mermaid label: no ``;``, ``:`` (label separators), ``#`` or quotes."""
    return "".join(_MERMAID_ESCAPES.get(c, c) for c in text)


def mermaid(diagram: Diagram, *, guards: bool = True, effects: bool = True) -> str:
    """A Mermaid ``stateDiagram-v2``. Risky and eventless edges are styled with CSS in the
    front matter, addressed by the edge's position in the text (Mermaid numbers every arrow,
    ``[*]`` ones included, in document order)."""
    ids = mermaid_ids(diagram)
    lines: list[str] = []
    arrows = 0

    def arrow(line: str, indent: str) -> None:
        nonlocal arrows
        lines.append(f"{indent}{line}")
        arrows += 1

    def declare(state: DiagramState, indent: str) -> None:
        sid = ids[state.name]
        notes = state.notes(effects=effects)
        if state.composite:
            title = state.label
            if notes:
                title += " (" + "; ".join(notes) + ")"
            lines.append(f'{indent}state "{_mermaid_text(title)}" as {sid} {{')
            assert state.initial_child is not None
            arrow(f"[*] --> {ids[state.initial_child]}", indent + "    ")
            for child in diagram.children_of(state.name):
                declare(child, indent + "    ")
            lines.append(f"{indent}}}")
            return
        if sid != state.label or notes:  # without a name, a description would replace it
            lines.append(f'{indent}state "{_mermaid_text(state.label)}" as {sid}')
        for note in notes:
            lines.append(f"{indent}{sid} : {_mermaid_text(note)}")

    body = "    "
    arrow(f"[*] --> {ids[diagram.initial]}", body)
    for state in diagram.children_of(None):
        declare(state, body)
    if ANY in ids:
        lines.append(f'{body}state "{ANY_STATE_LABEL}" as {ids[ANY]}')
    risky: list[int] = []
    eventless: list[int] = []
    for edge in diagram.edges:
        if edge.risky:
            risky.append(arrows)
        elif edge.eventless:
            eventless.append(arrows)
        label = _mermaid_text(edge.label(guards=guards, effects=effects))
        arrow(f"{ids[edge.source]} --> {ids[edge.dest]} : {label}", body)
    for state in diagram.finals:
        if not state.composite:
            arrow(f"{ids[state.name]} --> [*]", body)
    lines += [f"{body}{line}" for line in _mermaid_classes(diagram, ids)]
    css = _mermaid_css(risky, eventless)
    head = ["---", f"title: {json.dumps(diagram.machine)}"]
    if css:
        head += ["config:", f"  themeCSS: {json.dumps(css)}"]
    head += ["---", "stateDiagram-v2"]
    return "\n".join([*head, *lines]) + "\n"


def _mermaid_classes(diagram: Diagram, ids: Mapping[str, str]) -> list[str]:
    """The style classes of final, any-state and occupied states, and who has them."""
    finals = [ids[s.name] for s in diagram.finals if not s.composite]
    occupied = [ids[s.name] for s in diagram.states if not s.composite and s.count]
    lines = ["classDef final stroke-width:3px"]
    if ANY in ids:
        lines += ["classDef any stroke-dasharray:5 4,font-style:italic", f"class {ids[ANY]} any"]
    if diagram.counted:
        lines.append(f"classDef occupied fill:{OCCUPIED_FILL}")
    if finals:
        lines.append(f"class {','.join(finals)} final")
    if occupied:
        lines.append(f"class {','.join(occupied)} occupied")
    return lines


def _mermaid_css(risky: list[int], eventless: list[int]) -> str:
    rules = []
    for indexes, color, dash, background in (
        (risky, RISKY_COLOR, "8 4", RISKY_BACKGROUND),
        (eventless, EVENTLESS_COLOR, "2 3", EVENTLESS_BACKGROUND),
    ):
        if not indexes:
            continue
        paths = ",".join(f'path.transition[data-id="edge{i}"]' for i in indexes)
        labels = ",".join(f'.edgeLabel [data-id="edge{i}"] p' for i in indexes)
        rules.append(f"{paths}{{stroke:{color} !important;stroke-dasharray:{dash} !important;"
                     "stroke-width:2px !important}")
        label_style = f"color:{color} !important;"
        if background:
            label_style += f"background-color:{background} !important;"
        rules.append(f"{labels}{{{label_style}}}")
    return "".join(rules)


# -- Graphviz DOT --------------------------------------------------------------------------


def _dot_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _start_node(state: str | None) -> str:
    return f"{state}/start" if state else "/start"


def dot(diagram: Diagram, *, guards: bool = True, effects: bool = True) -> str:
    """A Graphviz digraph: composite states are clusters, each with a start point; risky
    edges red and dashed, eventless edges blue and dotted, final states with a double
    border."""
    by_name = {s.name: s for s in diagram.states}
    out = [
        f"digraph {_dot_string(diagram.machine)} {{",
        f"    graph [label=<<b>{_html(diagram.machine)}</b>>, labelloc=t, fontsize=16, "
        f'fontname="{_FONT}", compound=true, newrank=true, nodesep=0.45, ranksep=0.5, '
        f'pad=0.2, color="{_INK}"];',
        f'    node [shape=box, style="rounded,filled", fillcolor="#eef3f8", color="{_INK}", '
        f'fontname="{_FONT}", fontsize=12, margin="0.18,0.07"];',
        f'    edge [fontname="{_FONT}", fontsize=10, color="{_INK}", fontcolor="{_INK}", '
        "arrowsize=0.8];",
        f'    {_dot_string(_start_node(None))} [shape=point, width=0.16, color="{_INK}", '
        f'fillcolor="{_INK}", style=filled];',
    ]
    out.append("    " + _dot_edge(by_name, _start_node(None), diagram.initial, {}))

    def declare(state: DiagramState, indent: str) -> None:
        notes = state.notes(effects=effects)
        if state.composite:
            out.append(f"{indent}subgraph {_dot_string('cluster_' + state.name)} {{")
            inner = indent + "    "
            fill = OCCUPIED_FILL if state.count else "#f7f9fb"
            out.append(f"{inner}graph [label=<{_dot_label(state.label, notes)}>, "
                       f'style="rounded,filled", fillcolor="{fill}", fontsize=12, '
                       f"labeljust=l, penwidth={2.5 if state.final else 1.2}];")
            start = _start_node(state.name)
            out.append(f"{inner}{_dot_string(start)} [shape=point, width=0.12, "
                       f'color="{_INK}", fillcolor="{_INK}", style=filled];')
            assert state.initial_child is not None
            out.append(inner + _dot_edge(by_name, start, state.initial_child, {}))
            for child in diagram.children_of(state.name):
                declare(child, inner)
            out.append(f"{indent}}}")
            return
        attrs = [f"label=<{_dot_label(state.label, notes)}>"]
        if state.final:
            attrs.append("peripheries=2")
        if state.count:
            attrs.append(f'fillcolor="{OCCUPIED_FILL}"')
        if state.description:
            attrs.append(f"tooltip={_dot_string(state.description)}")
        out.append(f"{indent}{_dot_string(state.name)} [{', '.join(attrs)}];")

    for state in diagram.children_of(None):
        declare(state, "    ")
    if any(edge.source == ANY for edge in diagram.edges):
        out.append(f"    {_dot_string(ANY)} [label=<<i>{ANY_STATE_LABEL}</i>>, "
                   'style="rounded,dashed", fillcolor=white];')
    for edge in diagram.edges:
        out.append("    " + _dot_edge(by_name, edge.source, edge.dest,
                                      _dot_edge_style(edge, guards=guards, effects=effects)))
    out.append("}")
    return "\n".join(out) + "\n"


def _dot_edge_style(edge: DiagramEdge, *, guards: bool, effects: bool) -> dict[str, str]:
    """An edge's label and look: risky ones red and dashed, eventless ones blue and dotted."""
    attrs = {"label": _dot_string("\n".join(edge.label_lines(guards=guards, effects=effects)))}
    if edge.risky:
        attrs.update(color=f'"{RISKY_COLOR}"', fontcolor=f'"{RISKY_COLOR}"', style="dashed",
                     penwidth="1.8")
    elif edge.eventless:
        attrs.update(color=f'"{EVENTLESS_COLOR}"', fontcolor=f'"{EVENTLESS_COLOR}"',
                     style="dotted", penwidth="1.6")
    if edge.tooltip():
        attrs["tooltip"] = _dot_string(edge.tooltip())
    return attrs


def _dot_label(name: str, notes: list[str]) -> str:
    text = _html(name)
    for note in notes:
        text += f'<br/><font point-size="10" color="#455a64">{_html(note)}</font>'
    return text


def _inside(by_name: Mapping[str, DiagramState], name: str, cluster: str) -> bool:
    current: str | None = name
    while current is not None:
        if current == cluster:
            return True
        current = by_name[current].parent if current in by_name else None
    return False


def _dot_edge(by_name: Mapping[str, DiagramState], source: str, dest: str,
              attrs: Mapping[str, str]) -> str:
    """An edge statement; an end at a composite state is drawn to its cluster's border
    (``ltail``/``lhead``), anchored at the cluster's start point."""
    attrs = dict(attrs)
    tail, head = source, dest
    source_state, dest_state = by_name.get(source), by_name.get(dest)
    if source_state is not None and source_state.composite:
        tail = _start_node(source)
        if not _inside(by_name, dest, source):
            attrs["ltail"] = _dot_string(f"cluster_{source}")
    if dest_state is not None and dest_state.composite:
        head = _start_node(dest)
        if not _inside(by_name, source, dest):
            attrs["lhead"] = _dot_string(f"cluster_{dest}")
    text = f"{_dot_string(tail)} -> {_dot_string(head)}"
    if attrs:
        text += " [" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + "]"
    return text + ";"


# -- SVG -------------------------------------------------------------------------------------


def dot_program() -> str | None:
    """The path of Graphviz's ``dot``, or ``None`` when it is not installed."""
    return shutil.which("dot")


def svg(diagram: Diagram, *, guards: bool = True, effects: bool = True,
        timeout: float = 60.0) -> str:
    """SVG, drawn by Graphviz's ``dot`` from ``dot(diagram)``."""
    return dot_to_svg(dot(diagram, guards=guards, effects=effects), timeout=timeout)


def dot_to_svg(text: str, *, timeout: float = 60.0) -> str:
    program = dot_program()
    if program is None:
        raise RendererMissing("dot", GRAPHVIZ_INSTALL)
    try:
        done = subprocess.run([program, "-Tsvg"], input=text, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RenderFailed(f"Graphviz's dot did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        raise RenderFailed(f"Graphviz's dot failed (exit {done.returncode}): "
                           f"{done.stderr.strip()}")
    return done.stdout


def render(diagram: Diagram, fmt: str, *, guards: bool = True, effects: bool = True) -> str:
    """The diagram in ``fmt`` (one of ``FORMATS``)."""
    if fmt == "mermaid":
        return mermaid(diagram, guards=guards, effects=effects)
    if fmt == "dot":
        return dot(diagram, guards=guards, effects=effects)
    if fmt == "svg":
        return svg(diagram, guards=guards, effects=effects)
    raise ValueError(f"unknown diagram format {fmt!r}; use one of {', '.join(FORMATS)}")
