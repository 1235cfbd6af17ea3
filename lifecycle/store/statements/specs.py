"""Statements of ``lifecycle_machines`` (each machine's current spec version) and
``lifecycle_specs`` (every spec stored, under its version)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, select, text

from ..schema import machines, specs


def lock_registration(db: Connection, machine: str) -> None:
    """PostgreSQL: hold a lock on registering ``machine`` until this transaction ends, so that
    processes starting together register it one at a time (SQLite's ``BEGIN IMMEDIATE``
    already serialises them)."""
    if db.dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                   {"name": f"lifecycle.register:{machine}"})


def is_stored(db: Connection, machine: str, version: str) -> bool:
    return db.execute(select(specs.c.version).where(
        specs.c.machine == machine, specs.c.version == version)).first() is not None


def current_version(db: Connection, machine: str) -> str | None:
    """The spec version ``machine`` runs under now, or None for a machine not registered."""
    value = db.execute(select(machines.c.spec_version).where(machines.c.name == machine)).scalar()
    return None if value is None else str(value)


def store(db: Connection, machine: str, version: str, document: Any, now: dt.datetime) -> None:
    db.execute(specs.insert().values(machine=machine, version=version, spec=document,
                                     created_at=now))


def make_current(db: Connection, machine: str, version: str, now: dt.datetime, *,
                 known: bool) -> None:
    """Make ``version`` the machine's current one (``known``: the machine has a row)."""
    if known:
        db.execute(machines.update().where(machines.c.name == machine).values(
            spec_version=version, updated_at=now))
    else:
        db.execute(machines.insert().values(name=machine, spec_version=version, updated_at=now))


def document(db: Connection, machine: str, version: str) -> Any:
    """The stored spec document of ``machine`` at ``version``, or None."""
    return db.execute(select(specs.c.spec).where(
        specs.c.machine == machine, specs.c.version == version)).scalar()


def current(db: Connection, machine: str) -> Any:
    """(spec, version) of the spec ``machine`` runs under now, or None."""
    return db.execute(
        select(specs.c.spec, specs.c.version)
        .join(machines, (machines.c.name == specs.c.machine)
              & (machines.c.spec_version == specs.c.version))
        .where(machines.c.name == machine)).first()


def names(db: Connection) -> list[str]:
    """The names of the machines the database has registered."""
    return [str(name) for name in db.execute(select(machines.c.name)).scalars().all()]


__all__ = ["current", "current_version", "document", "is_stored", "lock_registration",
           "make_current", "names", "store"]
