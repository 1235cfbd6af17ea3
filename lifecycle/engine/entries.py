"""The rows a write adds besides the resource's: its journal row, the outbox rows of the
effects it asks for, the timers of the states it enters, and a risky edge's fence. Each is
made in one place, from values the write converted once (``at``: its time as a statement
parameter)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ..compiled import CompiledMachine
from ..effects import PENDING
from ..errors import InvalidData
from ..graph import EVENTLESS
from ..results import Observation
from ..spec import Edge
from ..store import Store
from .outcomes import Entry

LONGEST_TIMEOUT = 10 * 365 * 86400.0  # ten years, as spec.Seconds allows


def journal_row(store: Store, seq: int, kind: str, *, source: str | None, dest: str,
                version: int, spec_version: str, actor: str | None, at: Any,
                trigger: str | None = None, payload: Mapping[str, Any] | None = None,
                guards: Mapping[str, bool] | None = None, observation_id: int | None = None,
                fence: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The journal row of a write (without its resource's id, which the write fills in):
    the one place it is made."""
    json = store.json_param
    return {
        "seq": seq, "kind": kind,
        "trigger": None if trigger is None or trigger == EVENTLESS else trigger,
        "source": source, "dest": dest, "version": version, "spec_version": spec_version,
        "actor": actor, "at": at,
        "payload": json(payload) if payload else None,
        "guards": json(guards) if guards else None,
        "observation_id": observation_id,
        "fence": json(fence) if fence else None,
    }


def entered(store: Store, compiled: CompiledMachine, entry: Entry,
            when: Any) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """What crossing state boundaries asks for: the rows of the transition's effects, then
    those of the states entered (outermost first); the states exited whose timers are
    cancelled; the rows of the timers set. ``when`` is ``entry.now`` as a parameter."""
    effects = (*entry.effects, *(effect for state in entry.entered
                                 for effect in compiled.entry_effects.get(state, ())))
    row = entry.row
    fence = store.json_param(entry.fence) if entry.fence else None
    rows = [{  # the outbox: one row per effect (its head set by the write)
        "seq": entry.seq, "position": position, "name": effect.name,
        "args": store.json_param(effect.args), "status": PENDING, "attempts": 0,
        "next_attempt_at": when,
        "idempotency_key": f"{row.machine}:{row.key}:{entry.seq}:{position}:{effect.name}",
        "fence": fence, "on_failure": effect.on_failure, "created_at": when, "head": None,
    } for position, effect in enumerate(effects)]
    if not compiled.timeouts:
        return rows, [], []
    return (rows, [state for state in entry.exited if state in compiled.timeouts],
            timer_rows(store, compiled, entry, when))


def timer_rows(store: Store, compiled: CompiledMachine, entry: Entry,
               when: Any) -> list[dict[str, Any]]:
    """The timers of the states entered, as rows."""
    row, timers = entry.row, []
    for state in entry.entered:
        timeout = compiled.timeouts.get(state)
        if timeout is None:
            continue
        after = timeout.after
        if isinstance(after, str):
            value = entry.data.get(after)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 <= value <= LONGEST_TIMEOUT):
                raise InvalidData(row.machine, row.key, f"the timeout of {state!r} reads "
                                  f"data field {after!r}, which is {value!r}, not a "
                                  f"number of seconds from 0 to {LONGEST_TIMEOUT:g}")
            after = float(value)
        timers.append({
            "seq": entry.seq, "state": state, "trigger": timeout.trigger,
            "due_at": store.time_param(entry.now + dt.timedelta(seconds=after)),
            "status": PENDING, "created_at": when,
        })
    return timers


def fence_for(edge: Edge, observation: Observation | None) -> dict[str, Any]:
    """The fence a risky edge's transition records: the observation it rested on and
    what its effects may expect of the world (the edge's ``fence``, else the status)."""
    assert observation is not None
    return {
        "observation_id": observation.id,
        "observed_at": observation.observed_at.isoformat(),
        "source": observation.source,
        "status": observation.status,
        "expect": dict(edge.fence) if edge.fence is not None else dict(observation.status),
    }
