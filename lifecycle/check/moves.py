"""The moves of an exploration, in the words of a scenario file.

Every move is something ``lifecycle replay`` can do too (``create``, ``advance``,
``observe``, ``world``, ``update``, ``fire``, ``step``, ``run_effect``, ``begin_effect``,
``finish_effect``, ``fire_timers``, ``retry``, ``crash_effect``), so a path the
checker found is written as a scenario step for step. A world model declares its actions as
moves (a :class:`Note` changes only the model's own values, which no scenario needs: a status
cache taking a new status is seen when a heartbeat reports it).
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _at(start: dt.datetime, seconds: float) -> str:
    return (start + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Move(ABC):
    """One step of the machine or of its world."""

    @abstractmethod
    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        """The scenario file's steps that do this move."""

    @abstractmethod
    def text(self) -> str:
        """The move in a timeline."""


@dataclass(frozen=True)
class Create(Move):
    key: str
    state: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        args: dict[str, Any] = {"key": self.key}
        if self.state is not None:
            args["state"] = self.state
        if self.data:
            args["data"] = dict(self.data)
        return [{"create": args}]

    def text(self) -> str:
        return f"create {self.key}" + (f" in {self.state}" if self.state else "")


@dataclass(frozen=True)
class Advance(Move):
    seconds: float

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"advance": self.seconds}]

    def text(self) -> str:
        return f"{self.seconds:g} s pass"


@dataclass(frozen=True)
class Observe(Move):
    """A status report reaches the controller: true at ``at`` (seconds from the start; None:
    now)."""

    key: str
    status: Mapping[str, Any]
    at: float | None = None
    source: str = "scenario"

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        args: dict[str, Any] = {"key": self.key, "status": dict(self.status)}
        if self.at is not None:
            args["at"] = _at(start, self.at)
        if self.source != "scenario":
            args["source"] = self.source
        return [{"observe": args}]

    def text(self) -> str:
        return f"{self.key} is reported {_status(self.status)}"


@dataclass(frozen=True)
class SetWorld(Move):
    """The world changes: what ``key``'s probe and effect handlers see from now on."""

    key: str
    status: Mapping[str, Any]

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"world": {"key": self.key, "status": dict(self.status)}}]

    def text(self) -> str:
        return f"the world says {self.key} is {_status(self.status)}"


@dataclass(frozen=True)
class Update(Move):
    key: str
    data: Mapping[str, Any]

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"update": {"key": self.key, "data": dict(self.data)}}]

    def text(self) -> str:
        return f"{self.key}'s data: {_status(self.data)}"


@dataclass(frozen=True)
class Fire(Move):
    key: str
    trigger: str
    payload: Mapping[str, Any] = field(default_factory=dict)

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        args: dict[str, Any] = {"key": self.key, "trigger": self.trigger}
        if self.payload:
            args["payload"] = dict(self.payload)
        return [{"fire": args}]

    def text(self) -> str:
        return f"fire {self.trigger} on {self.key}"


@dataclass(frozen=True)
class Step(Move):
    """The engine takes ``key``'s eventless edges (asking its probe when a risky edge
    wants a fresh observation)."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"step": self.key}]

    def text(self) -> str:
        return f"step {self.key}"


@dataclass(frozen=True)
class RunEffect(Move):
    """The worker runs ``key``'s queue head, due now, and records its outcome (its
    follow-up's transition, or the failure's retry or giving up): one effect, nothing
    else, so that the world may move between any two effects."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"run_effect": self.key}]

    def text(self) -> str:
        return f"the worker runs {self.key}'s effect"


@dataclass(frozen=True)
class Begin(Move):
    """The worker starts ``key``'s queue head, due now, among others it runs at once
    (``Model.overlap``): its handler runs, and what it starts (a command) is in flight, and
    what it holds in the world (a slot of a pool) held, until the run finishes. The scenario
    step ``begin_effect``."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"begin_effect": self.key}]

    def text(self) -> str:
        return f"the worker starts {self.key}'s effect"


@dataclass(frozen=True)
class Finish(Move):
    """``key``'s begun run ends: what its handler started is over, what it held is let go,
    and the worker records its outcome (as :class:`RunEffect` records it). The scenario
    step ``finish_effect``."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"finish_effect": self.key}]

    def text(self) -> str:
        return f"{self.key}'s effect ends; the worker records it"


@dataclass(frozen=True)
class FireTimers(Move):
    """``key``'s due timers fire, soonest first, as the worker fires them."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"fire_timers": self.key}]

    def text(self) -> str:
        return f"{self.key}'s due timers fire"


@dataclass(frozen=True)
class Retry(Move):
    """An operator's ``lifecycle retry KEY``: its effects that failed for good go back in
    the queue, due now, with fresh attempts."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"retry": self.key}]

    def text(self) -> str:
        return f"lifecycle retry {self.key}"


@dataclass(frozen=True)
class Crash(Move):
    """A fault: the worker runs ``key``'s queue head and dies before it records the outcome
    (the handler's I/O happened; the effect runs again later)."""

    key: str

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return [{"crash_effect": self.key}]

    def text(self) -> str:
        return f"the worker dies after running {self.key}'s effect, unrecorded"


@dataclass(frozen=True)
class Note(Move):
    """The world model's own values change (``values``: name -> new value); nothing the
    machine sees, so no scenario step."""

    values: tuple[tuple[str, Any], ...]
    said: str = ""

    def scenario(self, start: dt.datetime) -> list[dict[str, Any]]:
        return []

    def text(self) -> str:
        return self.said or ", ".join(f"{k} = {v}" for k, v in self.values)


@dataclass(frozen=True)
class Action:
    """A world action: what it is called in a timeline, and its moves, in order.

    ``fair``: whether the world is bound to take it once it stays enabled (weak fairness:
    the heartbeat keeps reporting, an operator retries what failed for good). A string
    names the action across states whose labels differ (``"heartbeat d1"``); True names it
    by its label. An action that is not fair (the default) may never be taken: the
    liveness check looks for runs on which the world does nothing of it again."""

    label: str
    moves: tuple[Move, ...]
    fair: bool | str = False

    @property
    def fairness(self) -> str | None:
        """The name weak fairness knows it by, or None when it is not fair."""
        if self.fair is True:
            return self.label
        return self.fair or None


def _status(value: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
