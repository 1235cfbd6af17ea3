"""What the engine hands back: resources, journal rows, observations, fire results."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


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
