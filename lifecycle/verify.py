"""``lifecycle verify``: replay every resource's journal and compare it with its row.

Checks, per resource: sequence numbers contiguous from 1 and ending at the row's ``seq``;
the first row creates or adopts; each transition starts where the previous row ended, is a
transition its spec version has (trigger, a source covering the state, a dest entering the
state reached), and bumps the version by one; the replay ends in the row's state and version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from .records import Mismatch
from .spec import MachineSpec
from .store import Store

BATCH = 5000
"""Rows fetched at a time: memory stays flat whatever the journal's length."""


class _Line(NamedTuple):
    """A resource's row beside one row of its journal (``j_*`` None when it has none)."""

    id: int
    machine: str
    key: str
    state: str
    version: int
    seq: int
    j_seq: int | None
    kind: str
    trigger: str | None
    source: str | None
    dest: str
    j_version: int
    spec_version: str


def verify(store: Store) -> list[Mismatch]:
    problems: list[Mismatch] = []
    with store.scanning() as (rows, small):
        specs = _Specs(store, small)
        rows.execute(store.sql.journals)
        for resource, entries in _grouped(rows):
            for problem in _check(resource, entries, specs):
                problems.append(Mismatch(resource.machine, resource.key, problem))
    return problems


class _Specs:
    """The stored spec versions met, and whether each transition met is one of them
    (``covered_leaves`` is worked out once per spec, trigger, source and dest)."""

    def __init__(self, store: Store, cursor: Any) -> None:
        self.store, self.cursor = store, cursor
        self.specs: dict[tuple[str, str], MachineSpec | None] = {}
        self.allowed: dict[tuple[str, str, str | None, str, str], bool] = {}

    def __call__(self, machine: str, version: str) -> MachineSpec | None:
        if (machine, version) not in self.specs:
            self.cursor.execute(self.store.sql.stored_spec,
                                {"machine": machine, "version": version})
            found = self.cursor.fetchone()
            self.specs[machine, version] = (
                None if found is None else
                MachineSpec.model_validate(self.store.json_value(found[0])))
        return self.specs[machine, version]

    def allows(self, machine: str, version: str, trigger: str | None, source: str,
               dest: str) -> bool:
        key = (machine, version, trigger, source, dest)
        if key not in self.allowed:
            spec = self(machine, version)
            self.allowed[key] = spec is not None and _allowed(spec, trigger, source, dest)
        return self.allowed[key]


def _grouped(rows: Any) -> Iterator[tuple[_Line, list[_Line]]]:
    current: _Line | None = None
    entries: list[_Line] = []
    make = _Line._make
    while batch := rows.fetchmany(BATCH):
        for raw in batch:
            row = make(raw)
            if current is not None and row.id != current.id:
                yield current, entries
                entries = []
            current = row
            if row.j_seq is not None:
                entries.append(row)
    if current is not None:
        yield current, entries


def _check(resource: _Line, entries: list[_Line], specs: _Specs) -> Iterator[str]:
    if not entries:
        yield "has no journal"
        return
    seqs = [e.j_seq or 0 for e in entries]  # (a journal row has its seq)
    if seqs != list(range(1, len(seqs) + 1)):
        gaps = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
        yield f"journal sequence numbers are not contiguous (missing {gaps[:10]})"
    if seqs[-1] != resource.seq:
        yield f"journal ends at seq {seqs[-1]} but the resource says {resource.seq}"
    first = entries[0]
    if first.kind not in ("create", "adopt"):
        yield f"journal starts with a {first.kind!r} row, not a creation"
    state, version = first.dest, first.j_version
    for entry in entries[1:]:
        where = f"seq {entry.j_seq}"
        if entry.kind == "refusal":
            if entry.source != state or entry.j_version != version:
                yield (f"{where}: a refusal in {entry.source!r} at version {entry.j_version}, "
                       f"but the journal had reached {state!r} at version {version}")
            continue
        if entry.kind == "update":
            if entry.source != state or entry.dest != state:
                yield f"{where}: a data update moved {entry.source!r} -> {entry.dest!r}"
            if entry.j_version != version + 1:
                yield f"{where}: version {entry.j_version} does not follow {version}"
            version = entry.j_version
            continue
        if entry.kind != "transition":
            yield f"{where}: unknown kind {entry.kind!r}"
            continue
        if entry.source != state:
            yield f"{where}: starts from {entry.source!r} but the journal had reached {state!r}"
        if entry.j_version != version + 1:
            yield f"{where}: version {entry.j_version} does not follow {version}"
        if specs(resource.machine, entry.spec_version) is None:
            yield f"{where}: spec version {entry.spec_version} is not stored"
        elif not specs.allows(resource.machine, entry.spec_version, entry.trigger,
                              entry.source or "", entry.dest):
            what = entry.trigger or "eventless transition"
            yield (f"{where}: {what} {entry.source!r} -> {entry.dest!r} is not a transition of "
                   f"spec version {entry.spec_version}")
        state, version = entry.dest, entry.j_version
    if state != resource.state:
        yield f"journal replays to state {state!r} but the resource is in {resource.state!r}"
    if version != resource.version:
        yield f"journal replays to version {version} but the resource has {resource.version}"


def _allowed(spec: MachineSpec, trigger: str | None, source: str, dest: str) -> bool:
    graph = spec.graph
    if source not in graph.parent or dest not in graph.parent:
        return False
    edges = spec.eventless if trigger is None else [
        t for t in spec.transitions if t.trigger == trigger]
    return any(
        source in graph.covered_leaves(e.sources) and graph.enter(e.dest) == dest
        for e in edges if e.dest in graph.parent
    )


__all__ = ["verify"]
