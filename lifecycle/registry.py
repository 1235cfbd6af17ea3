"""Specs in the database: each stored under its content hash, one current per machine name.

Each resource and each journal row records the spec version it ran under, so history can be
read long after the file that declared the machine changed."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .errors import StrandedResources, UnknownMachine
from .logs import logger
from .spec import MachineSpec
from .store import Store, Transaction
from .store.statements import specs

log = logger(__name__)


def store_specs(store: Store, given: Sequence[MachineSpec], now: dt.datetime) -> None:
    """Store each spec of ``given`` that is new and make it its machine's current version,
    in order. A changed spec is refused (:class:`StrandedResources`) when live resources are
    in states it no longer has; the specs before it are registered all the same.

    One read tells which machines run these versions already (an engine's start-up on a
    database that has its machines: every worker's, every command's); only the others are
    registered, in one write transaction that locks their names and reads them again."""
    if not given:
        return
    sql = store.sql
    names = list(dict.fromkeys(spec.name for spec in given))
    with store.reading() as tx:
        tx.execute(sql.current_versions, {"names": sql.keys_param(names)})
        current = {str(name): str(version) for name, version in tx.fetchall()}
    if len(names) < len(given):  # a machine given twice: each of its specs in turn
        changed = list(given)
    else:
        changed = [spec for spec in given if current.get(spec.name) != spec.version]
    if changed:
        _register(store, changed, now)


def _register(store: Store, given: list[MachineSpec], now: dt.datetime) -> None:
    """:func:`store_specs`' write, on a connection of the pool: the machines' names locked
    (in one order, so that processes registering several at once never wait for each other
    in a circle), their current versions read again under the locks, and each spec stored
    and made current (the catalogue's statements, compiled once per process)."""
    sql = store.sql
    refused: StrandedResources | None = None
    with store.write(held=False) as tx:
        names = sorted({spec.name for spec in given})
        if sql.lock_registration is not None:
            for name in names:
                tx.execute(sql.lock_registration, {"name": f"lifecycle.register:{name}"})
        tx.execute(sql.current_versions, {"names": sql.keys_param(names)})
        current = {str(name): str(version) for name, version in tx.fetchall()}
        for spec in given:
            was = current.get(spec.name)
            if was == spec.version:
                continue
            stranded = _stranded(tx, spec)
            if stranded:  # the specs before it are committed, as each on its own would be
                refused = StrandedResources(spec.name, spec.version, stranded)
                break
            at = tx.time(now)
            tx.execute(sql.store_spec, {"machine": spec.name, "version": spec.version,
                                        "spec": tx.json(spec.to_json()), "now": at})
            tx.execute(sql.make_current, {"machine": spec.name, "version": spec.version,
                                          "now": at})
            current[spec.name] = spec.version
            if was is not None:
                log.info("machine %s: spec version %s replaces %s", spec.name, spec.version,
                         was)
    if refused is not None:
        raise refused


def _stranded(tx: Transaction, spec: MachineSpec) -> list[tuple[str, str]]:
    """Live resources (not in a final state of the spec they run under) whose state the new
    spec does not have."""
    sql = tx.sql
    assert sql is not None
    tx.execute(sql.stranded_candidates, {"machine": spec.name,
                                         "states": sql.keys_param(list(spec.graph.names))})
    finals_of: dict[str, set[str]] = {}
    stranded = []
    for key, state, version in tx.fetchall():
        if version not in finals_of:
            tx.execute(sql.spec_document, {"machine": spec.name, "version": version})
            old = MachineSpec.model_validate(tx.json_value(tx.fetchone()[0]))
            finals_of[version] = {n for n in old.graph.leaves
                                  if old.graph.is_final(n, old.final)}
        if state not in finals_of[version]:
            stranded.append((key, state))
    return stranded


def stored_spec(store: Store, machine: str, known: list[str]) -> MachineSpec:
    """The machine's current spec as the database last registered it, under the version it
    was stored as."""
    with store.read() as db:
        stored = specs.current(db, machine)
        if stored is None:
            raise UnknownMachine(machine, [*known, *specs.names(db)])
    return _as_stored(stored.spec, stored.version)


def _as_stored(document: Any, version: str) -> MachineSpec:
    """A spec read from the database, keeping the version it is stored under. Its content
    hash under this code may differ (an older release wrote the document, and today's
    serialisation adds or drops defaults): a resource fired under it must be stamped with
    a version the database holds, or its history could not be verified."""
    spec = MachineSpec.model_validate(document)
    spec.__dict__["version"] = version      # the cached_property's slot
    return spec


def stored_names(store: Store) -> list[str]:
    with store.read() as db:
        return specs.names(db)


def spec_at(db: Any, machine: str, version: str) -> MachineSpec | None:
    stored = specs.document(db, machine, version)
    return _as_stored(stored, version) if stored is not None else None
