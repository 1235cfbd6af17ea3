"""Statements of ``lifecycle_resources`` (and of ``lifecycle_state_counts``, the counts of
its rows by machine and state): a resource read by key, a page of them, a batch of them, and
its moves, each a compare-and-swap on the row the decision was taken on."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    Text,
    bindparam,
    cast,
    func,
    insert,
    select,
    tuple_,
    update,
)

from ...errors import AmbiguousKey, UnknownResource
from ...results import OBSERVATION_COLUMNS, SHOWN_COLUMNS
from ..schema import observations, resources, state_counts
from .compiling import Compiling


class ResourceStatements(Compiling):
    """The hot path's statements of resources."""

    RESOURCE_COLUMNS = ("id", "machine", "key", "state", "version", "seq", "data",
                        "spec_version", "last_transition_at", "created_at")
    OBSERVATION_COLUMNS = OBSERVATION_COLUMNS
    SHOWN_COLUMNS = SHOWN_COLUMNS

    def _resources(self) -> None:
        self._reading()
        self._bulk()
        self._moving()

    def _reading(self) -> None:
        """The resource with its newest observation, by key."""
        r, o, sql = resources.c, observations.c, self._sql
        located = (
            select(*(r[n] for n in self.RESOURCE_COLUMNS),
                   *(o[n] for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id))
        )
        self.resource_by_key = sql(located.where(r.key == bindparam("key")))
        self.resource_by_machine_key = sql(
            located.where(r.machine == bindparam("machine"), r.key == bindparam("key")))
        # what a reader is shown: get, and the pages of a listing
        self.shown = (
            select(*(r[n] for n in self.SHOWN_COLUMNS),
                   *(o[n] for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id)))
        self.shown_by_key = sql(self.shown.where(r.key == bindparam("key")))
        self.shown_by_machine_key = sql(
            self.shown.where(r.machine == bindparam("machine"), r.key == bindparam("key")))
        self._pages: dict[tuple[bool, bool, bool], str] = {}
        c = state_counts.c
        self.counts = {by_machine: sql(
            select(c.machine, c.state, func.sum(c.n), func.count())
            .where(*([c.machine == bindparam("machine")] if by_machine else []))
            .group_by(c.machine, c.state)) for by_machine in (False, True)}

    FOLD_COUNTS: ClassVar[dict[str, list[str]]] = {
        # one statement, so no row committed meanwhile is deleted without being added up
        "postgresql": ["WITH gone AS (DELETE FROM lifecycle_state_counts "
                       "RETURNING machine, state, n) "
                       "INSERT INTO lifecycle_state_counts (machine, state, n) "
                       "SELECT machine, state, sum(n) FROM gone GROUP BY machine, state "
                       "HAVING sum(n) <> 0"],
        # writers take turns on SQLite: nothing is added while the transaction runs
        "sqlite": ["INSERT INTO lifecycle_state_counts (machine, state, n) "
                   "SELECT machine, state, sum(n) FROM lifecycle_state_counts "
                   "WHERE id <= :upto GROUP BY machine, state HAVING sum(n) <> 0",
                   "DELETE FROM lifecycle_state_counts WHERE id <= :upto"],
    }
    """Folding the count rows: one row per machine and state, the sum of its rows."""

    LAST_COUNT_ROW = "SELECT max(id) FROM lifecycle_state_counts"
    """The count rows SQLite's fold adds up (``:upto``): those there when it began."""

    def page(self, machine: bool, state: bool, after: bool) -> str:
        """A page of resources in (machine, key) order, with their newest observations: of
        one ``machine`` or all, in one ``state`` (or a state inside it: a ``LIKE`` prefix,
        ``/`` its escape) or all, ``after`` a (machine, key) position (with ``machine``, a
        key of it) or from the start; ``limit`` rows. Compiled on first use."""
        shape = (machine, state, after)
        if shape not in self._pages:
            r = resources.c
            where = []
            if machine:
                where.append(r.machine == bindparam("machine"))
            if state:
                where.append((r.state == bindparam("state"))
                             | r.state.like(bindparam("state_prefix"), escape="/"))
            if after and machine:  # keyset: past the last key of the page before
                where.append(r.key > bindparam("after_key"))
            elif after:  # keyset: (machine, key) past the last row of the page before
                where.append(tuple_(r.machine, r.key) > tuple_(
                    bindparam("after_machine"), bindparam("after_key")))
            limit = ":limit" if self.dialect.name == "sqlite" else "%(limit)s"
            # the page's ids first, then their rows and observations: the planner then
            # walks the index for ``limit`` entries (asked all at once, PostgreSQL misjudges
            # a row comparison's rows and joins and sorts half the table)
            ids = self._sql(select(r.id).where(*where).order_by(r.machine, r.key))
            shown = self._sql(self.shown.order_by(r.machine, r.key))
            table = self._sql(select(r.id)).split("FROM ", 1)[1].strip()
            assert shown.count(f"FROM {table} ") == 1, shown
            self._pages[shape] = shown.replace(
                f"FROM {table} ",
                f"FROM ({ids} LIMIT {limit}) AS page JOIN {table} ON {table}.id = page.id ")
        return self._pages[shape]

    def _bulk(self) -> None:
        """Many resources of one machine, with their newest observations, by key: the read
        of a batch (``Engine.observe_many``, ``Engine.step_many``). The keys are one
        parameter, ``keys``: an array on PostgreSQL, a JSON array on SQLite."""
        r, o, sql = resources.c, observations.c, self._sql
        keys = self._among(r.key, "keys")
        # a machine's resources in some states, key and data alone, in key order: what a
        # heartbeat asks its site about (``lifecycle.machines.drone.live_drones``), in one
        # read; the states are one parameter, ``states``, as ``keys`` is
        states = self._among(r.state, "states")
        self.keys_and_data_by_states = sql(
            # (the data as text: decoded by ``results.json_value``, cheaper than the
            # driver's JSON loader)
            select(r.key, cast(r.data, Text)).where(r.machine == bindparam("machine"), states)
            .order_by(r.key))
        # the documents as text: decoded by ``results.json_value`` (rows.row_of), cheaper
        # than the driver's JSON loader on a batch's thousand rows
        def column(table: Any, name: str) -> Any:
            return cast(table[name], Text).label(name) if name in ("data", "status") else (
                table[name])

        self.resources_by_machine_keys = sql(
            select(*(column(r, n) for n in self.RESOURCE_COLUMNS),
                   *(column(o, n) for n in self.OBSERVATION_COLUMNS))
            .select_from(resources.outerjoin(observations, o.id == r.observation_id))
            .where(r.machine == bindparam("machine"), keys))
        # what an observation needs of its resource
        self.resource_ids_by_machine_keys = sql(
            select(r.id, r.machine, r.key).where(r.machine == bindparam("machine"), keys))
        self.snapshot_reads = frozenset((
            self.resource_by_key, self.resource_by_machine_key,
            self.resources_by_machine_keys, self.resource_ids_by_machine_keys))
        """The reads of a write's resources, which on PostgreSQL a write transaction sends
        outside itself (in autocommit) until it has written something: in READ COMMITTED a
        statement reads a snapshot of its own either way, and what is decided on them is
        written with a compare-and-swap, so a transaction that then writes nothing sends
        nothing more (:class:`lifecycle.store.Pipelined`)."""

    def keys_param(self, keys: list[str]) -> Any:
        """The ``keys`` parameter of :attr:`resources_by_machine_keys` and
        :attr:`resource_ids_by_machine_keys` (and ``states`` of
        :attr:`keys_and_data_by_states`)."""
        return keys if self.dialect.name == "postgresql" else json.dumps(keys)

    def _moving(self) -> None:
        """A resource created, moved, its data changed, a risky edge refused."""
        r, sql = resources.c, self._sql
        # compare-and-swap: the row is still the one the decision was taken on
        cas = (r.id == bindparam("id_"), r.version == bindparam("version_"),
               r.seq == bindparam("seq_"))
        rested = r.observation_id.is_not_distinct_from(bindparam("observation_id_"))
        moved: dict[str, Any] = {
            "state": bindparam("new_state"), "version": bindparam("new_version"),
            "seq": bindparam("new_seq"), "spec_version": bindparam("new_spec_version"),
            "updated_at": bindparam("now"), "last_transition_at": bindparam("now"),
        }
        self.move: dict[tuple[bool, bool], str] = {}
        for with_data in (False, True):
            for on_observation in (False, True):
                values = {**moved, "data": bindparam("new_data")} if with_data else moved
                where = (*cas, rested) if on_observation else cas
                self.move[with_data, on_observation] = sql(
                    update(resources).where(*where).values(**values), positional=True)
        # a change of data alone: a new version, not a transition
        self.change_data = sql(update(resources).where(*cas).values(
            data=bindparam("new_data"), version=bindparam("new_version"),
            seq=bindparam("new_seq"), updated_at=bindparam("now")), positional=True)
        # a refusal takes a journal sequence number, and changes nothing else
        self.refuse = sql(update(resources).where(*cas, rested).values(seq=bindparam("new_seq")),
                          positional=True)
        self.insert_resource = sql(
            insert(resources)
            .values(
                machine=bindparam("machine"), key=bindparam("key"),
                spec_version=bindparam("spec_version"), state=bindparam("state"),
                version=bindparam("version"), seq=bindparam("seq"), data=bindparam("data"),
                created_at=bindparam("now"), updated_at=bindparam("now"),
                last_transition_at=bindparam("now"),
            )
            .returning(r.id), positional=True
        )


# -- beside the hot path: SQLAlchemy Core on a connection of Store.read()/begin() ---------

OBSERVED = [observations.c[n].label(f"o_{n}")
            for n in ("id", "status", "observed_at", "recorded_at", "source")]
"""A resource's newest observation, beside its row: columns ``o_id``, ``o_status``, ..."""


def find(db: Connection, machine: str | None, key: str) -> Any:
    """The resource ``key`` (of ``machine``, or of whichever machine has it) with its newest
    observation (:data:`OBSERVED`); UnknownResource, or AmbiguousKey when several machines
    have the key and none was named."""
    query = select(resources, *OBSERVED).select_from(
        resources.outerjoin(observations, observations.c.id == resources.c.observation_id)
    ).where(resources.c.key == key)
    if machine is not None:
        query = query.where(resources.c.machine == machine)
    rows = db.execute(query).all()
    if not rows:
        raise UnknownResource(key, machine)
    if len(rows) > 1:
        raise AmbiguousKey(key, [r.machine for r in rows])
    return rows[0]


__all__ = ["OBSERVED", "ResourceStatements", "find"]
