"""Statements of ``lifecycle_machines`` (each machine's current spec version) and
``lifecycle_specs`` (every spec stored, under its version)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

from sqlalchemy import (
    ARRAY,
    Connection,
    String,
    any_,
    bindparam,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..schema import machines, specs
from .compiling import Compiling


class SpecStatements(Compiling):
    """The statement of a registration's one read (:func:`lifecycle.registry.store_specs`)."""

    def _specs(self) -> None:
        m = machines.c
        if self.dialect.name == "postgresql":
            named: Any = m.name == any_(bindparam("names", type_=ARRAY(String)))
        else:
            named = m.name.in_(select(literal_column("value")).select_from(
                func.json_each(bindparam("names"))).scalar_subquery())
        self.current_versions = self._sql(select(m.name, m.spec_version).where(named))
        """(name, spec version) of the machines named (``names``: :meth:`keys_param`) that
        the database has registered: the one statement an engine's start-up reads when
        every spec it registers is current already."""


def lock_registration(db: Connection, machine: str) -> None:
    """PostgreSQL: hold a lock on registering ``machine`` until this transaction ends, so that
    processes starting together register it one at a time (SQLite's ``BEGIN IMMEDIATE``
    already serialises them)."""
    if db.dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                   {"name": f"lifecycle.register:{machine}"})


def current_versions(db: Connection, names: Collection[str]) -> dict[str, str]:
    """The spec version each of the machines ``names`` runs under now (a machine not
    registered is absent)."""
    return {str(name): str(version) for name, version in db.execute(
        select(machines.c.name, machines.c.spec_version).where(machines.c.name.in_(names)))}


def store(db: Connection, machine: str, version: str, document: Any, now: dt.datetime) -> None:
    """Store a spec under its version, unless it is stored already (a version is its
    content's hash: the stored document is the same)."""
    db.execute(_insert(db, specs).values(machine=machine, version=version, spec=document,
                                         created_at=now).on_conflict_do_nothing())


def make_current(db: Connection, machine: str, version: str, now: dt.datetime) -> None:
    """Make ``version`` the machine's current one (the machine's row made, or changed)."""
    db.execute(_insert(db, machines).values(name=machine, spec_version=version, updated_at=now)
               .on_conflict_do_update(index_elements=[machines.c.name],
                                      set_={"spec_version": version, "updated_at": now}))


def _insert(db: Connection, table: Any) -> Any:
    """An INSERT of the connection's dialect, which has an ``ON CONFLICT`` clause."""
    if db.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table)
    return sqlite_insert(table)


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


__all__ = ["SpecStatements", "current", "current_versions", "document", "lock_registration",
           "make_current", "names", "store"]
