"""Reading resources, their journals and observations (SQLAlchemy Core; not the hot path)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select

from . import values
from .errors import AmbiguousKey, LifecycleError, UnknownResource
from .records import JournalEntry, Observation, Resource
from .spec import SEPARATOR
from .store import Store, journal, observations, resources

LONGEST_KEY = 510
"""Characters of a key as asked for (``MACHINE:KEY``: two names of at most 255)."""


def split_key(key: str) -> tuple[str | None, str]:
    """``MACHINE:KEY`` or a plain key."""
    machine, sep, rest = key.partition(":")
    if sep and machine and rest:
        return machine, rest
    return None, key


def _observation(row: Any, prefix: str = "o_") -> Observation | None:
    if getattr(row, f"{prefix}id") is None:
        return None
    return Observation(getattr(row, f"{prefix}id"), getattr(row, f"{prefix}status"),
                       getattr(row, f"{prefix}observed_at"),
                       getattr(row, f"{prefix}recorded_at"), getattr(row, f"{prefix}source"))


_OBSERVATION = [observations.c[n].label(f"o_{n}")
                for n in ("id", "status", "observed_at", "recorded_at", "source")]


def _resource_query() -> Any:
    return select(resources, *_OBSERVATION).select_from(
        resources.outerjoin(observations, observations.c.id == resources.c.observation_id))


def _resource(r: Any) -> Resource:
    return Resource(r.machine, r.key, r.state, r.version, r.seq, r.data, r.spec_version,
                    r.created_at, r.updated_at, _observation(r))


def _row(db: Any, key: str) -> Any:
    problem = values.text_problem(key, LONGEST_KEY)
    if problem is not None:  # before a database is asked (PostgreSQL refuses a NUL)
        raise LifecycleError(f"invalid key {key!r}: it {problem}")
    machine, plain = split_key(key)
    query = _resource_query().where(resources.c.key == plain)
    if machine is not None:
        query = query.where(resources.c.machine == machine)
    rows = db.execute(query).all()
    if not rows:
        raise UnknownResource(plain, machine)
    if len(rows) > 1:
        raise AmbiguousKey(plain, [r.machine for r in rows])
    return rows[0]


def get(db: Any, key: str) -> Resource:
    return _resource(_row(db, key))


def resource_id(db: Any, key: str) -> tuple[int, Resource]:
    """The resource's row id (for joins), read in the same query as the resource."""
    row = _row(db, key)
    return int(row.id), _resource(row)


def history(store: Store, key: str) -> list[JournalEntry]:
    with store.read() as db:
        rid, _ = resource_id(db, key)
        rows = db.execute(
            select(journal, *_OBSERVATION)
            .select_from(journal.outerjoin(observations,
                                           observations.c.id == journal.c.observation_id))
            .where(journal.c.resource_id == rid)
            .order_by(journal.c.seq)
        ).all()
    return [JournalEntry(r.seq, r.kind, r.trigger, r.source, r.dest, r.version, r.spec_version,
                         r.actor, r.at, r.payload, r.guards, _observation(r), r.fence)
            for r in rows]


def observations_of(store: Store, key: str) -> list[Observation]:
    """Every observation of the resource, in the order they were recorded."""
    with store.read() as db:
        rid, _ = resource_id(db, key)
        rows = db.execute(select(observations).where(observations.c.resource_id == rid)
                          .order_by(observations.c.id)).all()
    return [Observation(r.id, r.status, r.observed_at, r.recorded_at, r.source) for r in rows]


def listing(store: Store, machine: str | None, state: str | None) -> list[Resource]:
    query = _resource_query().order_by(resources.c.machine, resources.c.key)
    if machine is not None:
        query = query.where(resources.c.machine == machine)
    if state is not None:  # a composite state takes in the states inside it
        query = query.where(or_(resources.c.state == state,
                                resources.c.state.startswith(state + SEPARATOR,
                                                             autoescape=True)))
    with store.read() as db:
        return [_resource(r) for r in db.execute(query)]


def counts(store: Store, machine: str | None) -> dict[str, dict[str, int]]:
    query = select(resources.c.machine, resources.c.state, func.count()).group_by(
        resources.c.machine, resources.c.state)
    if machine is not None:
        query = query.where(resources.c.machine == machine)
    out: dict[str, dict[str, int]] = {}
    with store.read() as db:
        for name, state, count in db.execute(query):
            out.setdefault(name, {})[state] = count
    return out
