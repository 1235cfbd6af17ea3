"""What the engine hands back: resources, journal rows, observations, fire results, the
outbox's effects and timers; and how the database's values become them (the same for the
store's reads and for a read on the bare driver, :mod:`lifecycle.bare_read`)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The statuses of an effect's row (the outbox) and of a timer's: the one place they are named.
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
GAVE_UP = "gave_up"
"""An effect that failed for good whose ``on_failure`` transition asked for effects of its
own: the machine went another way, so, like a done one, it holds up nothing and is not
retried. (One whose ``on_failure`` asked for nothing, or was refused, is ``failed``: it holds
its resource's queue until retried.)"""
OPEN = (PENDING, RUNNING, FAILED)
"""The statuses of an effect that holds up the effects after it on its resource."""
FIRED, REFUSED, CANCELLED = "fired", "refused", "cancelled"


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def time_value(value: Any) -> dt.datetime:
    """A time as the database gives it (SQLite: text in UTC without a zone; PostgreSQL: an
    aware datetime) as an aware UTC datetime."""
    if type(value) is str:
        if len(value) == 26 and value[19] == ".":  # as SQLite keeps it (schema.sqlite_time)
            return dt.datetime.fromisoformat(value + "+00:00")
        value = dt.datetime.fromisoformat(value)
    assert isinstance(value, dt.datetime)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def optional_time(value: Any) -> dt.datetime | None:
    return None if value is None else time_value(value)


_decode = json.JSONDecoder().raw_decode


def json_value(value: Any) -> Any:
    """A JSON column as the database gives it (SQLite: text; PostgreSQL: decoded).

    SQLite's text is decoded without ``json.loads``' two whitespace scans (what lifecycle
    writes has none around it; text that has is decoded by ``json.loads``); the empty
    object, most resources' data, is not decoded at all."""
    if type(value) is not str:
        return value
    if value == "{}":
        return {}
    try:
        decoded, end = _decode(value)
    except ValueError:
        return json.loads(value)
    return decoded if end == len(value) else json.loads(value)


@dataclass(frozen=True, slots=True)
class Observation:
    """A status report about a resource from outside, with the time it was true at its
    source (``observed_at``) and the time it was recorded."""

    id: int
    status: dict[str, Any]
    observed_at: dt.datetime
    recorded_at: dt.datetime
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "observed_at": _iso(self.observed_at),
                "recorded_at": _iso(self.recorded_at), "source": self.source}


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource as it is in the database now."""

    machine: str
    key: str
    state: str
    version: int
    seq: int
    data: dict[str, Any]
    spec_version: str
    created_at: dt.datetime
    updated_at: dt.datetime
    observation: Observation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine, "key": self.key, "state": self.state,
            "version": self.version, "seq": self.seq, "data": self.data,
            "spec_version": self.spec_version, "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "observation": self.observation.to_json() if self.observation else None,
        }


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One row of a resource's history: a creation, a transition, or a refusal of a risky
    edge (which changes neither state nor version)."""

    seq: int
    kind: str
    trigger: str | None
    source: str | None
    dest: str
    version: int
    spec_version: str
    actor: str | None
    at: dt.datetime
    payload: dict[str, Any] | None
    guards: dict[str, bool] | None
    observation: Observation | None = None
    fence: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "kind": self.kind, "trigger": self.trigger, "source": self.source,
            "dest": self.dest, "version": self.version, "spec_version": self.spec_version,
            "actor": self.actor, "at": _iso(self.at), "payload": self.payload,
            "guards": self.guards,
            "observation": self.observation.to_json() if self.observation else None,
            "fence": self.fence,
        }


@dataclass(frozen=True, slots=True)
class FireResult:
    """What a fire (or a step) did. When ``fired`` is false, ``reason`` says why; ``error``
    names the refusal's kind (``StaleObservation``) when it was journaled as one.

    ``fence`` is set when the transition rested on an observation: that observation and what
    the world was expected to be, for effects that can act conditionally."""

    fired: bool
    machine: str
    key: str
    trigger: str
    source: str
    dest: str | None
    version: int
    reason: str | None = None
    guards: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    fence: dict[str, Any] | None = None
    probed: bool = False
    seq: int | None = None
    """The journal sequence number of the transition (or refusal) written."""
    effects: int = 0
    """How many effects the transition asked for (for a worker to carry out)."""

    def __bool__(self) -> bool:
        return self.fired

    def to_json(self) -> dict[str, Any]:
        return {
            "fired": self.fired, "machine": self.machine, "key": self.key,
            "trigger": self.trigger, "source": self.source, "dest": self.dest,
            "version": self.version, "reason": self.reason, "guards": self.guards,
            "error": self.error, "fence": self.fence, "probed": self.probed, "seq": self.seq,
            "effects": self.effects,
        }


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A resource whose journal does not replay to its current row."""

    machine: str
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.machine}:{self.key}: {self.problem}"


@dataclass(frozen=True, slots=True)
class EffectRecord:
    id: int
    machine: str
    key: str
    seq: int
    position: int
    name: str
    status: str
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None
    idempotency_key: str
    claimed_by: str | None = None
    """The worker that holds (or last held) the claim."""
    lease_until: dt.datetime | None = None
    """While the effect runs: when its claim ends unless its worker renews it."""

    COLUMNS = ("id", "seq", "position", "name", "status", "attempts", "next_attempt_at",
               "last_error", "idempotency_key", "claimed_by", "lease_until")
    """The columns of ``lifecycle_effects`` :meth:`from_row` reads, in its order."""

    @classmethod
    def from_row(cls, machine: str, key: str, row: Sequence[Any]) -> EffectRecord:
        (id_, seq, position, name, status, attempts, next_attempt_at, last_error,
         idempotency_key, claimed_by, lease_until) = row
        return cls(id_, machine, key, seq, position, name, status, attempts,
                   time_value(next_attempt_at), last_error, idempotency_key, claimed_by,
                   optional_time(lease_until))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "machine": self.machine, "key": self.key, "seq": self.seq,
                "position": self.position, "name": self.name, "status": self.status,
                "attempts": self.attempts, "next_attempt_at": self.next_attempt_at.isoformat(),
                "last_error": self.last_error, "idempotency_key": self.idempotency_key,
                "claimed_by": self.claimed_by,
                "lease_until": self.lease_until.isoformat() if self.lease_until else None}


@dataclass(frozen=True, slots=True)
class TimerRecord:
    id: int
    machine: str
    key: str
    seq: int
    state: str
    trigger: str
    due_at: dt.datetime
    status: str
    outcome: str | None

    COLUMNS = ("id", "seq", "state", "trigger", "due_at", "status", "outcome")
    """The columns of ``lifecycle_timers`` :meth:`from_row` reads, in its order."""

    @classmethod
    def from_row(cls, machine: str, key: str, row: Sequence[Any]) -> TimerRecord:
        id_, seq, state, trigger, due_at, status, outcome = row
        return cls(id_, machine, key, seq, state, trigger, time_value(due_at), status, outcome)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "machine": self.machine, "key": self.key, "seq": self.seq,
                "state": self.state, "trigger": self.trigger, "due_at": self.due_at.isoformat(),
                "status": self.status, "outcome": self.outcome}


SHOWN_COLUMNS = ("id", "machine", "key", "state", "version", "seq", "data", "spec_version",
                 "created_at", "updated_at")
"""The columns of ``lifecycle_resources`` a reader is shown (:func:`shown_resource`)."""
OBSERVATION_COLUMNS = ("id", "status", "observed_at", "recorded_at", "source")
"""The columns of ``lifecycle_observations`` read with a resource, after its own."""


def shown_resource(row: Sequence[Any]) -> Resource:
    """A row of :data:`SHOWN_COLUMNS` and then the newest observation's
    :data:`OBSERVATION_COLUMNS` (NULL without one) as a :class:`Resource`."""
    (_id, machine, key, state, version, seq, data, spec_version, created_at, updated_at,
     oid, status, observed_at, recorded_at, source) = row
    observation = None if oid is None else Observation(
        oid, json_value(status), time_value(observed_at), time_value(recorded_at), source)
    return Resource(machine, key, state, version, seq, json_value(data), spec_version,
                    time_value(created_at), time_value(updated_at), observation)
