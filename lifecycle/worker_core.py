"""The worker's core: everything a worker decides and records, once, for both of its drivers.

:class:`WorkerCore` claims the outbox's due effects and the due timers, holds and renews the
claims' leases, records the handlers' outcomes (rescheduling, failing, firing ``on_failure``
and follow-ups), gives claims back and takes over those of the dead. It runs no handler and
never sleeps: :meth:`WorkerCore.working` is a generator that yields what it needs its driver
to do (:class:`Start` a handler, :class:`Wait` for one to finish, :class:`Pause` while the
database is down, :class:`Abandon` running handlers on a fast stop), as
:meth:`Engine.firing` yields the probe calls it needs. The drivers answer: :class:`Worker`
(lifecycle.worker) with threads, :class:`AsyncWorker` (lifecycle.aio) with tasks on an event
loop. A driver hands each handler's outcome back with :meth:`WorkerCore.handler_ended`.

Effects of one resource run strictly in order; effects of different resources run
concurrently. A claim has a lease, which the core renews on a heartbeat thread of its own for
as long as it holds the claim (started with the first claim, or, ``lazy_heartbeat``, once a
claim has been held for a heartbeat): a claim lives exactly as long as its worker. A handler is
started only on a claim the worker can still vouch for: by its own monotonic clock, the
lease has not run out since the last renewal the database confirmed (a worker paused past
its lease starts nothing it may have lost). The claims of a worker that died are taken over
when their lease runs out, or sooner by a worker on the same host, which can see that the
claimant's process is gone (it looks at most every ``DEAD_LOOK`` seconds, first when it
starts). A lost database connection costs nothing but time: finished
outcomes are kept and recorded once the database is back, and the worker backs off and goes
on. A failing effect is rescheduled with exponential backoff and jitter, never waited for
with a sleep; after its last attempt it fires the ``on_failure`` trigger its transition
declared, or marks its resource stuck until ``retry``.

Timers are the timeouts of states: the worker fires a timer's trigger when it is due, in one
transaction with marking it fired, and only while the resource is still in the visit of the
state that set it (leaving the state cancelled it).

The core stands above the engine and uses only its public calls: an effect's outcome is
recorded in the transaction of the trigger it fires through ``Engine.fire_many(within=...)``.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from . import redact
from .effects import DONE, FAILED, GAVE_UP, PENDING, Effect, EffectCall
from .engine import Engine, Fire
from .errors import (
    ConcurrencyError,
    DatabaseError,
    EffectError,
    LifecycleError,
    LostClaim,
    PermanentError,
    RetryableError,
    UnknownResource,
)
from .logs import logger
from .processes import host_prefix, is_gone, this_process
from .results import FireResult
from .store import Moved, Transaction
from .store.statements import effects as effect_rows
from .within import Within

log = logger(__name__)

TIMER_LOOK = 0.5
"""Seconds between looks for due timers while effects keep the worker busy."""
DEAD_LOOK = 1.0
"""Seconds between looks for claims of workers on this host that died (a worker's first
look is on its first idle round): a look reads every claimant of the outbox, and making it
on every ``run_until_idle`` cost more than the call's claims."""
DEFAULT_LEASE = 30.0
"""Seconds a claim holds without a heartbeat: how long the claims of a worker that died on
another host wait before another worker takes them over."""
BATCH = 10
"""Effects a worker holds at most by default (as pgqueuer's default batch): each claim and
each record of outcomes is a transaction, and a no-op effect cost 1.2 ms of worker CPU in
batches of 4, 0.6 ms in batches of 10 (benchmarks, section queues)."""
MOST_HELD = 100
"""Effects a worker holds at most by default when its handlers are short (see ``HOLD_FOR``):
a no-op effect cost 270 µs of worker CPU in claims of 10, 60 µs in claims of 100, most of it
the transaction that records a batch and claims the next (benchmarks, section queues)."""
HOLD_FOR = 0.05
"""Seconds of handler time a worker claims ahead, by default: as many effects as its handlers
(by their recent average) start in that time, at least ``batch``, at most ``MOST_HELD``; so
short handlers are claimed and recorded many to a transaction, and long ones are not held
back from other workers."""
RECORD_WITHIN = 0.01
"""Seconds a finished outcome waits, at most, for others to be recorded with it in one
transaction (while the worker has handlers to start; it never waits when it would idle)."""
OUTAGE_BACKOFF = (0.1, 5.0)
"""First and longest wait, in seconds, before trying a database that failed again."""


@dataclass(frozen=True, slots=True)
class HeldClaims:
    """Effects another worker holds: how many, by whom, and until when (renewed while that
    worker lives)."""

    claimed_by: str
    effects: int
    lease_until: dt.datetime


@dataclass(slots=True)
class WorkerStats:
    done: int = 0
    retried: int = 0
    failed: int = 0
    timers_fired: int = 0
    timers_refused: int = 0
    timers_stale: int = 0

    def to_json(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Start:
    """Run ``call``'s handler now, and hand its outcome to :meth:`WorkerCore.handler_ended`."""

    call: EffectCall


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until a handler ends, a stop, or ``seconds`` (the driver's ``wake`` ends it)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Pause:
    """The database failed: wait ``seconds`` (or until a stop) before the core tries again."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Abandon:
    """A fast stop: cancel these running handlers if the driver can (their claims are given
    back once this is answered, their attempts returned)."""

    calls: tuple[EffectCall, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """Run these handlers one after another on one of the driver's handler slots (a core
    made with ``runs=True`` asks for this instead of :class:`Start`): before each, ask
    :meth:`WorkerCore.starting` whether it may start (skip it if not), and hand its outcome
    to :meth:`WorkerCore.handler_ended`. One hand-off for many short handlers, instead of
    one per handler."""

    calls: tuple[EffectCall, ...]
    slot: int


Need = Start | Run | Wait | Pause | Abandon
Working = Generator[Need, None, WorkerStats]


def _nothing() -> None:
    return None


def _never() -> bool:
    return False


def _checked(concurrency: int, lease: float, heartbeat: float | None, poll: float) -> float:
    """The heartbeat (default: a third of the lease), once the arguments make sense."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    heartbeat = lease / 3 if heartbeat is None else heartbeat
    for label, value in (("lease", lease), ("heartbeat", heartbeat), ("poll", poll)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a positive number of seconds, not {value}")
    if heartbeat * 2 > lease:
        raise ValueError(f"a lease of {lease:g} s must span at least two heartbeats "
                         f"(every {heartbeat:g} s): a claim would expire while its "
                         "worker lives")
    return heartbeat


class WorkerCore:
    """What a worker decides and records (see the module). ``concurrency`` handlers run at
    once; the core holds at most ``batch`` effects, running or waiting for a free slot
    (default: ``BATCH``, or four per handler if more, and more while its handlers are short:
    what they start in ``HOLD_FOR`` seconds, up to ``MOST_HELD`` or four per handler): when
    fewer wait than slots are free, it claims what that leaves room for, in the transaction
    that records the outcomes of the handlers that finished since (see :meth:`record`). A
    claim holds for ``lease`` seconds of the engine's clock and is renewed every
    ``heartbeat`` seconds (default: a third of the lease) while the worker holds it, however
    long its handler runs. ``name`` must be unique among the workers of a database (the
    default is). ``seed`` makes the backoff jitter reproducible.

    The driver passes ``wake`` (called, from any thread, when a handler ended or a stop was
    asked: it ends a :class:`Wait`), ``abandoned`` (whether what runs the handlers is gone
    for good: then the heartbeat gives every claim back instead of renewing it) and ``timed``
    (whether the core times handlers out by its clock; a driver that times them itself says
    False). With ``runs`` the driver takes :class:`Run` (several handlers for one slot, each
    started only once :meth:`starting` allows it) instead of one :class:`Start` per handler:
    the free slots share the effects waiting, and a handler that runs out of time gives the
    rest of its run back to the queue. With ``lazy_heartbeat`` the heartbeat thread starts
    only once a claim has been held for a heartbeat, not with every claim: for a driver that
    comes back to the core (answers a :class:`Wait`, or asks for the next need) at least that
    often while it holds claims, as :class:`~lifecycle.worker.Worker` does (its handlers run
    on threads of their own, and a :class:`Wait` ends when the heartbeat is due); a call that
    finishes its claims sooner starts no thread."""

    _driver: int | None = None
    """The thread that drives :meth:`working`: a handler it runs itself (the simulations'
    inline worker, an asyncio handler on the loop's thread) saves its progress on that
    thread's own connection, outside any transaction of the core's."""

    def __init__(self, engine: Engine, *, concurrency: int = 1, lease: float = DEFAULT_LEASE,
                 poll: float = 0.5, name: str | None = None, seed: int | None = None,
                 batch: int | None = None, heartbeat: float | None = None,
                 wake: Callable[[], None] = _nothing, abandoned: Callable[[], bool] = _never,
                 timed: bool = True, runs: bool = False, lazy_heartbeat: bool = False) -> None:
        heartbeat = _checked(concurrency, lease, heartbeat, poll)
        self.engine = engine
        self.store = engine.store
        self.concurrency = concurrency
        self.lease = lease
        self.heartbeat = heartbeat
        self.poll = poll
        self.batch = batch or max(BATCH, 4 * concurrency)
        self._most = batch or max(MOST_HELD, 4 * concurrency)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:04x}"
        self.rng = random.Random(seed)
        self.stats = WorkerStats()
        self.claimant = this_process()
        self.monotonic: Callable[[], float] = getattr(engine.clock, "monotonic",
                                                      time.monotonic)
        """The worker's own clock for leases and waits: the engine clock's monotonic source
        if it has one, else the process's (never the wall clock, which may jump)."""
        self._wake, self._abandoned, self._timed, self._runs = wake, abandoned, timed, runs
        self._lazy = lazy_heartbeat
        self._stop = threading.Event()
        self._fast = threading.Event()
        self._slots_kept()
        self._starting: list[Need] = []
        self._written_off: set[tuple[int, int]] = set()
        """(effect, attempt) of handlers that ran out of time or were abandoned: their late
        outcomes are not recorded."""
        self._queue: deque[EffectCall] = deque()
        self._timers_seen = 0.0
        self._claim_compiled: tuple[str, dict[str, Any]] | None = None
        self._results: dict[int, tuple[str, Any]] = {}
        self._lock = threading.Lock()
        self._claims: set[int] = set()
        """Ids of the effects this worker holds (claimed, running, or finished and not yet
        recorded), under ``_lock``: what the heartbeat renews."""
        self._confirmed: dict[int, float] = {}
        """When (monotonic seconds) the database last confirmed each claim: the claim's
        transaction or a renewal began then, so its lease runs at least ``lease`` seconds
        from it."""
        self._lost: set[int] = set()
        """Claims a renewal found taken over by another worker (under ``_lock``)."""
        self._beating = False
        self._heart = threading.Event()
        """Wakes the heartbeat early: on a fast stop, and when the last claim was let go."""
        self._heartbeat_thread: threading.Thread | None = None
        self._unrecorded: deque[tuple[EffectCall, str, Any]] = deque()
        """Finished outcomes not recorded yet (the database failed): kept until it is back."""
        self._finished_at = 0.0
        """When (monotonic) the oldest outcome in ``_unrecorded`` finished."""
        self._dead_seen = -math.inf
        self._settled = False
        """Whether the last round found nothing more to do: its claim found nothing (after
        recording what had finished, in the same transaction), nor its look for timers, nor
        its look for the dead, and it gave nothing back."""
        self._outage = 0.0

    def _slots_kept(self) -> None:
        """What the core keeps of the handlers handed to its driver, and of their pace."""
        self._running: dict[int, tuple[EffectCall, float]] = {}
        """Effects handed to the driver (their handlers run, or wait in their :class:`Run`),
        with when each runs out of time (monotonic; never, while it waits in its run)."""
        self._slot: dict[int, int] = {}
        """The slot (the hand-off) of each effect in ``_running``, under ``_lock``."""
        self._slot_left: dict[int, int] = {}
        """How many effects of each busy slot are in ``_running`` (under ``_lock``): as many
        slots are busy as it has keys."""
        self._unstarted: set[int] = set()
        """Effects of ``_running`` waiting in their run, not started yet (under ``_lock``)."""
        self._slots = 0
        self._pace = self.concurrency * HOLD_FOR / self.batch
        """The handlers' recent average time, seconds (a moving average; at first what makes
        the worker hold ``batch``)."""
        self._began: dict[int, float] = {}
        """When (monotonic) each running handler started (under ``_lock``)."""

    # -- the driver's side ---------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, *, fast: bool = False) -> None:
        """Stop working: graceful (the running handlers finish and are recorded) or ``fast``
        (they are abandoned, their claims given back)."""
        if fast:
            self._fast.set()
            self._heart.set()
        self._stop.set()
        self._wake()

    def handler_ended(self, call: EffectCall, kind: str, value: Any, *,
                      wake: bool = True) -> bool:
        """A driver's handler for ``call`` ended: ``kind`` "ok" with its answer, or "error"
        with what it raised (from any thread). False when its outcome is not wanted (it ran
        out of time or was abandoned: another attempt may hold the effect by now). Not
        ``wake``: a handler of a :class:`Run` that is not its last wakes the driver only if
        no other outcome waits for it already."""
        with self._lock:
            if (call.id, call.attempt) in self._written_off:
                self._written_off.discard((call.id, call.attempt))
                return False
            wake = wake or not self._results
            self._results[call.id] = (kind, value)
            began = self._began.pop(call.id, None)
            if began is not None:
                self._pace += (self.monotonic() - began - self._pace) / 4
        if wake:
            self._wake()
        return True

    def starting(self, call: EffectCall, slot: int) -> bool:
        """A driver is about to start ``call``'s handler, the next of its :class:`Run`
        ``slot`` (from its thread): whether it may. Only on a claim still held (see
        :meth:`still_held`), while the worker does not stop, and if the call is still the
        run's (a handler before it ran out of time: the rest of the run went back to the
        queue). A call refused for its claim or a stop is given back by the core."""
        with self._lock:
            if call.id not in self._unstarted or self._slot.get(call.id) != slot:
                return False  # taken back from the run, or abandoned
            self._unstarted.discard(call.id)
            if not self._stop.is_set() and self._held_now(call.id):
                timeout = self.engine.handlers[call.name].timeout
                now = self._began[call.id] = self.monotonic()
                self._running[call.id] = (call, now + timeout
                                          if self._timed and timeout else math.inf)
                return True
            self._results[call.id] = ("unstarted", None)
        self._wake()
        return False

    def heartbeat_alive(self) -> bool:
        """Whether the heartbeat thread runs (renewing the claims held)."""
        thread = self._heartbeat_thread
        return thread is not None and thread.is_alive()

    def held(self) -> set[int]:
        """The ids of the effects this worker holds now."""
        with self._lock:
            return set(self._claims)

    def held_elsewhere(self) -> list[HeldClaims]:
        """Effects this worker could serve that other workers hold now, by worker: what
        ``run_until_idle`` leaves to them (they are renewed while their worker lives, and
        taken over when it dies)."""
        now = self.engine.clock.now()
        with self.store.read() as db:
            rows = effect_rows.held_elsewhere(db, self.name, self.engine.handlers, now)
        return [HeldClaims(str(by), int(count), self.store.time_value(until))
                for by, count, until in rows]

    def working(self, *, until_idle: bool = False) -> Working:
        """The worker's loop, as what it needs done: until :meth:`stop` (or, ``until_idle``,
        until every effect and timer due now is carried out, including those their
        completion makes due), then winding down: the claims never started given back, the
        running handlers finished (or, on a fast stop, abandoned and given back), the
        heartbeat stopped. Returns the stats, cumulative."""
        self._driver = threading.get_ident()
        while not self._stop.is_set():
            busy = yield from self._guarded(self._cycle)
            starting, self._starting = self._starting, []
            yield from starting
            if busy is None:  # the database failed: backed off, try again
                continue
            if until_idle and not (self._running or self._queue or self._unrecorded):
                # nothing held: idle once a round found nothing (its timers due now fired
                # and its claim, after them, found nothing); else a round more
                if self._settled:
                    break
            elif not busy:
                yield from self._waiting(self.poll)
        return (yield from self._winding_down())

    def _winding_down(self) -> Working:
        self.give_back(list(self._queue))  # claimed, never started: another worker's now
        self._queue.clear()
        if not self._fast.is_set() and (self._running or self._unrecorded):
            log.info("worker %s: finishing %d running handlers", self.name, len(self._running))
            while (self._running or self._unrecorded) and not self._fast.is_set():
                yield from self._guarded(self.reap)
                if self._running:
                    yield from self._waiting(self.poll)
        if self._fast.is_set():
            with self._lock:
                running = tuple(call for call, _ in self._running.values())
                self._written_off.update((c.id, c.attempt) for c in running
                                         if c.id not in self._unstarted)
                self._unstarted.clear()  # (never started now)
            if running:
                yield Abandon(running)
            yield from self._guarded(self.reap)  # what finished is recorded
            self._drop_running()
            self.give_back(list(running))  # stopped on purpose: their attempts returned
        self.heartbeat_stopped()
        return self.stats

    def _waiting(self, limit: float) -> Generator[Need, None, None]:
        """A :class:`Wait` until a handler finishes, the nearest handler deadline, the time
        to record the outcomes waiting, a stop, or ``limit`` seconds (none if one of those
        has come already)."""
        with self._lock:
            if self._results or (self._stop.is_set() and not self._running):
                return
        yield Wait(self._waking(limit))

    def _waking(self, limit: float) -> float:
        self._heartbeat_if_due()
        deadlines = [d for _, d in self._running.values()]
        with self._lock:
            if self._lazy and not self._beating and self._confirmed:
                deadlines.append(min(self._confirmed.values()) + self.heartbeat)
        if self._unrecorded:
            deadlines.append(self._finished_at + RECORD_WITHIN)
        if deadlines:
            limit = min(limit, max(min(deadlines) - self.monotonic(), 0.0) + 0.001)
        return limit

    def _guarded(self, work: Callable[[], Any]) -> Generator[Need, None, Any]:
        """``work()``, or None when the database failed: then the worker pauses (backing
        off while the failures go on) and the caller tries again; it never dies of it."""
        try:
            result = work()
        except DatabaseError as exc:
            first, longest = OUTAGE_BACKOFF
            self._outage = min(longest, max(first, self._outage * 2))
            log.warning("worker %s: %s; trying again in %.1f s", self.name, exc, self._outage)
            self._heartbeat_if_due(ahead=True)  # the claims held are renewed meanwhile
            yield Pause(self._outage)
            return None
        if self._outage:
            log.info("worker %s: the database answers again", self.name)
            self._outage = 0.0
            yield from self._guarded(self._give_back_orphans)
        return result

    def _give_back_orphans(self) -> None:
        """Give back claims this worker took in a transaction whose commit it never heard
        of (the connection broke after the database committed): their handlers never ran."""
        with self._lock:
            held = sorted(self._claims)
        given = self._unclaim(except_ids=held)
        if given:
            log.info("worker %s: gave back %d effects claimed as the connection broke",
                     self.name, given)

    def _cycle(self) -> bool:
        """One round: note what finished; when the queue holds fewer effects than the free
        handler slots, record the finished outcomes and claim what the batch has room for,
        in one transaction (else record them once ``batch`` wait, the oldest has waited
        ``RECORD_WITHIN`` seconds, or nothing else is held); fire the due timers (when the
        claim found nothing, or half a second after the last look: a timeout is measured in
        seconds, and looking on every round cost as much as running an effect); pick what
        the concurrency allows to start (``_starting``), each only on a claim still held.
        Whether anything happened."""
        self._heartbeat_if_due()
        busy = self._collect() > 0
        self._forget_lost()
        found_none = self._settled = False
        free = self.concurrency - len(self._slot_left)
        if len(self._queue) < free and not self._stop.is_set():
            recorded, claimed = self.record(
                claim=max(free, self.holding() - len(self._running)) - len(self._queue))
            self._queue.extend(claimed)
            busy, found_none = bool(recorded or claimed) or busy, not claimed
        elif self._unrecorded and (
                len(self._unrecorded) >= self.holding() or not (self._running or self._queue)
                or self.monotonic() - self._finished_at >= RECORD_WITHIN):
            busy = self.record()[0] > 0 or busy
        fired = taken = 0
        if found_none or self.monotonic() - self._timers_seen >= TIMER_LOOK:
            fired = self._fire_due_timers()
        if found_none and self.monotonic() - self._dead_seen >= DEAD_LOOK:
            taken = self._take_over_the_dead()
        busy = busy or fired > 0 or taken > 0
        lapsed: list[EffectCall] = []
        while self._queue and len(self._slot_left) < self.concurrency and not self._stop.is_set():
            # with runs, the slots free share what waits; else one each
            size = (-(-len(self._queue) // (self.concurrency - len(self._slot_left)))
                    if self._runs else 1)
            calls: list[EffectCall] = []
            while self._queue and len(calls) < size:
                call = self._queue.popleft()
                (calls if self.still_held(call.id) else lapsed).append(call)
            self._start(calls)
            busy = True
        if lapsed:
            self._drop_lapsed(lapsed)
        # what a timer fired, a dead worker left or a lapse gave back is claimed next round
        self._settled = found_none and not (fired or taken or lapsed)
        return busy

    def _forget_lost(self) -> None:
        """Take the claims a renewal found taken over out of the queue: their effects are
        another worker's, and their places are free for new claims."""
        with self._lock:
            lost = set(self._lost)
        if not lost or not self._queue:
            return
        gone = [call.id for call in self._queue if call.id in lost]
        if gone:
            self._queue = deque(call for call in self._queue if call.id not in lost)
            self.let_go(gone)
            log.warning("worker %s: %d claimed effects were not started: a renewal found "
                        "their claims taken over by another worker (was this process "
                        "paused?)", self.name, len(gone))

    # -- claiming --------------------------------------------------------------------

    def claim(self, limit: int, batch: list[_Plain]) -> list[EffectCall]:
        """Write ``batch`` (outcomes that fire nothing) and claim up to ``limit`` effects,
        in one transaction (on PostgreSQL one round trip: every answer is read after the
        COMMIT)."""
        # at most a batch; no handlers: nothing this worker can do
        limit = min(limit, self.holding()) if self.engine.handlers else 0
        if limit <= 0 and not batch:
            return []
        now = self.engine.clock.now()
        store = self.store
        claim, claim_params = self._claim_sql()
        lease_until = store.time_param(now + dt.timedelta(seconds=self.lease))
        asked = self.monotonic()
        taken: Callable[[], list[Any]] = list
        with store.write() as tx:
            lost = self._write_batch(tx, batch, now)
            if limit > 0:
                taken = _answer(tx, tx.execute(claim, {
                    **claim_params, "now": store.time_param(now), "limit": limit,
                    "claimed_by": self.name, "claimant": self.claimant,
                    "lease_until": lease_until}))
        self._batch_recorded(batch, lost())
        rows = sorted(taken(), key=lambda row: row[0])
        if not rows:
            return []
        self._hold({row[0] for row in rows}, asked)
        value = store.json_value
        return [EffectCall(id_, name, machine, key, dict(value(args)), idempotency_key,
                           value(fence) if fence is not None else None, attempts, seq, trigger,
                           dict(value(payload) or {}), dict(value(data)),
                           dict(value(progress) or {}), now, saver=self.save_progress)
                for (id_, name, args, idempotency_key, fence, attempts, seq, progress, machine,
                     key, data, trigger, payload) in rows]

    def holding(self) -> int:
        """How many effects the worker holds at most now: what its handlers start in
        ``HOLD_FOR`` seconds at their recent pace, at least ``batch``, at most the most."""
        ahead = self.concurrency * HOLD_FOR / max(self._pace, 1e-6)
        return max(self.batch, min(self._most, int(ahead)))

    def _claim_sql(self) -> tuple[str, dict[str, Any]]:
        """The claim's statement, compiled once per worker (the names of its handlers are
        part of it)."""
        if self._claim_compiled is None:
            self._claim_compiled = effect_rows.claim(self.store.sql.dialect,
                                                     sorted(self.engine.handlers))
        return self._claim_compiled

    # -- keeping claims alive, and taking over those of the dead ------------------------

    def _hold(self, ids: set[int], asked: float) -> None:
        """Note claims taken in a transaction begun at ``asked`` (monotonic), and make sure
        the heartbeat renews them."""
        with self._lock:
            self._claims |= ids
            self._lost -= ids
            self._confirmed.update(dict.fromkeys(ids, asked))
            if self._beating or self._lazy:
                return
            self._beating = True
        self._start_heartbeat(self.heartbeat)

    def _heartbeat_if_due(self, *, ahead: bool = False) -> None:
        """With ``lazy_heartbeat``: start the heartbeat, renewing at once, when a claim has
        gone a heartbeat without a confirmation (a claim is started on only while its lease
        has a heartbeat left, so this is in time for every one); ``ahead``: start it now,
        renewing when that comes (the core is about to pause, and would not see it)."""
        with self._lock:
            if not self._lazy or self._beating or not self._confirmed:
                return
            left = min(self._confirmed.values()) + self.heartbeat - self.monotonic()
            if left > 0 and not ahead:
                return
            self._beating = True
        self._start_heartbeat(max(left, 0.0))

    def _start_heartbeat(self, first: float) -> None:
        """Start the heartbeat thread, its first renewal ``first`` seconds from now."""
        self._heart.clear()
        self._heartbeat_thread = threading.Thread(
            target=self._beat, args=(first,), name=f"lifecycle-heartbeat-{self.name}",
            daemon=True)
        self._heartbeat_thread.start()

    def let_go(self, ids: list[int]) -> None:
        with self._lock:
            self._claims.difference_update(ids)
            self._lost.difference_update(ids)
            for effect_id in ids:
                self._confirmed.pop(effect_id, None)
            if not self._claims:
                self._heart.set()

    def still_held(self, effect_id: int) -> bool:
        """Whether a claimed effect's handler may start now: the claim was not found taken
        over, and by this process's own monotonic clock its lease has at least a heartbeat
        left since the database last confirmed it. A worker that was paused (SIGSTOP, a VM
        frozen, a long GC) longer than that knows it may have lost the claim, and starts
        nothing on it."""
        with self._lock:
            return self._held_now(effect_id)

    def _held_now(self, effect_id: int) -> bool:
        """:meth:`still_held`, under ``_lock``."""
        if effect_id in self._lost or effect_id not in self._claims:
            return False
        since = self.monotonic() - self._confirmed.get(effect_id, -math.inf)
        return since < self.lease - self.heartbeat

    def _drop_lapsed(self, calls: list[EffectCall]) -> None:
        """Claimed effects whose claims may have lapsed before their handlers started: none
        is started; each goes back to the queue unless another worker has it already."""
        log.warning("worker %s: %d claimed effects were not started: their claims were "
                    "taken over, or not confirmed for longer than the lease less a heartbeat "
                    "(was this process paused?); they are given back", self.name, len(calls))
        self.give_back(calls)

    def heartbeat_stopped(self) -> None:
        """Wait for the heartbeat thread to leave (it does once nothing is held), so that
        nothing of this worker's touches the database after run() or run_until_idle()."""
        thread = self._heartbeat_thread
        if thread is not None and not (self._claims and not self._fast.is_set()):
            self._heart.set()
            thread.join()

    def _beat(self, first: float) -> None:
        """Renew the leases of every claim this worker holds, every ``heartbeat`` seconds,
        until it holds none (a thread of its own: a handler may run far longer than a lease).
        A failed renewal is tried again on the next beat. Woken to leave when the worker
        held nothing for a moment, it stays if claims came back meanwhile, and renews them
        when the beat is due, not at once (they were just confirmed by their claim)."""
        failing = False
        due = time.monotonic() + first  # the wait is in real time, as Event.wait's
        while True:
            self._heart.wait(max(due - time.monotonic(), 0.0))
            with self._lock:
                self._heart.clear()
                ids = sorted(self._claims)
                if not ids or self._fast.is_set():
                    self._beating = False
                    return
            if self._abandoned():
                self._give_back_abandoned()
                with self._lock:
                    self._beating = False
                return
            if time.monotonic() < due:
                continue
            due = time.monotonic() + self.heartbeat
            until = self.engine.clock.now() + dt.timedelta(seconds=self.lease)
            asked = self.monotonic()
            try:
                with self.store.begin() as db:
                    kept = effect_rows.renew(db, ids, self.name, until)
            except Exception as exc:  # the next beat tries again; the lease has slack
                if not failing:
                    log.warning("worker %s: could not renew %d leases: %s", self.name,
                                len(ids), exc)
                failing = True
                continue
            if failing:
                log.info("worker %s: leases renewed again", self.name)
            failing = False
            self._confirm(ids, kept, asked)

    def _confirm(self, ids: list[int], kept: set[int], asked: float) -> None:
        """After a renewal begun at ``asked`` of ``ids``: ``kept`` are confirmed; any other
        this worker still holds was taken over (its lease ran out) and is no longer its."""
        with self._lock:
            lost = [i for i in ids if i not in kept and i in self._claims]
            for effect_id in kept & self._claims:
                self._confirmed[effect_id] = asked
            for effect_id in lost:
                self._claims.discard(effect_id)
                self._confirmed.pop(effect_id, None)
                self._lost.add(effect_id)
        # (one recorded done just now is gone from the renewal too, and is no news)
        waiting = {call.id for call in list(self._queue)} | set(self._running)
        taken = [effect_id for effect_id in lost if effect_id in waiting]
        if taken:
            log.warning("worker %s: %d claims were taken over by another worker (their "
                        "leases ran out: was this process paused?); nothing more of them is "
                        "started here", self.name, len(taken))

    def _give_back_abandoned(self) -> None:
        """Give back every claim of a worker whose driver is gone (see :meth:`give_back_all`)."""
        waiting, started = self.give_back_all()
        log.warning("worker %s: its event loop is gone; gave back %d claimed effects and %d "
                    "whose handlers were running", self.name, waiting, started)

    def give_back_all(self) -> tuple[int, int]:
        """Give back every claim this worker holds: the effects never started as unattempted,
        the started ones as attempts that did not finish (they run again, once); how many of
        each. Outcomes of handlers that finished are recorded first, if the database takes
        them; else they are given back with the started ones."""
        try:
            self.reap()
        except Exception as exc:
            log.warning("worker %s: could not record %d finished outcomes (%s)", self.name,
                        len(self._unrecorded), exc)
        with self._lock:
            started = [call for call, _ in self._running.values()
                       if call.id not in self._unstarted]
            started += [call for call, _, _ in self._unrecorded]
            waiting = list(self._queue)
            waiting += [call for call, _ in self._running.values() if call.id in self._unstarted]
            self._unrecorded.clear()
            self._queue.clear()
        self._drop_running()
        self.give_back(waiting)
        self.give_back(started, refund=False)
        return len(waiting), len(started)

    def _take_over_the_dead(self) -> int:
        """End the leases of claims whose worker process ran on this host and is gone, so
        that they are claimed again now rather than when their leases run out; how many."""
        self._dead_seen = self.monotonic()
        prefix = host_prefix()
        if prefix is None:
            return 0
        with self.store.read() as db:
            claimants = effect_rows.claimants(db, prefix)
        dead = [c for c in claimants if c != self.claimant and is_gone(c, prefix)]
        if not dead:
            return 0
        expired = self.engine.clock.now() - dt.timedelta(seconds=1)
        with self.store.begin() as db:
            taken = effect_rows.expire(db, dead, expired)
        log.warning("worker %s: %d effects were held by %d worker processes of this host "
                    "that are gone; they are claimed again now", self.name, taken, len(dead))
        return int(taken)

    # -- running ---------------------------------------------------------------------

    def _start(self, calls: list[EffectCall]) -> None:
        """Hand ``calls`` to a free slot of the driver: a :class:`Run` (each started when
        the driver's thread comes to it and :meth:`starting` allows it), else one
        :class:`Start`; or record a call's failure at once when no handler of this worker
        can run it."""
        handed = []
        for call in calls:
            if call.name in self.engine.handlers:
                handed.append(call)
            else:  # recorded with the finished ones
                self.outcome(call, "failed", PermanentError(
                    f"no handler for effect {call.name!r} is registered in this worker"))
        if not handed:
            return
        slot = self._slots = self._slots + 1
        with self._lock:
            self._slot_left[slot] = len(handed)
            for call in handed:
                self._slot[call.id] = slot
                self._running[call.id] = (call, math.inf)
            if self._runs:
                self._unstarted.update(call.id for call in handed)
                self._starting.append(Run(tuple(handed), slot))
                return
        call, = handed
        timeout = self.engine.handlers[call.name].timeout
        now = self.monotonic()
        with self._lock:
            self._began[call.id] = now
            if self._timed and timeout:
                self._running[call.id] = (call, now + timeout)
        self._starting.append(Start(call))

    def _drop_running(self, ids: list[int] | None = None) -> None:
        """Take effects (``ids``, or all) out of ``_running``, freeing their slots."""
        with self._lock:
            if ids is None:
                self._began.clear()
                self._running.clear()
                self._slot.clear()
                self._slot_left.clear()
                self._unstarted.clear()
                return
            for effect_id in ids:
                self._began.pop(effect_id, None)
                self._running.pop(effect_id, None)
                self._unstarted.discard(effect_id)
                slot = self._slot.pop(effect_id, None)
                if slot is not None:
                    self._slot_left[slot] -= 1
                    if not self._slot_left[slot]:
                        del self._slot_left[slot]

    def cancel(self) -> list[EffectCall]:
        """The driver's handlers are being cancelled (its task was): stop at once; the
        running handlers' late outcomes are not recorded. Which calls were running."""
        self._fast.set()
        self._stop.set()
        self._heart.set()
        with self._lock:
            running = [call for call, _ in self._running.values()]
            self._written_off.update((c.id, c.attempt) for c in running
                                     if c.id not in self._unstarted)
        return running

    def _collect(self) -> int:
        """Move the outcome of every handler that finished or ran out of time to those
        waiting to be recorded (``_unrecorded``); how many."""
        now = self.monotonic()
        with self._lock:
            if not self._results and not any(d <= now for _, d in self._running.values()):
                return 0
            ready = [(call, self._results.pop(effect_id, None))
                     for effect_id, (call, deadline) in list(self._running.items())
                     if effect_id in self._results or deadline <= now]
            taken_back: list[EffectCall] = []
            for call, outcome in ready:
                if outcome is None:  # its handler hangs: written off (a thread, replaced)
                    self._written_off.add((call.id, call.attempt))
                    began = self._began.pop(call.id, None)
                    if began is not None:  # (it counts toward the pace, as long as it ran)
                        self._pace += (now - began - self._pace) / 4
                    slot = self._slot.get(call.id)  # the rest of its run goes elsewhere
                    taken_back += [c for c, _ in self._running.values()
                                   if c.id in self._unstarted and self._slot.get(c.id) == slot]
        self._drop_running([call.id for call, _ in ready] + [c.id for c in taken_back])
        self._queue.extendleft(reversed(taken_back))
        unstarted = []
        for call, outcome in ready:
            if outcome is None:
                timeout = self.engine.handlers[call.name].timeout or 0.0
                outcome = ("error", RetryableError(f"handler timed out after {timeout:g} s"))
            elif outcome[0] == "unstarted":  # refused by starting(): given back below
                unstarted.append(call)
                continue
            self.outcome(call, *outcome)
        if unstarted:
            if self._stop.is_set():
                self.give_back(unstarted)
            else:
                self._drop_lapsed(unstarted)
        return len(ready)

    def outcome(self, call: EffectCall, kind: str, value: Any) -> None:
        if not self._unrecorded:
            self._finished_at = self.monotonic()
        self._unrecorded.append((call, kind, value))

    def reap(self) -> int:
        """Record the outcome of every handler that finished or ran out of time; how many."""
        self._collect()
        return self.record()[0]

    def record(self, *, claim: int = 0) -> tuple[int, list[EffectCall]]:
        """Record every outcome waiting (``_unrecorded``), and claim up to ``claim``
        effects: the outcomes that fire a trigger (a follow-up, an ``on_failure``) through
        :meth:`Engine.fire_many`, each in the transaction of its trigger, many to a
        transaction; all the others (done, to be tried again, failed) in one transaction,
        which also claims. How many were recorded, and the effects claimed.

        An outcome the database fails to take is kept (and its claim renewed) until it
        does: a finished handler is never run again, nor counted as timed out, for a
        database that blinked; only a crash before its record commits runs it again."""
        batch: list[_Plain] = []
        fires: list[_Fired] = []
        recorded = 0
        for call, kind, value in list(self._unrecorded):
            settled = self._settle(call, kind, value)
            if settled is None:  # nothing to record
                self._recorded(call)
            elif isinstance(settled, _Plain):
                batch.append(settled)
            else:
                fires.append(settled)
        while fires:  # a DatabaseError leaves the rest for the next round
            recorded += self._fire_outcomes(fires, batch)  # (leaves those to fire again)
        claimed = self.claim(claim, batch)
        if self._unrecorded:
            self._finished_at = self.monotonic()
        return recorded + len(batch), claimed

    def _settle(self, call: EffectCall, kind: str, value: Any) -> _Plain | _Fired | None:
        """What recording an outcome takes: a write that fires nothing, or a fire."""
        if kind == "ok":
            if value is None:
                return _Plain(call, DONE)
            return _Fired(call, value.trigger, dict(value.payload),
                          _Outcome(self, call, DONE, None, value.writes))
        effect = self.engine.handlers.get(call.name) or Effect(lambda c: None)
        exc: BaseException = value
        # stored, logged and shown: no password of any URL in it
        message = redact.text(f"{type(exc).__name__}: {exc}")
        permanent = isinstance(exc, PermanentError) or kind == "failed"
        limit = effect.retry.max_attempts
        if not permanent and (limit is None or call.attempt < limit):
            return _Plain(call, PENDING, message, effect.retry.delay(call.attempt, self.rng))
        on_failure = self._on_failure(call)
        if on_failure is None:
            return _Plain(call, FAILED, message)
        return _Fired(call, on_failure, {"effect": call.name, "error": message},
                      _GivingUp(self, call, message[:2000]), message)

    def _fire_outcomes(self, fires: list[_Fired], batch: list[_Plain]) -> int:
        """Fire the triggers of ``fires`` together, each recording its effect's outcome in
        its transaction; how many were recorded. One whose recording failed (its follow-up
        refused by an error, the handler's writes raising) is recorded as the handler's
        failure: added to ``batch``, or fired again if that fires ``on_failure`` (its
        ``_Fired`` is put back in ``fires``)."""
        items: list[Fire] = [(f"{f.call.machine}:{f.call.key}", f.trigger, f.payload,
                              f"effect:{f.call.name}", f.within) for f in fires]
        try:
            results = self._fire_batch(items)
        except Exception as exc:
            if not effect_rows.lost_claim(exc):
                raise
            # PostgreSQL: a claim was found lost where the batch's answers were read, which
            # undid the batch; each goes again alone. (Had the batch been made in two
            # transactions, the first committed, those it recorded are found not held now,
            # and are said to be lost: nothing is written twice.)
            results = [self._fired_alone(f, item) for f, item in zip(fires, items, strict=True)]
        outage: DatabaseError | None = None
        again: list[_Fired] = []
        recorded = 0
        for fired, result in zip(fires, results, strict=True):
            call = fired.call
            if isinstance(result, DatabaseError):
                outage = result  # kept for the next round
            elif isinstance(result, LostClaim):
                log.warning("effect %s of %s:%s: the claim was lost; its new owner records "
                            "it", call.name, call.machine, call.key)
                self._recorded(call)
                recorded += 1
            elif isinstance(result, FireResult):
                self._fired(fired, result)
                self._recorded(call)
                recorded += 1
            elif fired.message is None:  # recording the success failed
                cause = result.__cause__ if isinstance(result, _WritesFailed) else result
                settled = self._settle(call, "error", cause)
                if isinstance(settled, _Plain):
                    batch.append(settled)
                elif settled is not None:
                    again.append(settled)
            else:  # its on_failure could not be fired: failed, its queue held
                batch.append(_Plain(call, FAILED, f"{fired.message}; its on_failure "
                                                  f"{fired.trigger} failed: {result}"))
        fires[:] = again
        if outage is not None:
            raise outage
        return recorded

    def _fire_batch(self, items: list[Fire]) -> list[Any]:
        """``Engine.fire_many`` of ``items``, made again while a row moved between the
        batch's read and its write: a strict write (these, with their ``Within`` hooks) then
        fails its whole transaction with ``Moved`` at the COMMIT, which the engine's batch
        loop lets through, everything undone; each is decided again on what was written."""
        for _ in range(self.engine.max_attempts):
            try:
                return self.engine.fire_many(items, on_stale="return",
                                             batch=max(self.batch, 1))
            except Moved:
                log.debug("worker %s: a follow-up's resource moved under its batch; "
                          "deciding the batch again", self.name)
        return [ConcurrencyError(f"{key}: its effect's follow-up {trigger} lost the race "
                                 f"{self.engine.max_attempts} times in a row")
                for key, trigger, *_ in items]

    def _fired_alone(self, fired: _Fired, item: Fire) -> Any:
        """One fire of a batch made alone: its result, or :class:`LostClaim`."""
        try:
            return self._fire_batch([item])[0]
        except Exception as exc:
            if not effect_rows.lost_claim(exc):
                raise
            return LostClaim(fired.call.idempotency_key)

    def _fired(self, fired: _Fired, result: FireResult) -> None:
        """Count and say what a recorded fire did."""
        call = fired.call
        if fired.message is None:
            self.stats.done += 1
            if not result.fired:
                log.warning("effect %s of %s:%s done; its follow-up %s was refused: %s",
                            call.name, call.machine, call.key, fired.trigger, result.reason)
            log.debug("effect %s of %s:%s done (attempt %d)", call.name, call.machine,
                      call.key, call.attempt)
            return
        self.stats.failed += 1
        if result.fired and result.effects:
            log.error("effect %s of %s:%s failed for good: %s; fired %s, which asked for "
                      "%d effects: they run next", call.name, call.machine, call.key,
                      fired.message, fired.trigger, result.effects)
        else:
            log.error("effect %s of %s:%s failed for good: %s; %s; the resource is stuck "
                      "until `lifecycle retry %s:%s`", call.name, call.machine, call.key,
                      fired.message, f"fired {fired.trigger}" if result.fired else
                      f"its on_failure {fired.trigger} was refused ({result.reason})",
                      call.machine, call.key)

    def _recorded(self, call: EffectCall) -> None:
        self._unrecorded.remove(next(i for i in self._unrecorded if i[0] is call))
        self.let_go([call.id])

    def _write_batch(self, tx: Transaction, batch: list[_Plain],
                     now: dt.datetime) -> Callable[[], set[int]]:
        """Write outcomes that fire nothing, each fenced by its claim and attempt (a done
        one passes its resource's queue head on); what gives the ids whose claims were
        lost once the transaction committed. On PostgreSQL four statements whatever the
        batch's size (see ``finish_effects``), none waiting for another's answer; on SQLite
        the statements of each outcome."""
        sql = self.store.sql
        if not batch:
            return set
        if sql.finish_effects is not None:
            return self._write_arrays(tx, batch, now)
        lost = set()
        for plain in batch:
            call = plain.call
            try:
                if plain.status == PENDING:
                    due = now + dt.timedelta(seconds=plain.delay)
                    self._held(tx, sql.reschedule_effect, call,
                               next_attempt_at=self.store.time_param(due),
                               error=plain.message[:2000])
                else:
                    self.mark(tx, call, plain.status,
                              plain.message[:2000] if plain.status == FAILED else None)
            except LostClaim:  # nothing was written for it
                lost.add(call.id)
        return lambda: lost

    def _write_arrays(self, tx: Transaction, batch: list[_Plain],
                      now: dt.datetime) -> Callable[[], set[int]]:
        """:meth:`_write_batch` on PostgreSQL."""
        sql, time_param = self.store.sql, self.store.time_param
        assert sql.finish_effects and sql.reschedule_effects
        assert sql.lock_resources_of_effects and sql.pass_heads
        sent = []
        for statement, plains in ((sql.finish_effects, [p for p in batch if p.status != PENDING]),
                                  (sql.reschedule_effects,
                                   [p for p in batch if p.status == PENDING])):
            if not plains:
                continue
            values: dict[str, Any] = {
                "ids": [p.call.id for p in plains], "attempts": [p.call.attempt for p in plains],
                "errors": [p.message[:2000] if p.status != DONE else None for p in plains],
                "claimed_by_": self.name}
            if statement is sql.finish_effects:
                values.update(statuses=[p.status for p in plains], now=time_param(now))
            else:
                values["dues"] = [now + dt.timedelta(seconds=p.delay) for p in plains]
            sent.append(tx.execute(statement, values))
            done = [p.call.id for p in plains if p.status == DONE]
            if done:  # (those it made done: the statements find them)
                tx.execute(sql.lock_resources_of_effects, {"ids": done})
                tx.execute(sql.pass_heads, {"ids": done})
        ids = {p.call.id for p in batch}
        return lambda: ids - {row[0] for cursor in sent for row in cursor.fetchall()}

    def _batch_recorded(self, batch: list[_Plain], lost: set[int]) -> None:
        """After the batch's commit: let go of its claims, count and say what happened."""
        for plain in batch:
            call = plain.call
            self._recorded(call)
            if call.id in lost:
                log.warning("effect %s of %s:%s: the claim was lost; its new owner records "
                            "it", call.name, call.machine, call.key)
            elif plain.status == DONE:
                self.stats.done += 1
                log.debug("effect %s of %s:%s done (attempt %d)", call.name, call.machine,
                          call.key, call.attempt)
            elif plain.status == PENDING:
                self.stats.retried += 1
                log.info("effect %s of %s:%s failed (attempt %d: %s); next attempt in %.1f s",
                         call.name, call.machine, call.key, call.attempt, plain.message,
                         plain.delay)
            else:
                self.stats.failed += 1
                log.error("effect %s of %s:%s failed for good after %d attempts: %s; the "
                          "resource is stuck until `lifecycle retry %s:%s`", call.name,
                          call.machine, call.key, call.attempt, plain.message, call.machine,
                          call.key)

    def _held(self, tx: Transaction, statement: str, call: EffectCall, **values: Any) -> None:
        """Write to the effect, if this worker still holds its claim (the fence is in the
        store's statements, once), and learn at once whether it did (SQLite)."""
        tx.execute(statement, {"id_": call.id, "claimed_by_": self.name,
                               "attempts_": call.attempt, **values})
        if tx.rowcount != 1:
            raise LostClaim(call.idempotency_key)

    def mark(self, tx: Transaction, call: EffectCall, status: str, error: str | None) -> None:
        """Record the effect's outcome, if this worker still holds its claim; a done effect
        (or one given up on) passes its resource's queue head to the next (a failed one
        keeps it: the effects behind it wait for ``retry``). A claim lost fails the whole
        transaction (see ``finish_effect``): on SQLite at once, as :class:`LostClaim`; on
        PostgreSQL where its answers are read, at the latest at the COMMIT, as the
        database's error (``effects.lost_claim`` tells it), so that nothing waits for the
        answer before then."""
        sql = self.store.sql
        try:
            tx.execute(sql.finish_effect, {
                "id_": call.id, "claimed_by_": self.name, "attempts_": call.attempt,
                "new_status": status, "now": self.store.time_param(self.engine.clock.now()),
                "error": error})
        except Exception as exc:
            # (PostgreSQL's pipeline may raise another effect's lost claim here: not named)
            if tx.dialect == "sqlite" and effect_rows.lost_claim(exc):
                raise LostClaim(call.idempotency_key) from None
            raise
        if status in (DONE, GAVE_UP):
            if sql.lock_resource_of_effect is not None:
                tx.execute(sql.lock_resource_of_effect, {"id_": call.id})
            tx.execute(sql.pass_head, {"id_": call.id})

    def _on_failure(self, call: EffectCall) -> str | None:
        with self.store.read() as db:
            return effect_rows.on_failure(db, call.id)

    def save_progress(self, call: EffectCall) -> None:
        store = self.store
        # from a handler's own thread: no connection kept; from the driver's (a handler it
        # runs itself, between two of the core's transactions): the connection it holds
        with store.write(held=threading.get_ident() == self._driver) as tx:
            saved = tx.changes(store.sql.save_progress, {
                "id_": call.id, "claimed_by_": self.name, "attempts_": call.attempt,
                "progress": store.json_param(dict(call.progress))})
        if saved() != 1:  # (read after the commit: one statement, nothing else written)
            raise LostClaim(call.idempotency_key)

    def give_back(self, calls: list[EffectCall], *, refund: bool = True) -> None:
        """Return claimed effects to the queue at once, instead of waiting for their leases
        to expire (a handler abandoned on a fast shutdown dies with the process). ``refund``:
        their handlers never ran, so their attempts are returned; else each counts as an
        attempt that did not finish."""
        if not calls:
            return
        ids = [call.id for call in calls]
        self.let_go(ids)
        try:
            self._unclaim(ids=ids, refund=refund)
        except Exception as exc:  # the leases will expire instead
            log.warning("worker %s: could not give back %d effects (%s); they are claimed "
                        "again when their leases expire", self.name, len(ids), exc)

    def _unclaim(self, *, ids: list[int] | None = None, except_ids: list[int] | None = None,
                 refund: bool = True) -> int:
        """Put the effects this worker holds (of ``ids``, or all but ``except_ids``) back in
        the queue; with ``refund`` (their handlers never ran) the attempt their claim counted
        is returned; how many."""
        with self.store.begin() as db:
            return effect_rows.unclaim(db, self.name, ids=ids, except_ids=except_ids,
                                       refund=refund)

    # -- timers ----------------------------------------------------------------------

    def _fire_due_timers(self) -> int:
        self._timers_seen = self.monotonic()
        now = self.engine.clock.now()
        due = self.store.due_timers(now, self.batch)
        fired = 0
        for timer_id, trigger, machine, key in due:
            if self._stop.is_set():
                break
            try:
                result = self.engine.fire_timer(timer_id, f"{machine}:{key}", trigger)
            except UnknownResource:
                continue
            if result is None:
                self.stats.timers_stale += 1
                continue
            fired += 1
            if result.fired:
                self.stats.timers_fired += 1
            else:
                self.stats.timers_refused += 1
        return fired


@dataclass(slots=True)
class _Fired:
    """An outcome recorded in the transaction of a trigger it fires: a follow-up (done),
    or the ``on_failure`` of an effect that failed for good with ``message``."""

    call: EffectCall
    trigger: str
    payload: dict[str, Any]
    within: Within
    message: str | None = None


class _WritesFailed(EffectError):
    """A handler's writes (``FollowUp.writes``) raised: the cause is the handler's failure."""


@dataclass(slots=True)
class _Plain:
    """An outcome that fires no trigger, written in a batch: done, to be tried again
    (``PENDING``, after ``delay`` seconds) or failed, with ``message``."""

    call: EffectCall
    status: str
    message: str = ""
    delay: float = 0.0


class _Outcome(Within):
    """Records an effect's outcome (and the handler's own writes) in the transaction of the
    trigger it fires, if the worker still holds the effect's claim."""

    def __init__(self, worker: WorkerCore, call: EffectCall, status: str, error: str | None,
                 writes: Callable[[Any], None] | None) -> None:
        self.worker, self.call, self.status, self.error = worker, call, status, error
        self.writes = writes

    def before(self, tx: Transaction, resource_id: int) -> str | None:
        self.worker.mark(tx, self.call, self.status, self.error)
        if self.writes is not None:
            try:
                self.writes(tx)
            except LifecycleError:
                raise
            except Exception as exc:  # the fire is made again without it
                if effect_rows.lost_claim(exc):  # (PostgreSQL: the mark's answer, read here)
                    raise
                raise _WritesFailed(f"{type(exc).__name__}: {exc}") from exc
        return None


class _GivingUp(Within):
    """Records an effect that failed for good in the transaction of its ``on_failure``
    trigger, once that is decided: given up on, its queue going on, if the transition fired
    and asked for effects (the machine went another way); failed, holding its resource's
    queue until retried, if it asked for none (the state records where it stopped) or was
    refused."""

    def __init__(self, worker: WorkerCore, call: EffectCall, error: str) -> None:
        self.worker, self.call, self.error = worker, call, error

    def after(self, tx: Transaction, result: FireResult) -> None:
        status = GAVE_UP if result.fired and result.effects else FAILED
        self.worker.mark(tx, self.call, status, self.error)


def _answer(tx: Transaction, cursor: Any) -> Callable[[], list[Any]]:
    """What gives a statement's rows: on PostgreSQL read after the COMMIT (nothing waits for
    them before it), on SQLite now (they cost no round trip, and its transaction's one
    cursor runs the next statement)."""
    if tx.dialect == "sqlite":
        rows = cursor.fetchall()
        return lambda: rows
    return cursor.fetchall  # type: ignore[no-any-return]


__all__ = ["BATCH", "DEFAULT_LEASE", "TIMER_LOOK", "Abandon", "HeldClaims", "Need", "Pause",
           "Run", "Start", "Wait", "WorkerCore", "WorkerStats", "Working"]
