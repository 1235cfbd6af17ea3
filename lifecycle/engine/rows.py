"""Reading resources inside a write: one by key (:func:`locate`), a batch's
(:func:`read_rows`), each as the :class:`Row` the decision and the write use (a batch's
made one at a time, :func:`row_of`, as its turn comes)."""

from __future__ import annotations

from typing import Any

from .. import storable
from ..errors import AmbiguousKey, LifecycleError, UnknownResource
from ..results import Observation, json_value, time_value
from ..store import Store, Transaction
from .outcomes import Row


def locate(store: Store, tx: Transaction, key: str) -> Row:
    """The resource ``key`` (``MACHINE:KEY`` or a plain key) read in ``tx``."""
    return row_of(store, located(store, tx, key))


def located(store: Store, tx: Transaction, key: str) -> Any:
    """:func:`locate`'s row as the database gave it."""
    machine, plain = storable.split_key(key)
    if machine is not None:
        tx.execute(store.sql.resource_by_machine_key, {"machine": machine, "key": plain})
    else:
        tx.execute(store.sql.resource_by_key, {"key": plain})
    rows = tx.fetchall()
    if not rows:
        raise UnknownResource(plain, machine)
    if len(rows) > 1:
        raise AmbiguousKey(plain, [row[1] for row in rows])
    return rows[0]


def row_of(store: Store, fetched: Any) -> Row:
    """A row of ``Statements.resource_by_key`` (and its kin) as the hot path uses it."""
    (rid, rmachine, rkey, state, version, seq, data, _spec_version, last_transition_at,
     created_at, oid, status, observed_at, recorded_at, source) = fetched
    observation = None if oid is None else Observation(
        oid, json_value(status), time_value(observed_at), time_value(recorded_at), source)
    return Row(rid, rmachine, rkey, state, version, seq, json_value(data),
               time_value(last_transition_at), created_at, observation)


def read_rows(store: Store, tx: Transaction, keys: list[str], *,
              whole: bool = True) -> dict[str, Any]:
    """The resources of ``keys`` read in the transaction of ``tx``, or why not (a
    ``LifecycleError``): one statement per machine named (``MACHINE:KEY``), one per plain
    key. Each row as the database gave it, for :func:`row_of` to make a :class:`Row` of
    when its turn comes (a batch's rows are plain tuples until then, which the garbage
    collector stops tracking: a thousand :class:`Row` s held through a batch were scanned
    again and again); with ``whole=False`` only ``(id, machine, key)``."""
    found: dict[str, Any] = {}
    by_machine: dict[str, dict[str, str]] = {}
    for key in dict.fromkeys(keys):
        machine, plain = storable.split_key(key)
        if machine is not None:
            by_machine.setdefault(machine, {})[plain] = key
            continue
        try:
            fetched = located(store, tx, key)
            found[key] = fetched if whole else tuple(fetched[:3])
        except LifecycleError as exc:
            found[key] = exc
    sql = store.sql
    statement = sql.resources_by_machine_keys if whole else sql.resource_ids_by_machine_keys
    for machine, named in by_machine.items():
        tx.execute(statement, {"machine": machine, "keys": sql.keys_param(list(named))})
        for fetched in tx.fetchall():
            found[named[fetched[2]]] = fetched if whole else tuple(fetched[:3])
        for plain, key in named.items():
            if key not in found:
                found[key] = UnknownResource(plain, machine)
    return found
