"""``lifecycle verify``: replay every resource's journal and compare it with its row.

Checks, per resource: sequence numbers contiguous from 1 and ending at the row's ``seq``;
the first row creates or adopts; each transition starts where the previous row ended, is a
transition its spec version has (trigger, a source covering the state, a dest entering the
state reached), and bumps the version by one; the replay ends in the row's state and version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import select

from .records import Mismatch
from .spec import MachineSpec
from .store import Store, journal, resources, specs


def verify(store: Store) -> list[Mismatch]:
    problems: list[Mismatch] = []
    spec_cache: dict[tuple[str, str], MachineSpec | None] = {}
    with store.read() as db:

        def spec_of(machine: str, version: str) -> MachineSpec | None:
            if (machine, version) not in spec_cache:
                stored = db.execute(select(specs.c.spec).where(
                    specs.c.machine == machine, specs.c.version == version)).scalar()
                spec_cache[machine, version] = (
                    MachineSpec.model_validate(stored) if stored is not None else None)
            return spec_cache[machine, version]

        rows = db.execute(
            select(resources.c.id, resources.c.machine, resources.c.key, resources.c.state,
                   resources.c.version, resources.c.seq, journal.c.seq.label("j_seq"),
                   journal.c.kind, journal.c.trigger, journal.c.source, journal.c.dest,
                   journal.c.version.label("j_version"), journal.c.spec_version)
            .outerjoin(journal, journal.c.resource_id == resources.c.id)
            .order_by(resources.c.id, journal.c.seq)
        )
        for resource, entries in _grouped(rows):
            for problem in _check(resource, entries, spec_of):
                problems.append(Mismatch(resource.machine, resource.key, problem))
    return problems


def _grouped(rows: Any) -> Iterator[tuple[Any, list[Any]]]:
    current: Any = None
    entries: list[Any] = []
    for row in rows:
        if current is not None and row.id != current.id:
            yield current, entries
            entries = []
        current = row
        if row.j_seq is not None:
            entries.append(row)
    if current is not None:
        yield current, entries


def _check(resource: Any, entries: list[Any], spec_of: Any) -> Iterator[str]:
    if not entries:
        yield "has no journal"
        return
    seqs = [e.j_seq for e in entries]
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
        spec = spec_of(resource.machine, entry.spec_version)
        if spec is None:
            yield f"{where}: spec version {entry.spec_version} is not stored"
        elif not _allowed(spec, entry.trigger, entry.source, entry.dest):
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
