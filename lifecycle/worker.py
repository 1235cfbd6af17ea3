"""The worker's thread driver: :class:`Worker` runs the worker core's handlers on threads.

What a worker decides and records (claims, leases and their heartbeat, outcomes, retries,
timers, give-backs) is :class:`~lifecycle.worker_core.WorkerCore`, once for both drivers;
this driver answers what the core's :meth:`~lifecycle.worker_core.WorkerCore.working` asks:
a handler started on a thread of a small pool (kept for the next effects, leaving after a
while idle), a wait on an event that a finished handler or a stop sets, a pause while the
database is down. The asyncio driver is :class:`~lifecycle.aio.AsyncWorker`; the two share
one outbox.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from .engine import Engine
from .freshness import run_to_end
from .logs import logger
from .worker_core import (
    BATCH,
    DEFAULT_LEASE,
    TIMER_LOOK,
    Abandon,
    HeldClaims,
    Pause,
    Run,
    Wait,
    WorkerCore,
    WorkerStats,
    Working,
)

log = logger(__name__)

IDLE_THREAD_SECONDS = 5.0


class Worker:
    """Claims due effects and timers and carries them out, ``concurrency`` handlers at once
    (threads). The other arguments are :class:`~lifecycle.worker_core.WorkerCore`'s: the
    worker holds at most ``batch`` effects, running or waiting for a free thread (by
    default 10, and up to 100 while its handlers are short: what they start in 50 ms); a
    thread runs the effects handed to it one after another, each only on a claim still
    held; a claim
    holds for ``lease`` seconds and is renewed every ``heartbeat`` seconds while held;
    ``name`` must be unique among the workers of a database (the default is); ``seed`` makes
    the backoff jitter reproducible. The core is :attr:`core`: its steps (claim, record,
    give back) are what a caller that runs a handler itself uses."""

    def __init__(self, engine: Engine, *, concurrency: int = 1, lease: float = DEFAULT_LEASE,
                 poll: float = 0.5, name: str | None = None, seed: int | None = None,
                 batch: int | None = None, heartbeat: float | None = None) -> None:
        self._woken = threading.Event()
        self.core = WorkerCore(engine, concurrency=concurrency, lease=lease, poll=poll,
                               name=name, seed=seed, batch=batch, heartbeat=heartbeat,
                               wake=self._woken.set, timed=True, runs=True,
                               lazy_heartbeat=True)
        core = self.core
        self.engine, self.store, self.name = engine, core.store, core.name
        self.concurrency, self.lease, self.heartbeat = concurrency, core.lease, core.heartbeat
        self.poll, self.batch, self.rng, self.claimant = poll, core.batch, core.rng, core.claimant
        self._idle: list[_Hand] = []  # threads waiting for a run, the latest idle last
        self._lock = threading.Lock()
        self._sigterms = 0

    @property
    def stats(self) -> WorkerStats:
        return self.core.stats

    # -- public ----------------------------------------------------------------------

    def run_until_idle(self) -> WorkerStats:
        """Carry out every effect and timer due now (by the engine's clock), including those
        their completion makes due, then return, with the worker's handler threads (and
        their connections) gone. The stats are the worker's, cumulative."""
        try:
            return self._drive(self.core.working(until_idle=True))
        finally:
            self._dismiss()

    def run(self, *, handle_signals: bool = False) -> WorkerStats:
        """Work until :meth:`stop` (or, with ``handle_signals``, SIGTERM: graceful, finishing
        the running handlers; a second SIGTERM or SIGQUIT: fast, abandoning them within a
        second, for another worker to claim)."""
        if handle_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGQUIT, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        log.info("worker %s: started (concurrency %d, lease %g s, heartbeat %g s)",
                 self.name, self.concurrency, self.lease, self.heartbeat)
        try:
            stats = self._drive(self.core.working())
        finally:
            self._dismiss()
        log.info("worker %s: stopped (%s)", self.name, stats.to_json())
        return stats

    def stop(self, *, fast: bool = False) -> None:
        """Stop :meth:`run`: graceful (the running handlers finish and are recorded) or
        ``fast`` (their claims are given back at once; their threads run on unrecorded)."""
        self.core.stop(fast=fast)

    def held_elsewhere(self) -> list[HeldClaims]:
        """Effects this worker could serve that other workers hold now (see
        :meth:`WorkerCore.held_elsewhere`)."""
        return self.core.held_elsewhere()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self._sigterms += 1
        fast = signum == signal.SIGQUIT or self._sigterms > 1
        log.warning("worker %s: %s, %s shutdown", self.name, signal.Signals(signum).name,
                    "fast" if fast else "graceful")
        self.stop(fast=fast)

    # -- answering the core ------------------------------------------------------------

    def _drive(self, working: Working) -> WorkerStats:
        """Answer what the core asks until it returns its stats."""
        while True:
            self._woken.clear()  # a handler ending after this wakes the next wait
            try:
                need = next(working)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
            if isinstance(need, Run):
                self._launch(need)
            elif isinstance(need, Wait):
                self._woken.wait(need.seconds)
            elif isinstance(need, Pause):
                self._pause(need.seconds)
            elif isinstance(need, Abandon):
                pass  # a thread cannot be stopped: it runs on, and its outcome is dropped

    def _pause(self, seconds: float) -> None:
        """Wait out a database outage (or until a stop)."""
        end = time.monotonic() + seconds
        while not self.core.stopping and (left := end - time.monotonic()) > 0:
            self._woken.wait(left)
            self._woken.clear()

    def _launch(self, run: Run) -> None:
        """Hand the run to a handler thread (the one idle the shortest time, or a new one)."""
        with self._lock:
            hand = self._idle.pop() if self._idle else None
        if hand is None:
            hand = _Hand(self._serve, f"lifecycle-effects-{self.name}")
        hand.inbox.put(run)

    def _dismiss(self) -> None:
        """Let the idle handler threads go, and wait until they have (each gives its
        database connection back as it ends): once :meth:`run_until_idle` or :meth:`run`
        returns, the worker holds no thread and no connection but those of handlers still
        running after a fast stop or a lapsed claim."""
        with self._lock:
            idle, self._idle = self._idle, []
        for hand in idle:
            hand.inbox.put(None)
        for hand in idle:
            hand.thread.join()

    def _serve(self, hand: _Hand) -> None:
        """A handler thread's life: it carries out the runs handed to it, one after another,
        and is kept for the next (starting one per effect cost a fifth of an effect's time);
        it leaves when dismissed, after IDLE_THREAD_SECONDS idle, or when its handler's
        outcome is no longer wanted."""
        while (run := self._next(hand)) is not None and self._carry_out(run, hand):
            pass

    def _next(self, hand: _Hand) -> Run | None:
        """The next run handed to this thread; None when it is to leave."""
        while True:
            try:
                return hand.inbox.get(timeout=IDLE_THREAD_SECONDS)
            except queue.Empty:
                with self._lock:
                    if hand in self._idle:  # else a run is on its way to it
                        self._idle.remove(hand)
                        return None

    def _carry_out(self, run: Run, hand: _Hand) -> bool:
        """Run the run's handlers in turn, each only on a claim still held, and then wait
        idle; False when this thread is to leave instead (its handler ran out of time and
        was replaced, or was abandoned)."""
        core, handlers = self.core, self.engine.handlers
        last = run.calls[-1]
        for call in run.calls:
            if not core.starting(call, run.slot):  # its claim may have lapsed, or a stop
                continue
            try:
                # a coroutine handler runs to its end in this thread
                outcome: tuple[str, Any] = ("ok", run_to_end(handlers[call.name].handler(call)))
            except BaseException as exc:  # the handler's failure is recorded, not raised
                outcome = ("error", exc)
            if call is last:
                with self._lock:  # idle before the driver, woken, launches the next
                    if not core.handler_ended(call, *outcome):
                        return False
                    self._idle.append(hand)
                return True
            if not core.handler_ended(call, *outcome, wake=False):
                return False
        with self._lock:  # the last was not started
            self._idle.append(hand)
        return True


class _Hand:
    """A handler thread, with its own inbox: a run to carry out, or None to leave."""

    __slots__ = ("inbox", "thread")

    def __init__(self, serve: Callable[[_Hand], None], name: str) -> None:
        self.inbox: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=serve, args=(self,), name=name, daemon=True)
        self.thread.start()


__all__ = ["BATCH", "DEFAULT_LEASE", "IDLE_THREAD_SECONDS", "TIMER_LOOK", "HeldClaims", "Worker",
           "WorkerStats"]
