"""The worker under faults: claims that live exactly as long as their worker (a heartbeat
renews them; a worker that died on this host loses them at once, elsewhere within one
lease), `--until-idle` that waits for what others hold, and lost database connections that
cost nothing but time. Every wait here waits for an event, with a deadline only against a
hang."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from asyncio_kinds import DRIVERS, KINDS, running, until_idle
from procs import gated
from sqlalchemy import select, text, update
from waiting import read_until, until

from lifecycle import Effect, EffectCall, Engine, FollowUp, LifecycleError, Retry, Store, Worker
from lifecycle.errors import DatabaseError
from lifecycle.outbox_admin import effect_records, retry_failed
from lifecycle.spec import load_spec
from lifecycle.store import outbox
from lifecycle.worker import DEFAULT_LEASE

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def lifecycle_cmd(forkserver: Any) -> list[str]:
    """`python -m lifecycle`, started warm (tests/zygote.py): for the commands that end by
    themselves or by the SIGTERM their client passes on, and for a worker the test kills by
    its own pid (which its claims name: the client's is not the worker's)."""
    return forkserver.python("-m", "lifecycle")  # type: ignore[no-any-return]


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "LIFECYCLE_PLUGINS": "procs.gated",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS),
                                                        os.environ.get("PYTHONPATH")])),
            "GATED_CALLS": str(tmp_path / "calls"), "GATED_GATE": str(tmp_path / "gate")}


def _gated_engine(url: str, tmp_path: Path) -> Engine:
    return Engine(Store(url, upgrade=True), [load_spec(gated.SPEC)], effects=gated.effects)


@pytest.fixture
def gated_engine(db_url: str, tmp_path: Path, plugin_env: dict[str, str]) -> Iterator[Engine]:
    os.environ.update({k: plugin_env[k] for k in ("GATED_CALLS", "GATED_GATE")})
    engine = _gated_engine(db_url, tmp_path)
    yield engine
    engine.store.dispose()


def _ends(tmp_path: Path) -> Counter[str]:
    return Counter(key for what, key, _ in gated.calls(tmp_path / "calls") if what == "end")


def _starts(tmp_path: Path) -> Counter[str]:
    return Counter(key for what, key, _ in gated.calls(tmp_path / "calls") if what == "start")


def _running(engine: Engine) -> list[tuple[str, str | None, dt.datetime | None]]:
    with engine.store.read() as db:
        rows = db.execute(select(outbox.c.status, outbox.c.claimed_by, outbox.c.lease_until)
                          .where(outbox.c.status == "running")).all()
    return [(r.status, r.claimed_by, r.lease_until) for r in rows]


# -- a worker that dies -------------------------------------------------------------------------


def test_a_killed_workers_claims_are_taken_over_within_its_lease(
        gated_engine: Engine, db_url: str, tmp_path: Path, plugin_env: dict[str, str],
        lifecycle_cmd: list[str]) -> None:
    """SIGKILL a `lifecycle worker` (default settings) while its handlers run; `lifecycle
    worker --until-idle` started next takes its claims over (the claimant's process is gone
    from this host) and finishes everything before the dead worker's leases would have
    ended, each handler finishing exactly once."""
    engine = gated_engine
    keys = [f"g{i}" for i in range(6)]
    for key in keys:
        engine.create("gated", key)
        engine.fire(key, "go")
    (tmp_path / "gate").touch()
    first = subprocess.Popen([*lifecycle_cmd, "worker", "--db", db_url, "--concurrency", "3"],
                             env=plugin_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        until(lambda: sum(_starts(tmp_path).values()) == 3, "three handlers to start")
        leases = {lease for _, _, lease in _running(engine)}
        assert len(_running(engine)) >= 3 and None not in leases
        # the worker's default name is HOST:PID:TAG: its own pid, not its client's
        [holder] = {claimed_by for _, claimed_by, _ in _running(engine)}
        assert holder is not None
        os.kill(int(holder.rsplit(":", 2)[1]), signal.SIGKILL)
        first.wait(timeout=60)  # (its client dies of the same signal, once it is reaped)
        assert first.returncode == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    killed_at = engine.clock.now()
    (tmp_path / "gate").unlink()
    done = subprocess.run([*lifecycle_cmd, "worker", "--until-idle", "--db", db_url],
                          env=plugin_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "claimed again now" in done.stderr  # taken over, not waited out
    assert {engine.get(key).state for key in keys} == {"done"}
    assert _ends(tmp_path) == Counter(keys)  # every handler finished exactly once
    records = effect_records(engine)
    assert {r.status for r in records} == {"done"}
    earliest_lease_end = min(lease for lease in leases if lease is not None)
    with engine.store.read() as db:
        finished = db.execute(select(outbox.c.finished_at)).scalars().all()
    assert max(finished) < earliest_lease_end, "the claims were only taken when leases ended"
    recovery = engine.store.time_value(max(finished)) - killed_at
    print(f"every effect done {recovery.total_seconds():.2f} s after the SIGKILL, a new "
          f"worker process started included (lease {DEFAULT_LEASE:g} s)")


def test_until_idle_waits_for_effects_another_host_holds(
        gated_engine: Engine, db_url: str, tmp_path: Path, plugin_env: dict[str, str],
        lifecycle_cmd: list[str]) -> None:
    """A claim of a worker on another host cannot be judged from here: `--until-idle` says
    what it waits for, waits, and finishes the effect once that lease has run out."""
    engine = gated_engine
    engine.create("gated", "far")
    engine.fire("far", "go")
    with engine.store.begin() as db:
        db.execute(update(outbox).values(
            status="running", attempts=1, claimed_by="elsewhere:4242:beef",
            claimant="another-boot/pid:[1]/4242/777",
            lease_until=engine.clock.now() + dt.timedelta(hours=1)))
    process = subprocess.Popen([*lifecycle_cmd, "worker", "--until-idle", "--db", db_url,
                                "--poll", "0.05"],  # it looks again soon after the lease
                               env=plugin_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        said = read_until(process.stderr, "waiting for",
                          "the worker ended without saying what it waits for")
        assert "waiting for 1 effect held by worker elsewhere:4242:beef (lease until" in said
        assert process.poll() is None  # it waits
        with engine.store.begin() as db:  # the other host's lease runs out
            db.execute(update(outbox).values(
                lease_until=engine.clock.now() - dt.timedelta(seconds=1)))
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert engine.get("far").state == "done"
    [record] = effect_records(engine)
    assert (record.status, record.attempts) == ("done", 2)
    assert _ends(tmp_path) == Counter(["far"])


def test_a_claim_of_a_live_process_is_never_taken_over(gated_engine: Engine, tmp_path: Path,
                                                      lifecycle_cmd: list[str]) -> None:
    """Claims of a process that lives (here: this one, under another worker's name) wait for
    their lease: a worker takes over only what it knows to be dead."""
    engine = gated_engine
    engine.create("gated", "mine")
    engine.fire("mine", "go")
    other = Worker(engine, name="other")
    with engine.store.begin() as db:
        db.execute(update(outbox).values(
            status="running", attempts=1, claimed_by="other", claimant=other.claimant,
            lease_until=engine.clock.now() + dt.timedelta(hours=1)))
    worker = Worker(engine)
    worker.run_until_idle()
    assert worker.held_elsewhere()[0].claimed_by == "other"
    [record] = effect_records(engine)
    assert (record.status, record.claimed_by) == ("running", "other")
    assert record.lease_until is not None and record.lease_until > engine.clock.now()
    assert _starts(tmp_path) == Counter()
    shown = subprocess.run([*lifecycle_cmd, "show", "gated:mine", "--db", engine.store.url],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
    assert "work running, attempt 1, held by worker other until" in shown.stdout, shown


# -- a handler slower than the lease ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_handler_slower_than_its_lease_runs_once(store: Store, kind: str) -> None:
    """The heartbeat renews the claim while the handler runs: a second worker polling all
    along never takes it, though the first lease ran out, and the lease after it too (the
    heartbeat renewed it at least twice)."""
    release = threading.Event()
    started = threading.Event()
    calls: list[str] = []

    def slow(call: EffectCall) -> FollowUp:
        calls.append(call.key)
        started.set()
        assert release.wait(120), "never released"
        return FollowUp("finished")

    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(slow, timeout=600.0)})
    engine.create("gated", "s1")
    engine.fire("s1", "go")
    lease = 0.6
    first, second = (DRIVERS[kind](engine, lease=lease, poll=0.02, name=n)
                     for n in ("one", "two"))
    threads = [running(w) for w in (first, second)]
    try:
        assert started.wait(60), "the handler never started"
        [(_, holder, lease_until)] = _running(engine)
        assert lease_until is not None
        claimed_until = engine.store.time_value(lease_until)
        # wait until the first lease has run out twice over, by the engine's clock: the
        # second worker polled all along (a claim that lapsed once is taken within a poll)
        until(lambda: engine.clock.now() > claimed_until + dt.timedelta(seconds=lease),
               "the first lease to run out")
        [(_, still, renewed)] = _running(engine)
        assert still == holder and renewed is not None
        assert engine.store.time_value(renewed) > claimed_until  # the heartbeat renewed it
        release.set()
        until(lambda: engine.get("s1").state == "done", "the effect to finish")
    finally:
        release.set()
        for w in (first, second):
            w.stop()
        for thread in threads:
            thread.join(60)
    assert calls == ["s1"]
    assert [(r.status, r.attempts) for r in effect_records(engine)] == [("done", 1)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_lease_shorter_than_two_heartbeats_is_refused(store: Store, kind: str) -> None:
    engine = Engine(store, [])
    with pytest.raises(ValueError, match="must span at least two heartbeats"):
        DRIVERS[kind](engine, lease=10, heartbeat=6)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lease must be a positive number"):
            DRIVERS[kind](engine, lease=bad)


# -- lost connections ---------------------------------------------------------------------------


def _terminate(postgres_url: str, application_name: str) -> int:
    base = postgres_url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(base, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                            "application_name = %s", (application_name,)).fetchall()
    return len(rows)


def _backends(postgres_url: str, application_name: str) -> int:
    base = postgres_url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (application_name,)).fetchone()
    return int(row[0]) if row else 0


def test_lost_connections_cost_nothing_but_time(postgres_url: str, tmp_path: Path,
                                                plugin_env: dict[str, str],
                                                lifecycle_cmd: list[str]) -> None:
    """Every connection of a running `lifecycle worker` is cut, again and again, while it
    works off 120 effects: each runs exactly once, no attempt is burnt, and the worker is
    still running at the end."""
    os.environ.update({k: plugin_env[k] for k in ("GATED_CALLS", "GATED_GATE")})
    engine = _gated_engine(postgres_url, tmp_path)
    keys = [f"c{i:03d}" for i in range(120)]
    for key in keys:
        engine.create("gated", key)
    assert all(r.fired for r in engine.fire_many([(key, "go", None, None, None)
                                                 for key in keys]))  # type: ignore[union-attr]
    worker_url = postgres_url.replace("application_name=", "application_name=worker_")
    worker_name = "worker_" + postgres_url.rsplit("application_name=", 1)[1]
    # handlers short enough that the worker is busy between cuts, long enough that each
    # cut (which the worker waits out for at least 0.1 s) finds more work left
    env = {**plugin_env, "GATED_SECONDS": "0.02"}
    process = subprocess.Popen([*lifecycle_cmd, "worker", "--db", worker_url,
                                "--concurrency", "4", "--poll", "0.05"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cut: list[int] = []  # the connections each try cut

    def cut_some() -> bool:
        cut.append(_terminate(postgres_url, worker_name))
        return cut[-1] > 0

    try:
        try:
            for round_ in range(6):
                # cut when some work is done and more is left, on every round; what the
                # worker holds then (on a busy machine it may still be waiting out the last
                # cut before it connects again: the cut waits for its new connection)
                until(lambda r=round_: sum(_ends(tmp_path).values()) >= 15 * (r + 1),
                      f"progress before cut {round_ + 1}")
                until(cut_some, f"a connection of the worker's to cut ({round_ + 1})")
            until(lambda: {r.status for r in effect_records(engine)} == {"done"},
                  "every effect done")  # one query a look, not one a key
            assert process.poll() is None, "the worker died"
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr[-3000:]
        assert {engine.get(k).state for k in keys} == {"done"}
        assert _ends(tmp_path) == Counter(keys), "an effect ran twice or never"
        assert _starts(tmp_path) == Counter(keys), "a handler was started twice"
        records = effect_records(engine)
        assert {(r.status, r.attempts) for r in records} == {("done", 1)}, "an attempt was burnt"
        assert "Traceback" not in stderr
    finally:
        engine.store.dispose()
    print(f"{sum(cut)} connections cut in 6 rounds; 120 effects each done once")


def test_a_connection_known_lost_is_not_logged_by_the_pool_as_an_error(
        postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each way the store writes on a connection (a held write, a write on a borrowed
    connection, as an effect's saved progress is, a read and a transaction of SQLAlchemy
    Core), its connection cut by `pg_terminate_backend`: the use fails with lifecycle's
    DatabaseError (once per dead connection the pool held) and then works again, and
    SQLAlchemy's pool logs no ERROR with a
    traceback for a connection lifecycle already knew was lost."""
    store = Store(postgres_url)
    name = postgres_url.rsplit("application_name=", 1)[1]
    uses = {"write": lambda: store.write(), "borrowed write": lambda: store.write(held=False)}
    cores = {"read": lambda: store.read(), "begin": lambda: store.begin()}
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.pool")
    def failures(what: str, use: Any, run: Any) -> int:
        """Use the store until a use works; how many failed (each dead connection the
        pool held fails once, then goes)."""
        failed = 0
        while True:
            try:
                with use() as tx:
                    run(tx)
                return failed
            except DatabaseError:
                failed += 1
                assert failed <= 20, f"{what}: the connections stay lost"

    try:
        for what, use in [*uses.items(), *cores.items()]:
            run = ((lambda tx: tx.execute("SELECT 1")) if what in uses
                   else (lambda db: db.execute(text("SELECT 1"))))
            failed = 0
            for _ in range(3):
                failures(what, use, run)
                assert _terminate(postgres_url, name) >= 1
                until(lambda: _backends(postgres_url, name) == 0, "the backends to end")
                failed += failures(what, use, run)
            assert failed >= 1, f"{what}: no cut was noticed"
    finally:
        store.dispose()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


@pytest.mark.parametrize("kind", KINDS)
def test_a_handlers_error_is_stored_without_the_passwords_it_names(store: Store,
                                                                   kind: str) -> None:
    def leaky(call: EffectCall) -> None:
        raise ConnectionError("cannot reach postgresql://app:s3cr/et@db.example.org/prod")

    engine = Engine(store, [load_spec(gated.SPEC)],
                    effects={"work": Effect(leaky, Retry(max_attempts=1))})
    engine.create("gated", "leak")
    engine.fire("leak", "go")
    until_idle(DRIVERS[kind](engine))
    [record] = effect_records(engine)
    assert record.status == "failed" and record.last_error is not None
    assert "s3cr" not in record.last_error and "db.example.org/prod" in record.last_error


def test_listings_refuse_a_key_no_database_can_be_asked_about(store: Store) -> None:
    engine = Engine(store, [load_spec(gated.SPEC)], effects=gated.effects)
    for listing in (effect_records, retry_failed):
        with pytest.raises(LifecycleError, match="invalid key"):
            listing(engine, "bad\x00key")
