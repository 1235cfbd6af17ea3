"""The slurm_dispatch machine: its cancel path on a simulated clock (delay A, delay B and its
backoff, the freshness rule, the log throttle), the limits under a thousand simultaneous
finishes, the adapter's parsing, and the whole path on a real single-node Slurm (see
tests/slurm_cluster.py; skipped without the Slurm binaries or root, unless
LIFECYCLE_REQUIRE_SLURM=1)."""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lifecycle import Engine, SimulatedClock, Store, Worker
from lifecycle.adapters.container_api import MemoryContainerAPI
from lifecycle.adapters.sites import SiteError
from lifecycle.adapters.slurm import run_command
from lifecycle.adapters.slurm_dispatch import (
    CANCEL_STEPS,
    CancelOutcome,
    Listing,
    QueueEntry,
    ScancelRate,
    SlurmDispatch,
    cancel_step,
    parse_squeue,
    parse_squeue_json,
)
from lifecycle.machines import slurm_dispatch as sd
from lifecycle.sim import scancel_flood

START = "2026-01-01T00:00:00Z"


# -- a Slurm in memory, on the simulated clock ------------------------------------------------


@dataclass
class FakeSlurm:
    """Jobs listed while ``listed`` holds them (by container name, each with the job id
    :meth:`job_id` gives it); records each scancel with its time. A scancel acts while the
    job is listed in the state its step is for."""

    clock: SimulatedClock
    listed: dict[str, str] = field(default_factory=dict)
    cancels: list[tuple[str, float]] = field(default_factory=list)
    calls: list[tuple[str, tuple[int, ...], float]] = field(default_factory=list)
    """Every cancel call with its steps."""
    exit_codes: list[int] = field(default_factory=list)
    renices: list[tuple[str, int]] = field(default_factory=list)
    before_answer: Callable[[], None] | None = None
    entries: dict[str, QueueEntry] = field(default_factory=dict)
    per_second: float | None = None

    def __post_init__(self) -> None:
        self.rate = ScancelRate(self.per_second, self.clock)
        self.start = self.clock.now()
        self.ids: dict[str, str] = {}

    def elapsed(self) -> float:
        return (self.clock.now() - self.start).total_seconds()

    def job_id(self, name: str) -> str:
        return self.ids.setdefault(name, str(1000 + len(self.ids)))

    def name(self, job_id: str) -> str:
        return next(n for n, i in self.ids.items() if i == job_id)

    def submit(self, name: str) -> str:
        self.listed[name] = "PENDING"
        return self.job_id(name)

    def queue(self) -> Listing:
        answer = {self.job_id(n): self.entries.get(
            n, QueueEntry(self.job_id(n), n, 10000, 1, s, "None"))
            for n, s in self.listed.items()}
        if self.before_answer is not None:
            self.before_answer()
        return Listing(answer)

    def cancel(self, job_id: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        """Each scancel is recorded in ``cancels`` and ``calls`` (with its steps)."""
        name = self.name(job_id)
        self.calls.append((name, tuple(steps), self.elapsed()))
        self.cancels.append((name, self.elapsed()))
        code = self.exit_codes.pop(0) if self.exit_codes else 0
        acted = code == 0 and name in self.listed and cancel_step(self.listed[name]) in steps
        return CancelOutcome(code, 1, f"exit {code}", acted=acted)

    def renice(self, job_id: str, nice: int) -> None:
        self.renices.append((self.name(job_id), nice))


def add(dispatcher: sd.Dispatcher, name: str, **data: Any) -> Any:
    """A container whose job ``dispatcher``'s fake Slurm knows by its id."""
    slurm = dispatcher.slurm
    assert isinstance(slurm, FakeSlurm)
    return dispatcher.add(name, job_id=slurm.job_id(name), **data)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'dispatch.db'}", upgrade=True)
    yield store
    store.dispose()


def machine(store: Store, settings: sd.Settings, api: Any = None, **fake: Any) -> tuple[
        Engine, Worker, sd.Dispatcher, FakeSlurm, SimulatedClock]:
    clock = SimulatedClock(START)
    slurm = FakeSlurm(clock, **fake)
    engine = Engine(store, [sd.SPEC], guards=sd.GUARDS,
                    effects=sd.effects(slurm, api or MemoryContainerAPI()), clock=clock)
    return engine, Worker(engine), sd.Dispatcher(engine, slurm, settings), slurm, clock


def tick(clock: SimulatedClock, worker: Worker, dispatcher: sd.Dispatcher, seconds: float,
         *, poll_every: float) -> None:
    """``seconds`` of simulated time in steps of 0.5 s: timers and effects at each step, a
    poll at every multiple of ``poll_every`` seconds since the start."""
    start = SimulatedClock(START).now()
    per_poll = round(poll_every / 0.5)
    for _ in range(round(seconds / 0.5)):
        clock.advance(0.5)
        worker.run_until_idle()
        if round((clock.now() - start).total_seconds() / 0.5) % per_poll == 0:
            dispatcher.poll()
            worker.run_until_idle()


# -- the cancel path on a simulated clock -----------------------------------------------------


def test_delay_a_then_scancel_on_the_next_poll_then_delay_b(store: Store) -> None:
    settings = sd.Settings(delay_a=20.0, delay_b=15.0, poll_interval=5.0)
    engine, worker, dispatcher, slurm, clock = machine(store, settings)
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "COMPLETING"            # the job lingers after the container ends
    engine.fire("slurm_dispatch:c1", "container_done", {"container_state": "Complete"})
    tick(clock, worker, dispatcher, 19.5, poll_every=5.0)
    assert slurm.cancels == []                   # polls at 5, 10, 15 s: within delay A
    assert engine.get("c1").state == "finished"
    tick(clock, worker, dispatcher, 40.5, poll_every=5.0)
    # delay A ends at 20 s, the poll at 20 s scancels; delay B (15 s) ends at 35 s, the next
    # poll at 35 s scancels again; then at 50 s
    assert [at for _, at in slurm.cancels] == [20.0, 35.0, 50.0]
    assert engine.get("c1").data["scancels"] == 3
    del slurm.listed["c1"]
    tick(clock, worker, dispatcher, 5.0, poll_every=5.0)
    assert engine.get("c1").state == "gone"
    assert len(slurm.cancels) == 3


def test_a_failed_scancel_backs_off_exponentially_to_the_cap(sqlite_store: Store) -> None:
    settings = sd.Settings(delay_a=0.0, delay_b=5.0, error_delay=10.0, error_cap=40.0,
                           poll_interval=1.0)
    engine, worker, dispatcher, slurm, clock = machine(
        sqlite_store, settings, exit_codes=[1, 1, 1, 1, 1, 0])
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "RUNNING"
    engine.fire("slurm_dispatch:c1", "container_done")
    tick(clock, worker, dispatcher, 200.0, poll_every=1.0)
    times = [at for _, at in slurm.cancels]
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(times)]
    # after each failure 10, 20, 40, 40 (the cap), 40 s; after the good one 5 s again
    assert gaps[:6] == [10.0, 20.0, 40.0, 40.0, 40.0, 5.0]
    assert engine.get("c1").data["scancel_failures"] == 0


def test_api_cancel_is_at_once_without_delay_a(sqlite_store: Store) -> None:
    _engine, worker, dispatcher, slurm, _clock = machine(sqlite_store,
                                                       sd.Settings(delay_a=60.0))
    add(dispatcher, "c1", state="running", priority=5)
    slurm.listed["c1"] = "RUNNING"
    dispatcher.set_priority("c1", 0)             # priority 0 in the API: cancel
    worker.run_until_idle()
    assert slurm.cancels == [("c1", 0.0)]


def test_no_scancel_rests_on_an_squeue_asked_before_the_last_transition(
        store: Store) -> None:
    settings = sd.Settings(delay_a=0.0, delay_b=0.5, poll_interval=1.0)
    engine, worker, dispatcher, slurm, clock = machine(store, settings)
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "COMPLETING"
    engine.fire("slurm_dispatch:c1", "container_done")
    worker.run_until_idle()                      # delay A 0: due at once
    clock.advance(1)
    dispatcher.poll()                            # the first scancel, at 1 s
    worker.run_until_idle()
    assert [at for _, at in slurm.cancels] == [1.0]
    clock.advance(0.2)

    def delay_b_ends_meanwhile() -> None:
        # squeue was asked at 1.2 s and answers at 1.7 s: delay B ended at 1.5 s
        clock.advance(0.5)
        worker.run_until_idle()
        assert engine.get("c1").state == "cancelling.due"

    slurm.before_answer = delay_b_ends_meanwhile
    report = dispatcher.poll()
    worker.run_until_idle()
    assert report.refused == 1
    assert len(slurm.cancels) == 1               # not on an squeue older than the move
    refusal = [e for e in engine.history("c1") if e.kind == "refusal"][-1]
    assert refusal.source == "cancelling.due"
    slurm.before_answer = None
    clock.advance(1)
    dispatcher.poll()                            # an squeue made after it: scancel
    worker.run_until_idle()
    assert [at for _, at in slurm.cancels] == [1.0, 2.7]


def test_a_job_that_left_during_delay_a_is_never_scancelled(sqlite_store: Store) -> None:
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store,
                                                       sd.Settings(delay_a=10.0))
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "COMPLETING"
    engine.fire("slurm_dispatch:c1", "container_done")
    tick(clock, worker, dispatcher, 5.0, poll_every=5.0)
    del slurm.listed["c1"]
    tick(clock, worker, dispatcher, 30.0, poll_every=5.0)
    assert engine.get("c1").state == "gone"
    assert slurm.cancels == []


def test_job_gone_before_its_container_started_unlocks_it(sqlite_store: Store) -> None:
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, sd.Settings())
    add(dispatcher, "c1")
    engine.fire("slurm_dispatch:c1", "lock")
    worker.run_until_idle()                      # sbatch
    assert engine.get("c1").state == "submitted" and "c1" in slurm.listed
    clock.advance(1)
    dispatcher.poll()
    assert engine.get("c1").state == "submitted"
    del slurm.listed["c1"]
    clock.advance(1)
    dispatcher.poll()
    assert engine.get("c1").state == "queued"


def test_each_job_due_gets_the_one_scancel_for_its_state_a_tick_apart(
        sqlite_store: Store) -> None:
    """Three jobs fall due together under a limit of 10 scancels a second: each gets one
    scancel of its job id, the step for the state squeue showed, a tick apart; none gets
    another while delay B runs, and a job that left needs no further command."""
    settings = sd.Settings(delay_a=0.0, delay_b=5.0, poll_interval=1.0)
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, settings,
                                                       per_second=10)
    for key, state in (("r", "RUNNING"), ("p", "PENDING"), ("s", "SUSPENDED")):
        add(dispatcher, key, state="running")
        slurm.listed[key] = state
        engine.fire(f"slurm_dispatch:{key}", "container_done")
    worker.run_until_idle()                      # delay A 0: all due
    clock.advance(1)
    dispatcher.poll()
    for _ in range(40):                          # 0.05 s steps: the throttled timers
        worker.run_until_idle()
        clock.advance(0.05)
    assert sorted((name, steps) for name, steps, _ in slurm.calls) == [
        ("p", (0,)), ("r", (1,)), ("s", (2,))]
    times = [at for _, _, at in slurm.calls]
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert {engine.get(k).state for k in "rps"} == {"cancelling.waiting"}
    assert {engine.get(k).data["scancels"] for k in "rps"} == {1}
    del slurm.listed["p"]                        # p's job leaves
    clock.advance(5)
    worker.run_until_idle()                      # delay B over: due again
    dispatcher.poll()
    assert engine.get("p").state == "gone"
    for _ in range(10):
        worker.run_until_idle()
        clock.advance(0.05)
    assert sorted(name for name, _, _ in slurm.calls[3:]) == ["r", "s"]   # none for p


def test_a_scancel_that_matched_nothing_looks_again_at_once(sqlite_store: Store) -> None:
    """The job left PENDING between squeue and scancel: the pending step matched nothing,
    so the next fresh squeue (not delay B) decides, and its step is the TERM; a second
    miss in a row waits delay B."""
    settings = sd.Settings(delay_a=0.0, delay_b=30.0, poll_interval=1.0)
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, settings)
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "PENDING"
    engine.fire("slurm_dispatch:c1", "container_done")
    worker.run_until_idle()
    clock.advance(1)
    slurm.before_answer = lambda: slurm.listed.update(c1="RUNNING")   # it starts meanwhile
    dispatcher.poll()
    slurm.before_answer = None
    worker.run_until_idle()
    assert slurm.calls == [("c1", (0,), 1.0)]
    assert engine.get("c1").state == "cancelling.due"        # no delay B after a miss
    clock.advance(1)
    dispatcher.poll()
    worker.run_until_idle()
    assert slurm.calls[1:] == [("c1", (1,), 2.0)]            # TERM to the running job
    assert engine.get("c1").data["scancel_missed"] == 0
    assert engine.get("c1").data["next_delay"] == 30.0


def test_a_due_scancel_asks_for_a_quick_poll(sqlite_store: Store) -> None:
    settings = sd.Settings(delay_a=5.0, poll_interval=10.0, quick_poll=1.0)
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, settings)
    add(dispatcher, "c1", state="running")
    slurm.listed["c1"] = "RUNNING"
    assert dispatcher.poll_if_due() is not None  # the first poll: at once
    engine.fire("slurm_dispatch:c1", "container_done")
    clock.advance(1)
    assert dispatcher.poll_if_due() is None      # nothing due: the poll interval
    clock.advance(4)
    worker.run_until_idle()                      # delay A is over
    assert engine.get("c1").state == "cancelling.due"
    assert dispatcher.poll_if_due() is not None  # due: polled 5 s after the last, not 10
    worker.run_until_idle()
    assert [at for _, at in slurm.cancels] == [5.0]
    clock.advance(0.5)
    assert dispatcher.poll_if_due() is None      # never closer than quick_poll


def test_the_api_is_told_when_a_job_leaves(sqlite_store: Store) -> None:
    """Through the outbox: a Running container whose job left is Cancelled, a Locked one
    unlocked, a Complete one left alone; a failing API is asked again."""
    api = MemoryContainerAPI({"run": "Running", "lock": "Locked", "done": "Complete"})
    failures = ["API down"]
    real_state = api.state

    def state(uuid: str) -> str:
        if failures:
            raise RuntimeError(failures.pop())
        return real_state(uuid)

    api.state = state  # type: ignore[method-assign]
    engine, worker, dispatcher, _slurm, clock = machine(sqlite_store, sd.Settings(), api=api)
    add(dispatcher, "run", state="running")
    add(dispatcher, "lock", state="submitted")
    add(dispatcher, "done", state="finished")
    dispatcher.poll()                            # none of their jobs is listed
    assert [engine.get(k).state for k in ("run", "lock", "done")] == [
        "gone", "queued", "gone"]
    worker.run_until_idle()
    assert len(api.changes) == 1                 # the first asked met the failure
    clock.advance(60)                            # the failed one's retry is due
    worker.run_until_idle()
    assert sorted(api.changes) == [("lock", "Locked", "Queued"),
                                   ("run", "Running", "Cancelled")]
    assert api.states == {"run": "Cancelled", "lock": "Queued", "done": "Complete"}


def test_a_pending_job_at_low_priority_draws_a_warning(
        sqlite_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    _engine, _worker, dispatcher, slurm, _clock = machine(sqlite_store, sd.Settings())
    for key in ("low", "high", "running"):
        add(dispatcher, key, state="submitted", priority=500)
        slurm.listed[key] = "PENDING"
    slurm.entries = {
        "low": QueueEntry(slurm.job_id("low"), "low", 10000, 20000, "PENDING", "Priority"),
        "high": QueueEntry(slurm.job_id("high"), "high", 10000, 20001, "PENDING", "Priority"),
        "running": QueueEntry(slurm.job_id("running"), "running", 10000, 5, "RUNNING",
                              "None")}
    with caplog.at_level(logging.WARNING, logger="lifecycle.machines.slurm_dispatch"):
        dispatcher.poll()
    warned = [r.getMessage() for r in caplog.records if "low priority" in r.getMessage()]
    assert warned == [f"job {slurm.job_id('low')} (low) has low priority 20000, nice 10000, "
                      "state PENDING, reason Priority"]


# -- the log throttle -------------------------------------------------------------------------


def test_still_in_squeue_is_logged_once_then_once_per_interval_with_a_count(
        sqlite_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    settings = sd.Settings(delay_a=0.0, delay_b=1.0, poll_interval=1.0, log_interval=30.0)
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, settings)
    for key in ("c1", "c2"):
        add(dispatcher, key, state="running")
        slurm.listed[key] = "RUNNING"
        engine.fire(f"slurm_dispatch:{key}", "container_done")
    with caplog.at_level(logging.INFO, logger="lifecycle.machines.slurm_dispatch"):
        tick(clock, worker, dispatcher, 75.0, poll_every=1.0)
    lines = [r.getMessage() for r in caplog.records if "still in squeue" in r.getMessage()]
    for key in ("c1", "c2"):
        mine = [line for line in lines if line.startswith(f"container {key} ")]
        # the first, then one at 30 s and one at 60 s after it, each with the count left out
        assert len(mine) == 3, mine
        assert "left out" not in mine[0]
        counts = [int(line.split("; ")[1].split()[0]) for line in mine[1:]]
        assert all(count > 0 for count in counts)
        assert counts == [29, 29]               # a poll a second, one line per 30 s
    # and those held back since the last line, to be counted in the next
    reported = sum(int(line.split("; ")[1].split()[0]) for line in lines if "left out" in line)
    assert 0 < dispatcher.still_in_squeue.suppressed - reported <= 2 * 30
    assert len(slurm.cancels) > 20               # the scancels go on; only the log is quiet


def test_log_throttle_counts_what_it_holds_back() -> None:
    clock = SimulatedClock(START)
    throttle = sd.LogThrottle(10.0, clock)
    assert throttle.allow("a") == 0
    assert throttle.allow("a") is None
    assert throttle.allow("b") == 0              # per key
    clock.advance(9.9)
    assert throttle.allow("a") is None
    clock.advance(0.1)
    assert throttle.allow("a") == 2
    throttle.forget("a")
    assert throttle.allow("a") == 0


# -- priorities -------------------------------------------------------------------------------


def test_wanted_priority_orders_by_priority_then_age() -> None:
    old = sd.wanted_priority(500, "2026-01-01T00:00:00+00:00")
    new = sd.wanted_priority(500, "2026-01-02T00:00:00+00:00")
    higher = sd.wanted_priority(501, "2026-01-02T00:00:00+00:00")
    assert higher > old > new > 0
    assert sd.wanted_priority(5000, None) == 5000
    assert sd.wanted_priority(0, None) == 0


def test_renice_only_the_jobs_whose_niceness_must_change(sqlite_store: Store) -> None:
    _engine, _worker, dispatcher, slurm, _clock = machine(sqlite_store, sd.Settings())
    for key, priority in (("a", 900), ("b", 100), ("c", 500)):
        add(dispatcher, key, state="running", priority=priority,
                       created_at="2026-01-01T00:00:00+00:00")
        slurm.listed[key] = "PENDING"
    # Slurm's priority is its base less the niceness (10000 at submission)
    slurm.entries = {k: QueueEntry(slurm.job_id(k), k, 10000, 4_000_000 - 10000, "PENDING",
                                   "Priority") for k in ("a", "b", "c")}
    dispatcher.poll()
    # a (the highest) gets nice 0; c and b below it, in that order
    assert dict(slurm.renices) == {"a": 0, "c": 10, "b": 20}
    slurm.renices.clear()
    slurm.entries = {k: QueueEntry(slurm.job_id(k), k, nice, 4_000_000 - nice, "PENDING",
                                   "Priority") for k, nice in (("a", 0), ("c", 10), ("b", 20))}
    dispatcher.poll()
    assert slurm.renices == []                   # in order already: nothing to do
    dispatcher.set_priority("b", 1000)           # now b comes first, the others follow
    dispatcher.poll()
    assert dict(slurm.renices) == {"b": 0, "a": 10, "c": 20}


# -- the limits ---------------------------------------------------------------------------


def test_rate_limit_serves_the_cancels_in_the_order_they_fell_due_at_most_r_a_second(
) -> None:
    """A thousand cancels fall due at once: each one's scancel comes one tick after the one
    before, in the order they asked, whoever comes back first; never more than R a
    second."""
    clock = SimulatedClock(START)
    start = clock.now()
    rate = ScancelRate(20, clock)
    keys = [f"c{i}" for i in range(1000)]
    waits = {key: rate.reserve(key) for key in keys}
    assert [waits[k] for k in keys] == [i / 20 for i in range(1000)]
    assert rate.reserve("c5") == waits["c5"]             # asking again keeps its place
    # they come back when told, the later ones first among equals: the order holds
    asks = [(waits[k], -i, k, waits[k] == 0) for i, k in enumerate(keys)]
    heapq.heapify(asks)
    order = itertools.count(-2000, -1)
    starts: list[tuple[float, str]] = []
    while asks:
        at, _, key, granted = heapq.heappop(asks)
        clock.advance(max(0.0, at - (clock.now() - start).total_seconds()))
        wait = 0.0 if granted else rate.reserve(key)
        if wait > 0:                                     # told to come back later
            heapq.heappush(asks, (at + wait, next(order), key, False))
            continue
        clock.advance(rate.turn())
        starts.append(((clock.now() - start).total_seconds(), key))
    assert [key for _, key in starts] == keys            # in the order they asked
    assert starts[999][0] == pytest.approx(999 / 20)
    assert scancel_flood.most_in_a_second([at for at, _ in starts]) == 20
    assert rate.waiting() == 0


def test_a_cancel_that_is_no_longer_wanted_holds_nobody_back() -> None:
    clock = SimulatedClock(START)
    rate = ScancelRate(10, clock)
    assert [rate.reserve(k) for k in ("a", "b", "c")] == [0.0, 0.1, 0.2]
    rate.forget("b")                                     # its job left squeue meanwhile
    assert rate.reserve("c") == pytest.approx(0.1)
    clock.advance(5.0)                                   # "c" was told 0.1 s and never came
    assert rate.reserve("d") == 0.0                      # so it holds back no one


def test_an_unlimited_rate_never_waits() -> None:
    rate = ScancelRate(None, SimulatedClock(START))
    assert [rate.reserve(f"c{i}") for i in range(100)] == [0.0] * 100
    assert rate.turn() == 0.0


def test_the_step_is_the_one_for_the_jobs_state() -> None:
    assert [cancel_step(s) for s in ("RUNNING", "COMPLETING", "PENDING", "SUSPENDED", None)] \
        == [1, 1, 0, 2, 0]                               # unknown: pending, Arvados' first


def test_pool_holds_at_most_p_commands_for_a_thousand_threads() -> None:
    size, cancels = 4, 1000
    total = cancels * len(CANCEL_STEPS)
    state = {"in_flight": 0, "most": 0, "started": 0, "finished": 0}
    lock = threading.Condition()

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        with lock:
            state["in_flight"] += 1
            state["started"] += 1
            state["most"] = max(state["most"], state["in_flight"])
            lock.notify_all()
            # hold the slot until the pool is full, or every cancel not yet finished
            # is in here (nothing more can come)
            lock.wait_for(lambda: state["in_flight"] >= min(size,
                                                            cancels - state["finished"]),
                          timeout=60)
            state["in_flight"] -= 1
            lock.notify_all()
        return subprocess.CompletedProcess(list(argv), 0, "", "")

    slurm = SlurmDispatch(wrap="true", max_in_flight=size, scancels_per_second=None,
                          runner=runner, timeout=120)
    outcomes: list[CancelOutcome] = []

    def cancel(name: str) -> None:
        outcomes.append(slurm.cancel(name))
        with lock:
            state["finished"] += 1
            lock.notify_all()

    threads = [threading.Thread(target=cancel, args=(f"c{i}",)) for i in range(cancels)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(outcomes) == cancels and all(o.ok for o in outcomes)
    assert state["started"] == total == slurm.scancel_invocations
    assert state["most"] == size == slurm.pool.most_in_flight


@pytest.mark.parametrize("seed,poll", [(3, 10.0), (5, 0.5)])
def test_a_thousand_finishes_at_once_meet_the_goal_within_the_limits(
        seed: int, poll: float) -> None:
    """The machine, its worker and its poll against the simulated Slurm of the simulation,
    with the default configuration, on the default poll and on the incident's 500 ms: a
    thousand containers finish together; at most R scancels a second and P commands in
    flight, no job lingers longer than under Arvados' cancel loop of today, and none longer
    than delay A, a poll and its own exit time unless Arvados' lets one too; far fewer
    scancels than either Arvados, and at most one "still in squeue" line per container."""
    report = scancel_flood.simulate(seed=seed, poll_interval=poll)
    after, today, old = report["after"], report["master"], report["before"]
    options = report["options"]
    assert after["containers_cancelled"] > 200   # the limits were put to work
    assert after["most_scancels_in_one_second"] == options["scancels_per_second"]
    assert today["most_scancels_in_one_second"] > options["scancels_per_second"]
    assert after["most_in_flight"] <= options["max_in_flight"]
    assert after["longest_linger"] <= today["longest_linger"]
    assert after["lingered_past_bound"] <= today["lingered_past_bound"]
    assert after["containers_gone"] == 1000 and after["left_in_squeue"] == 0
    assert after["most_lines_for_one_container"] <= 1
    assert after["scancel_invocations"] * 4 < today["scancel_invocations"]
    assert after["scancel_invocations"] * 2 < old["scancel_invocations"]


def test_with_arvados_delays_no_job_lingers_past_the_machines_bound(slow: bool) -> None:
    """Delay A 0 and delay B 1 s, as Arvados has them: every job due gets its TERM within
    the poll, so none lingers past delay A, a poll and its own exit time (300 containers
    finishing together; a thousand with --slow)."""
    report = scancel_flood.simulate(seed=1, delay_a=0.0, delay_b=1.0,
                                    containers=1000 if slow else 300)
    assert report["after"]["lingered_past_bound"] == 0
    assert report["after"]["longest_linger"] <= report["master"]["longest_linger"]


def test_simulation_is_reproducible() -> None:
    first = scancel_flood.simulate(seed=5, containers=50)
    second = scancel_flood.simulate(seed=5, containers=50)
    for report in (first, second):
        report.pop("timing")
    assert first == second


# -- the adapter ------------------------------------------------------------------------------


def test_squeue_lines_are_read_by_job_id_and_a_bad_line_is_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    out = ("11|10000|4294901760|PENDING|Resources|zzzzz-dz642-000000000000001\n"
           "12|0|4294991760|RUNNING|None|victim 0 4294967295 COMPLETED shadow\n"
           "garbage\n"
           "13|ten|1|PENDING|None|x\n"
           "\n"
           "14|5|100|PENDING|launch failed requeued held|a|b|c\n")
    with caplog.at_level(logging.WARNING):
        listing = parse_squeue(out)
    assert sorted(listing.jobs) == ["11", "12", "14"] and not listing.unsure
    assert listing.jobs["11"] == QueueEntry("11", "zzzzz-dz642-000000000000001", 10000,
                                            4294901760, "PENDING", "Resources")
    # a name's blanks and bars are the name's: it cannot pose as another job's fields
    assert listing.jobs["12"].name == "victim 0 4294967295 COMPLETED shadow"
    assert listing.jobs["12"].state == "RUNNING"
    assert listing.jobs["14"].reason == "launch failed requeued held"
    assert listing.jobs["14"].name == "a|b|c"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "line 3" in warned[0] and "line 4" in warned[1]


def test_a_forged_squeue_line_is_never_attributed(caplog: pytest.LogCaptureFixture) -> None:
    """A job of someone else's whose name holds a line break prints a line that looks like
    job 11's: job 11 is then unsure (neither listed nor gone), never read from the forgery;
    the continuation of a name is skipped."""
    real = "11|10000|1|RUNNING|None|victim\n"
    forged = "12|10000|1|PENDING|None|x\n11|0|1|COMPLETED|None|victim\n"
    with caplog.at_level(logging.WARNING):
        listing = parse_squeue(real + forged)
    assert listing.unsure == {"11"} and "11" not in listing.jobs
    assert listing.find("11", "victim") == (None, False)
    assert listing.find("12", "x")[0] is not None
    assert any("listed job 11 twice" in r.getMessage() for r in caplog.records)
    # a job that left: a forgery alone cannot be told from it by lines, but by JSON
    document = {"jobs": [{"job_id": 12, "name": "x\n11|0|1|RUNNING|None|victim",
                          "job_state": "PENDING", "nice": 10000, "priority": 1,
                          "state_reason": "None"}]}
    listing = parse_squeue_json(json.dumps(document))
    assert list(listing.jobs) == ["12"] and listing.find("11", "victim") == (None, True)


def test_squeue_json_of_old_and_new_slurm() -> None:
    old = {"jobs": [{"job_id": 5, "name": "a b", "job_state": "RUNNING", "nice": None,
                     "priority": 4294901759, "state_reason": "None"}]}
    new = {"jobs": [{"job_id": 5, "name": "a b", "job_state": ["RUNNING"],
                     "nice": 10, "priority": {"set": True, "infinite": False, "number": 7},
                     "state_reason": "None"}]}
    assert parse_squeue_json(json.dumps(old)).jobs["5"] == QueueEntry(
        "5", "a b", 0, 4294901759, "RUNNING", "None")
    assert parse_squeue_json(json.dumps(new)).jobs["5"] == QueueEntry(
        "5", "a b", 10, 7, "RUNNING", "None")
    # --json lists finished jobs too (it ignores squeue's filters): they have left
    new["jobs"][0]["job_state"] = ["CANCELLED"]
    old["jobs"][0]["job_state"] = "COMPLETED"
    assert parse_squeue_json(json.dumps(new)).jobs == parse_squeue_json(json.dumps(old)).jobs \
        == {}
    with pytest.raises(SiteError, match="squeue --json: not the listing"):
        parse_squeue_json('{"meta": {}}')


def test_a_container_without_a_job_id_is_found_by_its_unique_name(
        sqlite_store: Store) -> None:
    """A container submitted before job ids were kept: two jobs of its name are unsure, and
    nothing moves; the one job of its name is its job (recorded in the observation and in
    its data, and the scancel goes to that id), and from then on only that id is."""
    engine, worker, dispatcher, slurm, clock = machine(sqlite_store, sd.Settings(delay_a=0))
    dispatcher.add("old", state="running")                   # no job id in its data
    engine.fire("slurm_dispatch:old", "container_done")
    worker.run_until_idle()
    clock.advance(1)
    twice = Listing({"1": QueueEntry("1", "old", 0, 1, "RUNNING", "None"),
                     "2": QueueEntry("2", "old", 0, 1, "RUNNING", "None")})
    real_queue = slurm.queue
    slurm.queue = lambda: twice  # type: ignore[method-assign]
    assert dispatcher.poll().unsure == 1
    assert engine.get("old").state == "cancelling.due" and engine.observations("old") == []
    slurm.queue = real_queue  # type: ignore[method-assign]
    slurm.listed["old"] = "RUNNING"
    clock.advance(1)
    dispatcher.poll()
    worker.run_until_idle()
    assert engine.get("old").observation.status["job_id"] == slurm.job_id("old")
    assert slurm.calls == [("old", (1,), 2.0)]
    assert engine.get("old").data["job_id"] == slurm.job_id("old")
    clock.advance(20)
    worker.run_until_idle()
    slurm.queue = lambda: twice  # type: ignore[method-assign]
    assert dispatcher.poll().unsure == 0                     # by its id now: not listed
    assert engine.get("old").state == "gone"


def test_a_uuid_squeue_could_not_list_on_one_line_is_refused() -> None:
    engine_parts = machine(Store("sqlite://", upgrade=True), sd.Settings())
    dispatcher = engine_parts[2]
    with pytest.raises(ValueError, match=r"line feed \(U\+000A\) at position 2"):
        dispatcher.add("nl\nvictim")
    assert engine_parts[0].resources(sd.MACHINE) == []
    slurm = SlurmDispatch(wrap="true", runner=lambda *a: pytest.fail("ran a command"))
    with pytest.raises(ValueError, match="carriage return"):
        slurm.submit("a\rb")
    engine_parts[0].store.dispose()


def test_a_failed_squeue_moves_nobody(sqlite_store: Store) -> None:
    engine, _worker, dispatcher, slurm, _clock = machine(sqlite_store, sd.Settings())
    add(dispatcher, "c1", state="running")

    def down() -> Listing:
        raise SiteError("squeue: slurmctld is down")

    slurm.queue = down  # type: ignore[method-assign]
    report = dispatcher.poll()
    assert report.error and engine.get("c1").state == "running"
    assert engine.observations("c1") == []


def test_squeue_json_is_given_up_only_when_lines_answer_where_json_did_not() -> None:
    """slurmctld down at the first poll: both forms fail, and whether this Slurm has --json
    stays open (the next poll asks again); lines answering where --json did not is what
    settles it."""
    calls: list[str] = []
    answers = {"json": (1, "", "squeue: error: Unable to contact slurm controller"),
               "lines": (1, "", "squeue: error: Unable to contact slurm controller")}

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        kind = "json" if "--json" in argv else "lines"
        calls.append(kind)
        code, out, err = answers[kind]
        return subprocess.CompletedProcess(list(argv), code, out, err)

    slurm = SlurmDispatch(wrap="true", runner=runner)
    with pytest.raises(SiteError, match="Unable to contact"):
        slurm.queue()
    assert slurm.squeue_json is None and calls == ["json", "lines"]
    answers["json"] = (0, json.dumps({"jobs": [{"job_id": 7, "name": "c", "nice": 0,
                                                "priority": 1, "job_state": "RUNNING",
                                                "state_reason": "None"}]}), "")
    assert list(slurm.queue().jobs) == ["7"] and slurm.squeue_json is True
    slurm = SlurmDispatch(wrap="true", runner=runner)
    answers["json"] = (1, "", "squeue: unrecognized option '--json'")
    answers["lines"] = (0, "7|0|1|RUNNING|None|c\n", "")
    assert list(slurm.queue().jobs) == ["7"] and slurm.squeue_json is False
    calls.clear()
    slurm.queue()
    assert calls == ["lines"]                        # settled: no --json asked again


def test_the_cancel_stops_at_the_first_failing_step() -> None:
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        code = 1 if "--state=running" in argv else 0
        return subprocess.CompletedProcess(list(argv), code, "", "scancel: error: boom")

    slurm = SlurmDispatch(wrap="true", runner=runner, scancels_per_second=None)
    outcome = slurm.cancel("41")
    assert (outcome.exit, outcome.invocations) == (1, 2) and "boom" in outcome.detail
    assert not outcome.acted
    assert calls == [["scancel", "-v", "--state=pending", "41"],
                     ["scancel", "-v", "--batch", "--signal=TERM", "--state=running", "41"]]


def test_the_cancel_stops_at_the_step_that_acted() -> None:
    """scancel exits 0 whether or not it matched; its verbose report says whether it
    signalled the job (and a refusal for this job is not an act)."""
    reports = {"--state=pending": "scancel: error: No active jobs match ALL job filters, "
                                  "including: state=PENDING",
               "--state=running": "scancel: Signal 15 to batch job 41"}
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", reports.get(argv[-2], ""))

    slurm = SlurmDispatch(wrap="true", runner=runner, scancels_per_second=None)
    outcome = slurm.cancel("41")
    assert (outcome.ok, outcome.acted, outcome.invocations) == (True, True, 2)
    assert [c[-2] for c in calls] == ["--state=pending", "--state=running"]
    reports["--state=running"] = "scancel: Signal 15 to batch job 411"   # another job
    calls.clear()
    assert not slurm.cancel("41").acted and len(calls) == 3


def test_a_cancel_of_a_job_that_left_is_no_failure() -> None:
    """scancel of a job id Slurm no longer knows exits 1 (by name it exited 0): the job has
    left, which is what the cancel wanted; no further step runs."""
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 1, "", "scancel: error: Kill job error "
                                           "on job id 41: Invalid job id specified")

    outcome = SlurmDispatch(wrap="true", runner=runner, scancels_per_second=None).cancel("41")
    assert (outcome.ok, outcome.acted, outcome.invocations) == (True, False, 1)
    assert "has left" in outcome.detail and len(calls) == 1


def test_every_command_but_squeue_takes_a_slot_in_the_pool_renice_too() -> None:
    """sbatch, scontrol's renice and each scancel run inside a slot of the pool of
    max_in_flight commands (the renice within the same limits as the cancels); squeue
    outside it, as Arvados runs it."""
    seen: list[tuple[str, int]] = []
    slurm: SlurmDispatch

    def runner(argv: Sequence[str], timeout: float,
               env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        seen.append((argv[0], slurm.pool.in_flight))
        return subprocess.CompletedProcess(list(argv), 0, "7\n" if argv[0] == "sbatch" else "",
                                           "")

    slurm = SlurmDispatch(wrap="true", runner=runner, max_in_flight=2,
                          scancels_per_second=None, squeue_json=False)
    assert slurm.submit("c1") == "7"
    slurm.queue()
    slurm.renice("7", 10)
    slurm.cancel("7", (1, 0, 2))
    # squeue outside the pool: a poll never waits behind the scancels it decides about
    assert seen == [("sbatch", 1), ("squeue", 0), ("scontrol", 1), ("scancel", 1),
                    ("scancel", 1), ("scancel", 1)]
    assert slurm.pool.in_flight == 0 and slurm.scancel_invocations == 3


# -- on a real Slurm --------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float,
                 env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return run_command(argv, timeout, env)

    def scancels(self, job_id: str) -> list[list[str]]:
        """The steps of each scancel of ``job_id`` (between ``-v`` and the id)."""
        return [c[2:-1] for c in self.calls if c[:2] == ["scancel", "-v"] and c[-1] == job_id]


@dataclass
class Live:
    engine: Engine
    worker: Worker
    dispatcher: sd.Dispatcher
    slurm: SlurmDispatch
    recorder: Recorder
    cluster: Any
    api: MemoryContainerAPI

    def until(self, key: str, done: Callable[[Any], bool], timeout: float = 60) -> Any:
        """Poll and work (each a few milliseconds on this cluster) until ``done(resource)``;
        a generous deadline only against a hang."""
        deadline = time.monotonic() + timeout
        while True:
            self.dispatcher.poll()
            self.worker.run_until_idle()
            resource = self.engine.get(key)
            if done(resource):
                return resource
            if time.monotonic() > deadline:
                raise AssertionError(f"{key} is {resource.state} after {timeout} s\n"
                                     f"{self.cluster.log_tail()}")
            time.sleep(0.05)


@pytest.fixture
def live(cluster: Any, tmp_path: Path) -> Iterator[Callable[..., Live]]:
    def make(script: str, settings: sd.Settings) -> Live:
        recorder = Recorder()
        out = cluster.directory / "log"
        slurm = SlurmDispatch(
            wrap=script, sbatch_options=[f"--chdir={cluster.directory}",
                                         f"--output={out}/job-%j.out"],
            environment={"SLURM_CONF": str(cluster.conf)}, runner=recorder, timeout=20)
        store = Store(f"sqlite:///{tmp_path / 'live.db'}", upgrade=True)
        stores.append(store)
        api = MemoryContainerAPI()
        engine = Engine(store, [sd.SPEC], guards=sd.GUARDS, effects=sd.effects(slurm, api))
        return Live(engine, Worker(engine), sd.Dispatcher(engine, slurm, settings), slurm,
                    recorder, cluster, api)

    stores: list[Store] = []
    yield make
    for store in stores:
        store.dispose()


def _name() -> str:
    return f"zzzzz-dz642-{uuid.uuid4().hex[:15]}"


def _job_id(box: Live, key: str) -> str:
    return str(box.engine.get(key).data["job_id"])


def test_real_slurm_submit_run_finish_linger_cancel_gone(live: Callable[..., Live]) -> None:
    box = live("exec sleep 300", sd.Settings(delay_a=0.5, delay_b=0.5, poll_interval=0.1))
    name = _name()
    key = f"slurm_dispatch:{name}"
    box.dispatcher.add(name)
    box.engine.fire(key, "lock")
    box.worker.run_until_idle()                               # sbatch
    assert box.engine.get(key).state == "submitted"
    job = _job_id(box, key)
    box.cluster.wait_for_state(job, "RUNNING")
    box.engine.fire(key, "started")
    box.until(key, lambda r: r.observation is not None
              and r.observation.status.get("state") == "RUNNING")
    # the container reports Complete; its job lingers (still running)
    box.engine.fire(key, "container_done", {"container_state": "Complete"})
    gone = box.until(key, lambda r: r.state == "gone")
    assert gone.data["scancel_exit"] == 0
    assert box.recorder.scancels(job)[:1] == [list(CANCEL_STEPS[1])]   # TERM, and it acted
    assert box.cluster.wait_for_state(job, "CANCELLED", "FAILED", "COMPLETED")
    path = [e.dest for e in box.engine.history(key) if e.kind == "transition"]
    assert path[:6] == ["locked", "submitted", "running", "finished", "cancelling.due",
                        "cancelling.scancelling"]
    assert path[-1] == "gone"
    assert box.api.changes == []                  # Complete in the API: left alone


def test_real_slurm_pending_job_cancelled_by_the_api(live: Callable[..., Live]) -> None:
    box = live("exec sleep 300", sd.Settings(poll_interval=0.1))
    name = _name()
    key = f"slurm_dispatch:{name}"
    box.slurm.sbatch_options = [*box.slurm.sbatch_options, "--begin=now+3600"]
    box.dispatcher.add(name)
    box.engine.fire(key, "lock")
    box.worker.run_until_idle()
    job = _job_id(box, key)
    assert box.cluster.job_state(job) == "PENDING"
    box.dispatcher.set_priority(name, 0)                      # cancelled in the API
    box.worker.run_until_idle()
    assert box.recorder.scancels(job)[0] == ["--state=pending"]
    box.cluster.wait_for_state(job, "CANCELLED")
    assert box.until(key, lambda r: r.state == "gone").data["scancel_exit"] == 0


def test_real_slurm_cancel_of_a_job_already_gone_is_harmless(
        live: Callable[..., Live]) -> None:
    box = live("true", sd.Settings(delay_a=0.0, poll_interval=0.1))
    name = _name()
    key = f"slurm_dispatch:{name}"
    box.dispatcher.add(name)
    box.engine.fire(key, "lock")
    box.worker.run_until_idle()
    job = _job_id(box, key)
    box.cluster.wait_for_state(job, "COMPLETED")
    box.engine.fire(key, "cancel")                            # the job has already left
    box.worker.run_until_idle()
    assert box.engine.get(key).data["scancel_exit"] == 0
    # pending first (no squeue had shown the job), exit 0, nothing matched: the next
    # fresh squeue decides, and shows the job gone
    assert box.recorder.scancels(job) == [list(CANCEL_STEPS[0])]
    assert box.engine.get(key).data["scancel_missed"] == 1
    resource = box.until(key, lambda r: r.state == "gone")
    assert resource.data["scancel_exit"] == 0
    assert len(box.recorder.scancels(job)) == 1
    outcome = box.slurm.cancel(job)                           # and once more, directly
    assert outcome.ok and not outcome.acted and "has left" in outcome.detail
    assert outcome.invocations == 1                           # Slurm said so at once
    assert box.cluster.job_state(job) == "COMPLETED"


def test_real_slurm_job_that_ignores_term(live: Callable[..., Live],
                                          caplog: pytest.LogCaptureFixture) -> None:
    box = live("trap '' TERM; while true; do sleep 0.1; done",
               sd.Settings(delay_a=0.0, delay_b=0.3, poll_interval=0.1, log_interval=3600))
    name = _name()
    key = f"slurm_dispatch:{name}"
    box.dispatcher.add(name)
    box.engine.fire(key, "lock")
    box.worker.run_until_idle()
    job = _job_id(box, key)
    box.cluster.wait_for_state(job, "RUNNING")
    box.engine.fire(key, "started")
    box.engine.fire(key, "container_done", {"container_state": "Cancelled"})
    with caplog.at_level(logging.INFO, logger="lifecycle.machines.slurm_dispatch"):
        resource = box.until(key, lambda r: r.data.get("scancels", 0) >= 3)
    assert resource.state.startswith("cancelling")
    assert box.cluster.job_state(job) == "RUNNING"          # TERM to the shell is ignored
    # each scancel after the first rested on an squeue made after the one before
    history = box.engine.history(key)
    last_scancel = None
    for entry in history:
        if entry.dest == "cancelling.scancelling" and entry.trigger is None:
            assert entry.observation is not None
            if last_scancel is not None:
                assert entry.observation.observed_at >= last_scancel
        if entry.trigger == "scancelled":
            last_scancel = entry.at
    lines = [r for r in caplog.records if "still in squeue" in r.getMessage()]
    assert len(lines) == 1                                    # throttled: one per container
    # end it for good: KILL to the batch shell (the job ends with it, at once; a KILL to
    # the whole job would be a termination, TERM first and KILL only after KillWait)
    box.cluster.run("scancel", "--batch", "--signal=KILL", job)
    assert box.until(key, lambda r: r.state == "gone").state == "gone"


def test_real_slurm_renice_follows_the_containers_priorities(
        live: Callable[..., Live]) -> None:
    box = live("exec sleep 300", sd.Settings(poll_interval=0.1))
    box.slurm.sbatch_options = [*box.slurm.sbatch_options, "--begin=now+3600"]  # pending
    low, high = _name(), _name()
    for name, priority in ((low, 100), (high, 900)):
        box.dispatcher.add(name, priority=priority, created_at="2026-12-02T09:00:00+00:00")
        box.engine.fire(f"slurm_dispatch:{name}", "lock")
    box.worker.run_until_idle()

    def nice(name: str) -> int:
        job = _job_id(box, f"slurm_dispatch:{name}")
        return int(box.cluster.run("squeue", "-h", "-o", "%y", f"--job={job}").strip())

    assert (nice(low), nice(high)) == (10000, 10000)          # as submitted
    report = box.dispatcher.poll()
    assert report.reniced == 2
    assert nice(high) == 0                                    # the higher priority first
    assert nice(low) > 0
    updates = [c[2:] for c in box.recorder.calls if c[:2] == ["scontrol", "update"]]
    ids = {name: _job_id(box, f"slurm_dispatch:{name}") for name in (low, high)}
    assert sorted(updates) == sorted([[f"JobId={ids[high]}", "Nice=0"],
                                      [f"JobId={ids[low]}", f"Nice={nice(low)}"]])
    assert box.dispatcher.poll().reniced == 0                 # in order now: left alone
    for name in (low, high):
        box.dispatcher.set_priority(name, 0)
    box.worker.run_until_idle()
    for name in (low, high):
        box.until(f"slurm_dispatch:{name}", lambda r: r.state == "gone")


@pytest.mark.parametrize("squeue_json", [True, False], ids=["squeue-json", "squeue-lines"])
def test_real_slurm_hostile_names_follow_their_own_jobs_and_reach_no_shell(
        live: Callable[..., Live], tmp_path: Path, squeue_json: bool) -> None:
    """Containers named like another's squeue line, like a shell command, and with a line
    break: each container's state follows its own job only, the job's shell never runs the
    name, and the name squeue could not list on one line is refused, saying why."""
    pwned = tmp_path / "PWNED"
    box = live("echo container {name}; echo '{name}'; echo \"{name}\"; exec sleep 300",
               sd.Settings(delay_a=0.0, delay_b=0.3, poll_interval=0.1))
    box.slurm.squeue_json = squeue_json
    victim, forger, shell = "victim", "victim 0 1 RUNNING x", f"x;touch {pwned};#"
    with pytest.raises(ValueError, match=r"line feed \(U\+000A\) at position 2"):
        box.dispatcher.add("nl\nvictim")
    for name in (victim, forger, shell):
        box.dispatcher.add(name)
        box.engine.fire(f"slurm_dispatch:{name}", "lock")
    box.worker.run_until_idle()
    jobs = {name: _job_id(box, f"slurm_dispatch:{name}") for name in (victim, forger, shell)}
    assert len(set(jobs.values())) == 3
    for name in (victim, forger, shell):
        box.cluster.wait_for_state(jobs[name], "RUNNING")
        box.engine.fire(f"slurm_dispatch:{name}", "started")
    # the victim's job ends by itself; the forger's runs on, its name posing as the victim
    box.cluster.run("scancel", "--full", "--signal=KILL", jobs[victim])
    box.until(f"slurm_dispatch:{victim}", lambda r: r.state == "gone")
    for name in (forger, shell):
        resource = box.engine.get(f"slurm_dispatch:{name}")
        assert resource.state == "running", name
        assert resource.observation.status["job_id"] == jobs[name]
        assert resource.observation.status["state"] == "RUNNING"
    left = box.engine.get(f"slurm_dispatch:{victim}").observation.status
    assert left == {"in_squeue": False}                      # its own job, not the forgery
    # the forger's container finishes: its own job, by id, is cancelled; the shell's runs on
    box.engine.fire(f"slurm_dispatch:{forger}", "container_done",
                    {"container_state": "Complete"})
    box.until(f"slurm_dispatch:{forger}", lambda r: r.state == "gone")
    # (COMPLETING while slurmd ends it: under load, for a while)
    assert box.cluster.wait_for_state(jobs[forger], "CANCELLED", "FAILED", "COMPLETED")
    assert box.cluster.job_state(jobs[shell]) == "RUNNING"
    assert box.recorder.scancels(jobs[forger]) and not box.recorder.scancels(jobs[shell])
    # the name reached the job's output as a value, three ways quoted, and ran nothing
    out = (box.cluster.directory / "log" / f"job-{jobs[shell]}.out").read_text()
    assert out.splitlines()[:1] == [f"container {shell}"]
    assert not pwned.exists()
    box.dispatcher.set_priority(shell, 0)
    box.worker.run_until_idle()
    box.until(f"slurm_dispatch:{shell}", lambda r: r.state == "gone")
    assert not pwned.exists()
