"""What asyncio adds: coroutine probes awaited concurrently on one loop and cancelled at their
timeout, the database work on a thread pool, coroutine handlers run as tasks by the
AsyncWorker, and a sync and an async worker sharing one outbox. (The engine, freshness and
effects tests run against AsyncEngine and AsyncWorker as well: tests/asyncio_kinds.py.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from lifecycle import (
    AsyncEngine,
    AsyncWorker,
    Effect,
    EffectCall,
    Engine,
    FollowUp,
    ProbeRequest,
    Retry,
    SimulatedClock,
    Store,
    Worker,
)
from lifecycle.errors import StaleObservation, UnknownResource
from lifecycle.outbox_admin import effect_records

RISKY: dict[str, Any] = {
    "name": "job",
    "initial": "booting",
    "final": ["running", "down"],
    "states": ["booting", "running", "cleanup", "down"],
    "transitions": [
        {"trigger": "release", "source": "booting", "dest": "cleanup", "guards": ["booting"],
         "fresh": {"max_age": 30, "probe": "site"}, "effects": ["remove"]},
        {"trigger": "release", "source": "booting", "dest": "running", "guards": ["running"],
         "fresh": {"max_age": 30, "probe": "site"}},
        {"trigger": "removed", "source": "cleanup", "dest": "down"},
    ],
}
GUARDS = {"booting": lambda c: c.status.get("state") != "Running",
          "running": lambda c: c.status.get("state") == "Running"}
WAIT = 60.0
"""Seconds a test waits for an event that must come; only a broken engine waits that long."""


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock("2026-06-01T00:00:00Z")


def test_probes_of_many_fires_are_awaited_at_once(store: Store, clock: SimulatedClock) -> None:
    """Each probe waits until every one of them was asked: only concurrent awaits finish."""
    count = 20
    asked: list[str] = []
    everyone = asyncio.Event()

    async def site(request: ProbeRequest) -> dict[str, Any]:
        asked.append(request.key)
        if len(asked) == count:
            everyone.set()
        await everyone.wait()
        return {"state": "Running" if request.key.endswith("0") else "Booting"}

    engine = AsyncEngine(store, [RISKY], guards=GUARDS, probes={"site": site}, clock=clock,
                         strict=False)

    async def main() -> list[Any]:
        for i in range(count):
            await engine.create("job", f"j{i}")
        async with asyncio.timeout(WAIT):
            return await asyncio.gather(*(engine.fire(f"j{i}", "release")
                                          for i in range(count)))

    results = asyncio.run(main())
    assert sorted(asked) == sorted(f"j{i}" for i in range(count))
    assert all(r.fired and r.probed for r in results)
    assert {r.key: r.dest for r in results}["j10"] == "running"
    assert sum(r.dest == "cleanup" for r in results) == count - 2
    assert engine.engine.verify() == []


def test_a_probe_that_runs_out_of_time_is_cancelled_and_refused(store: Store,
                                                                clock: SimulatedClock) -> None:
    cancelled = threading.Event()

    async def hanging(request: ProbeRequest) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()  # never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    engine = AsyncEngine(store, [RISKY], guards=GUARDS, probes={"site": hanging}, clock=clock,
                         probe_timeout=0.05, strict=False)

    async def main() -> None:
        await engine.create("job", "j")
        with pytest.raises(StaleObservation, match=r"probe site timed out after 0\.05 s"):
            await engine.fire("j", "release")

    asyncio.run(main())
    assert cancelled.is_set()  # nothing of it hangs on
    assert [e.kind for e in engine.engine.history("j")] == ["create", "refusal"]


def test_the_database_work_on_a_thread_pool(store: Store, clock: SimulatedClock) -> None:
    threads: set[str] = set()

    async def site(request: ProbeRequest) -> dict[str, Any]:
        return {"state": "Booting"}

    async def main() -> None:
        async with AsyncEngine(store, [RISKY], guards=GUARDS, probes={"site": site},
                               clock=clock, database="threads", threads=2,
                               strict=False) as engine:
            await engine.create("job", "j")
            result = await engine.fire("j", "release")
            assert result.fired and result.dest == "cleanup" and result.fence is not None
            threads.update(t.name for t in threading.enumerate())
            assert [e.kind for e in await engine.history("j")] == ["create", "transition"]
            assert await engine.verify() == []

    asyncio.run(main())
    assert any(name.startswith("lifecycle-db") for name in threads)


def test_many_at_once_as_the_engine_does(store: Store, clock: SimulatedClock) -> None:
    """observe_many and step_many: the engine's bulk calls, the same batches and
    transactions; step_many's probes are awaited together on the loop itself (an adapter
    bound to its event loop, as TARDIS's are, can be one), not in threads."""
    fresh = {"max_age": 30, "probe": "site"}
    auto = {"name": "auto", "initial": "booting", "final": ["running", "cleanup"],
            "states": ["booting", "running", "cleanup"], "eventless": [
                {"source": "booting", "dest": "cleanup", "guards": ["booting"], "fresh": fresh},
                {"source": "booting", "dest": "running", "guards": ["running"], "fresh": fresh},
            ]}

    loops: list[asyncio.AbstractEventLoop] = []
    both_asked = asyncio.Event()

    async def site(request: ProbeRequest) -> dict[str, Any]:
        loops.append(asyncio.get_running_loop())
        if len(loops) == 2:
            both_asked.set()
        await asyncio.wait_for(both_asked.wait(), 60)  # each waits for the other: at once
        return {"state": "Running" if request.key == "a1" else "Booting"}

    engine = AsyncEngine(store, [auto], guards=GUARDS, probes={"site": site}, clock=clock)

    async def main() -> list[Any]:
        loops.clear()
        for key in ("a1", "a2"):
            await engine.create("auto", key)
        observed = await engine.observe_many([("a2", {"state": "Running"}),
                                              ("nope", {"state": "Booting"})])
        assert isinstance(observed[1], UnknownResource)
        clock.advance(60)  # a2's observation is too old now: the probe is asked for both
        stepped = await engine.step_many(["a1", "a2"])
        assert loops == [asyncio.get_running_loop()] * 2
        return stepped

    stepped = asyncio.run(main())
    assert [(r.dest, r.probed) for r in stepped] == [("running", True), ("cleanup", True)]
    assert [o.source for o in engine.engine.observations("a2")] == ["api", "site"]


def test_the_sync_engine_runs_a_coroutine_probe(store: Store, clock: SimulatedClock) -> None:
    async def site(request: ProbeRequest) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"state": "Running"}

    engine = Engine(store, [RISKY], guards=GUARDS, probes={"site": site}, clock=clock,
                    strict=False)
    engine.create("job", "j")
    assert engine.fire("j", "release").dest == "running"


class _AheadLoop(asyncio.SelectorEventLoop):
    """An event loop whose time (what ``asyncio.timeout`` reads) the test moves forward."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead = 0.0

    def time(self) -> float:
        return super().time() + self.ahead


def test_coroutine_handlers_run_as_tasks_and_time_out(store: Store,
                                                      clock: SimulatedClock) -> None:
    """Handlers of different resources run at once on the loop (each waits for all of them);
    one that hangs is cancelled at its timeout and retried. The timeout is long (no busy
    machine makes the others reach it); once the others returned, the loop's clock is moved
    past it, rather than waited for."""
    count = 6
    timeout = 30.0
    started: list[str] = []
    everyone = asyncio.Event()
    cancelled: list[str] = []
    returned: list[str] = []

    async def remove(call: EffectCall) -> FollowUp:
        started.append(call.key)
        if len(started) == count:
            everyone.set()
        if call.key == "stuck" and call.attempt == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(call.key)
                raise
        await everyone.wait()
        returned.append(call.key)  # no await from here to its end: it is out of its timeout
        return FollowUp("removed")

    async def site(request: ProbeRequest) -> dict[str, Any]:
        return {"state": "Booting"}

    engine = AsyncEngine(store, [RISKY], guards=GUARDS, probes={"site": site}, clock=clock,
                         effects={"remove": Effect(remove, Retry(base=1, jitter=0),
                                                   timeout=timeout)})
    keys = [*(f"j{i}" for i in range(count - 1)), "stuck"]

    async def past_the_timeout(loop: _AheadLoop) -> None:
        while len(returned) < count - 1:
            await asyncio.sleep(0.01)
        loop.ahead += timeout

    async def main() -> None:
        for key in keys:
            await engine.create("job", key)
            await engine.fire(key, "release")
        worker = AsyncWorker(engine, concurrency=count)
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _AheadLoop)
        async with asyncio.timeout(WAIT):
            first, _ = await asyncio.gather(worker.run_until_idle(), past_the_timeout(loop))
        assert (first.done, first.retried) == (count - 1, 1)
        clock.advance(2)  # the retry of the one that hung is due
        async with asyncio.timeout(WAIT):
            assert (await worker.run_until_idle()).done == count

    with asyncio.Runner(loop_factory=_AheadLoop) as runner:
        runner.run(main())
    assert cancelled == ["stuck"]
    assert all(engine.engine.get(key).state == "down" for key in keys)


def test_a_sync_and_an_async_worker_share_one_outbox(store: Store,
                                                     clock: SimulatedClock) -> None:
    ran: list[str] = []
    lock = threading.Lock()

    def remove(call: EffectCall) -> FollowUp:
        with lock:
            ran.append(call.key)
        return FollowUp("removed")

    def site(request: ProbeRequest) -> dict[str, Any]:
        return {"state": "Booting"}

    engine = Engine(store, [RISKY], guards=GUARDS, probes={"site": site}, clock=clock,
                    effects={"remove": remove})
    keys = [f"j{i}" for i in range(40)]
    for key in keys:
        engine.create("job", key)
        engine.fire(key, "release")
    other = Engine(Store(store.url), [RISKY], guards=GUARDS, probes={"site": site},
                   clock=clock, effects={"remove": remove})
    sync_worker = Worker(other, concurrency=2, batch=3)
    thread = threading.Thread(target=sync_worker.run_until_idle)
    thread.start()
    async_worker = AsyncWorker(engine, concurrency=4, batch=3)
    asyncio.run(async_worker.run_until_idle())
    thread.join()
    other.store.dispose()
    assert sorted(ran) == sorted(keys)  # each effect ran once, by one of them
    assert async_worker.stats.done + sync_worker.stats.done == len(keys)
    assert {r.status for r in effect_records(engine)} == {"done"}
    assert all(engine.get(key).state == "down" for key in keys)


def test_a_fast_stop_cancels_the_handlers_and_gives_their_claims_back(
        store: Store, clock: SimulatedClock) -> None:
    started = asyncio.Event()

    async def remove(call: EffectCall) -> None:
        started.set()
        await asyncio.Event().wait()

    def site(request: ProbeRequest) -> dict[str, Any]:
        return {"state": "Booting"}

    engine = Engine(store, [RISKY], guards=GUARDS, probes={"site": site}, clock=clock,
                    effects={"remove": remove})
    engine.create("job", "j")
    engine.fire("j", "release")
    worker = AsyncWorker(engine)

    async def main() -> None:
        running = asyncio.create_task(worker.run())
        async with asyncio.timeout(WAIT):
            await started.wait()
        worker.stop(fast=True)
        async with asyncio.timeout(WAIT):
            await running

    asyncio.run(main())
    [effect] = effect_records(engine)
    assert (effect.status, effect.attempts, effect.claimed_by) == ("pending", 0, None)
