"""Recording observations: status reports about a resource from outside, one
(:meth:`Observing.observe`) or a batch's (:meth:`Observing.record_observations`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .. import storable
from ..errors import InvalidData, LifecycleError
from ..logs import logger
from ..results import Observation
from ..store import Transaction
from .checks import NAME_MAX, in_range, key_document
from .machines import MachineRegistry
from .rows import locate

log = logger("lifecycle.engine")

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
            row = locate(self.store, tx, key)
            recorded = self.record_observations(
                tx, [((row.id, row.machine, row.key), *checked)], source)
        [observation] = recorded()
        if isinstance(observation, LifecycleError):
            raise observation
        return observation

    def checked_observation(self, key: str, status: Mapping[str, Any],
                            observed_at: dt.datetime | None, source: str) -> Checked:
        """An observation as it is to be recorded, or :class:`InvalidData`."""
        document = key_document(key, status, "status")
        problem = storable.text_problem(source, NAME_MAX)
        if problem is not None:
            raise InvalidData("?", key, f"source {problem}")
        recorded_at = self.clock.now()
        if observed_at is None:
            observed_at = recorded_at
        elif observed_at.tzinfo is None or not in_range(observed_at):
            raise InvalidData("?", key, f"observed_at {observed_at} has no time zone"
                              if observed_at.tzinfo is None else
                              f"observed_at {observed_at} is not a time in UTC's years 1-9999")
        elif observed_at > recorded_at:
            log.warning("%s: observation from %s is ahead of the clock (%s); taken as now",
                        key, observed_at.isoformat(), recorded_at.isoformat())
            observed_at = recorded_at
        return document, observed_at, recorded_at

    def record_observations(
            self, tx: Transaction,
            items: list[tuple[tuple[int, str, str], dict[str, Any], dt.datetime, dt.datetime]],
            source: str) -> Callable[[], list[Observation | LifecycleError]]:
        """Write observations (of a resource (id, machine, key): status, observed at,
        recorded at), each the newest of its resource if it is; all of them in a statement
        or two (:meth:`Transaction.observed`). A status that JSON cannot hold is refused
        alone, before anything is written. What gives the outcomes once the transaction
        committed (an observation's id may come with the commit)."""
        store = self.store
        out: list[Observation | LifecycleError] = []
        rows: list[dict[str, Any]] = []
        for (resource_id, machine, key), document, observed_at, recorded_at in items:
            try:
                status = store.json_param(document)
            except (TypeError, ValueError) as exc:
                out.append(InvalidData(machine, key, f"status is not JSON: {exc}"))
                continue
            out.append(Observation(id=0, status=document, observed_at=observed_at,
                                   recorded_at=recorded_at, source=source))
            rows.append({"resource_id": resource_id, "status": status,
                         "observed_at": store.time_param(observed_at),
                         "recorded_at": store.time_param(recorded_at)})
        ids = tx.observed(rows, source) if rows else list

        def outcomes() -> list[Observation | LifecycleError]:
            given = iter(ids())
            return [replace(o, id=next(given)) if isinstance(o, Observation) else o
                    for o in out]
        return outcomes
