"""What one attempt of a write comes back as, besides a result: go again (:class:`Again`),
not sure yet (:class:`Unsure`, PostgreSQL's answer still on its way), a journaled refusal
(:class:`Stale`); and the records the attempt passes between its layers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..freshness import ProbeRequest
from ..results import FireResult, Observation
from ..spec import EffectSpec
from ..store import Pending
from .checks import shown

OnStale = Literal["raise", "return"]
"""What a fire does with a journaled refusal of a risky edge: raise it, or return it."""
MAX_PROBES = 3
STALE_TIMER = "the timer is no longer pending"


@dataclass(slots=True)
class Row:
    """The resource as a write read it."""

    id: int
    machine: str
    key: str
    state: str
    version: int
    seq: int
    data: dict[str, Any]
    last_transition_at: dt.datetime
    created_at: Any
    """As the database gave it (read by ``update`` alone; converting it costs every fire)."""
    observation: Observation | None


@dataclass(frozen=True, slots=True)
class Again:
    """Why an attempt was rolled back and is made again: load ``machine`` first, ask
    ``probe`` first, or (neither) the resource moved underneath."""

    machine: str | None = None
    probe: tuple[str, ProbeRequest] | None = None


MOVED = Again()


@dataclass(slots=True)
class Unsure:
    """An outcome whose write was sent on PostgreSQL and not yet answered: ``value`` once
    the answer says its compare-and-swap held, else ``moved`` (nothing was written)."""

    pending: Pending
    value: Any
    moved: Any = MOVED

    def settled(self) -> Any:
        return self.value if self.pending.id() is not None else self.moved


def unsure_or(written: Any, value: Any) -> Any:
    """``value``, or an :class:`Unsure` of it while the write's answer is on its way."""
    return Unsure(written, value) if type(written) is Pending else value


@dataclass(frozen=True, slots=True)
class Stale:
    """A refusal of a risky edge, journaled: raised as :class:`StaleObservation` or returned,
    as the caller asked."""

    result: FireResult
    dest: str
    probe_error: str | None


@dataclass(slots=True)
class Tries:
    """What the retry loop learnt from the probes it asked."""

    probes: int = 0
    probed_version: int | None = None
    probe_error: str | None = None

    @property
    def may_probe(self) -> bool:
        return self.probe_error is None and self.probes < MAX_PROBES

    def asking(self, request: ProbeRequest) -> bool:
        """Whether to ask the probe for ``request``: not when its last answer did not make
        the resource fresh and nothing moved since (then the edge is refused)."""
        if request.version == self.probed_version:
            self.probe_error = "the probe's answer was not fresh either"
            return False
        self.probes += 1
        self.probed_version = request.version
        return True


UNTRIED = Tries()
"""The tries of a resource no probe was asked for (read, never changed: a batch makes a
:class:`Tries` of its own only for a resource it asks a probe for)."""


@dataclass(slots=True)
class Entry:
    """What crossing into a state asks for, in the transition's transaction."""

    row: Row
    seq: int
    data: Mapping[str, Any]
    fence: dict[str, Any] | None
    now: dt.datetime
    effects: tuple[EffectSpec, ...] = ()
    exited: list[str] = field(default_factory=list)
    entered: list[str] = field(default_factory=list)


def not_fired(row: Row, trigger: str, reason: str | None,
              guards: dict[str, bool] | None = None, *, error: str | None = None,
              probed: bool = False) -> FireResult:
    """A refusal's result. ``guards`` becomes the result's own (a decision's verdicts, made
    for it: not copied)."""
    return FireResult(False, row.machine, row.key, shown(trigger), row.state, None,
                      row.version, reason, {} if guards is None else guards, error, None,
                      probed)
