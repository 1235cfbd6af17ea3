"""The outbox: effects written with their transition, run in order per resource, retried
with backoff, failed for good into a declared state or a stuck mark; timers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncio_kinds import KINDS, closing, engine_of, worker_of
from sqlalchemy import select

from lifecycle import (
    Effect,
    EffectCall,
    Engine,
    FollowUp,
    PermanentError,
    Retry,
    SimulatedClock,
    Store,
    Worker,
)
from lifecycle.file_writes import atomic_write, verified_append
from lifecycle.outbox_admin import effect_records, retry_failed, timer_records
from lifecycle.store import outbox

CHAIN: dict[str, Any] = {
    "name": "chain",
    "initial": "new",
    "final": ["done", "broken"],
    "states": ["new", "first", "second", "third", "done", "broken"],
    "transitions": [
        {"trigger": "go", "source": "new", "dest": "first", "effects": ["a"]},
        {"trigger": "a_done", "source": "first", "dest": "second",
         "effects": ["b", {"name": "c", "args": {"greeting": "hi"}, "on_failure": "give_up"}]},
        {"trigger": "c_done", "source": "second", "dest": "third"},
        {"trigger": "finish", "source": "third", "dest": "done"},
        {"trigger": "give_up", "source": "*", "dest": "broken"},
    ],
}


class Recorder:
    """Handlers that log their calls (with the thread's view of time) and can be told to
    fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.failures: dict[str, list[BaseException]] = {}
        self.lock = threading.Lock()
        self.running: dict[str, str] = {}
        self.overlaps: list[str] = []

    def handler(self, name: str, follow: str | None) -> Any:
        def run(call: EffectCall) -> FollowUp | None:
            with self.lock:
                if call.key in self.running:
                    self.overlaps.append(f"{call.key}: {name} began during "
                                         f"{self.running[call.key]}")
                self.running[call.key] = name
                self.calls.append((name, call.key, call.attempt))
            try:
                time.sleep(0.001)
                pending = self.failures.get(name)
                if pending:
                    raise pending.pop(0)
                return FollowUp(follow) if follow else None
            finally:
                with self.lock:
                    self.running.pop(call.key, None)

        return run


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock("2026-05-01T00:00:00Z")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(params=KINDS)
def engine(store: Store, clock: SimulatedClock, recorder: Recorder,
           request: pytest.FixtureRequest) -> Iterator[Any]:
    """The Engine and Worker, and the same driven as AsyncEngine and AsyncWorker."""
    effects = {
        "a": recorder.handler("a", "a_done"),
        "b": Effect(recorder.handler("b", None), Retry(max_attempts=3, base=10, jitter=0)),
        "c": Effect(recorder.handler("c", "c_done"), Retry(max_attempts=2, base=5, jitter=0)),
    }
    engine = engine_of(request.param, store, [CHAIN], effects=effects, clock=clock)
    yield engine
    closing(engine)()


def test_effects_are_written_with_their_transition(engine: Engine) -> None:
    engine.create("chain", "r1")
    assert effect_records(engine) == []
    result = engine.fire("r1", "go")
    [effect] = effect_records(engine)
    assert (effect.name, effect.status, effect.attempts, effect.seq) == ("a", "pending", 0, 2)
    assert effect.idempotency_key == "chain:r1:2:0:a" and result.seq == 2
    assert not engine.fire("r1", "finish")  # refused: nothing asked for
    assert len(effect_records(engine)) == 1


def test_a_chain_runs_in_order_and_follow_ups_fire(engine: Engine, recorder: Recorder) -> None:
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    stats = worker_of(engine).run_until_idle()
    assert [c[0] for c in recorder.calls] == ["a", "b", "c"]
    assert engine.get("r1").state == "third"
    assert (stats.done, stats.retried, stats.failed) == (3, 0, 0)
    entries = engine.history("r1")
    assert [(e.trigger, e.actor) for e in entries[2:]] == [("a_done", "effect:a"),
                                                            ("c_done", "effect:c")]
    assert all(e.status == "done" for e in effect_records(engine))
    assert engine.verify() == []


def test_effects_of_one_resource_never_overlap(engine: Engine, recorder: Recorder) -> None:
    for i in range(12):
        engine.create("chain", f"r{i}")
        engine.fire(f"r{i}", "go")
    worker_of(engine, concurrency=4).run_until_idle()
    assert recorder.overlaps == []
    for i in range(12):
        assert [c[0] for c in recorder.calls if c[1] == f"r{i}"] == ["a", "b", "c"]
        assert engine.get(f"r{i}").state == "third"


def test_backoff_with_a_simulated_clock(engine: Engine, clock: SimulatedClock,
                                        recorder: Recorder) -> None:
    recorder.failures["b"] = [RuntimeError("schedd down"), RuntimeError("schedd down")]
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    worker = worker_of(engine)
    worker.run_until_idle()
    [_, b, c] = effect_records(engine)
    assert (b.status, b.attempts, b.last_error) == ("pending", 1, "RuntimeError: schedd down")
    assert b.next_attempt_at == clock.now() + __import__("datetime").timedelta(seconds=10)
    assert c.status == "pending" and c.attempts == 0  # waits behind b
    clock.advance(9.9)
    worker.run_until_idle()
    assert effect_records(engine)[1].attempts == 1  # not due yet: nobody slept
    clock.advance(0.1)
    worker.run_until_idle()
    b = effect_records(engine)[1]
    assert (b.attempts, (b.next_attempt_at - clock.now()).total_seconds()) == (2, 20)
    clock.advance(20)
    worker.run_until_idle()
    assert [e.status for e in effect_records(engine)] == ["done", "done", "done"]
    assert engine.get("r1").state == "third"


def test_jitter_is_reproducible_and_bounded() -> None:
    import random

    retry = Retry(base=2, cap=60, jitter=0.5)
    delays = [retry.delay(n, random.Random(7)) for n in range(1, 9)]
    assert delays == [retry.delay(n, random.Random(7)) for n in range(1, 9)]
    for n, delay in enumerate(delays, start=1):
        raw = min(60, 2 * 2 ** (n - 1))
        assert raw * 0.5 <= delay <= raw


def test_failed_for_good_fires_on_failure(engine: Engine, clock: SimulatedClock,
                                          recorder: Recorder) -> None:
    recorder.failures["c"] = [RuntimeError("smtp refused")] * 2
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    worker = worker_of(engine)
    worker.run_until_idle()
    clock.advance(5)
    worker.run_until_idle()
    assert engine.get("r1").state == "broken"
    last = engine.history("r1")[-1]
    assert (last.trigger, last.actor, last.payload) == (
        "give_up", "effect:c", {"effect": "c", "error": "RuntimeError: smtp refused"})
    assert effect_records(engine)[-1].status == "failed"


def test_failed_for_good_without_on_failure_is_stuck_until_retried(
        engine: Engine, clock: SimulatedClock, recorder: Recorder) -> None:
    recorder.failures["b"] = [PermanentError("disk full")]
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    worker = worker_of(engine)
    worker.run_until_idle()
    [_, b, c] = effect_records(engine)
    assert (b.status, b.attempts, b.last_error) == ("failed", 1, "PermanentError: disk full")
    assert c.status == "pending"
    clock.advance(3600)
    worker.run_until_idle()
    assert effect_records(engine)[2].status == "pending"  # c waits behind the stuck b
    assert [r.key for r in effect_records(engine, statuses=("failed",))] == ["r1"]
    assert retry_failed(engine, "r1") == 1
    worker.run_until_idle()
    assert [e.status for e in effect_records(engine)] == ["done", "done", "done"]
    assert [c[0] for c in recorder.calls] == ["a", "b", "b", "c"]


RESCUE: dict[str, Any] = {
    "name": "rescue",
    "initial": "new",
    "final": ["broken"],
    "states": ["new", "working", "broken"],
    "transitions": [
        {"trigger": "go", "source": "new", "dest": "working",
         "effects": [{"name": "flaky", "on_failure": "give_up"}, "tidy"]},
        {"trigger": "give_up", "source": "working", "dest": "broken", "effects": ["report"]},
    ],
}


@pytest.mark.parametrize("kind", KINDS)
def test_an_on_failure_that_asks_for_effects_lets_the_queue_go_on(
        store: Store, clock: SimulatedClock, kind: str) -> None:
    """The machine went another way (a drone whose deploy failed for good goes down and
    releases its demand): the failed effect is given up on, the effects behind it and those
    its ``on_failure`` transition asked for run, and nothing is left stuck or to retry."""
    ran: list[str] = []

    def flaky(call: EffectCall) -> None:
        ran.append("flaky")
        raise PermanentError("the site said no")

    engine = engine_of(kind, store, [RESCUE], clock=clock, effects={
        "flaky": flaky, "tidy": lambda call: ran.append("tidy"),
        "report": lambda call: ran.append("report")})
    try:
        engine.create("rescue", "r1")
        engine.fire("r1", "go")
        worker_of(engine).run_until_idle()
        assert engine.get("r1").state == "broken"
        assert ran == ["flaky", "tidy", "report"]
        assert [(e.name, e.status, e.last_error) for e in effect_records(engine)] == [
            ("flaky", "gave_up", "PermanentError: the site said no"), ("tidy", "done", None),
            ("report", "done", None)]
        assert effect_records(engine, statuses=("failed",)) == []
        assert retry_failed(engine, "r1") == 0
    finally:
        closing(engine)()


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_on_failure_is_logged_as_refused_and_the_resource_is_stuck(
        store: Store, clock: SimulatedClock, recorder: Recorder, kind: str,
        caplog: pytest.LogCaptureFixture) -> None:
    spec = {**CHAIN, "transitions": [
        *CHAIN["transitions"][:-1],
        {"trigger": "give_up", "source": "second", "dest": "broken"}]}
    engine = engine_of(kind, store, [spec], clock=clock, effects={
        name: recorder.handler(name, follow)
        for name, follow in (("a", "a_done"), ("b", None), ("c", "c_done"))})
    try:
        recorder.failures["c"] = [PermanentError("smtp refused")]
        engine.create("chain", "r1")
        engine.fire("r1", "go")
        worker = worker_of(engine)
        worker.run_until_idle()  # a, then b; c fails for good, give_up fires
        assert engine.get("r1").state == "broken"
        assert "fired give_up" in caplog.text
        caplog.clear()
        recorder.failures["c"] = [PermanentError("smtp refused")]
        assert retry_failed(engine, "r1") == 1
        worker.run_until_idle()  # c fails again; give_up does not leave broken
        assert "its on_failure give_up was refused" in caplog.text
        assert "stuck until `lifecycle retry chain:r1`" in caplog.text
        assert [e.status for e in effect_records(engine)] == ["done", "done", "failed"]
    finally:
        closing(engine)()


def test_a_worker_claims_only_what_it_has_handlers_for(store: Store,
                                                       clock: SimulatedClock) -> None:
    calls: list[str] = []
    engine = Engine(store, [CHAIN], effects={n: lambda c: None for n in "abc"}, clock=clock)
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    mailer = Engine(Store(store.url), clock=clock, effects={
        "c": lambda c: calls.append("c")})  # another service, with another handler
    Worker(mailer).run_until_idle()
    assert calls == [] and effect_records(engine)[0].status == "pending"
    worker_of(engine).run_until_idle()
    assert effect_records(engine)[0].status == "done"


def test_a_handler_that_hangs_times_out_and_is_retried(store: Store,
                                                       clock: SimulatedClock) -> None:
    release = threading.Event()
    attempts: list[int] = []

    def hang_once(call: EffectCall) -> FollowUp:
        attempts.append(call.attempt)
        if call.attempt == 1:
            release.wait(300)
        return FollowUp("a_done")

    engine = Engine(store, [CHAIN], clock=clock, effects={
        "a": Effect(hang_once, Retry(base=1, jitter=0), timeout=0.2),
        "b": lambda c: None, "c": lambda c: None})
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    worker = worker_of(engine)
    worker.run_until_idle()  # returns without waiting for the hung handler
    assert not release.is_set() and attempts == [1]
    a = effect_records(engine)[0]
    assert (a.status, a.last_error) == ("pending", "RetryableError: handler timed out after 0.2 s")
    clock.advance(1)
    worker.run_until_idle()
    release.set()
    assert attempts == [1, 2] and engine.get("r1").state != "first"


def test_an_expired_lease_is_claimed_again(engine: Engine, clock: SimulatedClock,
                                           recorder: Recorder) -> None:
    engine.create("chain", "r1")
    engine.fire("r1", "go")
    dead = worker_of(engine, lease=60, name="dead-worker")
    [claimed] = dead.core.claim(1, [])
    assert effect_records(engine)[0].status == "running"
    alive = worker_of(engine, name="alive-worker")
    alive.run_until_idle()
    assert recorder.calls == []  # the lease still holds
    clock.advance(61)
    alive.run_until_idle()
    assert [c[0] for c in recorder.calls] == ["a", "b", "c"]
    assert recorder.calls[0][2] == 2  # the second attempt
    # the dead worker's late answer is refused: it no longer holds the claim
    dead.core.outcome(claimed, "ok", FollowUp("a_done"))
    dead.core.record()
    assert engine.get("r1").state == "third"
    assert [e.trigger for e in engine.history("r1")].count("a_done") == 1


# -- timers -------------------------------------------------------------------------------

SLOT: dict[str, Any] = {
    "name": "slot",
    "initial": "unclaimed",
    "states": [
        "unclaimed",
        {"name": "matched", "timeout": {"after": 120, "trigger": "match_timeout"}},
        {"name": "claimed", "timeout": {"after": "lease", "trigger": "lease_expired"},
         "initial": "idle", "states": ["idle", "busy"]},
    ],
    "transitions": [
        {"trigger": "match", "source": "unclaimed", "dest": "matched"},
        {"trigger": "match_timeout", "source": "matched", "dest": "unclaimed"},
        {"trigger": "claim", "source": "matched", "dest": "claimed"},
        {"trigger": "activate", "source": "claimed.idle", "dest": "claimed.busy"},
        {"trigger": "deactivate", "source": "claimed.busy", "dest": "claimed.idle"},
        {"trigger": "renew", "source": "claimed", "dest": "claimed"},
        {"trigger": "lease_expired", "source": "claimed", "dest": "unclaimed",
         "guards": ["lease_not_renewed"]},
        {"trigger": "release", "source": "claimed", "dest": "unclaimed"},
    ],
}


@pytest.fixture
def slots(store: Store, clock: SimulatedClock) -> Engine:
    return Engine(store, [SLOT], clock=clock,
                  guards={"lease_not_renewed": lambda c: not c.data.get("pinned")})


def test_timer_fires_when_due(slots: Engine, clock: SimulatedClock) -> None:
    slots.create("slot", "s1")
    slots.fire("s1", "match")
    [timer] = timer_records(slots, "s1")
    assert (timer.state, timer.trigger, timer.status, timer.seq) == (
        "matched", "match_timeout", "pending", 2)
    assert timer.due_at == clock.now() + __import__("datetime").timedelta(seconds=120)
    worker = worker_of(slots)
    clock.advance(119)
    worker.run_until_idle()
    assert slots.get("s1").state == "matched"
    clock.advance(1)
    worker.run_until_idle()
    assert slots.get("s1").state == "unclaimed"
    assert slots.history("s1")[-1].actor == "timer"
    assert timer_records(slots, "s1")[0].status == "fired"


def test_timer_of_a_state_left_is_a_no_op(slots: Engine, clock: SimulatedClock) -> None:
    slots.create("slot", "s1", {"lease": 600})
    slots.fire("s1", "match")
    slots.fire("s1", "claim")
    clock.advance(200)
    worker_of(slots).run_until_idle()
    assert slots.get("s1").state == "claimed.idle"
    statuses = {t.state: t.status for t in timer_records(slots, "s1")}
    assert statuses == {"matched": "cancelled", "claimed": "pending"}


def test_moving_inside_a_composite_state_keeps_its_timer(slots: Engine,
                                                         clock: SimulatedClock) -> None:
    slots.create("slot", "s1", {"lease": 600})
    slots.fire("s1", "match")
    slots.fire("s1", "claim")
    slots.fire("s1", "activate")
    slots.fire("s1", "deactivate")
    assert [t.status for t in timer_records(slots, "s1") if t.state == "claimed"] == ["pending"]
    slots.fire("s1", "renew")  # re-entering the state starts a new visit and a new timer
    claimed = [t for t in timer_records(slots, "s1") if t.state == "claimed"]
    assert [t.status for t in claimed] == ["cancelled", "pending"]
    clock.advance(600)
    worker_of(slots).run_until_idle()
    assert slots.get("s1").state == "unclaimed"


def test_timer_from_a_data_field_and_refused_by_a_guard(slots: Engine,
                                                        clock: SimulatedClock) -> None:
    slots.create("slot", "s1", {"lease": 30, "pinned": True})
    slots.fire("s1", "match")
    slots.fire("s1", "claim")
    clock.advance(30)
    worker_of(slots).run_until_idle()
    assert slots.get("s1").state == "claimed.idle"
    timer = next(t for t in timer_records(slots, "s1") if t.state == "claimed")
    assert (timer.status, timer.outcome) == ("refused", "guard 'lease_not_renewed' is false")
    with pytest.raises(Exception, match="reads data field 'lease'"):
        slots.create("slot", "s2", {"lease": "soon"}, state="claimed")


def test_timers_survive_a_restart(slots: Engine, store: Store, clock: SimulatedClock) -> None:
    slots.create("slot", "s1")
    slots.fire("s1", "match")
    restarted = Engine(Store(store.url), [SLOT], clock=clock,
                       guards={"lease_not_renewed": lambda c: True})
    clock.advance(121)
    stats = Worker(restarted).run_until_idle()
    assert stats.timers_fired == 1
    assert restarted.get("s1").state == "unclaimed"


def test_timeout_validation() -> None:
    from lifecycle import load_spec
    from lifecycle.errors import SpecError

    bad = {**SLOT, "states": [
        "unclaimed", {"name": "matched", "timeout": {"after": 120, "trigger": "nope"}},
        {"name": "claimed", "initial": "idle", "states": ["idle", "busy"]}]}
    with pytest.raises(SpecError, match=r"states\[1\]\.timeout\.trigger: no transition for "
                                        r"'nope' leaves 'matched'"):
        load_spec(bad)


# -- building blocks for idempotent handlers --------------------------------------------------


class FakeCall:
    def __init__(self) -> None:
        self.progress: dict[str, Any] = {}
        self.saved = 0

    def save_progress(self, values: dict[str, Any]) -> None:
        self.progress.update(values)
        self.saved += 1


def test_verified_append_is_exactly_once(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"000 earlier event\n...\n")
    call = FakeCall()
    record = b"005 (042.000.000) 2026-05-01T00:00:00 Job terminated.\n...\n"
    assert verified_append(call, log, record) is True  # type: ignore[arg-type]
    assert verified_append(call, log, record) is False  # type: ignore[arg-type]
    # another job appends to the shared log; the retry still finds ours
    with open(log, "ab") as handle:
        handle.write(b"001 (043.000.000) other\n...\n")
    assert verified_append(call, log, record) is False  # type: ignore[arg-type]
    assert log.read_bytes().count(record) == 1


def test_verified_append_repairs_a_torn_record(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"header\n")
    call = FakeCall()
    record = b"005 (042.000.000) Job terminated.\n...\n"
    call.progress["append:" + str(log)] = len(b"header\n")
    with open(log, "ab") as handle:  # a crash in the middle of the write
        handle.write(record[:10])
    assert verified_append(call, log, record) is True  # type: ignore[arg-type]
    assert log.read_bytes() == b"header\n" + record


def test_atomic_write(tmp_path: Path) -> None:
    target = tmp_path / "job.ad"
    atomic_write(target, b"ClusterId = 42\n")
    atomic_write(target, b"ClusterId = 43\n")
    assert target.read_bytes() == b"ClusterId = 43\n"
    assert [p.name for p in tmp_path.iterdir()] == ["job.ad"]


def test_entry_effects_run_on_every_entry_and_on_creation(store: Store,
                                                          clock: SimulatedClock) -> None:
    calls: list[tuple[str, str, int]] = []
    spec = {
        "name": "pilot", "initial": "request", "final": ["down"],
        "states": [{"name": "request", "effects": ["deploy"]},
                   {"name": "cleanup", "effects": [{"name": "terminate", "args": {"how": "rm"}}]},
                   "booting", "down"],
        "transitions": [
            {"trigger": "deployed", "source": "request", "dest": "booting"},
            {"trigger": "release", "source": "booting", "dest": "cleanup", "effects": ["note"]},
            {"trigger": "again", "source": "cleanup", "dest": "cleanup"},
            {"trigger": "gone", "source": "cleanup", "dest": "down"}]}

    def record(name: str, follow: str | None = None) -> Any:
        def run(call: EffectCall) -> FollowUp | None:
            calls.append((name, call.key, call.seq))
            return FollowUp(follow) if follow else None
        return run

    engine = Engine(store, [spec], clock=clock, effects={
        "deploy": record("deploy", "deployed"), "terminate": record("terminate"),
        "note": record("note")})
    engine.create("pilot", "p1")
    worker_of(engine).run_until_idle()
    engine.fire("p1", "release")
    engine.fire("p1", "again")  # re-entering cleanup asks again
    worker_of(engine).run_until_idle()
    assert calls == [("deploy", "p1", 1), ("note", "p1", 3), ("terminate", "p1", 3),
                     ("terminate", "p1", 4)]
    assert [e.idempotency_key for e in effect_records(engine)][1:3] == [
        "pilot:p1:3:0:note", "pilot:p1:3:1:terminate"]


TOCK: dict[str, Any] = {
    "name": "tock", "initial": "a", "states": ["a", "b"],
    "transitions": [{"trigger": "tock", "source": "a", "dest": "b", "effects": ["e"]},
                    {"trigger": "tock", "source": "b", "dest": "a", "effects": ["e"]}],
}


def _heads(store: Store) -> list[tuple[int, str]]:
    with store.read() as db:
        return [(r.id, r.status) for r in db.execute(
            select(outbox.c.id, outbox.c.status).where(outbox.c.head == 1)).all()]


def test_an_effect_asked_for_while_its_predecessor_is_recorded_done_can_run(
        store: Store) -> None:
    """The queue head passes from a finished effect to the next under the resource's lock:
    a transition asking for an effect while the worker records its predecessor done waits
    for that record, then finds nothing open and makes its effect the head (without the
    lock, each would miss the other's uncommitted row, and the new effect would never
    run)."""
    engine = Engine(store, [TOCK], effects={"e": lambda c: None})
    engine.create("tock", "t1")
    engine.fire("t1", "tock")
    [(first, _)] = _heads(store)
    worker = worker_of(engine)
    [call] = worker.core.claim(1, [])
    other = threading.Thread(target=engine.fire, args=("t1", "tock"))
    with store.write() as cursor:
        worker.core.mark(cursor, call, "done", None)  # recorded, not committed yet
        other.start()
        other.join(1.0)  # it waits for the lock (were there none, it would commit now)
    other.join(60)
    assert not other.is_alive()
    [(second, status)] = _heads(store)
    assert second > first and status == "pending"
    assert worker_of(engine).run_until_idle().done == 1
    assert _heads(store) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_follow_ups_writes_that_raise_fail_their_effect_not_the_batch(
        store: Store, clock: SimulatedClock, kind: str) -> None:
    """Six effects finish together and are recorded in one batch of fires; the writes of
    two of them raise: those two are rescheduled (their transition not fired), the other
    four are done with their follow-ups fired, each once."""
    bad = {"r1", "r4"}

    def writes(call: EffectCall) -> Any:
        def write(tx: Any) -> None:
            if call.key in bad:
                raise ValueError(f"cannot write {call.key}")
        return write

    def a(call: EffectCall) -> FollowUp:
        return FollowUp("a_done", writes=writes(call))

    engine = engine_of(kind, store, [CHAIN], clock=clock, effects={
        "a": Effect(a, Retry(max_attempts=3, base=60, jitter=0)),
        "b": lambda c: None, "c": lambda c: FollowUp("c_done")})
    try:
        keys = [f"r{i}" for i in range(6)]
        for key in keys:
            engine.create("chain", key)
            engine.fire(key, "go")
        stats = worker_of(engine, concurrency=6).run_until_idle()
        assert stats.retried == 2
        for key in keys:
            a_done = [e.trigger for e in engine.history(key)].count("a_done")
            assert (engine.get(key).state, a_done) == (
                ("first", 0) if key in bad else ("third", 1)), key
        failed = {r.key: r for r in effect_records(engine) if r.name == "a"}
        assert {k for k, r in failed.items() if r.status == "pending"} == bad
        assert all("ValueError: cannot write" in (failed[k].last_error or "") for k in bad)
        assert engine.verify() == []
    finally:
        closing(engine)()
