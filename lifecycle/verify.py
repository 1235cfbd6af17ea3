"""``lifecycle verify``: replay every resource's journal and compare it with its row.

Checks, per resource: sequence numbers contiguous from 1 and ending at the row's ``seq``;
the first row creates or adopts; each transition starts where the previous row ended, is a
transition its spec version has (trigger, a source covering the state, a dest entering the
state reached), and bumps the version by one; the replay ends in the row's state and version.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from itertools import chain, groupby
from operator import itemgetter
from typing import Any

from .results import Mismatch
from .spec import MachineSpec
from .store import Store, Transaction

BATCH = 5000
"""Rows fetched at a time: memory stays flat whatever the journal's length."""


_ID, _MACHINE, _KEY, _STATE, _VERSION, _SEQ = range(6)
"""A row of ``Statements.verified_resources``; a journal row is one of
``Statements.journals``: (resource id, seq, kind, trigger, source, dest, version, spec
version). Both as the driver gives them (tuples: a million rows read as objects cost a third
of the time)."""


def verify(store: Store) -> list[Mismatch]:
    problems: list[Mismatch] = []
    with store.scanning(streams=2) as ((resources, journal), small):
        specs = _Specs(store, small)
        resources.execute(store.sql.verified_resources)
        journal.execute(store.sql.journals)
        for resource, entries in _grouped(resources, journal):
            for problem in _check(resource, entries, specs):
                problems.append(Mismatch(resource[_MACHINE], resource[_KEY], problem))
    return problems


class _Specs:
    """The stored spec versions met, and whether each transition met is one of them
    (``covered_leaves`` is worked out once per spec, trigger, source and dest)."""

    def __init__(self, store: Store, tx: Transaction) -> None:
        self.store, self.tx = store, tx
        self.specs: dict[tuple[str, str], MachineSpec | None] = {}
        self.allowed: dict[tuple[str, str, str | None, str, str], bool | None] = {}

    def spec(self, machine: str, version: str) -> MachineSpec | None:
        if (machine, version) not in self.specs:
            self.tx.execute(self.store.sql.stored_spec,
                                {"machine": machine, "version": version})
            found = self.tx.fetchone()
            self.specs[machine, version] = (
                None if found is None else
                MachineSpec.model_validate(self.store.json_value(found[0])))
        return self.specs[machine, version]

    def allows(self, machine: str, version: str, trigger: str | None, source: str,
               dest: str) -> bool | None:
        """Whether the spec version has the transition; None when it is not stored."""
        key = (machine, version, trigger, source, dest)
        if key not in self.allowed:
            spec = self.spec(machine, version)
            self.allowed[key] = None if spec is None else _allowed(spec, trigger, source, dest)
        return self.allowed[key]


def _rows(tx: Transaction) -> Iterator[tuple[Any, ...]]:
    """The rows of ``tx``, :data:`BATCH` at a time."""
    return chain.from_iterable(iter(partial(tx.fetchmany, BATCH), []))


def _grouped(resources: Any, journal: Any
             ) -> Iterator[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    """Each resource with its journal rows, the two streams (both in resource id order)
    merged."""
    journals = groupby(_rows(journal), key=itemgetter(0))
    current = next(journals, None)
    for resource in _rows(resources):
        rid = resource[_ID]
        while current is not None and current[0] < rid:  # (a row of no resource)
            current = next(journals, None)
        if current is not None and current[0] == rid:
            yield resource, list(current[1])
            current = next(journals, None)
        else:
            yield resource, []


def _check(resource: tuple[Any, ...], entries: list[tuple[Any, ...]],
           specs: _Specs) -> Iterator[str]:
    if not entries:
        yield "has no journal"
        return
    seqs = [e[1] for e in entries]
    if seqs != list(range(1, len(seqs) + 1)):
        gaps = sorted(set(range(1, max(seqs) + 1)) - set(seqs))
        yield f"journal sequence numbers are not contiguous (missing {gaps[:10]})"
    if seqs[-1] != resource[_SEQ]:
        yield f"journal ends at seq {seqs[-1]} but the resource says {resource[_SEQ]}"
    first = entries[0]
    if first[2] not in ("create", "adopt"):
        yield f"journal starts with a {first[2]!r} row, not a creation"
    machine, state, version = resource[_MACHINE], first[5], first[6]
    known = specs.allowed
    for _id, seq, kind, trigger, source, dest, j_version, spec_version in entries[1:]:
        if kind == "transition" and source == state and j_version == version + 1 and (
                known.get((machine, spec_version, trigger, source, dest))
                or specs.allows(machine, spec_version, trigger, source, dest)):
            state, version = dest, j_version  # (the common case, checked at once)
            continue
        yield from _problems(f"seq {seq}", (machine, kind, trigger, source, dest, j_version,
                                            spec_version), state, version, specs)
        if kind in ("transition", "update"):
            state, version = (dest if kind == "transition" else state), j_version
    if state != resource[_STATE]:
        yield f"journal replays to state {state!r} but the resource is in {resource[_STATE]!r}"
    if version != resource[_VERSION]:
        yield f"journal replays to version {version} but the resource has {resource[_VERSION]}"


def _problems(where: str, entry: tuple[Any, ...], state: str, version: int,
              specs: _Specs) -> Iterator[str]:
    """What is wrong with a journal row that the common case did not let through."""
    machine, kind, trigger, source, dest, j_version, spec_version = entry
    if kind == "refusal":
        if source != state or j_version != version:
            yield (f"{where}: a refusal in {source!r} at version {j_version}, "
                   f"but the journal had reached {state!r} at version {version}")
        return
    if kind == "update":
        if source != state or dest != state:
            yield f"{where}: a data update moved {source!r} -> {dest!r}"
        if j_version != version + 1:
            yield f"{where}: version {j_version} does not follow {version}"
        return
    if kind != "transition":
        yield f"{where}: unknown kind {kind!r}"
        return
    if source != state:
        yield f"{where}: starts from {source!r} but the journal had reached {state!r}"
    if j_version != version + 1:
        yield f"{where}: version {j_version} does not follow {version}"
    verdict = specs.allows(machine, spec_version, trigger, source or "", dest)
    if verdict is None:
        yield f"{where}: spec version {spec_version} is not stored"
    elif not verdict:
        what = trigger or "eventless transition"
        yield (f"{where}: {what} {source!r} -> {dest!r} is not a transition of "
               f"spec version {spec_version}")


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
