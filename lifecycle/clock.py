"""Where time comes from. Nothing else in lifecycle reads the wall clock."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Protocol

UTC = dt.UTC


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The wall clock."""

    __slots__ = ()

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)


class SimulatedClock:
    """A clock that moves only when told to: for tests, scenarios and simulations."""

    __slots__ = ("_lock", "_now")

    def __init__(self, start: dt.datetime | str = "2026-01-01T00:00:00Z") -> None:
        if isinstance(start, str):
            start = dt.datetime.fromisoformat(start)
        if start.tzinfo is None:
            raise ValueError("a simulated clock needs a timezone-aware start time")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float) -> dt.datetime:
        if seconds < 0:
            raise ValueError(f"time does not go backwards (advance by {seconds} s)")
        with self._lock:
            self._now += dt.timedelta(seconds=seconds)
            return self._now

    def set(self, when: dt.datetime) -> None:
        if when < self._now:
            raise ValueError(f"time does not go backwards ({when} is before {self._now})")
        with self._lock:
            self._now = when.astimezone(UTC)
