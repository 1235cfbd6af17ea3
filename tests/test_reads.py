"""Reads for fleets: pages of resources by keyset, the counts kept by the database, ``get``
on the raw path, ``verify`` streamed, and ``lifecycle list`` a page at a time."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, text

from lifecycle import AsyncEngine, Engine, LifecycleError, SimulatedClock, Store, queries
from lifecycle import verify as verify_module
from lifecycle.cli import main
from lifecycle.results import FireResult
from lifecycle.store import Transaction, resources
from lifecycle.within import Within

TOGGLE: dict[str, Any] = {
    "name": "toggle", "initial": "off",
    "states": ["off", {"name": "on", "initial": "low", "states": ["low", "high"]}, "claimed"],
    "transitions": [{"trigger": "flip", "source": "off", "dest": "on"},
                    {"trigger": "flip", "source": "on", "dest": "off"},
                    {"trigger": "up", "source": "on.low", "dest": "on.high"},
                    {"trigger": "claim", "source": "*", "dest": "claimed"}],
}
OTHER: dict[str, Any] = {"name": "other", "initial": "new", "states": ["new", "old"],
                         "final": ["old"],
                         "transitions": [{"trigger": "age", "source": "new", "dest": "old"}]}


@pytest.fixture
def engine(store: Store) -> Engine:
    return Engine(store, [TOGGLE, OTHER], clock=SimulatedClock("2026-03-01T12:00:00Z"))


def _keys(found: list[Any]) -> list[str]:
    return [f"{r.machine}:{r.key}" for r in found]


def _scan(store: Store) -> dict[str, dict[str, int]]:
    """The counts as a full scan of the resources finds them."""
    out: dict[str, dict[str, int]] = {}
    with store.read() as db:
        for machine, state, n in db.execute(
                select(resources.c.machine, resources.c.state, func.count())
                .group_by(resources.c.machine, resources.c.state)):
            out.setdefault(machine, {})[state] = n
    return out


def _delete(store: Store, key: str) -> None:
    with store.begin() as db:
        db.execute(resources.delete().where(resources.c.key == key))


# -- pages ----------------------------------------------------------------------------------


def test_pages_of_an_empty_database(engine: Engine) -> None:
    assert engine.resources(limit=10) == []
    assert engine.resources("toggle", "on", limit=10, after="toggle:x") == []
    assert list(engine.iter_resources()) == []
    assert engine.resources() == []


def test_pages_walk_every_resource_once_in_order(engine: Engine) -> None:
    for i in range(7):
        engine.create("toggle", f"t{i}")
    engine.create("other", "o1")
    everything = _keys(engine.resources())
    assert everything == ["other:o1", *[f"toggle:t{i}" for i in range(7)]]
    walked, after = [], None
    while page := engine.resources(limit=3, after=after):
        assert len(page) <= 3
        walked += _keys(page)
        after = walked[-1]
    assert walked == everything
    assert _keys(engine.iter_resources(page=2)) == everything
    assert _keys(engine.resources(limit=0)) == []


def test_a_page_that_ends_exactly_at_the_last_resource(engine: Engine) -> None:
    for i in range(4):
        engine.create("toggle", f"t{i}")
    first = engine.resources("toggle", limit=2)
    second = engine.resources("toggle", limit=2, after=first[-1].key)  # plain key: of toggle
    assert _keys(first + second) == [f"toggle:t{i}" for i in range(4)]
    assert engine.resources("toggle", limit=2, after=second[-1].key) == []
    assert _keys(engine.iter_resources("toggle", page=4)) == _keys(first + second)


def test_a_page_after_a_deleted_or_unknown_resource(engine: Engine, store: Store) -> None:
    for key in ("a", "b", "c", "d"):
        engine.create("toggle", key)
    first = engine.resources(limit=2)
    _delete(store, first[-1].key)  # the position's resource is gone before the next page
    assert _keys(engine.resources(limit=2, after="toggle:b")) == ["toggle:c", "toggle:d"]
    # a position that never existed: the page starts at the next key
    assert _keys(engine.resources(limit=5, after="toggle:bb")) == ["toggle:c", "toggle:d"]
    assert _keys(engine.resources(limit=5, after="aaa:zzz")) == [
        "toggle:a", "toggle:c", "toggle:d"]
    assert engine.resources(limit=5, after="zzz:a") == []
    assert engine.resources("toggle", limit=5, after="toggle:d") == []
    # a machine named: a position in a machine before it or after it
    assert _keys(engine.resources("toggle", limit=5, after="aaa:zzz")) == _keys(
        engine.resources("toggle", limit=5))
    assert engine.resources("toggle", limit=5, after="zzz:a") == []


def test_pages_of_a_state_take_in_the_states_inside_it(engine: Engine) -> None:
    for key in ("a", "b", "c"):
        engine.create("toggle", key)
        engine.fire(key, "flip")
    engine.fire("b", "up")
    engine.create("toggle", "z")
    assert _keys(engine.resources("toggle", "on", limit=10)) == [
        "toggle:a", "toggle:b", "toggle:c"]
    assert _keys(engine.resources("toggle", "on.high", limit=10)) == ["toggle:b"]
    assert _keys(engine.resources(state="on", limit=1, after="toggle:a")) == ["toggle:b"]
    # LIKE's wildcards in a state are letters: "o_" takes in no "on.low"; "%" matches nothing
    assert engine.resources("toggle", "o_", limit=10) == []
    assert engine.resources("toggle", "%", limit=10) == []
    assert engine.resources(state="o/", limit=10) == []


@pytest.mark.parametrize("hostile", ["toggle:a\x00", "x" * 600, "\ud800", "toggle:a'; --"])
def test_hostile_positions_are_refused_or_read_as_text(engine: Engine, hostile: str) -> None:
    engine.create("toggle", "a")
    engine.create("toggle", "b")
    try:
        found = engine.resources(limit=5, after=hostile)
    except LifecycleError as exc:
        assert "invalid position" in str(exc)
    else:
        assert _keys(found) == ["toggle:b"]  # "toggle:a'; --" sorts after a, before b
    assert _keys(engine.resources()) == ["toggle:a", "toggle:b"]


def test_bad_pages_are_refused(engine: Engine) -> None:
    with pytest.raises(LifecycleError, match="MACHINE:KEY"):
        engine.resources(limit=5, after="plain")
    for limit in (-1, True, 1.5):
        with pytest.raises(LifecycleError, match="invalid limit"):
            engine.resources(limit=limit)  # type: ignore[arg-type]
    with pytest.raises(LifecycleError, match="invalid page"):
        list(engine.iter_resources(page=0))


# -- counts ---------------------------------------------------------------------------------


def test_counts_follow_creates_fires_and_deletes(engine: Engine, store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "FOLD_AFTER", 3)  # fold often
    assert engine.counts() == {} == _scan(store)
    for i in range(6):
        engine.create("toggle", f"t{i}")
        assert engine.counts() == _scan(store)
    engine.create("other", "o")
    for i in range(4):
        engine.fire(f"t{i}", "flip")
        assert engine.counts() == _scan(store)
    engine.fire("t0", "up")
    engine.fire("t1", "claim")
    assert not engine.fire("t1", "up")  # not fired: nothing counted
    engine.update("t2", {"x": 1})  # a data change is no move
    assert engine.counts() == _scan(store) == {
        "toggle": {"off": 2, "on.low": 2, "on.high": 1, "claimed": 1}, "other": {"new": 1}}
    assert engine.counts("other") == {"other": {"new": 1}}
    _delete(store, "t3")
    _delete(store, "o")
    assert engine.counts() == _scan(store) == {
        "toggle": {"off": 2, "on.low": 1, "on.high": 1, "claimed": 1}}
    with store.read() as db:  # folded: about one row per machine and state
        rows = db.execute(text("SELECT count(*) FROM lifecycle_state_counts")).scalar_one()
    assert rows <= 4 + 3 + 2


def test_counts_stay_right_under_concurrent_writers(store: Store,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers on threads of their own (each with its connection) fire while others read
    and fold the counts: the sums stay those of a scan."""
    monkeypatch.setattr(queries, "FOLD_AFTER", 5)
    engine = Engine(store, [TOGGLE])
    writers, fires = 4, 25
    for w in range(writers):
        engine.create("toggle", f"w{w}")
    problems: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for _ in range(fires):
                engine.fire(f"w{w}", "flip")
                engine.counts()
        except BaseException as exc:  # reported below
            problems.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    expected = {"toggle": {"on.low": writers}} if fires % 2 else {"toggle": {"off": writers}}
    assert engine.counts() == _scan(store) == expected


# -- get ------------------------------------------------------------------------------------


def test_get_reads_what_the_core_query_reads(engine: Engine, store: Store) -> None:
    engine.create("toggle", "t", {"n": 1})
    engine.create("other", "t")
    engine.create("other", "solo")
    engine.fire("toggle:t", "flip")
    engine.observe("toggle:t", {"up": True})
    for key in ("toggle:t", "other:t", "solo", "other:solo"):
        with store.read() as db:
            _, before = queries.resource_id(db, key)
        assert engine.get(key) == before
    got = engine.get("toggle:t")
    assert got.observation is not None and got.observation.status == {"up": True}
    assert got.created_at.tzinfo is not None and got.data == {"n": 1}


def test_get_inside_a_write_of_the_same_thread(engine: Engine) -> None:
    """A read asked for inside a fire's transaction (a ``Within`` hook) is made in it."""
    engine.create("toggle", "t")
    seen: list[str] = []

    class Peek(Within):
        def after(self, cursor: Any, result: FireResult) -> None:
            seen.append(engine.get("toggle:t").state)

    assert engine.fire("t", "flip", within=Peek())
    assert seen == ["on.low"] and engine.get("t").state == "on.low"


def test_a_within_hook_writes_its_own_rows_the_same_on_either_database(
        engine: Engine, store: Store) -> None:
    """A caller's writes in a fire's transaction get a ``Transaction``: its own statement in
    the database's parameter style, a document and a time converted as the database stores
    them, read back in the same transaction, on SQLite and PostgreSQL alike."""
    engine.create("toggle", "t")
    at = dt.datetime(2026, 12, 3, 18, 0, tzinfo=dt.UTC)
    mark = ":{}" if store.dialect == "sqlite" else "%({})s"
    insert = ("INSERT INTO lifecycle_job_queue (cluster, proc, ad, job_status, updates, "
              "submitted_at) VALUES ({}, {}, {}, 2, 0, {})").format(
        *(mark.format(n) for n in ("cluster", "proc", "ad", "at")))
    read = "SELECT ad, submitted_at FROM lifecycle_job_queue WHERE cluster = 7"
    seen: list[tuple[Any, Any]] = []

    class Records(Within):
        def after(self, tx: Transaction, result: FireResult) -> None:
            assert tx.paramstyle == ("named" if tx.dialect == "sqlite" else "pyformat")
            tx.execute(insert, {"cluster": 7, "proc": 0, "ad": tx.json({"Owner": "ana"}),
                                "at": tx.time(at)})
            assert tx.rowcount == 1
            tx.execute(read)
            ad, submitted = tx.fetchone()
            seen.append((tx.json_value(ad), tx.time_value(submitted)))

    assert engine.fire("t", "flip", within=Records())
    assert seen == [({"Owner": "ana"}, at)]
    with store.reading() as tx:   # committed with the transition
        tx.execute(read)
        assert tx.fetchall()[0][0] is not None


# -- verify ---------------------------------------------------------------------------------


def test_verify_streamed_in_small_batches_finds_the_same(engine: Engine, store: Store,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    for i in range(5):
        engine.create("toggle", f"t{i}")
        for _ in range(i):
            engine.fire(f"t{i}", "flip")
    with store.begin() as db:  # tamper with two resources
        db.execute(resources.update().where(resources.c.key == "t2").values(state="claimed"))
        db.execute(text("DELETE FROM lifecycle_journal WHERE seq = 2 AND resource_id = "
                        "(SELECT id FROM lifecycle_resources WHERE key = 't4')"))
    whole = [str(m) for m in engine.verify()]
    assert any("t2" in m and "claimed" in m for m in whole)
    assert any("t4" in m and "not contiguous" in m for m in whole)
    for batch in (1, 2, 3):
        monkeypatch.setattr(verify_module, "BATCH", batch)
        assert [str(m) for m in engine.verify()] == whole


# -- the command line -----------------------------------------------------------------------


def test_lifecycle_list_a_page_at_a_time(engine: Engine, db_url: str) -> None:
    for i in range(5):
        engine.create("toggle", f"t{i}")
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(main, [*args, "--db", db_url], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    first = run("list", "toggle", "--limit", "2")
    assert "toggle:t0" in first and "toggle:t2" not in first
    assert first.rstrip().endswith(
        "2 resources shown; the next page: lifecycle list toggle --limit 2 --after toggle:t1")
    second = run("list", "toggle", "--limit", "2", "--after", "toggle:t1")
    assert "toggle:t2" in second and "toggle:t3" in second and "toggle:t1" not in second
    last = run("list", "toggle", "--limit", "2", "--after", "toggle:t3")
    assert last.rstrip().endswith("\n1 resource") and "toggle:t4" in last
    exact = run("list", "--limit", "5")
    assert exact.rstrip().endswith("\n5 resources")
    assert run("list", "--after", "toggle:t4").rstrip().endswith("0 resources")
    listed = json.loads(runner.invoke(main, ["list", "--json", "--limit", "3", "--db", db_url],
                                      catch_exceptions=False).stdout)
    assert [r["key"] for r in listed] == ["t0", "t1", "t2"]
    assert run("list", "--all", "--limit", "1").rstrip().endswith("\n5 resources")
    refused = runner.invoke(main, ["list", "--after", "t1", "--db", db_url])
    assert refused.exit_code == 1 and "MACHINE:KEY" in refused.output


def test_a_write_after_a_read_is_still_one_transaction(engine: Engine) -> None:
    """A read switches nothing for the writes after it on the same connection: a fire whose
    hook fails after the transition was written leaves nothing behind."""
    engine.create("toggle", "t")
    engine.get("t")
    engine.resources(limit=5)
    engine.counts()

    class Fails(Within):
        def after(self, cursor: Any, result: FireResult) -> None:
            raise RuntimeError("the caller's own write failed")

    with pytest.raises(RuntimeError):
        engine.fire("t", "flip", within=Fails())
    assert engine.get("t").state == "off" and engine.get("t").version == 1
    assert [e.kind for e in engine.history("t")] == ["create"]
    assert engine.counts() == {"toggle": {"off": 1}}


def test_threads_that_only_read_hold_no_connection(engine: Engine) -> None:
    """More threads than the pool has connections read at once and wait for each other
    while alive: each borrowed its connection for the read alone (had it kept one, as a
    writing thread does, the sixteenth would wait for the pool)."""
    engine.create("toggle", "t")
    threads, states, problems = 20, [], []
    everyone_read = threading.Barrier(threads, timeout=120)

    def read() -> None:
        try:
            states.append(engine.get("t").state)
            everyone_read.wait()
        except BaseException as exc:  # reported below
            problems.append(exc)

    started = [threading.Thread(target=read) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    assert problems == [] and states == ["off"] * threads


def test_the_async_engine_reads_pages_too(store: Store) -> None:
    async def main() -> tuple[list[str], list[str]]:
        async with AsyncEngine(store, [TOGGLE]) as engine:
            for key in ("a", "b", "c"):
                await engine.create("toggle", key)
            page = await engine.resources("toggle", limit=2, after="toggle:a")
            every = [r async for r in engine.iter_resources(page=2)]
            return _keys(page), _keys(every)

    assert asyncio.run(main()) == (["toggle:b", "toggle:c"],
                                   ["toggle:a", "toggle:b", "toggle:c"])


def test_a_pool_connection_a_write_borrowed_goes_back_out_of_autocommit(
        postgres_url: str) -> None:
    """A PostgreSQL write runs on a connection in autocommit (it says BEGIN and COMMIT
    itself, and only when it must); one it borrowed from the pool (``held=False``) goes back
    out of it, whether it wrote nothing, one statement, or two, so that a SQLAlchemy
    transaction that gets it next is one. Times come in UTC as the session gives them."""
    with Store(postgres_url, upgrade=True) as store:
        engine = Engine(store, [TOGGLE])
        engine.create("toggle", "t")
        sql = store.sql
        for writes in (0, 1, 2):
            with store.write(held=False) as tx:
                tx.execute(sql.resource_by_key, {"key": "t"})
                row = tx.fetchall()[0]
                connection = tx._connection  # type: ignore[attr-defined]
                for _ in range(writes):
                    tx.execute("UPDATE lifecycle_resources SET updated_at = updated_at "
                               "WHERE id = %(id)s", {"id": row[0]})
            assert connection.autocommit is False
            assert row[8].tzinfo is dt.UTC  # last_transition_at
        with pytest.raises(RuntimeError), store.begin() as db:
            db.execute(text("UPDATE lifecycle_resources SET state = 'gone'"))
            raise RuntimeError("rolled back")
        assert engine.get("toggle:t").state != "gone"
