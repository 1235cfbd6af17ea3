"""Section 6 and 7: the asyncio engine against the sync one, in the same run.

6: the cost of one ``AsyncEngine.fire`` against ``Engine.fire`` (the toggle of section 1, no
probe), on SQLite and PostgreSQL. ``inline`` runs the database work on the event loop's own
thread: a fire that asks no probe never suspends, so it is driven as a coroutine without a
loop (``send(None)``), which is exactly what awaiting it inside a running loop costs.
``threads`` runs it on a pool of database threads and must go through the loop for every
call (``run_until_complete``), which the figure includes.

7: wall time of N drones (1,000; ``--quick`` 100) whose risky edge each needs a fresh status
from a probe that takes a second (``--quick`` 0.2 s): the sync ``Engine`` fires them on
threads (each probe in a thread of its own, as the engine asks probes), the ``AsyncEngine``
gathers N coroutines on one loop whose probe awaits ``asyncio.sleep``. The reference is one
such fire alone: the goal is that N finish in about the time of one. What they cannot
share is the database's work (on SQLite one writer at a time): the same N fires with a probe
that answers at once show it, and the difference is what the probes' waiting added. The
sync engine runs at most :data:`THREADS` fires at once: each thread holds one of the store's pooled
connections, so more threads than the pool gives only wait for one (and time out).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sqlalchemy import func, select

from lifecycle import AsyncEngine, Engine, ProbeRequest, Store
from lifecycle.store import journal

from . import toggle
from .harness import Bench, BenchError, Case, Measurement, Workspace

DRONES, QUICK_DRONES = 1000, 100
PROBE_SECONDS, QUICK_PROBE_SECONDS = 1.0, 0.2
ROUNDS, QUICK_ROUNDS = 1, 1
THREADS = 14
"""The sync engine's threads: each holds a connection of the store's pool while it lives,
and SQLAlchemy's pool gives 15 (5 and 10 overflow), one of them the main thread's; more
threads wait for one, then fail."""

# -- 6: one fire ----------------------------------------------------------------------------


@contextmanager
def fire(url: str, kind: str) -> Iterator[Bench]:
    """The toggle's ``flip`` by the sync engine, or by the async engine over it."""
    store = Store(url, upgrade=True)
    loop = asyncio.new_event_loop()
    aio: AsyncEngine | None = None
    try:
        engine = Engine(store, [toggle.spec()])
        engine.create(toggle.MACHINE, toggle.KEY)
        key, trigger = toggle.KEY, toggle.TRIGGER
        if kind == "sync":
            sync_fire = engine.fire

            def op() -> None:
                if not sync_fire(key, trigger):
                    raise BenchError(f"Engine.fire: {trigger} on {key} did not fire")
        elif kind == "inline":
            aio = AsyncEngine.over(engine)
            async_fire = aio.fire

            def op() -> None:
                coroutine = async_fire(key, trigger)
                try:
                    coroutine.send(None)
                except StopIteration as done:
                    if not done.value:
                        raise BenchError("AsyncEngine.fire did not fire") from None
                    return
                coroutine.close()
                raise BenchError("AsyncEngine.fire (inline, no probe) suspended")
        else:
            aio = AsyncEngine.over(engine, database="threads", threads=1)
            threaded_fire = aio.fire

            def op() -> None:
                if not loop.run_until_complete(threaded_fire(key, trigger)):
                    raise BenchError("AsyncEngine.fire (threads) did not fire")

        def verify(n: int) -> None:
            with store.read() as db:
                rows = db.execute(select(func.count()).select_from(journal)).scalar_one()
            if rows != n + 1:
                raise BenchError(f"{kind}: expected {n + 1} journal rows, found {rows}")

        yield Bench(op, verify)
    finally:
        if aio is not None:
            loop.run_until_complete(aio.aclose())
        loop.close()
        store.dispose()


def _cases(db: str, needs: str | None) -> list[Case]:
    def opener(kind: str) -> Callable[[Workspace], Any]:
        if db == "sqlite":
            return lambda ws: fire(f"sqlite:///{ws.sqlite_path(f'aio_{kind}')}", kind)
        return lambda ws: fire(ws.postgres_schema(f"aio_{kind}"), kind)

    return [Case(f"aio.{db}.sync", "Engine.fire", opener("sync"), needs),
            Case(f"aio.{db}.inline", "AsyncEngine.fire, inline database", opener("inline"),
                 needs),
            Case(f"aio.{db}.threads", "AsyncEngine.fire, database thread", opener("threads"),
                 needs)]


CASES = [*_cases("sqlite", None), *_cases("pg", "postgres")]

# -- 7: many drones, each waiting on a slow probe ---------------------------------------------

RISKY: dict[str, Any] = {
    "name": "drone_bench",
    "initial": "booting",
    "final": ["cleanup"],
    "states": ["booting", "cleanup"],
    "transitions": [
        {"trigger": "release", "source": "booting", "dest": "cleanup",
         "guards": ["not_running"], "fresh": {"max_age": 60, "probe": "site"}},
    ],
}
GUARDS = {"not_running": lambda c: c.status.get("resource_status") != "Running"}

DRONE_CASES = {
    "aio.drones.one": "one drone's fire alone (Engine), µs",
    "aio.drones.sync": f"N drones, Engine on {THREADS} threads, µs per batch",
    "aio.drones.async": "N drones, AsyncEngine on one loop, µs per batch",
    "aio.drones.instant": "N drones, AsyncEngine, a probe that answers at once",
}
DRONES_GROUP = [Case(case_id, label, lambda _ws: _nothing())
                for case_id, label in DRONE_CASES.items()]


def _drones(url: str, n: int, probe_seconds: float, kind: str, round_: int) -> float:
    """Seconds for ``n`` fires whose probe each takes ``probe_seconds``."""

    def slow(request: ProbeRequest) -> dict[str, Any]:
        time.sleep(probe_seconds)
        return {"resource_status": "Booting"}

    async def awaited(request: ProbeRequest) -> dict[str, Any]:
        await asyncio.sleep(probe_seconds)
        return {"resource_status": "Booting"}

    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [RISKY], guards=GUARDS, probe_timeout=60 + probe_seconds,
                        probes={"site": awaited if kind == "async" else slow})
        keys = [f"{kind}-{round_}-{i}" for i in range(n)]
        for key in keys:
            engine.create(RISKY["name"], key)
        start = time.perf_counter()
        if kind == "async":
            aio = AsyncEngine.over(engine)

            async def all_of_them() -> list[Any]:
                return await asyncio.gather(*(aio.fire(k, "release") for k in keys))

            results = asyncio.run(all_of_them())
        else:
            with ThreadPoolExecutor(max_workers=min(n, THREADS)) as pool:
                results = list(pool.map(lambda k: engine.fire(k, "release"), keys))
        seconds = time.perf_counter() - start
        missed = [r for r in results if not (r.fired and r.probed)]
        if missed:
            raise BenchError(f"{kind}: {len(missed)} of {n} drones did not fire on a fresh "
                             f"probe: {missed[0]}")
        return seconds
    finally:
        store.dispose()


def run_drones(workspace: Workspace, quick: bool,
               progress: Callable[[str], None]) -> dict[str, Measurement]:
    """Section 7 on SQLite: one fire alone, then N on threads and N on the loop, each round
    in a rotating order."""
    n = QUICK_DRONES if quick else DRONES
    seconds = QUICK_PROBE_SECONDS if quick else PROBE_SECONDS
    rounds = QUICK_ROUNDS if quick else ROUNDS
    results = {case.id: Measurement(case, n) for case in DRONES_GROUP}
    kinds = [("aio.drones.one", "one", 1, seconds), ("aio.drones.sync", "sync", n, seconds),
             ("aio.drones.async", "async", n, seconds), ("aio.drones.instant", "async", n, 0)]
    for round_ in range(rounds):
        for case_id, kind, count, wait in kinds[round_ % 4:] + kinds[:round_ % 4]:
            progress(f"round {round_ + 1}/{rounds}: {results[case_id].case.label}")
            name = case_id.rpartition(".")[2]
            url = f"sqlite:///{workspace.sqlite_path(f'drones_{name}_{round_}')}"
            wall = _drones(url, count, wait, "sync" if kind == "one" else kind, round_)
            results[case_id].samples_us.append(wall * 1e6)
            results[case_id].cpu_samples_us.append(0.0)
    return results


@contextmanager
def _nothing() -> Iterator[Bench]:
    yield Bench(lambda: None)


def note(results: dict[str, Measurement], quick: bool) -> str | None:
    """The drones' figures in seconds, for the table's caption."""
    if not all(case_id in results for case_id in DRONE_CASES):
        return None
    n = QUICK_DRONES if quick else DRONES
    probe = QUICK_PROBE_SECONDS if quick else PROBE_SECONDS
    wall = {case_id: statistics.median(results[case_id].samples_us) / 1e6
            for case_id in DRONE_CASES}
    return (f"Section 7: {n:,} drones whose risky edge awaits a {probe:g} s probe, on SQLite: "
            f"one alone {wall['aio.drones.one']:.2f} s; all on {THREADS} threads (Engine) "
            f"{wall['aio.drones.sync']:.2f} s; all on one loop (AsyncEngine) "
            f"{wall['aio.drones.async']:.2f} s, of which the database work of the "
            f"{n:,} fires (probe, observation, transition: the same with a probe that answers "
            f"at once) {wall['aio.drones.instant']:.2f} s: the probes' wait added "
            f"{wall['aio.drones.async'] - wall['aio.drones.instant']:.2f} s to it "
            "(µs columns: per batch).")


__all__ = ["CASES", "DRONES_GROUP", "note", "run_drones"]
