"""The worker's core on its own, with no driver: what it asks for (``Start``, ``Wait``,
``Abandon``) is all a driver sees, and a handler's outcome is whatever the test hands back.
No handler runs here: the core does not run them."""

from __future__ import annotations

import datetime as dt

import pytest
from procs import gated
from sqlalchemy import update
from waiting import until

from lifecycle import Effect, Engine, Store, effect_records
from lifecycle.spec import load_spec
from lifecycle.store import outbox
from lifecycle.worker_core import Abandon, Start, Wait, WorkerCore


def _never_called(_call: object) -> None:
    raise AssertionError("the core ran a handler itself")


def test_the_core_asks_its_driver_and_a_fast_stop_abandons_what_runs(store: Store) -> None:
    """Two slots, three effects: two starts, then a wait; one outcome handed back frees a
    slot for the third; a fast stop abandons the two running, records the finished one and
    gives the others back with their attempts returned; the heartbeat is gone."""
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(_never_called, timeout=600.0)})
    for i in range(3):
        engine.create("gated", f"c{i}")
        engine.fire(f"c{i}", "go")
    core = WorkerCore(engine, concurrency=2, seed=0)
    working = core.working()
    first, second = next(working), next(working)
    assert isinstance(first, Start) and isinstance(second, Start)
    assert isinstance(next(working), Wait)  # both slots busy, nothing ended
    assert core.handler_ended(first.call, "ok", None)
    third = next(working)
    assert isinstance(third, Start)
    assert {first.call.key, second.call.key, third.call.key} == {"c0", "c1", "c2"}
    core.stop(fast=True)
    abandon = next(working)
    assert isinstance(abandon, Abandon)
    assert {c.key for c in abandon.calls} == {second.call.key, third.call.key}
    with pytest.raises(StopIteration) as end:
        next(working)
    assert end.value.value.done == 1
    # an abandoned handler's late outcome is not wanted
    assert not core.handler_ended(second.call, "ok", None)
    records = {r.key: r for r in effect_records(engine)}
    assert (records[first.call.key].status, records[first.call.key].attempts) == ("done", 1)
    for call in (second.call, third.call):
        record = records[call.key]
        assert (record.status, record.attempts, record.claimed_by) == ("pending", 0, None)
    assert not core.heartbeat_alive() and core.held() == set()


def test_claims_a_renewal_finds_taken_over_are_never_started(store: Store) -> None:
    """One slot, three effects: the first starts, two wait in the queue; another worker
    takes those two over (their rows say so, with a lease far ahead); once a renewal has
    seen it, the core starts neither, takes them out of its queue and lets them be (no
    give-back undoes the other's claim), and goes on with new work."""
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(_never_called, timeout=600.0)})
    for i in range(3):
        engine.create("gated", f"c{i}")
        engine.fire(f"c{i}", "go")
    core = WorkerCore(engine, concurrency=1, lease=3.0, heartbeat=0.2, seed=0)
    working = core.working()
    first = next(working)
    assert isinstance(first, Start)
    assert isinstance(next(working), Wait)
    taken = core.held() - {first.call.id}
    assert len(taken) == 2
    far = engine.clock.now() + dt.timedelta(hours=1)
    with store.begin() as db:
        db.execute(update(outbox).where(outbox.c.id.in_(taken))
                   .values(claimed_by="thief", lease_until=far))
    until(lambda: core.held() == {first.call.id}, "a renewal to find the two taken over")
    engine.create("gated", "c3")
    engine.fire("c3", "go")
    assert core.handler_ended(first.call, "ok", None)
    started = []
    while not isinstance(need := next(working), Wait):
        if isinstance(need, Start):
            started.append(need.call.key)
            assert core.handler_ended(need.call, "ok", None)
    assert started == ["c3"]
    core.stop()
    for _ in working:
        pass
    records = {r.key: r for r in effect_records(engine)}
    assert {k: r.status for k, r in records.items()} == {
        first.call.key: "done", "c3": "done",
        **{k: "running" for k, r in records.items() if r.id in taken}}
    assert {records[k].claimed_by for k in records if records[k].id in taken} == {"thief"}
    assert not core.heartbeat_alive()
