"""Recording observations: status reports about a resource from outside, one
(:meth:`Observing.observe`) or a batch's (:meth:`Observing.record_observations`)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import storable
from ..errors import InvalidData, LifecycleError, UnknownResource
from ..logs import logger
from ..results import Observation
from ..store import Transaction
from ..store.transaction import JsonText, json_text
from .checks import NAME_MAX, in_range, key_document
from .machines import MachineRegistry
from .rows import locate

log = logger("lifecycle.engine")
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_VERBATIM = re.compile(r'[ !#-\[\]-~]*').fullmatch
"""Text that is its own JSON string's body: printable ASCII without a quote or backslash."""


def _text(name: str) -> str:
    """A key or machine name as JSON text (most are quoted as they are: no encoder call)."""
    return f'"{name}"' if _VERBATIM(name) else _ENCODE(name)

Target = tuple[int | None, str, str]
"""The resource an observation is for: (id, machine, key); on PostgreSQL the id may be None,
the write then finding it by (machine, key)."""
Checked = tuple[dict[str, Any], dt.datetime, dt.datetime]
"""An observation as it is to be recorded: status, observed at, recorded at."""


class Observing(MachineRegistry):
    """Observations, written in their own transactions (no decision is made on them here:
    guards read the newest when a write decides)."""

    def observe(
        self,
        key: str,
        status: Mapping[str, Any],
        observed_at: dt.datetime | None = None,
        *,
        source: str = "api",
    ) -> Observation:
        """Record a status report about ``key`` from outside. ``observed_at`` is when it was
        true at its source (default: now). Guards see the newest observation by
        ``observed_at``; an older one arriving late is kept in history but replaces nothing.
        A time ahead of the engine's clock is taken as now."""
        checked = self.checked_observation(key, status, observed_at, source)
        with self.store.write() as tx:
            recorded = self.record_observations(tx, [(self.target(tx, key), *checked)],
                                                source)
        [observation] = recorded()
        if isinstance(observation, LifecycleError):
            raise observation
        return observation

    def checked_observation(self, key: str, status: Mapping[str, Any],
                            observed_at: dt.datetime | None, source: str) -> Checked:
        """An observation as it is to be recorded, or :class:`InvalidData`: a batch of one."""
        checked = self.checked_observations([(key, status)], observed_at, source)[0]
        if isinstance(checked, LifecycleError):
            raise checked
        return checked

    def checked_observations(self, statuses: list[tuple[str, Mapping[str, Any]]],
                             observed_at: dt.datetime | None, source: str
                             ) -> list[Checked | LifecycleError]:
        """:meth:`checked_observation` of a batch (``(key, status)`` pairs) given at one
        ``observed_at``: the source and the time are checked once for all of them, the clock
        read once (they are recorded in one statement), each key and status on its own. Each
        in order: as it is to be recorded, or the :class:`InvalidData` that refuses it."""
        recorded_at = self.clock.now()
        problem = storable.text_problem(source, NAME_MAX)
        refusal = None if problem is None else f"source {problem}"
        if refusal is not None or observed_at is None:
            observed_at = recorded_at
        elif observed_at.tzinfo is None or not in_range(observed_at):
            refusal = (f"observed_at {observed_at} has no time zone"
                       if observed_at.tzinfo is None else
                       f"observed_at {observed_at} is not a time in UTC's years 1-9999")
        elif observed_at > recorded_at:
            log.warning("%d observation(s) (%s first) from %s ahead of the clock (%s); "
                        "taken as now", len(statuses), statuses[0][0] if statuses else "-",
                        observed_at.isoformat(), recorded_at.isoformat())
            observed_at = recorded_at
        out: list[Checked | LifecycleError] = []
        for key, status in statuses:
            try:
                document = key_document(key, status, "status")
            except LifecycleError as exc:
                out.append(exc)
                continue
            out.append(InvalidData("?", key, refusal) if refusal is not None else
                       (document, observed_at, recorded_at))
        return out

    def target(self, tx: Transaction, key: str) -> Target:
        """The resource an observation of ``key`` is for: on PostgreSQL a ``MACHINE:KEY``
        as it is (its write finds it: no round trip to read it first), else read here."""
        machine, plain = storable.split_key(key)
        if machine is not None and tx.dialect == "postgresql":
            return None, machine, plain
        row = locate(self.store, tx, key)
        return row.id, row.machine, row.key

    def record_observations(self, tx: Transaction,
                            items: list[tuple[Target, dict[str, Any], dt.datetime, dt.datetime]],
                            source: str) -> Callable[[], list[Observation | LifecycleError]]:
        """Write observations (of a resource, :meth:`target`: status, observed at, recorded
        at), each the newest of its resource if it is; all of them in one statement on
        PostgreSQL, which finds the resources by key (:func:`observed_rows`), two on SQLite
        (:meth:`Transaction.observed`). A status that JSON cannot hold is refused alone,
        before anything is written; a resource not found (gone since) is
        :class:`UnknownResource`. What gives the outcomes once the transaction committed (an
        observation's id may come with the commit)."""
        store = self.store
        refused: dict[int, LifecycleError] = {}
        written: list[tuple[Target, Any, dt.datetime, dt.datetime]] = []
        documents: list[dict[str, Any]] = []
        for n, (target, document, observed_at, recorded_at) in enumerate(items):
            try:
                # plain text on both databases (SQLite's parameter; a part of PostgreSQL's
                # one document): a batch's tuples of it are then left alone by the garbage
                # collector, which keeps scanning a str subclass such as JsonText
                status = json_text(document)
            except (TypeError, ValueError) as exc:
                refused[n] = InvalidData(target[1], target[2], f"status is not JSON: {exc}")
                continue
            documents.append(document)
            written.append((target, status, observed_at, recorded_at))
        if not written:
            ids: Callable[[], Sequence[int | None]] = list
        elif tx.dialect == "postgresql":
            ids = observed_rows(tx, written, source)
        else:
            ids = tx.observed([
                {"resource_id": resource_id, "status": status,
                 "observed_at": store.time_param(observed_at),
                 "recorded_at": store.time_param(recorded_at)}
                for (resource_id, _, _), status, observed_at, recorded_at in written], source)

        def outcomes() -> list[Observation | LifecycleError]:
            # each Observation made once its id is known (not made, then copied with it)
            made: list[Observation | LifecycleError] = [
                UnknownResource(key, machine) if oid is None else
                Observation(oid, document, observed_at, recorded_at, source)
                for oid, document, ((_, machine, key), _, observed_at, recorded_at)
                in zip(ids(), documents, written, strict=True)]
            if not refused:
                return made
            given = iter(made)
            return [refused[n] if n in refused else next(given) for n in range(len(items))]
        return outcomes


def observed_rows(tx: Transaction, written: list[tuple[Target, Any, dt.datetime, dt.datetime]],
                  source: str) -> Callable[[], list[int | None]]:
    """PostgreSQL's write of observations (``WriteStatements.observed``): one statement,
    its rows one JSON document (each status's text as it was encoded, the times in ISO
    form with their offset), each resource found by (machine, key). What gives each
    observation's id, None for a resource not found, once the transaction committed."""
    # a batch's observations share their times (the same objects) and mostly their machine:
    # each is made text once
    observed = recorded = named = None
    observed_text = recorded_text = machine_text = ""
    parts = []
    for (_, machine, key), status, observed_at, recorded_at in written:
        if observed_at is not observed:
            observed, observed_text = observed_at, observed_at.isoformat()
        if recorded_at is not recorded:
            recorded, recorded_text = recorded_at, recorded_at.isoformat()
        if machine != named:
            named, machine_text = machine, _text(machine)
        parts.append(f'[{machine_text},{_text(key)},{status},"{observed_text}",'
                     f'"{recorded_text}"]')
    assert tx.sql is not None
    cursor = tx.execute(tx.sql.observed, {"rows": JsonText("[" + ",".join(parts) + "]"),
                                          "source": source})

    def ids() -> list[int | None]:
        found = dict(cursor.fetchall())
        return [found.get(n) for n in range(1, len(written) + 1)]
    return ids
