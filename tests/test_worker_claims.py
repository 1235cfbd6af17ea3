"""A handler starts only on a claim its worker still holds, and a worker whose driver is gone
holds nothing: a worker process paused (SIGSTOP) past its lease, another worker finishing
its effects meanwhile, then woken (SIGCONT), starts none of them again; a cancelled
``AsyncWorker`` task, and one whose event loop was closed under it, give their claims back
and renew nothing. Both drivers, both databases. Every wait waits for an event, with a
deadline only against a hang; the pause lasts past the lease by a clock the test moves
(procs/jump_clock.py), not by waiting for it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import gated
from procs.jump_clock import JumpClock, jump
from procs.warm import said_pid
from waiting import until

from lifecycle import AsyncWorker, Effect, EffectCall, Engine, Store, Worker
from lifecycle.outbox_admin import effect_records
from lifecycle.spec import load_spec

SCRIPT = str(Path(__file__).resolve().parent / "procs" / "run_gated_worker.py")
LEASE = 30.0
"""The paused worker's lease (a heartbeat a third of it): the default, so that no busy machine
makes it lapse before the pause; the pause outlasts it by the clock the test moves."""
ASYNC_LEASE = 1.5
"""The lease of the async workers whose driver goes: the heartbeat (a third of it) is what
notices a closed loop, so the test waits about that long; a claim still has a second of it
left for its handler to start (a busy machine that takes longer makes the worker give the
claim back and claim it again, which the test allows)."""


@pytest.fixture
def run_cmd(forkserver: Any) -> list[str]:
    """`python procs/run_gated_worker.py`, started warm (tests/zygote.py): the worker says its
    own pid, which the test stops, wakes and ends (procs/warm.py)."""
    return forkserver.python(SCRIPT)  # type: ignore[no-any-return]


@pytest.fixture
def gated_engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    """The gated machine's engine, its time the JumpClock of tmp_path/clock."""
    os.environ["GATED_CALLS"] = str(tmp_path / "calls")
    os.environ["GATED_GATE"] = str(tmp_path / "gate")
    engine = Engine(Store(db_url, upgrade=True), [load_spec(gated.SPEC)],
                    effects=gated.effects, clock=JumpClock(tmp_path / "clock"))
    yield engine
    engine.store.dispose()
    for name in ("GATED_CALLS", "GATED_GATE"):
        os.environ.pop(name, None)


def _starts(tmp_path: Path) -> Counter[str]:
    return Counter(key for what, key, _ in gated.calls(tmp_path / "calls") if what == "start")


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _in_a_transaction(engine: Engine, db_url: str) -> bool:
    """Whether another process holds a transaction open on the test's database (the paused
    worker, stopped between its BEGIN and COMMIT, would block everyone else)."""
    if engine.store.dialect == "sqlite":
        path = db_url.removeprefix("sqlite:///")
        connection = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            connection.close()
    import psycopg

    name = db_url.split("application_name=")[1].split("&")[0]
    base = db_url.replace("postgresql+psycopg://", "postgresql://").split("?")[0]
    with psycopg.connect(base, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND "
            "state <> 'idle' AND pid <> pg_backend_pid()", (name,)).fetchone()
    return bool(row and row[0])


def _pause(pid: int, engine: Engine, db_url: str) -> None:
    """SIGSTOP the process at a moment it holds no transaction open (else woken for a
    moment and stopped again)."""
    deadline = time.monotonic() + 60
    while True:
        os.kill(pid, signal.SIGSTOP)
        until(lambda: _stopped(pid), "the worker to stop")
        if not _in_a_transaction(engine, db_url):
            return
        assert time.monotonic() < deadline, "the worker was always in a transaction"
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)


def _stderr_lines(process: subprocess.Popen[str]) -> list[str]:
    """Its stderr, read in a thread as it comes (a paused reader must not block it)."""
    lines: list[str] = []
    assert process.stderr is not None
    stream = process.stderr

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_worker_paused_past_its_lease_starts_nothing_it_lost(
        gated_engine: Engine, db_url: str, tmp_path: Path, kind: str,
        run_cmd: list[str]) -> None:
    """P1 claims 12 effects and runs 2 (concurrency 2); it is paused past its lease (its
    clock and P2's jump two leases while it is stopped); P2 takes over and finishes all 12;
    P1 is woken. P1 may finish the 2 handlers it was
    running (that window cannot be closed), but starts none of the 10 it had queued: every
    effect whose handler P1 had not started runs exactly once in all."""
    engine = gated_engine
    gate = tmp_path / "gate"
    gate.touch()
    keys = [f"g{i:02d}" for i in range(12)]
    for key in keys:
        engine.create("gated", key)
        engine.fire(key, "go")
    p1 = subprocess.Popen([*run_cmd, kind, db_url, str(LEASE), "2", "12",
                           str(tmp_path / "clock")], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    log = _stderr_lines(p1)
    pid = said_pid(p1)
    try:
        until(lambda: sum(_starts(tmp_path).values()) == 2, "P1 to start two handlers")
        _pause(pid, engine, db_url)
        started_by_p1 = set(_starts(tmp_path))
        assert len(started_by_p1) == 2
        gate.unlink()
        jump(tmp_path / "clock", 2 * LEASE)  # P1 sleeps for two leases, by its clock and ours
        # P1's leases ran out while it slept
        until(lambda: all(r.status == "pending" or (r.lease_until is not None and
                                                     r.lease_until < engine.clock.now())
                           for r in effect_records(engine)), "P1's leases to run out")
        Worker(engine, concurrency=4, name="p2").run_until_idle()
        assert {r.status for r in effect_records(engine)} == {"done"}
        os.kill(pid, signal.SIGCONT)

        def settled() -> bool:   # P1 finished its two, and either let the rest go or ran some
            calls = [c for c in gated.calls(tmp_path / "calls") if c[0] != "writing"]
            ends = sum(1 for what, _, _ in calls if what == "end")
            return ends >= 14 and (len(calls) > 28 or any("were not started" in line
                                                          for line in log))

        until(settled, "P1 to finish its running handlers and go on")
    finally:
        with contextlib.suppress(ProcessLookupError):
            if p1.poll() is None:  # (its client ends with it)
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
        p1.wait(timeout=120)
        assert p1.stdout is not None
        p1.stdout.close()
    starts = _starts(tmp_path)
    assert set(starts) == set(keys)
    twice = {key for key, count in starts.items() if count > 1}
    assert twice <= started_by_p1, f"P1 started {sorted(twice - started_by_p1)} again"
    assert all(starts[key] == 1 for key in set(keys) - started_by_p1)
    assert {r.status for r in effect_records(engine)} == {"done"}
    assert any("claims were taken over" in line or "were not started" in line
               for line in log)


def _waiting_engine(db_url: str, started: list[str]) -> Engine:
    """Effects whose coroutine handler notes its key and then waits a minute."""
    async def wait(call: EffectCall) -> None:
        started.append(call.key)
        await asyncio.sleep(60)

    return Engine(Store(db_url, upgrade=True), [load_spec(gated.SPEC)],
                  effects={"work": Effect(wait, timeout=600.0)})


def _six_effects(engine: Engine) -> None:
    for i in range(6):
        engine.create("gated", f"w{i}")
        engine.fire(f"w{i}", "go")


def _each_runs_once_more(db_url: str) -> Counter[str]:
    """A worker with a quick handler runs what was given back; the keys it ran."""
    ran: Counter[str] = Counter()

    def quick(call: EffectCall) -> None:
        ran[call.key] += 1

    engine = Engine(Store(db_url), [load_spec(gated.SPEC)], effects={"work": quick})
    try:
        Worker(engine, concurrency=2).run_until_idle()
        assert {r.status for r in effect_records(engine)} == {"done"}
    finally:
        engine.store.dispose()
    return ran


def _given_back(engine: Engine, started: list[str]) -> None:
    """Every effect pending again: the ones whose handler had started with their attempt
    counted, the others as they were."""
    records = {r.key: r for r in effect_records(engine)}
    assert {r.status for r in records.values()} == {"pending"}
    assert {r.claimed_by for r in records.values()} == {None}
    assert {key: r.attempts for key, r in records.items()} == {
        key: 1 if key in started else 0 for key in records}


def test_a_cancelled_async_worker_gives_its_claims_back(db_url: str) -> None:
    """``asyncio.run`` ends while the worker's task runs two minute-long handlers and holds
    four more claims: the task is cancelled, every claim goes back, the heartbeat stops,
    and the next worker runs each effect once."""
    started: list[str] = []
    engine = _waiting_engine(db_url, started)
    _six_effects(engine)
    worker = AsyncWorker(engine, concurrency=2, batch=6, lease=ASYNC_LEASE)

    async def main() -> None:
        asyncio.get_running_loop().create_task(worker.run())
        while len(started) < 2:
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
        _given_back(engine, started)
        assert not worker.core.heartbeat_alive(), "the heartbeat still renews leases"
        assert _each_runs_once_more(db_url) == dict.fromkeys(sorted(f"w{i}" for i in range(6)),
                                                              1)
    finally:
        engine.store.dispose()


def test_an_async_worker_whose_loop_was_closed_gives_its_claims_back(db_url: str) -> None:
    """The event loop running the worker is closed without cancelling it (its task simply
    never runs again): within about a heartbeat the heartbeat sees it, gives every claim
    back and stops."""
    started: list[str] = []
    engine = _waiting_engine(db_url, started)
    _six_effects(engine)
    worker = AsyncWorker(engine, concurrency=2, batch=6, lease=ASYNC_LEASE)
    loop = asyncio.new_event_loop()
    task: Any = loop.create_task(worker.run())

    async def two_started() -> None:
        while len(started) < 2:
            await asyncio.sleep(0.01)

    abandoned: set[asyncio.Task[Any]] = set()
    try:
        loop.run_until_complete(two_started())
        abandoned = asyncio.all_tasks(loop)  # the worker's and its handlers', never to run
        loop.close()
        until(lambda: not worker.core.heartbeat_alive(), "the heartbeat to see the loop closed")
        _given_back(engine, started)
        assert _each_runs_once_more(db_url) == dict.fromkeys(sorted(f"w{i}" for i in range(6)),
                                                              1)
    finally:
        # pending on purpose: asyncio need not log "Task was destroyed but it is pending!"
        # when the collector takes them, in whichever later test that happens
        for pending in abandoned:
            pending._log_destroy_pending = False  # type: ignore[attr-defined]
        del task, abandoned
        engine.store.dispose()
