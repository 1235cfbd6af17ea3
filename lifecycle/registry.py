"""Specs in the database: each stored under its content hash, one current per machine name.

Each resource and each journal row records the spec version it ran under, so history can be
read long after the file that declared the machine changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select, text

from .errors import StrandedResources, UnknownMachine
from .logs import logger
from .spec import MachineSpec
from .store import Store, machines, resources, specs

log = logger(__name__)


def store_spec(store: Store, spec: MachineSpec, now: dt.datetime) -> None:
    """Store ``spec`` if it is new and make it its machine's current version. A changed spec
    is refused when live resources are in states it no longer has."""
    with store.begin() as db:
        if store.dialect == "postgresql":
            # processes starting together register one machine one at a time (SQLite's
            # BEGIN IMMEDIATE already serialises them); held until this transaction ends
            db.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                       {"name": f"lifecycle.register:{spec.name}"})
        known = db.execute(select(specs.c.version).where(
            specs.c.machine == spec.name, specs.c.version == spec.version)).first()
        current = db.execute(
            select(machines.c.spec_version).where(machines.c.name == spec.name)).scalar()
        if current != spec.version:
            stranded = _stranded(db, spec)
            if stranded:
                raise StrandedResources(spec.name, spec.version, stranded)
        if known is None:
            db.execute(specs.insert().values(
                machine=spec.name, version=spec.version, spec=spec.to_json(), created_at=now))
        if current is None:
            db.execute(machines.insert().values(
                name=spec.name, spec_version=spec.version, updated_at=now))
        elif current != spec.version:
            db.execute(machines.update().where(machines.c.name == spec.name).values(
                spec_version=spec.version, updated_at=now))
            log.info("machine %s: spec version %s replaces %s", spec.name, spec.version,
                     current)


def _stranded(db: Any, spec: MachineSpec) -> list[tuple[str, str]]:
    """Live resources (not in a final state of the spec they run under) whose state the new
    spec does not have."""
    finals_of: dict[str, set[str]] = {}
    rows = db.execute(
        select(resources.c.key, resources.c.state, resources.c.spec_version)
        .where(resources.c.machine == spec.name,
               resources.c.state.not_in(set(spec.graph.names)))
        .order_by(resources.c.key)
    ).all()
    stranded = []
    for key, state, version in rows:
        if version not in finals_of:
            old = MachineSpec.model_validate(db.execute(select(specs.c.spec).where(
                specs.c.machine == spec.name, specs.c.version == version)).scalar_one())
            finals_of[version] = {n for n in old.graph.leaves
                                  if old.graph.is_final(n, old.final)}
        if state not in finals_of[version]:
            stranded.append((key, state))
    return stranded


def stored_spec(store: Store, machine: str, known: list[str]) -> MachineSpec:
    """The machine's current spec as the database last registered it, under the version it
    was stored as."""
    with store.read() as db:
        stored = db.execute(
            select(specs.c.spec, specs.c.version)
            .join(machines, (machines.c.name == specs.c.machine)
                  & (machines.c.spec_version == specs.c.version))
            .where(machines.c.name == machine)
        ).first()
        if stored is None:
            names = db.execute(select(machines.c.name)).scalars().all()
            raise UnknownMachine(machine, [*known, *names])
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
        return list(db.execute(select(machines.c.name)).scalars().all())


def spec_at(db: Any, machine: str, version: str) -> MachineSpec | None:
    stored = db.execute(select(specs.c.spec).where(
        specs.c.machine == machine, specs.c.version == version)).scalar()
    return _as_stored(stored, version) if stored is not None else None
