"""Statements of ``lifecycle_machines`` (each machine's current spec version) and
``lifecycle_specs`` (every spec stored, under its version), and registration's look at the
resources a changed spec would strand."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    select,
)

from ..schema import machines, resources, specs
from .compiling import Compiling


class SpecStatements(Compiling):
    """A registration's statements (:func:`lifecycle.registry.store_specs`): compiled once
    per process, as the hot path's are, not by each store's SQLAlchemy engine again (every
    test's store, every command's)."""

    def _specs(self) -> None:
        m, s, r, sql, among = machines.c, specs.c, resources.c, self._sql, self._among
        postgresql = self.dialect.name == "postgresql"

        self.current_versions = sql(select(m.name, m.spec_version).where(among(m.name, "names")))
        """(name, spec version) of the machines named (``names``: :meth:`keys_param`) that
        the database has registered: what an engine's start-up reads, once for all its
        machines, outside any transaction."""
        self.lock_registration = (
            "SELECT pg_advisory_xact_lock(hashtext(%(name)s))" if postgresql else None)
        """PostgreSQL: hold a lock on registering ``name`` until the transaction ends, so that
        processes starting together register it one at a time (the key is
        ``lifecycle.register:MACHINE``, as every release took it). None on SQLite, whose
        ``BEGIN IMMEDIATE`` serialises them already."""
        self.stranded_candidates = sql(
            select(r.key, r.state, r.spec_version)
            .where(r.machine == bindparam("machine"), ~among(r.state, "states"))
            .order_by(r.key))
        """(key, state, spec version) of ``machine``'s resources in a state not among
        ``states`` (:meth:`keys_param`), by key."""
        self.spec_document = sql(select(s.spec).where(
            s.machine == bindparam("machine"), s.version == bindparam("version")))
        dialect_insert: Any
        if postgresql:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        else:  # (PostgreSQL's dialect is imported only where it is used)
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        self.store_spec = sql(dialect_insert(specs).values(
            machine=bindparam("machine"), version=bindparam("version"),
            spec=bindparam("spec"), created_at=bindparam("now")).on_conflict_do_nothing())
        """A spec stored under its version, unless it is stored already (a version is its
        content's hash)."""
        current = dialect_insert(machines).values(
            name=bindparam("machine"), spec_version=bindparam("version"),
            updated_at=bindparam("now"))
        self.make_current = sql(current.on_conflict_do_update(
            index_elements=[m.name], set_={"spec_version": current.excluded.spec_version,
                                           "updated_at": current.excluded.updated_at}))
        """``version`` the machine's current one: its row made, or changed."""


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


__all__ = ["SpecStatements", "current", "document", "names"]
