"""The state tree of a machine, flattened, and which triggers each leaf can take: the one
computation of both, for a spec in Python (:class:`~lifecycle.spec.MachineSpec`) and for a
spec as the database stores it (its JSON document), so that a command that only reads
(``lifecycle show``) needs neither pydantic nor ``transitions``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

SEPARATOR = "."
ANY = "*"
EVENTLESS = "_eventless"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

S = TypeVar("S")
E = TypeVar("E")

Fields = Callable[[S], tuple[str, Sequence[S], str | None]]
"""A state's name, its children and its initial child's name."""


def sources(source: str | Sequence[str]) -> tuple[str, ...]:
    """An edge's ``source``, one state or several, as a tuple."""
    return (source,) if isinstance(source, str) else tuple(source)


@dataclass(slots=True)
class StateGraph(Generic[S]):
    """The flattened state tree: full names (``parent.child``), nesting, and what an edge
    from a source covers. Shared by validation, the engine, the renderers and the read of
    a stored spec. ``declared`` keeps each state's declaration (``S``: a ``StateSpec``, or
    a state of a JSON document) and where it is in the spec."""

    names: list[str] = field(default_factory=list)
    parent: dict[str, str | None] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    initial_child: dict[str, str] = field(default_factory=dict)
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    bad_names: list[tuple[str, str]] = field(default_factory=list)
    bad_initials: list[tuple[str, str, str | None]] = field(default_factory=list)
    declared: dict[str, tuple[str, S]] = field(default_factory=dict)

    def walk(self, states: Sequence[S], fields: Fields[S], parent: str | None = None,
             where: str = "states") -> None:
        """Add ``states`` (and their children) under ``parent``."""
        for i, state in enumerate(states):
            loc = f"{where}[{i}]"
            name, children, initial = fields(state)
            if not NAME.match(name):
                self.bad_names.append((loc, name))
            full = f"{parent}{SEPARATOR}{name}" if parent else name
            if full in self.parent:
                self.duplicates.append((loc, full))
                continue
            self.names.append(full)
            self.parent[full] = parent
            self.declared[full] = (loc, state)
            self.children[full] = []
            if parent is not None:
                self.children[parent].append(full)
            self.walk(children, fields, full, f"{loc}.states")
            if children:
                child_names = [fields(c)[0] for c in children]
                if initial in child_names:
                    self.initial_child[full] = f"{full}{SEPARATOR}{initial}"
                else:
                    self.bad_initials.append((loc, full, initial))
                    self.initial_child[full] = f"{full}{SEPARATOR}{child_names[0]}"
            elif initial is not None:
                self.bad_initials.append((loc, full, initial))

    @property
    def leaves(self) -> list[str]:
        return [n for n in self.names if not self.children[n]]

    def is_leaf(self, name: str) -> bool:
        return not self.children[name]

    def ancestors(self, name: str) -> list[str]:
        """``name`` and its ancestors, innermost first."""
        chain = []
        current: str | None = name
        while current is not None:
            chain.append(current)
            current = self.parent[current]
        return chain

    def descendants(self, name: str) -> list[str]:
        out = [name]
        for child in self.children[name]:
            out.extend(self.descendants(child))
        return out

    def enter(self, name: str) -> str:
        """The leaf a resource is in after entering ``name``."""
        while name in self.initial_child:
            name = self.initial_child[name]
        return name

    def covered_leaves(self, sources: Iterable[str]) -> set[str]:
        """The leaves an edge from ``sources`` applies to."""
        leaves: set[str] = set()
        for source in sources:
            if source == ANY:
                return set(self.leaves)
            if source in self.parent:
                leaves.update(n for n in self.descendants(source) if self.is_leaf(n))
        return leaves

    def is_final(self, leaf: str, final: Iterable[str]) -> bool:
        listed = set(final)
        return any(a in listed for a in self.ancestors(leaf))


class Candidates(Generic[E]):
    """A machine's edges by leaf: for a leaf and a trigger (``EVENTLESS`` for eventless
    edges), the edges that may take it, in declaration order; for a leaf, its triggers."""

    def __init__(self, graph: StateGraph[Any], edges: Iterable[tuple[str, E]],
                 sources_of: Callable[[E], Iterable[str]]) -> None:
        self.edges: dict[tuple[str, str], tuple[E, ...]] = {}
        by_leaf: dict[str, set[str]] = {leaf: set() for leaf in graph.leaves}
        for trigger, edge in edges:
            for leaf in graph.covered_leaves(sources_of(edge)):
                self.edges[leaf, trigger] = (*self.edges.get((leaf, trigger), ()), edge)
                by_leaf[leaf].add(trigger)
        self.by_leaf: dict[str, frozenset[str]] = {
            leaf: frozenset(found) for leaf, found in by_leaf.items()}

    def triggers_from(self, leaf: str) -> frozenset[str]:
        """The triggers that have an edge from ``leaf`` (guards not asked)."""
        return self.by_leaf.get(leaf, frozenset()) - {EVENTLESS}


# -- a spec as the database stores it ---------------------------------------------------------

def _document_fields(state: Mapping[str, Any]) -> tuple[str, Sequence[Mapping[str, Any]],
                                                        str | None]:
    return state["name"], state.get("states", ()), state.get("initial")


def stored_triggers(document: Mapping[str, Any], state: str) -> list[str]:
    """The triggers that have a transition from leaf ``state``, sorted, in a spec's JSON
    document (``MachineSpec.to_json()``, as the database keeps it)."""
    graph: StateGraph[Mapping[str, Any]] = StateGraph()
    graph.walk(document["states"], _document_fields)
    edges = [(t["trigger"], t) for t in document.get("transitions", ())]
    candidates = Candidates(graph, edges, lambda edge: sources(edge["source"]))
    return sorted(candidates.triggers_from(state))


def stored_guards(document: Mapping[str, Any]) -> set[str]:
    """Every guard a spec's JSON document names (``guards`` and ``unless`` of its edges)."""
    edges = [*document.get("transitions", ()), *document.get("eventless", ())]
    return {name for edge in edges for kind in ("guards", "unless")
            for name in edge.get(kind, ())}
