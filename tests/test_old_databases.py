"""A database written by an older release keeps its history verifiable after an upgrade: a
resource fired after the upgrade is stamped with a spec version the database holds, even
when today's code would hash the stored spec document to another version."""

from __future__ import annotations

import datetime as dt
import json

from sqlalchemy import text

from lifecycle import Engine, Store

# What the release whose schema head was 0001_core wrote for a machine with an effect,
# created and fired once (copied from such a database): its spec document hashes to
# another version under today's serialisation.
OLD_VERSION = "6b13f5c0fa149541"
OLD_SPEC = {"name": "m1", "states": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "initial": "a", "final": ["c"],
            "transitions": [{"source": "a", "dest": "b", "effects": ["notify"], "trigger": "go"},
                            {"source": "b", "dest": "c", "trigger": "end"}]}
AT = dt.datetime(2026, 12, 3, 16, 44, 52)


def _written_at_0001(url: str) -> None:
    store = Store(url, check=False)
    try:
        store.upgrade("0001_core")
        with store.engine.begin() as db:   # the schema of then: no check for today's
            db.execute(text("INSERT INTO lifecycle_machines (name, spec_version, updated_at) "
                            "VALUES ('m1', :v, :at)"), {"v": OLD_VERSION, "at": AT})
            db.execute(text("INSERT INTO lifecycle_specs (machine, version, spec, created_at) "
                            "VALUES ('m1', :v, :spec, :at)"),
                       {"v": OLD_VERSION, "spec": json.dumps(OLD_SPEC), "at": AT})
            db.execute(text("INSERT INTO lifecycle_resources (machine, key, spec_version, "
                            "state, version, seq, data, created_at, updated_at) VALUES "
                            "('m1', 'k1', :v, 'b', 2, 2, '{}', :at, :at)"),
                       {"v": OLD_VERSION, "at": AT})
            rid = db.execute(text("SELECT id FROM lifecycle_resources")).scalar_one()
            for seq, kind, trigger, source, dest in ((1, "create", None, None, "a"),
                                                     (2, "transition", "go", "a", "b")):
                db.execute(text("INSERT INTO lifecycle_journal (resource_id, seq, kind, "
                                "trigger, source, dest, version, spec_version, at) VALUES "
                                "(:rid, :seq, :kind, :trigger, :source, :dest, :seq, :v, :at)"),
                           {"rid": rid, "seq": seq, "kind": kind, "trigger": trigger,
                            "source": source, "dest": dest, "v": OLD_VERSION, "at": AT})
    finally:
        store.dispose()


def test_a_database_written_at_0001_verifies_after_upgrade_and_a_fire(
        empty_db_url: str) -> None:
    _written_at_0001(empty_db_url)
    store = Store(empty_db_url, upgrade=True)
    try:
        engine = Engine(store, [], effects={"notify": lambda call: None})
        assert engine.spec("m1").version == OLD_VERSION    # as stored, not re-hashed
        assert engine.fire("m1:k1", "end").dest == "c"
        assert engine.verify() == []
        assert engine.get("m1:k1").spec_version == OLD_VERSION
        # the same machine registered from code under today's hash is stored first, then
        # stamped: history stays verifiable across the change of version
        engine = Engine(store, [OLD_SPEC], effects={"notify": lambda call: None})
        engine.create("m1", "k2")
        engine.fire("m1:k2", "go")
        assert engine.verify() == []
    finally:
        store.dispose()
