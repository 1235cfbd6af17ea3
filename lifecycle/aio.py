"""asyncio: the engine's operations as coroutines, and the outbox worker on an event loop.

:class:`AsyncEngine` is not a second engine. It holds an :class:`Engine` and runs the same
decision and transaction code: a fire is the engine's sans-IO generator
(:meth:`Engine.firing`), which yields the probe calls it needs; the async engine awaits each
probe on its event loop (a coroutine probe under ``asyncio.timeout``, never a thread each)
and sends the answer back. Same store, schema, journal, guarantees.

The database work between two probe calls is a few statements in one transaction. By
default (``database="inline"``) it runs on the event loop's own thread and connection,
blocking the loop for that long (tens of microseconds on SQLite; a loopback round trip per
statement on PostgreSQL); ``database="threads"`` runs it on a small thread pool instead, each
thread with its connection, for a loop that must never wait on a slow database.
benchmarks/aio.py measures both against the sync engine; ARCHITECTURE.md says why inline is
the default.

:class:`AsyncWorker` is the asyncio driver of the worker's core
(:class:`~lifecycle.worker_core.WorkerCore`), as :class:`~lifecycle.worker.Worker` is its
thread driver: handlers run as tasks on the event loop instead of threads, and the claims,
leases, heartbeat, outcomes and shutdown are the core's, so sync and async workers may share
one outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, ParamSpec, TypeVar

from .clock import Clock
from .effects import Effect, EffectCall, Handler
from .engine import Deciding, Engine, Guard, OnStale, SpecFor
from .errors import InvalidInput, LifecycleError, RetryableError
from .freshness import Probe, ProbeCall, ProbeOutcome, await_probe, is_async
from .logs import logger
from .results import FireResult, JournalEntry, Mismatch, Observation, Resource
from .spec import MachineSpec, SpecSource
from .store import Store
from .within import Within
from .worker_core import (
    DEFAULT_LEASE,
    Abandon,
    HeldClaims,
    Pause,
    Start,
    Wait,
    WorkerCore,
    WorkerStats,
    Working,
)

log = logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
DatabaseMode = Literal["inline", "threads"]


class AsyncEngine:
    """The :class:`Engine`'s operations as coroutines, over the same store.

    Takes the engine's arguments (``probes`` and ``effects`` may be coroutine functions), or
    wraps an existing engine with :meth:`over`. ``database`` says where the database work
    runs: ``"inline"`` on the event loop's thread, ``"threads"`` on a pool of ``threads``
    threads (:meth:`aclose` or ``async with`` shuts it down)."""

    def __init__(
        self,
        store: Store,
        machines: Iterable[SpecSource] = (),
        *,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Handler | Effect] | None = None,
        probes: Mapping[str, Probe] | None = None,
        clock: Clock | None = None,
        probe_timeout: float = 10.0,
        max_attempts: int = 50,
        spec_for: SpecFor | None = None,
        strict: bool = True,
        database: DatabaseMode = "inline",
        threads: int = 4,
    ) -> None:
        engine = Engine(store, machines, guards=guards, effects=effects, probes=probes,
                        clock=clock, probe_timeout=probe_timeout, max_attempts=max_attempts,
                        spec_for=spec_for, strict=strict)
        self._setup(engine, database, threads)

    @classmethod
    def over(cls, engine: Engine, *, database: DatabaseMode = "inline",
             threads: int = 4) -> AsyncEngine:
        """An async engine running ``engine``'s machines, guards, probes and handlers."""
        self = cls.__new__(cls)
        self._setup(engine, database, threads)
        return self

    def _setup(self, engine: Engine, database: DatabaseMode, threads: int) -> None:
        if database not in ("inline", "threads"):
            raise ValueError(f"database must be 'inline' or 'threads', not {database!r}")
        self.engine = engine
        self.store = engine.store
        self.clock = engine.clock
        self.database = database
        self._pool = (ThreadPoolExecutor(threads, thread_name_prefix="lifecycle-db")
                      if database == "threads" else None)

    async def aclose(self) -> None:
        """Shut the database thread pool down (its threads' connections stay the store's,
        closed by ``store.dispose()``)."""
        if self._pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
            self._pool = None

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    # -- where the database work runs ----------------------------------------------------

    async def _db(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._pool is None:
            return work(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: work(*args, **kwargs))

    async def drive(self, deciding: Deciding[T]) -> T:
        """Run a sans-IO decision of the engine to its end, awaiting each probe it asks."""
        outcome: Any = None
        while True:
            done, value = await self._db(_advance, deciding, outcome)
            if done:
                return value  # type: ignore[no-any-return]
            if isinstance(value, ProbeCall):
                outcome = await self._ask(value)
            elif not value.calls:  # a batch's transaction ended: let the loop breathe
                outcome = []
                await asyncio.sleep(0)
            else:
                room = asyncio.Semaphore(value.at_once)
                outcome = await asyncio.gather(*(self._ask(call, room)
                                                 for call in value.calls))

    async def _ask(self, call: ProbeCall,
                   room: asyncio.Semaphore | None = None) -> ProbeOutcome:
        engine = self.engine
        if room is None:
            return await await_probe(call.name, engine.probes[call.name], call.request,
                                     engine.probe_timeout)
        async with room:
            return await self._ask(call)

    # -- the engine's operations -----------------------------------------------------------

    async def fire(self, key: str, trigger: str, payload: Mapping[str, Any] | None = None, *,
                   actor: str | None = None, on_stale: OnStale = "raise",
                   within: Within | None = None) -> FireResult:
        """:meth:`Engine.fire`, awaiting the probe a risky edge asks."""
        return await self.drive(self.engine.firing(key, trigger, payload, actor=actor,
                                                   on_stale=on_stale, within=within))

    async def step(self, key: str, *, actor: str | None = None,
                   on_stale: OnStale = "raise") -> FireResult:
        """:meth:`Engine.step`, awaiting the probe a risky edge asks."""
        return await self.drive(self.engine.stepping(key, actor=actor, on_stale=on_stale))

    async def fire_timer(self, timer_id: int, key: str, trigger: str) -> FireResult | None:
        """:meth:`Engine.fire_timer`, awaiting the probe a risky edge asks."""
        return await self.drive(self.engine.timer_firing(timer_id, key, trigger))

    async def create(self, machine: str, key: str, data: Mapping[str, Any] | None = None, *,
                     state: str | None = None, actor: str | None = None) -> Resource:
        return await self._db(self.engine.create, machine, key, data, state=state, actor=actor)

    async def update(self, key: str, data: Mapping[str, Any], *,
                     actor: str | None = None) -> Resource:
        return await self._db(self.engine.update, key, data, actor=actor)

    async def observe(self, key: str, status: Mapping[str, Any],
                      observed_at: dt.datetime | None = None, *,
                      source: str = "api") -> Observation:
        return await self._db(self.engine.observe, key, status, observed_at, source=source)

    async def observe_many(self, statuses: Iterable[tuple[str, Mapping[str, Any]]],
                           observed_at: dt.datetime | None = None, *, source: str = "api",
                           batch: int = 500) -> list[Observation | LifecycleError]:
        """:meth:`Engine.observe_many` (no probe: the database work alone)."""
        return await self._db(self.engine.observe_many, list(statuses), observed_at,
                              source=source, batch=batch)

    async def step_many(self, keys: Iterable[str], *, actor: str | None = None,
                        on_stale: OnStale = "return", batch: int = 500, probes: int = 8,
                        retry_conflicts: bool = True) -> list[FireResult | LifecycleError]:
        """:meth:`Engine.step_many`: the same batches and transactions, the probes its risky
        edges ask between them awaited on the loop, ``probes`` at a time; after each
        transaction other tasks run before the next."""
        return await self.drive(self.engine.stepping_many(
            list(keys), actor=actor, on_stale=on_stale, batch=batch, probes=probes,
            retry_conflicts=retry_conflicts))

    async def register(self, source: SpecSource) -> MachineSpec:
        return await self._db(self.engine.register, source)

    async def get(self, key: str) -> Resource:
        return await self._db(self.engine.get, key)

    async def history(self, key: str) -> list[JournalEntry]:
        return await self._db(self.engine.history, key)

    async def observations(self, key: str) -> list[Observation]:
        return await self._db(self.engine.observations, key)

    async def available_triggers(self, key: str) -> list[str]:
        return await self._db(self.engine.available_triggers, key)

    async def resources(self, machine: str | None = None, state: str | None = None, *,
                        limit: int | None = None, after: str | None = None) -> list[Resource]:
        return await self._db(self.engine.resources, machine, state, limit=limit,
                              after=after)

    async def iter_resources(self, machine: str | None = None, state: str | None = None, *,
                             after: str | None = None,
                             page: int = 1000) -> AsyncIterator[Resource]:
        """Every resource, a page at a time, as :meth:`Engine.iter_resources` (each page
        read off the event loop)."""
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise InvalidInput(f"invalid page {page!r}: a whole number, 1 or more")
        while True:
            found = await self.resources(machine, state, limit=page, after=after)
            for resource in found:
                yield resource
            if len(found) < page:
                return
            after = f"{found[-1].machine}:{found[-1].key}"

    async def counts(self, machine: str | None = None) -> dict[str, dict[str, int]]:
        return await self._db(self.engine.counts, machine)

    async def verify(self) -> list[Mismatch]:
        return await self._db(self.engine.verify)

    @property
    def machines(self) -> dict[str, MachineSpec]:
        return self.engine.machines

    @property
    def handlers(self) -> dict[str, Effect]:
        return self.engine.handlers

    @property
    def probes(self) -> dict[str, Probe]:
        return self.engine.probes


def _advance(deciding: Deciding[T], outcome: Any) -> tuple[bool, Any]:
    """One step of a decision: (True, its result) or (False, the probe call it asks)."""
    try:
        return False, deciding.send(outcome)
    except StopIteration as done:
        return True, done.value


class AsyncWorker:
    """The outbox worker on an event loop: the asyncio driver of the worker's core
    (:class:`~lifecycle.worker_core.WorkerCore`, the same claims, leases and their
    heartbeat, outcomes, retries, timers and give-backs as :class:`~lifecycle.worker.Worker`,
    so sync and async workers may share one outbox). ``concurrency`` handlers run at once as
    tasks (a coroutine handler is awaited, under ``asyncio.timeout`` of its effect's
    timeout, and cancelled when it runs out; a plain one runs in a thread of the loop's
    default pool); the core's database work runs on the loop's thread. ``await run()``
    until :meth:`stop` (graceful: the running handlers finish; ``fast=True``: they are
    cancelled and their claims given back at once), or ``await run_until_idle()``.
    Cancelled (``task.cancel()``, a ``TaskGroup``, ``asyncio.run`` ending), it cancels its
    handlers and gives every claim back; a loop closed under it is seen by the heartbeat,
    which gives the claims back instead of renewing them.

    What it records goes through the sync engine on the loop's thread: a due timer's trigger
    or a handler's follow-up that crosses a risky edge whose observation is stale asks its
    probe as ``Engine`` does, and the loop waits for that answer (at most
    ``probe_timeout``)."""

    def __init__(self, engine: Engine | AsyncEngine, *, concurrency: int = 1,
                 lease: float = DEFAULT_LEASE, poll: float = 0.5, name: str | None = None,
                 seed: int | None = None, batch: int | None = None,
                 heartbeat: float | None = None) -> None:
        sync = engine.engine if isinstance(engine, AsyncEngine) else engine
        self.core = WorkerCore(sync, concurrency=concurrency, lease=lease, poll=poll,
                               name=name, seed=seed, batch=batch, heartbeat=heartbeat,
                               wake=self._wake, abandoned=self._abandoned, timed=False)
        core = self.core
        self.engine, self.store, self.name = sync, core.store, core.name
        self.concurrency, self.lease, self.heartbeat = concurrency, core.lease, core.heartbeat
        self.poll, self.batch, self.rng, self.claimant = poll, core.batch, core.rng, core.claimant
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._woken: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def stats(self) -> WorkerStats:
        return self.core.stats

    def held_elsewhere(self) -> list[HeldClaims]:
        """Effects this worker could serve that other workers hold now (see
        :meth:`WorkerCore.held_elsewhere`)."""
        return self.core.held_elsewhere()

    def stop(self, *, fast: bool = False) -> None:
        """Stop :meth:`run` (from any thread)."""
        self.core.stop(fast=fast)

    async def run(self, *, handle_signals: bool = False) -> WorkerStats:
        """Work until :meth:`stop` (or a signal, as :meth:`Worker.run` says). Cancelled, it
        gives its claims back (see :meth:`_cancelled`) and lets the cancellation through."""
        try:
            return await self._driven(self.core.working(), handle_signals)
        finally:
            if handle_signals and not asyncio.get_running_loop().is_closed():
                for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
                    asyncio.get_running_loop().remove_signal_handler(signum)

    async def run_until_idle(self) -> WorkerStats:
        """:meth:`Worker.run_until_idle`, on the loop: every effect and timer due now, and
        those their completion makes due. Cancelled, it gives its claims back, as
        :meth:`run` does."""
        return await self._driven(self.core.working(until_idle=True), False)

    # -- answering the core ------------------------------------------------------------

    async def _driven(self, working: Working, handle_signals: bool) -> WorkerStats:
        self._started(handle_signals)
        try:
            return await self._drive(working)
        except asyncio.CancelledError:
            working.close()
            await self._cancelled()
            raise

    def _started(self, handle_signals: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
                self._loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        fast = signum != signal.SIGTERM or self.core.stopping
        log.warning("worker %s: %s, %s shutdown", self.name, signal.Signals(signum).name,
                    "fast" if fast else "graceful")
        self.stop(fast=fast)

    async def _drive(self, working: Working) -> WorkerStats:
        """Answer what the core asks until it returns its stats."""
        woken = self._woken
        assert woken is not None
        while True:
            woken.clear()  # a handler ending after this wakes the next wait
            try:
                need = next(working)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
            if isinstance(need, Start):
                self._launch(need.call)
            elif isinstance(need, Wait):
                await self._sleep(need.seconds)
            elif isinstance(need, Pause):
                end_at = asyncio.get_running_loop().time() + need.seconds
                while not self.core.stopping and (
                        left := end_at - asyncio.get_running_loop().time()) > 0:
                    await self._sleep(left)
                    woken.clear()
            elif isinstance(need, Abandon):
                await self._cancel([self._tasks[c.id] for c in need.calls
                                    if c.id in self._tasks])

    def _launch(self, call: EffectCall) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(call))
        self._tasks[call.id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(call.id, None))

    async def _handle(self, call: EffectCall) -> None:
        effect = self.engine.handlers[call.name]
        timeout = effect.timeout
        outcome: tuple[str, Any]
        try:
            async with asyncio.timeout(timeout) as limit:
                if is_async(effect.handler):
                    answer = await effect.handler(call)  # type: ignore[misc]
                else:
                    answer = await asyncio.to_thread(effect.handler, call)
            outcome = ("ok", answer)
        except TimeoutError as exc:
            outcome = ("error", RetryableError(f"handler timed out after {timeout or 0:g} s")
                       if limit.expired() else exc)
        except Exception as exc:  # the handler's failure is recorded, not raised
            outcome = ("error", exc)
        self.core.handler_ended(call, *outcome)

    async def _sleep(self, limit: float) -> None:
        """Until a handler finishes, a stop, or ``limit`` seconds."""
        woken = self._woken
        assert woken is not None
        try:
            async with asyncio.timeout(limit):
                await woken.wait()
        except TimeoutError:
            pass

    def _wake(self) -> None:
        """End the loop's wait (from the loop's thread or any other)."""
        loop, woken = self._loop, self._woken
        if loop is None or woken is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            woken.set()
        else:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(woken.set)

    def _abandoned(self) -> bool:
        """Whether the loop running this worker's handlers is gone (closed under it)."""
        loop = self._loop
        return loop is not None and loop.is_closed()

    async def _cancel(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    async def _cancelled(self) -> None:
        """The task running this worker was cancelled: the running handlers are cancelled,
        their claims given back as attempts that did not finish, the claims never started
        given back as they were, and the heartbeat stops, so that nothing renews a claim
        whose handler no longer runs. A plain handler's thread cannot be stopped: it runs
        on, unrecorded, while its effect is claimed again."""
        self.core.cancel()
        await self._cancel(list(self._tasks.values()))
        self.core.give_back_all()
        self.core.heartbeat_stopped()
        log.warning("worker %s: cancelled; its claims were given back", self.name)


__all__ = ["AsyncEngine", "AsyncWorker", "DatabaseMode"]
