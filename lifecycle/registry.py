"""Specs in the database: each stored under its content hash, one current per machine name.

Each resource and each journal row records the spec version it ran under, so history can be
read long after the file that declared the machine changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .errors import StrandedResources, UnknownMachine
from .logs import logger
from .spec import MachineSpec
from .store import Store
from .store.statements import resources, specs

log = logger(__name__)


def store_spec(store: Store, spec: MachineSpec, now: dt.datetime) -> None:
    """Store ``spec`` if it is new and make it its machine's current version. A changed spec
    is refused when live resources are in states it no longer has."""
    with store.begin() as db:
        specs.lock_registration(db, spec.name)
        known = specs.is_stored(db, spec.name, spec.version)
        current = specs.current_version(db, spec.name)
        if current != spec.version:
            stranded = _stranded(db, spec)
            if stranded:
                raise StrandedResources(spec.name, spec.version, stranded)
        if not known:
            specs.store(db, spec.name, spec.version, spec.to_json(), now)
        if current != spec.version:
            specs.make_current(db, spec.name, spec.version, now, known=current is not None)
        if current is not None and current != spec.version:
            log.info("machine %s: spec version %s replaces %s", spec.name, spec.version,
                     current)


def _stranded(db: Any, spec: MachineSpec) -> list[tuple[str, str]]:
    """Live resources (not in a final state of the spec they run under) whose state the new
    spec does not have."""
    finals_of: dict[str, set[str]] = {}
    stranded = []
    for key, state, version in resources.stranded_candidates(db, spec.name,
                                                             set(spec.graph.names)):
        if version not in finals_of:
            old = MachineSpec.model_validate(specs.document(db, spec.name, version))
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
