"""One resource as ``lifecycle show`` prints it, read on the database's own driver: no
SQLAlchemy, no Alembic, no pydantic, no ``transitions`` (a command that only reads one
resource would otherwise spend most of its time importing them).

The database is opened for reading only (SQLite: ``mode=ro`` through the standard library's
``sqlite3``; PostgreSQL: psycopg, a read-only transaction) and everything is read in one
snapshot: the schema revision (it must be the code's head, :mod:`lifecycle.revisions`), the
resource with its newest observation, the spec its machine runs under now (as the database
stores it), and its timers and effects of the statuses asked for. Rows become records
through the same conversions as the store's reads (:mod:`lifecycle.results`).

Whatever this read cannot answer exactly as the store would (a URL it does not read itself,
a database it cannot open read-only, one at another revision or missing, a driver's error)
is :class:`Unsure`: the caller then opens the store, which answers or says what is wrong in
its own words. A key that is invalid, unknown or ambiguous is the store's own error.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import AmbiguousKey, UnknownResource
from .results import (
    OBSERVATION_COLUMNS,
    SHOWN_COLUMNS,
    EffectRecord,
    Resource,
    TimerRecord,
    json_value,
    shown_resource,
)
from .revisions import VERSION_TABLE, core_revision, head_revision
from .storable import asked_key
from .urls import resolve_url


class Unsure(Exception):
    """This read cannot answer as the store would: ask the store."""


@dataclass(frozen=True, slots=True)
class Peeked:
    """A resource and what ``lifecycle show`` prints beside it."""

    resource: Resource
    spec_version: str | None
    """The spec version its machine runs under now (None: the database has no such
    machine)."""
    spec: Mapping[str, Any] | None
    """That spec's JSON document, as the database stores it."""
    timers: list[TimerRecord]
    effects: list[EffectRecord]


def _names(prefix: str, columns: Sequence[str]) -> list[str]:
    return [f'{prefix}"{name}"' for name in columns]


_SHOWN = (
    f"SELECT {', '.join([*_names('r.', SHOWN_COLUMNS), *_names('o.', OBSERVATION_COLUMNS)])}"
    ' FROM "lifecycle_resources" AS r LEFT OUTER JOIN "lifecycle_observations" AS o'
    ' ON o."id" = r."observation_id" WHERE r."key" = :key')
_CURRENT_SPEC = (
    'SELECT m."spec_version", s."spec" FROM "lifecycle_machines" AS m JOIN "lifecycle_specs"'
    ' AS s ON s."machine" = m."name" AND s."version" = m."spec_version"'
    ' WHERE m."name" = :machine')


def _listed(table: str, columns: Sequence[str], statuses: Sequence[str], order: str) -> str:
    """A resource's rows of the outbox (``table``) of these statuses (constants of the
    statement), ``columns`` in order."""
    wanted = ", ".join(f"'{status}'" for status in statuses)
    return (f'SELECT {", ".join(_names("", columns))} FROM "{table}" WHERE "resource_id" = :id'
            f' AND "status" IN ({wanted}) ORDER BY {order}')


def peek(url: str | None, key: str, timer_statuses: Sequence[str],
         effect_statuses: Sequence[str]) -> Peeked:
    """Resource ``key`` (or ``MACHINE:KEY``) of the database at ``url`` (resolved as the
    store resolves it), its machine's current spec, and its timers and effects of these
    statuses (timers by due time, effects in the order they run)."""
    with _reading(resolve_url(url)) as run:
        found = run("SELECT version_num FROM " + VERSION_TABLE, {})
        if core_revision([row[0] for row in found]) != head_revision():  # (branches' rows aside)
            raise Unsure("the database is not at the code's schema revision")
        machine, plain = asked_key(key)  # (after the database: the store's order)
        if machine is None:
            rows = run(_SHOWN, {"key": plain})
        else:
            rows = run(_SHOWN + ' AND r."machine" = :machine', {"key": plain,
                                                               "machine": machine})
        if not rows:
            raise UnknownResource(plain, machine)
        if len(rows) > 1:
            raise AmbiguousKey(plain, [row[1] for row in rows])
        resource, rid = shown_resource(rows[0]), rows[0][0]
        current = run(_CURRENT_SPEC, {"machine": resource.machine})
        timers = run(_listed("lifecycle_timers", TimerRecord.COLUMNS, timer_statuses,
                             '"due_at", "id"'), {"id": rid})
        effects = run(_listed("lifecycle_effects", EffectRecord.COLUMNS, effect_statuses,
                              '"id"'), {"id": rid})
    at = resource.machine, resource.key
    return Peeked(
        resource, current[0][0] if current else None,
        json_value(current[0][1]) if current else None,
        [TimerRecord.from_row(*at, row) for row in timers],
        [EffectRecord.from_row(*at, row) for row in effects])


Run = Any
"""``run(statement, params) -> rows``: a statement with ``:name`` parameters, run in the
read's one transaction."""


@contextmanager
def _reading(url: str) -> Iterator[Run]:
    if url.startswith("sqlite:///"):
        with _sqlite(url.removeprefix("sqlite:///")) as run:
            yield run
    elif url.startswith("postgresql+psycopg://"):
        with _postgresql("postgresql://" + url.removeprefix("postgresql+psycopg://")) as run:
            yield run
    else:
        raise Unsure(f"not a URL read here: {url.split(':', 1)[0]}")


@contextmanager
def _sqlite(path: str) -> Iterator[Run]:
    if path in ("", ":memory:") or any(c in path for c in "%?#"):
        raise Unsure("an in-memory database, URL parameters or escapes")  # (as the store)
    try:  # (the path needs no escaping in a URI: it holds none of %?#)
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise Unsure(str(exc)) from None
    try:
        def run(statement: str, params: Mapping[str, Any]) -> list[Any]:
            return connection.execute(statement, params).fetchall()

        run("BEGIN", {})  # one snapshot for every statement
        yield run
    except sqlite3.Error as exc:
        raise Unsure(str(exc)) from None
    finally:
        connection.close()


@contextmanager
def _postgresql(conninfo: str) -> Iterator[Run]:
    import psycopg

    try:
        connection = psycopg.connect(conninfo)
    except psycopg.Error as exc:
        raise Unsure(str(exc)) from None
    try:
        connection.read_only = True
        connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

        def run(statement: str, params: Mapping[str, Any]) -> list[Any]:
            with connection.cursor() as cursor:
                cursor.execute(re.sub(r":([a-z_]+)", r"%(\1)s", statement), params)
                return cursor.fetchall()

        yield run
    except psycopg.Error as exc:
        raise Unsure(str(exc)) from None
    finally:
        connection.close()
