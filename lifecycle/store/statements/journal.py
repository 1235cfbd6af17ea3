"""Statements of ``lifecycle_journal`` and ``lifecycle_observations``: the journal row of
every write, observations and which one is a resource's newest, and what ``verify`` and the
readers of a history read."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from ..schema import journal, observations, resources, specs
from .compiling import Compiling
from .resources import OBSERVED


class JournalStatements(Compiling):
    """The hot path's statements of the journal and observations; ``verify``'s streams."""

    def _journal(self) -> None:
        self._recording()
        self._verifying()

    def _recording(self) -> None:
        """The journal row of every write; observations and which one is the newest."""
        r, o, sql = resources.c, observations.c, self._sql
        self.insert_journal = sql(
            insert(journal).values(
                resource_id=bindparam("resource_id"), seq=bindparam("seq"),
                kind=bindparam("kind"), trigger=bindparam("trigger"),
                source=bindparam("source"), dest=bindparam("dest"),
                version=bindparam("version"), spec_version=bindparam("spec_version"),
                actor=bindparam("actor"), at=bindparam("at"),
                payload=bindparam("payload"), guards=bindparam("guards"),
                observation_id=bindparam("observation_id"), fence=bindparam("fence"),
            ), positional=True
        )
        self.insert_observation = sql(
            insert(observations).values(
                resource_id=bindparam("resource_id"), status=bindparam("status"),
                observed_at=bindparam("observed_at"), recorded_at=bindparam("recorded_at"),
                source=bindparam("source"),
            ).returning(o.id)
        )
        # the newest observation by observed_at; an older one arriving late does not replace it
        self.newest_observation = sql(
            update(resources)
            .where(r.id == bindparam("id_"),
                   (r.observed_at.is_(None)) | (r.observed_at <= bindparam("observed_at_")))
            .values(observation_id=bindparam("observation_id"),
                    observed_at=bindparam("observed_at_"))
        )

    def _verifying(self) -> None:
        """Every resource with its journal, in order; a stored spec."""
        r, j, sql = resources.c, journal.c, self._sql
        # two streams in the same order, merged by the reader: each row read once, the
        # resource's columns not repeated on each of its journal rows
        self.verified_resources = sql(
            select(r.id, r.machine, r.key, r.state, r.version, r.seq).order_by(r.id))
        self.journals = sql(
            select(j.resource_id, j.seq, j.kind, j.trigger, j.source, j.dest, j.version,
                   j.spec_version).order_by(j.resource_id, j.seq))
        self.stored_spec = sql(select(specs.c.spec).where(
            specs.c.machine == bindparam("machine"), specs.c.version == bindparam("version")))


# -- beside the hot path ----------------------------------------------------------------------


def history(db: Connection, resource_id: int) -> list[Any]:
    """The resource's journal rows in order, each with the observation it was decided on
    (:data:`OBSERVED` columns)."""
    return list(db.execute(
        select(journal, *OBSERVED)
        .select_from(journal.outerjoin(observations,
                                       observations.c.id == journal.c.observation_id))
        .where(journal.c.resource_id == resource_id)
        .order_by(journal.c.seq)).all())


def observations_of(db: Connection, resource_id: int) -> list[Any]:
    """Every observation of the resource, in the order they were recorded."""
    return list(db.execute(select(observations).where(observations.c.resource_id == resource_id)
                           .order_by(observations.c.id)).all())


__all__ = ["JournalStatements", "history", "observations_of"]
