"""The schema's history: migrations agree with the models, go down and up again, and a
database that was never upgraded is refused without being written to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from lifecycle import Engine, Store
from lifecycle.errors import DatabaseError, SchemaOutOfDate
from lifecycle.machines.job_exit import MIGRATIONS
from lifecycle.store import metadata, migrate
from lifecycle.store.statements import job_queue

TOGGLE = {"name": "toggle", "initial": "a", "states": ["a", "b"],
          "transitions": [{"trigger": "flip", "source": "a", "dest": "b"},
                          {"trigger": "flip", "source": "b", "dest": "a"}]}


def differences(store: Store) -> list[object]:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True})
        # the core's tables and job_exit's (core 0004 made its queue; its branch adopts it)
        return list(compare_metadata(context, [metadata, job_queue.metadata]))  # type: ignore[arg-type]


def lifecycle_tables(store: Store) -> set[str]:
    with store.engine.connect() as connection:
        return {t for t in inspect(connection).get_table_names() if t.startswith("lifecycle_")}


def test_models_and_migrations_agree(empty_db_url: str) -> None:
    store = Store(empty_db_url, upgrade=True, branches=[MIGRATIONS])
    assert differences(store) == []
    assert sorted(store.revisions()) == [migrate.head_revision(), "job_exit_0001_queue"]


def test_the_core_metadata_holds_no_machine_table() -> None:
    """What the core's ``metadata`` holds does not depend on which machines were imported."""
    assert "lifecycle_job_queue" not in metadata.tables
    assert set(job_queue.metadata.tables) == {"lifecycle_job_queue"}


def queue_row(store: Store) -> list[tuple[int, int]]:
    from sqlalchemy import text

    with store.read() as db:
        return [tuple(r) for r in db.execute(text(
            "SELECT cluster, proc FROM lifecycle_job_queue ORDER BY cluster"))]


@pytest.mark.parametrize("written_at", ["0004_job_queue", "0010_effect_gave_up"])
def test_a_queue_made_before_the_branch_is_adopted_with_its_rows(
        empty_db_url: str, written_at: str) -> None:
    """A database the code before job_exit's branch upgraded through 0004 (to 0004, or to
    that code's head) has the queue with rows: the branch takes the table over, keeps every
    row, and a job_exit store then opens it; downgrading the branch leaves the queue to 0004."""
    from sqlalchemy import text

    old = Store(empty_db_url, check=False)
    old.upgrade(written_at)
    with old.begin() as db:
        db.execute(text("INSERT INTO lifecycle_job_queue (cluster, proc, ad, job_status, "
                        "updates, submitted_at) VALUES (7, 0, '{}', 2, 0, "
                        "'2026-01-01 00:00:00')"))
    with pytest.raises(SchemaOutOfDate):
        Store(empty_db_url, branches=[MIGRATIONS])  # the branch is to apply: refused
    store = Store(empty_db_url, upgrade=True, branches=[MIGRATIONS])
    assert sorted(store.revisions()) == [migrate.head_revision(), "job_exit_0001_queue"]
    assert queue_row(store) == [(7, 0)]
    assert differences(store) == []
    Store(empty_db_url).dispose()  # a store without the branch opens it too
    store.downgrade("job_exit@base")
    assert store.revisions() == [migrate.head_revision()]
    assert queue_row(store) == [(7, 0)]
    store.upgrade()
    assert store.branch_revision(MIGRATIONS) == "job_exit_0001_queue"
    assert queue_row(store) == [(7, 0)]


def test_a_database_before_0004_gets_the_queue_and_the_branch(empty_db_url: str) -> None:
    store = Store(empty_db_url, check=False, branches=[MIGRATIONS])
    store.upgrade("0003_effects_timers")
    store.upgrade()
    assert sorted(store.revisions()) == [migrate.head_revision(), "job_exit_0001_queue"]
    assert queue_row(store) == []
    store.downgrade("base")
    assert lifecycle_tables(store) <= {migrate.VERSION_TABLE}


def test_a_branch_this_process_was_not_given_is_named_not_broken(empty_db_url: str) -> None:
    """A store without job_exit's branch, upgrading a database that has it, says which
    branch it lacks instead of Alembic's "can't locate revision"."""
    store = Store(empty_db_url, upgrade=True, branches=[MIGRATIONS])
    store.downgrade("head-1")  # the core's head-1 (Alembic sees two heads): the branch stays
    assert store.current_revision() == [r for r, _, _ in migrate.revisions()][-2]
    assert store.branch_revision(MIGRATIONS) == "job_exit_0001_queue"
    with pytest.raises(DatabaseError, match="job_exit_0001_queue, which this process was "
                                            "not given"):
        Store(empty_db_url, upgrade=True)
    assert Store(empty_db_url, upgrade=True, branches=[MIGRATIONS]).current_revision() == \
        migrate.head_revision()


def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    store = Store(empty_db_url, check=False)
    store.upgrade()
    assert store.current_revision() == migrate.head_revision()
    assert lifecycle_tables(store) >= {t for t in metadata.tables}
    Engine(store, [TOGGLE]).create("toggle", "x")
    store.downgrade("base")
    assert store.current_revision() is None
    assert lifecycle_tables(store) == {migrate.VERSION_TABLE} or lifecycle_tables(store) == set()
    store.upgrade()
    assert differences(store) == []
    engine = Engine(Store(empty_db_url), [TOGGLE])
    engine.create("toggle", "x")
    assert engine.fire("x", "flip").dest == "b"


def test_every_revision_steps_down_and_up(empty_db_url: str) -> None:
    store = Store(empty_db_url, check=False)
    chain = [revision for revision, _, _ in migrate.revisions()]
    for revision in chain:
        store.upgrade(revision)
        assert store.current_revision() == revision
    for down in reversed([None, *chain[:-1]]):
        store.downgrade(down or "base")
        assert store.current_revision() == down


def test_empty_database_is_refused_and_left_alone(empty_db_url: str) -> None:
    with pytest.raises(SchemaOutOfDate, match=r"has no lifecycle schema yet; run `lifecycle db "
                                              r"upgrade`"):
        Store(empty_db_url)
    if empty_db_url.startswith("sqlite"):
        assert not Path(empty_db_url.removeprefix("sqlite:///")).exists()
    else:
        assert lifecycle_tables(Store(empty_db_url, check=False)) == set()


def test_database_behind_the_code_is_refused(empty_db_url: str) -> None:
    chain = [revision for revision, _, _ in migrate.revisions()]
    store = Store(empty_db_url, check=False)
    if len(chain) < 2:
        # With a single revision, "behind" can only mean "not upgraded at all".
        store.upgrade()
        store.downgrade("base")
        with pytest.raises(SchemaOutOfDate):
            Store(empty_db_url)
        return
    store.upgrade(chain[-2])
    with pytest.raises(SchemaOutOfDate, match=f"is at schema revision {chain[-2]}"):
        Store(empty_db_url)
    assert Store(empty_db_url, upgrade=True).current_revision() == chain[-1]


def test_a_revision_this_code_does_not_know_is_refused(empty_db_url: str) -> None:
    from sqlalchemy import text


    store = Store(empty_db_url, upgrade=True, branches=[MIGRATIONS])
    with store.begin() as db:  # (the core's row; the branch's stays)
        db.execute(text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999_future' "
                        f"WHERE version_num = '{migrate.head_revision()}'"))
    with pytest.raises(DatabaseError, match="9999_future, which this version of lifecycle "
                                            "does not know"):
        Store(empty_db_url)


def test_upgrading_keeps_every_row(empty_db_url: str) -> None:
    """Each revision upgrades a database full of history without losing a row of it."""
    chain = [revision for revision, _, _ in migrate.revisions()]
    store = Store(empty_db_url, check=False)
    store.upgrade(chain[0])
    from sqlalchemy import text

    with store.begin() as db:  # history written by the first revision's code
        db.execute(text(
            "INSERT INTO lifecycle_specs (machine, version, spec, created_at) VALUES "
            "('toggle', 'v1', :spec, '2026-01-01 00:00:00')"), {"spec": __import__("json").dumps(
                TOGGLE)})
        db.execute(text("INSERT INTO lifecycle_machines VALUES ('toggle', 'v1', "
                        "'2026-01-01 00:00:00')"))
        db.execute(text(
            "INSERT INTO lifecycle_resources (machine, key, spec_version, state, version, seq, "
            "data, created_at, updated_at) VALUES ('toggle', 'x', 'v1', 'b', 2, 2, '{}', "
            "'2026-01-01 00:00:00', '2026-01-01 00:00:01')"))
        rid = db.execute(text("SELECT id FROM lifecycle_resources")).scalar_one()
        for seq, kind, trigger, source, dest in ((1, "create", None, None, "a"),
                                                 (2, "transition", "flip", "a", "b")):
            db.execute(text(
                "INSERT INTO lifecycle_journal (resource_id, seq, kind, trigger, source, dest, "
                "version, spec_version, at) VALUES (:rid, :seq, :kind, :trigger, :source, "
                ":dest, :seq, 'v1', '2026-01-01 00:00:00')"),
                {"rid": rid, "seq": seq, "kind": kind, "trigger": trigger, "source": source,
                 "dest": dest})
    store.upgrade()
    engine = Engine(Store(empty_db_url), [TOGGLE])
    assert [e.dest for e in engine.history("x")] == ["a", "b"]
    assert engine.verify() == []
    assert engine.fire("x", "flip").dest == "a"
    store.downgrade(chain[0])
    with store.read() as db:
        count = db.execute(text("SELECT count(*) FROM lifecycle_journal")).scalar_one()
    assert count == 3


def test_many_processes_upgrade_a_fresh_postgresql_database_at_once(
        empty_postgres_url: str, slow: bool, forkserver: Any) -> None:
    """Processes starting together each run `lifecycle db upgrade`: they take turns on an
    advisory lock, and every one ends well (without it, most failed creating the same type)."""
    import subprocess

    # each a process of its own, started warm (tests/zygote.py): they start closer together
    command = [*forkserver.python("-m", "lifecycle"), "db", "upgrade", "--db", empty_postgres_url]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(20 if slow else 4)]
    outcomes = [(p.wait(timeout=300), p.communicate()) for p in processes]
    failed = [(code, err) for code, (_, err) in outcomes if code != 0]
    assert not failed, failed[:3]
    store = Store(empty_postgres_url)  # at head, or this raises
    try:
        assert differences(store) == []
    finally:
        store.dispose()


def test_the_dashboard_and_show_read_the_core_revision_beside_a_branch(
        empty_db_url: str) -> None:
    """The version table's row of job_exit's branch is not the core's revision: the
    dashboard's read-only store and `lifecycle show`'s read on the bare driver take the
    database for current, and one at another core revision for another."""
    from lifecycle.bare_read import Unsure, peek
    from lifecycle.store.readonly import ReadOnlyDatabase, Unavailable

    store = Store(empty_db_url, upgrade=True, branches=[MIGRATIONS])
    Engine(store, [TOGGLE]).create("toggle", "x")
    dashboard = ReadOnlyDatabase(empty_db_url)
    try:
        with dashboard.read():
            pass
        assert peek(empty_db_url, "x", ["pending"], ["pending"]).resource.machine == "toggle"
        store.downgrade("head-1")
        with pytest.raises(Unavailable, match="not " + migrate.head_revision()), \
                dashboard.read():
            pass
        with pytest.raises(Unsure):
            peek(empty_db_url, "x", ["pending"], ["pending"])
    finally:
        dashboard.dispose()


def test_a_new_sqlite_store_is_a_fresh_migrated_database_of_its_own(tmp_path: Path) -> None:
    """``Store.new_sqlite`` copies a database migrated once per process: each copy is at the
    code's revision with the tables the migrations make, holds only what is written to it,
    and an existing file is refused, not overwritten."""
    first = Store.new_sqlite(tmp_path / "first.db")
    second = Store.new_sqlite(tmp_path / "second.db")
    try:
        assert first.revisions() == [migrate.head_revision()]
        assert differences(first) == []
        Engine(first, [TOGGLE]).create("toggle", "t1")
        assert Engine(second, [TOGGLE]).resources("toggle") == []
    finally:
        first.dispose()
        second.dispose()
    with pytest.raises(FileExistsError):
        Store.new_sqlite(tmp_path / "first.db")
    with Store(f"sqlite:///{tmp_path / 'first.db'}") as again:
        assert [r.key for r in Engine(again, [TOGGLE]).resources("toggle")] == ["t1"]
