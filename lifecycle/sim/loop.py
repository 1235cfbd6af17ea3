"""A discrete-event loop over a simulated clock, with a seeded random generator: the same
seed gives the same run, bit for bit."""

from __future__ import annotations

import datetime as dt
import heapq
import random
from collections.abc import Callable

from ..clock import SimulatedClock

Progress = Callable[[float, float], None]
"""Called as (simulated seconds done, simulated seconds in all)."""

_Event = tuple[float, int, Callable[[], None]]
"""(at, order, action): ordered by time, then by the order scheduled (unique, so the
actions are never compared); a plain tuple, which the heap compares in C."""


class EventLoop:
    """Events at simulated times, run in time order (ties in the order they were scheduled),
    the clock moved to each event's time before it runs."""

    def __init__(self, clock: SimulatedClock, seed: int) -> None:
        self.clock = clock
        self.rng = random.Random(seed)
        self.start = clock.now()
        self._events: list[_Event] = []
        self._order = 0
        self._seen: dt.datetime = self.start
        self._elapsed = 0.0

    @property
    def elapsed(self) -> float:
        """Simulated seconds since the loop started (worked out again only when the clock
        has moved: a run asks tens of thousands of times between two moves)."""
        now = self.clock.now()
        if now is not self._seen:
            self._seen, self._elapsed = now, (now - self.start).total_seconds()
        return self._elapsed

    def at(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` at ``seconds`` after the start."""
        self._order += 1
        heapq.heappush(self._events, (max(seconds, self.elapsed), self._order, action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        self.at(self.elapsed + max(delay, 0.0), action)

    def every(self, period: float, action: Callable[[], None], *, until: float,
              offset: float = 0.0) -> None:
        """Run ``action`` every ``period`` seconds from ``offset`` until ``until``."""
        def tick() -> None:
            action()
            if self.elapsed + period <= until:
                self.after(period, tick)

        self.at(offset, tick)

    def run(self, until: float, progress: Progress | None = None) -> None:
        """Run the events due up to ``until`` seconds after the start."""
        last_report = -1.0
        events = self._events
        while events and events[0][0] <= until:
            at, _, action = heapq.heappop(events)
            delta = at - self.elapsed
            if delta > 0:
                self.clock.advance(delta)
            action()
            if progress is not None and self.elapsed - last_report >= until / 200:
                last_report = self.elapsed
                progress(self.elapsed, until)
        if until > self.elapsed:
            self.clock.advance(until - self.elapsed)
        if progress is not None:
            progress(until, until)
