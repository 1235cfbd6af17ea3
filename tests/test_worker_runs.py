"""The worker core's runs (``runs=True``, as the thread driver makes it): the effects waiting
handed to a slot many at a time, each started only once ``WorkerCore.starting`` allows it;
and how many effects the core holds, by its handlers' pace. No handler runs here: the test
is the driver, and the core's monotonic clock is the test's, so that nothing waits."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from procs import gated
from sqlalchemy import update
from waiting import until

from lifecycle import Effect, Engine, Store
from lifecycle.outbox_admin import effect_records
from lifecycle.spec import load_spec
from lifecycle.store import outbox
from lifecycle.worker_core import BATCH, Run, Start, Wait, WorkerCore, Working


def _never_called(_call: object) -> None:
    raise AssertionError("the core ran a handler itself")


class _Clock:
    """The core's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _core(store: Store, count: int, *, timeout: float | None = 600.0,
          **options: Any) -> tuple[Engine, WorkerCore, _Clock]:
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(_never_called, timeout=timeout)})
    for i in range(count):
        engine.create("gated", f"c{i:03d}")
        engine.fire(f"c{i:03d}", "go")
    core = WorkerCore(engine, seed=0, runs=True, **options)
    clock = core.monotonic = _Clock()
    return engine, core, clock


def _next_run(working: Working) -> Run:
    """The core's next Run (the waits between answered at once: the test moved the clock)."""
    for _ in range(100):
        need = next(working)
        assert not isinstance(need, Start), "a core with runs hands out runs"
        if isinstance(need, Run):
            return need
    raise AssertionError("the core handed out no run")


def _finish(core: WorkerCore, working: Working) -> None:
    core.stop()
    for need in working:
        assert isinstance(need, Wait), need


def test_a_run_starts_each_handler_on_a_claim_still_held_and_a_hung_one_gives_the_rest_back(
        store: Store) -> None:
    """One slot, four effects: one run of four. Its first handler starts; another worker
    takes the fourth's claim over, and a renewal sees it: the fourth is refused, and left to
    that worker. The second handler hangs past its timeout: the third, never started, goes
    back to the queue and comes again in a new run (the old run's thread may not start it),
    where it runs once. Every effect's record says so."""
    engine, core, clock = _core(store, 4, timeout=5.0, concurrency=1, lease=30.0,
                                heartbeat=0.2)
    working = core.working()
    run = _next_run(working)
    first, second, third, fourth = run.calls
    assert isinstance(next(working), Wait)  # one slot, busy with the run
    assert core.starting(first, run.slot)
    assert core.handler_ended(first, "ok", None, wake=False)
    far = engine.clock.now() + dt.timedelta(hours=1)
    with store.begin() as db:
        db.execute(update(outbox).where(outbox.c.id == fourth.id)
                   .values(claimed_by="thief", lease_until=far))
    until(lambda: fourth.id not in core.held(), "a renewal to find the fourth taken over")
    assert not core.starting(fourth, run.slot)
    assert core.starting(second, run.slot)
    clock.now += 6.0  # the second handler's timeout passes: its thread is written off
    again = _next_run(working)
    assert again.calls == (third,) and again.slot != run.slot
    assert not core.starting(third, run.slot)  # the old run's thread, should it wake
    assert core.starting(third, again.slot)
    assert core.handler_ended(third, "ok", None)
    assert not core.handler_ended(second, "ok", None)  # written off: a late outcome
    _finish(core, working)
    records = {r.key: r for r in effect_records(engine)}
    assert {k: (r.status, r.attempts) for k, r in records.items()} == {
        first.key: ("done", 1), second.key: ("pending", 1), third.key: ("done", 1),
        fourth.key: ("running", 1)}
    assert records[fourth.key].claimed_by == "thief"
    assert "timed out" in (records[second.key].last_error or "")
    assert not core.heartbeat_alive()


def test_a_stop_starts_nothing_more_of_a_run_and_gives_it_back(store: Store) -> None:
    """A graceful stop while a run's first handler runs: the rest of the run is refused
    and given back with its attempts returned; the running one is recorded."""
    engine, core, _clock = _core(store, 3, concurrency=1)
    working = core.working()
    run = _next_run(working)
    assert core.starting(run.calls[0], run.slot)
    core.stop()
    assert not core.starting(run.calls[1], run.slot)
    assert core.handler_ended(run.calls[0], "ok", None)
    assert not core.starting(run.calls[2], run.slot)
    for need in working:
        assert isinstance(need, Wait), need
    records = {r.key: (r.status, r.attempts) for r in effect_records(engine)}
    assert records == {run.calls[0].key: ("done", 1), run.calls[1].key: ("pending", 0),
                       run.calls[2].key: ("pending", 0)}
    assert core.held() == set()


def test_free_slots_share_the_effects_waiting(store: Store) -> None:
    """Three slots, ten effects: three runs, of four, three and three."""
    _engine, core, _clock = _core(store, 10, concurrency=3, batch=10)
    working = core.working()
    runs = [_next_run(working) for _ in range(3)]
    assert [len(r.calls) for r in runs] == [4, 3, 3]
    assert len({c.id for r in runs for c in r.calls}) == 10
    assert isinstance(next(working), Wait)
    for r in runs:
        for call in r.calls:
            assert core.starting(call, r.slot)
            assert core.handler_ended(call, "ok", None, wake=call is r.calls[-1])
    _finish(core, working)
    assert core.stats.done == 10


@pytest.mark.parametrize("seconds", [0.0, 2.0])
def test_short_handlers_are_claimed_many_at_a_time_long_ones_a_batch(
        store: Store, seconds: float) -> None:
    """Handlers that take no time: after a few runs the worker claims far more than a batch
    at a time (and holds no more than ``MOST_HELD``); handlers of two seconds each: a batch."""
    _engine, core, clock = _core(store, 150, concurrency=1)
    working = core.working()
    sizes: list[int] = []
    while sum(sizes) < 150:
        run = _next_run(working)
        sizes.append(len(run.calls))
        for call in run.calls:
            assert core.starting(call, run.slot)
            clock.now += seconds
            assert core.handler_ended(call, "ok", None, wake=call is run.calls[-1])
    _finish(core, working)
    assert sizes[0] == BATCH and core.stats.done == 150
    if seconds:
        assert sizes == [BATCH] * 15
    else:
        assert max(sizes) > 4 * BATCH and core.holding() <= 100


def test_an_explicit_batch_is_the_most_held(store: Store) -> None:
    """``batch=`` given: however short the handlers, no run (no claim) holds more."""
    _engine, core, _clock = _core(store, 60, concurrency=1, batch=7)
    working = core.working()
    sizes = []
    while sum(sizes) < 60:
        run = _next_run(working)
        sizes.append(len(run.calls))
        for call in run.calls:
            assert core.starting(call, run.slot)
            assert core.handler_ended(call, "ok", None, wake=call is run.calls[-1])
    _finish(core, working)
    assert max(sizes) == 7 and core.stats.done == 60


def test_a_worker_holds_no_handler_thread_once_run_until_idle_returns(store: Store) -> None:
    """Its idle handler threads (each with its own database connection) leave before
    run_until_idle returns, not a while later; the next call starts new ones."""
    import threading

    from lifecycle import Worker

    done: list[str] = []
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": lambda call: done.append(call.key)})

    def handler_threads(worker: Worker) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == f"lifecycle-effects-{worker.name}"]

    worker = Worker(engine, concurrency=3, seed=0)
    for round_ in range(2):
        for i in range(12):
            engine.create("gated", f"r{round_}-{i:02d}")
            engine.fire(f"r{round_}-{i:02d}", "go")
        worker.run_until_idle()
        assert handler_threads(worker) == []
        assert sorted(done) == sorted(f"r{r}-{i:02d}" for r in range(round_ + 1) for i in range(12))
