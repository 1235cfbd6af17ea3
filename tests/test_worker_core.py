"""The worker's core on its own, with no driver: what it asks for (``Start``, ``Wait``,
``Abandon``) is all a driver sees, and a handler's outcome is whatever the test hands back.
No handler runs here: the core does not run them."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
from databases import round_trips
from procs import gated
from sqlalchemy import select, update
from waiting import until

from lifecycle import Effect, Engine, FollowUp, RetryableError, Store
from lifecycle.errors import LostClaim
from lifecycle.outbox_admin import effect_records
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


def _take_over(store: Store, ids: set[int]) -> None:
    """Another worker's claims on ``ids`` now, a later attempt (as after their leases ran
    out)."""
    far = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with store.begin() as db:
        db.execute(update(outbox).where(outbox.c.id.in_(ids)).values(
            claimed_by="thief", attempts=outbox.c.attempts + 1, lease_until=far))


def test_an_outcome_whose_claim_was_lost_writes_nothing(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """Four claims, two of them taken over by another worker before their outcomes are
    recorded together: a follow-up and a done one held, a follow-up and a retry lost. The
    held ones are recorded (the follow-up fired once); of the lost ones nothing is written:
    no transition, the other worker's claim and attempt untouched, no progress saved."""
    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(_never_called, timeout=600.0)})
    for i in range(4):
        engine.create("gated", f"r{i}")
        engine.fire(f"r{i}", "go")
    core = WorkerCore(engine, concurrency=4, lease=600.0, seed=0)
    calls = {call.key: call for call in core.claim(4, [])}
    assert sorted(calls) == ["r0", "r1", "r2", "r3"]
    _take_over(store, {calls["r1"].id, calls["r3"].id})
    calls["r0"].save_progress({"step": 1})
    with pytest.raises(LostClaim):
        calls["r1"].save_progress({"step": 1})
    caplog.set_level(logging.WARNING, logger="lifecycle")
    core.outcome(calls["r0"], "ok", FollowUp("finished"))
    core.outcome(calls["r1"], "ok", FollowUp("finished"))
    core.outcome(calls["r2"], "ok", None)
    core.outcome(calls["r3"], "error", RetryableError("try again"))
    assert core.record()[0] == 4
    assert (core.stats.done, core.stats.retried) == (2, 0)
    assert core.held() == set()
    lost = [r for r in caplog.records if "the claim was lost" in r.getMessage()]
    assert sorted(r.getMessage().split(":")[1].split()[0] for r in lost) == ["r1", "r3"]
    assert {key: engine.get(key).state for key in calls} == {
        "r0": "done", "r1": "working", "r2": "working", "r3": "working"}
    assert [e.trigger for e in engine.history("r0")].count("finished") == 1
    assert "finished" not in [e.trigger for e in engine.history("r1")]
    records = {r.key: r for r in effect_records(engine)}
    assert {k: (r.status, r.attempts, r.claimed_by) for k, r in records.items()} == {
        "r0": ("done", 1, core.name), "r2": ("done", 1, core.name),
        "r1": ("running", 2, "thief"), "r3": ("running", 2, "thief")}
    with store.read() as db:
        progress = dict(db.execute(select(outbox.c.id, outbox.c.progress)).all())
    assert (progress[calls["r0"].id], progress[calls["r1"].id]) == ({"step": 1}, None)
    assert records["r3"].last_error is None
    assert engine.verify() == []
    core.heartbeat_stopped()




def test_recording_costs_two_round_trips_with_a_follow_up_and_one_with_a_claim(
        counted: Any, postgres_url: str) -> None:
    """On PostgreSQL the worker waits for no answer before a COMMIT: an outcome with its
    follow-up fire costs the fire's two round trips (its read; its writes, the outcome's
    fenced one with them, and the COMMIT), and so do three recorded together; outcomes that
    fire nothing recorded with the next claim cost one, the claim's rows read after the
    COMMIT."""
    spec, work = load_spec(gated.SPEC), {"work": Effect(_never_called, timeout=600.0)}
    with Store(postgres_url) as direct:
        made = Engine(direct, [spec], effects=work)
        for i in range(28):
            made.create("gated", f"r{i}")
            made.fire(f"r{i}", "go")
    with Store(counted.url) as store:
        engine = Engine(store, [spec], effects=work)
        core = WorkerCore(engine, concurrency=1, batch=3, lease=600.0, seed=0)

        def follow_up() -> int:
            [call] = core.claim(1, [])
            core.outcome(call, "ok", FollowUp("finished"))
            return round_trips(counted, core.record)

        def done_then_claim() -> int:
            [call] = core.claim(1, [])
            core.outcome(call, "ok", None)
            claimed: list[Any] = []
            trips = round_trips(counted, lambda: claimed.extend(core.record(claim=1)[1]))
            assert len(claimed) == 1
            core.give_back(claimed)
            return trips

        def follow_ups() -> int:  # three outcomes, their three fires in one transaction
            calls = core.claim(3, [])
            assert len(calls) == 3
            for call in calls:
                core.outcome(call, "ok", FollowUp("finished"))
            return round_trips(counted, core.record)

        # psycopg prepares a statement on its sixth run (a round trip), and a busy machine
        # may split what the client sent without waiting into two bursts: never fewer
        # than the client waited for. The fewest of the tries after the warm-up is the
        # count (a regression adds a round trip to every try)
        trips = [(follow_up(), done_then_claim()) for _ in range(10)]
        assert (min(f for f, _ in trips[6:]), min(c for _, c in trips[6:])) == (2, 1), trips
        assert min(follow_ups() for _ in range(2)) == 2
        assert core.stats.done == 26
        assert [engine.get(f"r{i}").state for i in range(28)].count("done") == 16
        assert engine.verify() == []
        core.heartbeat_stopped()


def test_a_follow_up_whose_resource_moved_under_its_batch_is_decided_again(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer moves a resource between the read of a batch of follow-ups and its
    writes (a strict write: the whole transaction fails at the COMMIT, on PostgreSQL): the
    worker decides the batch again on what was written, and records every outcome once,
    each follow-up fired once, the other writer's change kept."""
    from lifecycle.engine import bulk

    spec, work = load_spec(gated.SPEC), {"work": Effect(_never_called, timeout=600.0)}
    with Store(postgres_url) as store, Store(postgres_url) as elsewhere:
        engine = Engine(store, [spec], effects=work)
        other = Engine(elsewhere, [spec], effects=work)
        for key in ("m0", "m1"):
            engine.create("gated", key)
            engine.fire(key, "go")
        core = WorkerCore(engine, concurrency=2, lease=600.0, seed=0)
        calls = core.claim(2, [])
        read = bulk.read_rows
        moved: list[str] = []

        def read_then_move(*args: Any, **kwargs: Any) -> Any:
            rows = read(*args, **kwargs)
            if not moved:  # after the batch's read, before its writes
                moved.append("m1")
                other.update("gated:m1", {"moved": True})
            return rows

        monkeypatch.setattr(bulk, "read_rows", read_then_move)
        for call in calls:
            core.outcome(call, "ok", FollowUp("finished"))
        assert core.record()[0] == 2
        assert moved == ["m1"] and core.stats.done == 2 and core.held() == set()
        for key in ("m0", "m1"):
            assert engine.get(key).state == "done"
            assert [e.trigger for e in engine.history(key)].count("finished") == 1
        assert engine.get("m1").data == {"moved": True}
        assert {(r.status, r.attempts) for r in effect_records(engine)} == {("done", 1)}
        assert engine.verify() == []
        core.heartbeat_stopped()
