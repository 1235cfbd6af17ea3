"""Reading resources, their journals and observations, as records (the statements are the
store's: :mod:`lifecycle.store.statements`)."""

from __future__ import annotations

from typing import Any

from . import storable
from .errors import AmbiguousKey, InvalidInput, UnknownResource
from .graph import SEPARATOR
from .results import JournalEntry, Observation, Resource, shown_resource
from .storable import LONGEST_KEY, split_key
from .store import Store
from .store.statements import journal as journal_rows
from .store.statements import resources as resource_rows


def _observation(row: Any, prefix: str = "o_") -> Observation | None:
    if getattr(row, f"{prefix}id") is None:
        return None
    return Observation(getattr(row, f"{prefix}id"), getattr(row, f"{prefix}status"),
                       getattr(row, f"{prefix}observed_at"),
                       getattr(row, f"{prefix}recorded_at"), getattr(row, f"{prefix}source"))


def _resource(r: Any) -> Resource:
    return Resource(r.machine, r.key, r.state, r.version, r.seq, r.data, r.spec_version,
                    r.created_at, r.updated_at, _observation(r))


def get(store: Store, key: str) -> Resource:
    """The resource with its newest observation, read on the raw path (``Store.reading``)."""
    machine, plain = storable.asked_key(key)
    sql = store.sql
    with store.reading() as tx:
        if machine is not None:
            tx.execute(sql.shown_by_machine_key, {"machine": machine, "key": plain})
        else:
            tx.execute(sql.shown_by_key, {"key": plain})
        rows = tx.fetchall()
    if not rows:
        raise UnknownResource(plain, machine)
    if len(rows) > 1:
        raise AmbiguousKey(plain, [row[1] for row in rows])
    return shown_resource(rows[0])


def resource_id(db: Any, key: str) -> tuple[int, Resource]:
    """The resource's row id (for joins), read in the same query as the resource, on a
    connection of ``Store.read()``/``Store.begin()``."""
    machine, plain = storable.asked_key(key)
    row = resource_rows.find(db, machine, plain)
    return int(row.id), _resource(row)


def history(store: Store, key: str) -> list[JournalEntry]:
    with store.read() as db:
        rid, _ = resource_id(db, key)
        rows = journal_rows.history(db, rid)
    return [JournalEntry(r.seq, r.kind, r.trigger, r.source, r.dest, r.version, r.spec_version,
                         r.actor, r.at, r.payload, r.guards, _observation(r), r.fence)
            for r in rows]


def observations_of(store: Store, key: str) -> list[Observation]:
    """Every observation of the resource, in the order they were recorded."""
    with store.read() as db:
        rid, _ = resource_id(db, key)
        rows = journal_rows.observations_of(db, rid)
    return [Observation(r.id, r.status, r.observed_at, r.recorded_at, r.source) for r in rows]


def position(after: str, machine: str | None) -> tuple[str, str]:
    """The (machine, key) a page starts after: ``MACHINE:KEY``, or a plain key of
    ``machine``. It need not name a resource that exists (one deleted since is fine)."""
    problem = storable.text_problem(after, LONGEST_KEY)
    if problem is not None:
        raise InvalidInput(f"invalid position {after!r}: it {problem}")
    owner, key = split_key(after)
    if owner is None:
        if machine is None:
            raise InvalidInput(f"invalid position {after!r}: without a machine, a page "
                                 "starts after MACHINE:KEY")
        owner = machine
    return owner, key


def page(store: Store, machine: str | None, state: str | None, limit: int,
         after: tuple[str, str] | None) -> list[Resource]:
    """At most ``limit`` resources in (machine, key) order, after the position ``after``:
    one statement that walks the (machine, key) index, however many resources there are."""
    params: dict[str, Any] = {"limit": limit}
    if machine is not None:
        params["machine"] = machine
    if state is not None:  # a composite state takes in the states inside it
        escaped = state.replace("/", "//").replace("%", "/%").replace("_", "/_")
        params["state"], params["state_prefix"] = state, f"{escaped}{SEPARATOR}%"
    if after is not None and machine is not None:  # the position within the machine
        if after[0] > machine:
            return []
        after = after if after[0] == machine else None
    if after is not None:
        params["after_machine"], params["after_key"] = after
    statement = store.sql.page(machine is not None, state is not None, after is not None)
    with store.reading() as tx:
        tx.execute(statement, params, **store.planned_each_time)
        rows = tx.fetchall()
    return [shown_resource(row) for row in rows]


FOLD_AFTER = 1000
"""Count rows beyond one per machine and state that a reading of the counts folds."""


def counts(store: Store, machine: str | None) -> dict[str, dict[str, int]]:
    """How many resources each machine has in each state, added up from the rows the
    database's triggers append (``lifecycle_state_counts``); when those have grown by
    :data:`FOLD_AFTER`, they are folded into one row per machine and state."""
    with store.reading() as tx:
        tx.execute(store.sql.counts[machine is not None],
                       {"machine": machine} if machine is not None else {})
        rows = tx.fetchall()
    if sum(row[3] for row in rows) > len(rows) + FOLD_AFTER:
        fold_counts(store)
    out: dict[str, dict[str, int]] = {}
    for name, state, count, _rows in sorted(rows):
        if count:
            out.setdefault(name, {})[state] = int(count)
    return out


def fold_counts(store: Store) -> None:
    """Fold the count rows into one per machine and state (the sums do not change)."""
    with store.write() as tx:
        params: dict[str, Any] = {}
        if store.dialect == "sqlite":
            tx.execute(store.sql.LAST_COUNT_ROW)
            params["upto"] = tx.fetchone()[0] or 0
        for statement in store.sql.FOLD_COUNTS[store.dialect]:
            tx.execute(statement, params)
