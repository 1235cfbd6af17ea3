"""The outbox across processes: workers killed with SIGKILL at every point of a chain,
several workers sharing PostgreSQL, and shutdown on real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from procs import machines
from sqlalchemy import text

from lifecycle import Engine, Store, Worker
from lifecycle.outbox_admin import effect_records, outbox_counts

SCRIPT = str(Path(__file__).parent / "procs" / "run_worker.py")


@pytest.fixture
def run_cmd(forkserver: Any) -> list[str]:
    """`python procs/run_worker.py`, started warm (tests/zygote.py): each run here ends by
    itself (its own forks kill themselves) or by the SIGTERM or SIGQUIT its client passes
    on."""
    return forkserver.python(SCRIPT)  # type: ignore[no-any-return]


def test_crashes_at_every_point_lose_and_repeat_nothing(db_url: str, tmp_path: Path,
                                                       slow: bool, run_cmd: list[str]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    store = Store(db_url, upgrade=True)
    engine = machines.exit_engine(db_url, logs, crasher=None)
    # 30 jobs with --slow; 10 by default, each point more likely to crash (some 8 crashes)
    jobs = [f"{cluster}.0" for cluster in range(100, 130 if slow else 110)]
    probability = "0.04" if slow else "0.05"
    for key in jobs:
        engine.create("exit3", key)
        engine.fire(key, "exited")
    # each worker run a process forked from one that imported everything once; the next
    # run takes over the claims of the one that died at once (it sees its process is gone).
    # This process holds no connection meanwhile (see procs/crash_loop.py on SQLite)
    store.dispose()
    engine.store.dispose()
    done = subprocess.run([*run_cmd, "exit", db_url, str(logs), probability],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    runs, crashes = summary["runs"], summary["crashes"]
    print(f"{runs} worker runs, {crashes} killed with SIGKILL")
    assert crashes >= 3, "the test did not crash often enough to show anything"
    assert {e.status for e in effect_records(engine)} == {"done"}
    for key in jobs:
        lines = (logs / f"{key}.log").read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["userlog", "ad", "mail"], (key, lines)
        assert (logs / f"{key}.ad").read_text() == f"ClusterId = {key}\n"
        assert engine.get(key).state == "done"
    assert engine.verify() == []
    store.dispose()


def _ticker_with_calls_table(postgres_url: str) -> tuple[Store, Engine]:
    """A store with a table the ticker workers note each effect's call in, and an engine
    for the ticker machine."""
    store = Store(postgres_url, upgrade=True)
    with store.begin() as db:
        db.execute(text("CREATE TABLE effect_calls (n BIGSERIAL PRIMARY KEY, "
                        "idempotency_key TEXT NOT NULL, effect_id BIGINT NOT NULL, "
                        "resource TEXT NOT NULL, worker TEXT NOT NULL)"))
    return store, Engine(store, [machines.TICKER], effects={"e0": lambda c: None,
                                                            "e1": lambda c: None})


def _in_order(calls: list[Any]) -> None:
    per_resource: dict[str, list[int]] = {}
    for call in calls:
        per_resource.setdefault(call.resource, []).append(call.effect_id)
    for resource, order in per_resource.items():
        assert order == sorted(order), f"{resource} ran out of order: {order}"


def test_four_workers_share_postgres_without_running_anything_twice(
        postgres_url: str, tmp_path: Path, slow: bool, run_cmd: list[str]) -> None:
    """Without the claim's row locks (SKIP LOCKED), effects run twice at 20 resources in
    every run; 40 here, 500 with --slow."""
    store, engine = _ticker_with_calls_table(postgres_url)
    keys = [f"r{i:03d}" for i in range(500 if slow else 40)]
    effects = 2 * 5 * len(keys)  # each tick asks for two
    for key in keys:
        engine.create("ticker", key)
    for _ in range(5):  # many fires to a transaction: what the workers meet is the same
        assert all(r.fired for r in engine.fire_many(  # type: ignore[union-attr]
            [(key, "tick", None, None, None) for key in keys]))
    assert outbox_counts(engine) == {"pending": effects}
    started = time.monotonic()
    # four worker processes, forked at once from one that imported everything, start
    # claiming together, when the last has started
    workers = subprocess.run([*run_cmd, "tickers", postgres_url, "effect_calls", "4",
                              str(tmp_path)], stderr=subprocess.PIPE, text=True, timeout=300)
    assert workers.returncode == 0, workers.stderr
    elapsed = time.monotonic() - started
    with store.read() as db:
        calls = db.execute(text(
            "SELECT idempotency_key, effect_id, resource, worker FROM effect_calls "
            "ORDER BY n")).all()
    print(f"{effects} effects by 4 workers in {elapsed:.1f} s")
    assert outbox_counts(engine) == {"done": effects}
    assert len(calls) == effects
    assert len({c.idempotency_key for c in calls}) == effects, "an effect ran twice"
    _in_order(calls)
    assert len({c.worker for c in calls}) == 4, "the work was not shared"


def _start_slow_worker(run_cmd: list[str], db_url: str, tmp_path: Path, kind: str = "sync"
                       ) -> tuple[subprocess.Popen[str], Engine, Path]:
    """A worker process whose handler has started and waits until the test removes its
    gate file."""
    marker = tmp_path / "done"
    marker.with_suffix(".gate").touch()
    engine = machines.slow_engine(db_url, marker)
    engine.store.upgrade()
    engine.create("slow", "s1")
    engine.fire("s1", "go")
    process = subprocess.Popen([*run_cmd, "slow" if kind == "sync" else "slow-async", db_url,
                                str(marker)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 120
    while not marker.with_suffix(".started").exists():
        assert time.monotonic() < deadline, "the worker never started the handler"
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    assert effect_records(engine)[0].status == "running"
    return process, engine, marker


def _stderr_until(process: subprocess.Popen[str], text: str) -> str:
    """The worker's log up to the first line that holds ``text``."""
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"the worker ended without saying {text!r}: {''.join(seen)}")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigterm_finishes_the_running_handler(sqlite_url: str, tmp_path: Path,
                                              kind: str, run_cmd: list[str]) -> None:
    """SIGTERM: the worker stops claiming and waits for its running handler, however long
    (either driver)."""
    Store(sqlite_url, upgrade=True).dispose()
    process, engine, marker = _start_slow_worker(run_cmd, sqlite_url, tmp_path, kind)
    process.send_signal(signal.SIGTERM)
    _stderr_until(process, "finishing 1 running handlers")
    assert process.poll() is None  # still waiting for the handler, which waits for its gate
    marker.with_suffix(".gate").unlink()
    assert process.wait(timeout=120) == 0
    assert marker.exists()
    assert effect_records(engine)[0].status == "done"
    engine.store.dispose()


@pytest.mark.parametrize("signals", [[signal.SIGTERM, signal.SIGTERM], [signal.SIGQUIT]])
def test_fast_shutdown_abandons_the_running_handler(sqlite_url: str, tmp_path: Path,
                                                    signals: list[int],
                                                    run_cmd: list[str]) -> None:
    """A second SIGTERM, or SIGQUIT: the worker leaves at once, its handler still running
    (it waits for a gate nobody opens), and gives the effect back for another worker."""
    Store(sqlite_url, upgrade=True).dispose()
    process, engine, marker = _start_slow_worker(run_cmd, sqlite_url, tmp_path)
    first, *then = signals
    process.send_signal(first)
    for number in then:
        _stderr_until(process, "graceful shutdown")
        process.send_signal(number)
    assert process.wait(timeout=120) == 0
    assert marker.with_suffix(".gate").exists() and not marker.exists()
    [effect] = effect_records(engine)
    assert (effect.status, effect.attempts) == ("pending", 0)  # given back, not lost
    engine.store.dispose()


def test_effects_asked_for_while_workers_finish_their_predecessors(postgres_url: str,
                                                                  run_cmd: list[str]) -> None:
    """Each resource's effects form a queue whose head alone may run. Transitions ask for new
    effects on the very resources whose effects two worker processes are finishing: a new
    effect must become the head when its predecessor is done, whichever commits first, or
    it would wait for ever. At the end nothing is left, and every queue ran in order."""
    store, engine = _ticker_with_calls_table(postgres_url)
    keys = [f"q{i:02d}" for i in range(40)]
    for key in keys:
        engine.create("ticker", key)
        engine.fire(key, "tick")
    workers = subprocess.Popen([*run_cmd, "tickers", postgres_url, "effect_calls", "2"],
                               stderr=subprocess.PIPE, text=True)  # two, forked
    try:
        for _ in range(15):  # while they work: more effects on the same resources
            for key in keys:
                engine.fire(key, "tick")
    finally:
        _, stderr = workers.communicate(timeout=300)
        assert workers.returncode == 0, stderr
    last = machines.ticker_engine(postgres_url, "effect_calls", "last")
    Worker(last).run_until_idle()  # what came after the workers found the outbox empty
    last.store.dispose()
    assert outbox_counts(engine) == {"done": 40 * 16 * 2}, "an effect was never claimable"
    with store.read() as db:
        calls = db.execute(text("SELECT effect_id, resource FROM effect_calls ORDER BY n")).all()
        heads = db.execute(text("SELECT count(*) FROM lifecycle_effects WHERE head = 1")).scalar()
    assert heads == 0
    assert len(calls) == len({c.effect_id for c in calls}) == 40 * 16 * 2
    _in_order(calls)
    store.dispose()
