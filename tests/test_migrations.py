"""The schema's history: migrations agree with the models, go down and up again, and a
database that was never upgraded is refused without being written to."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

import lifecycle.adapters.job_queue  # noqa: F401  (its table is in the metadata, migrated too)
from lifecycle import Engine, SchemaOutOfDate, Store
from lifecycle.store import metadata, migrate

TOGGLE = {"name": "toggle", "initial": "a", "states": ["a", "b"],
          "transitions": [{"trigger": "flip", "source": "a", "dest": "b"},
                          {"trigger": "flip", "source": "b", "dest": "a"}]}


def differences(store: Store) -> list[object]:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True})
        return list(compare_metadata(context, metadata))


def lifecycle_tables(store: Store) -> set[str]:
    with store.engine.connect() as connection:
        return {t for t in inspect(connection).get_table_names() if t.startswith("lifecycle_")}


def test_models_and_migrations_agree(empty_db_url: str) -> None:
    store = Store(empty_db_url, upgrade=True)
    assert differences(store) == []


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

    from lifecycle import DatabaseError

    store = Store(empty_db_url, upgrade=True)
    with store.begin() as db:
        db.execute(text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999_future'"))
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
        empty_postgres_url: str, slow: bool) -> None:
    """Processes starting together each run `lifecycle db upgrade`: they take turns on an
    advisory lock, and every one ends well (without it, most failed creating the same type)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "lifecycle", "db", "upgrade", "--db", empty_postgres_url]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(20 if slow else 8)]
    outcomes = [(p.wait(timeout=300), p.communicate()) for p in processes]
    failed = [(code, err) for code, (_, err) in outcomes if code != 0]
    assert not failed, failed[:3]
    store = Store(empty_postgres_url)  # at head, or this raises
    try:
        assert differences(store) == []
    finally:
        store.dispose()
