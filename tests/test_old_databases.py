"""A database written by an older release keeps its history verifiable after an upgrade: a
resource fired after the upgrade is stamped with a spec version the database holds, even
when today's code would hash the stored spec document to another version. A database at
each earlier revision, holding what the code of then wrote, upgrades without losing a row,
and today's engine and worker carry its resources, effects and timers on."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, DateTime, bindparam, inspect, text

from lifecycle import Engine, SimulatedClock, Store, Worker
from lifecycle.machines.job_exit import MIGRATIONS
from lifecycle.outbox_admin import effect_records, timer_records
from lifecycle.store import migrate
from lifecycle.store.schema import UtcDateTime

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


# -- a database at every earlier revision ----------------------------------------------------
#
# What the code of each revision wrote for one machine, in that revision's columns: a
# resource just created (k1), three fired on with an effect each (k2's done, k3's pending,
# k5's claimed by a worker that died), and one fired on twice (k4: its effect done, then a
# risky edge taken on an observation, entering a state whose timeout set a timer). Where a
# revision lacks the table, the row is not written (and the risky edge not taken before
# observations). The rows are those the release at the end of each revision wrote when
# driven so, compared column by column when this test was written (but for the order of
# ids across resources, the spacing of the spec's JSON and the state counts' rows, which
# add up the same); the spec documents and versions are copied from its lifecycle_specs.

EARLIER = [revision for revision, _, _ in migrate.revisions()]
"""Every core revision, each without job_exit's branch: the head's too, as the code
wrote it before the machines had branches of their own."""
OBSERVATIONS, OUTBOX, QUEUE, CLAIMANTS, HEADS = 2, 3, 4, 6, 7
"""The revisions that brought observations, effects and timers, job_exit's job queue
(before it had a branch of its own), claimants, queue heads."""

SINCE = {  # columns of the tables below that a revision after 0001 added
    ("lifecycle_resources", "observation_id"): OBSERVATIONS,
    ("lifecycle_resources", "observed_at"): OBSERVATIONS,
    ("lifecycle_resources", "last_transition_at"): OBSERVATIONS,
    ("lifecycle_journal", "observation_id"): OBSERVATIONS,
    ("lifecycle_journal", "fence"): OBSERVATIONS,
    ("lifecycle_effects", "claimant"): CLAIMANTS,
    ("lifecycle_effects", "head"): HEADS,
}

# the machine as each era's code stored it: before 0003 an effect was a name and a state had
# no timeout; the first document hashes to another version under today's serialisation
SPECS = {
    1: ("bdfd66b8e06fb809", {
        "name": "old", "states": [{"name": "new"}, {"name": "running"}, {"name": "draining"},
                                  {"name": "gone"}],
        "initial": "new", "final": ["gone"],
        "transitions": [
            {"source": "new", "dest": "running", "effects": ["notify"], "trigger": "start"},
            {"source": "running", "dest": "draining",
             "fresh": {"max_age": 600.0, "probe": "status"}, "trigger": "drain"},
            {"source": "draining", "dest": "gone", "trigger": "expire"},
            {"source": "draining", "dest": "gone", "effects": ["notify"], "trigger": "end"}]}),
    OUTBOX: ("7330a724776a416a", {
        "name": "old", "states": [{"name": "new"}, {"name": "running"},
                                  {"name": "draining",
                                   "timeout": {"after": 60.0, "trigger": "expire"}},
                                  {"name": "gone"}],
        "initial": "new", "final": ["gone"],
        "transitions": [
            {"source": "new", "dest": "running", "effects": [{"name": "notify"}],
             "trigger": "start"},
            {"source": "running", "dest": "draining",
             "fresh": {"max_age": 600.0, "probe": "status"}, "trigger": "drain"},
            {"source": "draining", "dest": "gone", "trigger": "expire"},
            {"source": "draining", "dest": "gone", "effects": [{"name": "notify"}],
             "trigger": "end"}]}),
}
SPEC = {  # the machine as today's code declares it
    "name": "old", "initial": "new", "final": ["gone"],
    "states": ["new", "running", {"name": "draining",
                                  "timeout": {"after": 60, "trigger": "expire"}}, "gone"],
    "transitions": [
        {"trigger": "start", "source": "new", "dest": "running", "effects": ["notify"]},
        {"trigger": "drain", "source": "running", "dest": "draining",
         "fresh": {"max_age": 600, "probe": "status"}},
        {"trigger": "expire", "source": "draining", "dest": "gone"},
        {"trigger": "end", "source": "draining", "dest": "gone", "effects": ["notify"]}]}
T0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)
UP = {"up": True}

# each resource: when it was created, and its transitions (trigger, source, dest, seconds
# after T0, the status of the effect it asked for); "drain" is risky, taken on an observation
RESOURCES = {
    "k1": (0, []),
    "k2": (1, [("start", "new", "running", 4, "done")]),
    "k3": (2, [("start", "new", "running", 5, "pending")]),
    "k4": (3, [("start", "new", "running", 4, "done"), ("drain", "running", "draining", 5, None)]),
    "k5": (4, [("start", "new", "running", 5, "running")]),   # its worker died, its lease ran out
}


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def era(revision: str) -> int:
    return int(revision.split("_", 1)[0])


class _Writer:
    """Inserts rows as the code at revision ``n`` wrote them, with raw SQL: columns added
    later are left out, and a row must name every column its table has (but its id). A
    document is written as the engine wrote it (compact JSON text), a time as its column's
    type stores it on the dialect."""

    def __init__(self, db: Any, n: int) -> None:
        self.db, self.n = db, n
        self.types = {t: {c["name"]: c["type"] for c in inspect(db).get_columns(t)
                          if c["name"] != "id"}
                      for t in inspect(db).get_table_names() if t.startswith("lifecycle_")}

    def insert(self, table: str, **row: Any) -> int | None:
        row = {c: v for c, v in row.items() if SINCE.get((table, c), 1) <= self.n}
        types = self.types[table]
        assert set(row) == set(types), (table, set(row) ^ set(types))
        row = {c: json.dumps(v, separators=(",", ":"))
               if isinstance(types[c], JSON) and v is not None else v for c, v in row.items()}
        statement = text(f"INSERT INTO {table} ({', '.join(row)}) VALUES "
                         f"({', '.join(':' + c for c in row)})").bindparams(
            *(bindparam(c, type_=UtcDateTime()) for c in row
              if isinstance(types[c], DateTime)))
        self.db.execute(statement, row)
        if table in ("lifecycle_resources", "lifecycle_observations"):
            return int(self.db.execute(text(f"SELECT max(id) FROM {table}")).scalar_one())
        return None


def _written_at(url: str, revision: str) -> set[str]:
    """A database at ``revision`` holding what the code of then wrote (see RESOURCES); the
    idempotency keys of the effects it ran."""
    n, done_keys = era(revision), set()
    version, spec = SPECS[OUTBOX if n >= OUTBOX else 1]
    store = Store(url, check=False)
    try:
        store.upgrade(revision)
        with store.engine.begin() as db:
            rows = _Writer(db, n)
            if n >= QUEUE:  # a job the job_exit machine of then entered and completed
                db.execute(text("INSERT INTO lifecycle_job_queue (cluster, proc, ad, "
                                "job_status, updates, submitted_at, updated_at, updated_by) "
                                "VALUES (7, 0, '{}', 4, 1, :at, :at, 'job_exit:7.0:c')"),
                           {"at": AT})
            rows.insert("lifecycle_specs", machine="old", version=version, spec=spec,
                        created_at=at(0))
            rows.insert("lifecycle_machines", name="old", spec_version=version,
                        updated_at=at(0))
            for key, (created, moves) in RESOURCES.items():
                moves = [m for m in moves if m[0] != "drain" or n >= OBSERVATIONS]
                state, moved = (moves[-1][2], moves[-1][3]) if moves else ("new", created)
                rid = rows.insert(
                    "lifecycle_resources", machine="old", key=key, spec_version=version,
                    state=state, version=len(moves) + 1, seq=len(moves) + 1, data={},
                    created_at=at(created), updated_at=at(moved), observation_id=None,
                    observed_at=None, last_transition_at=at(moved))
                rows.insert("lifecycle_journal", resource_id=rid, seq=1, kind="create",
                            trigger=None, source=None, dest="new", version=1,
                            spec_version=version, actor=None, at=at(created), payload=None,
                            guards=None, observation_id=None, fence=None)
                for seq, (trigger, source, dest, when, effect) in enumerate(moves, 2):
                    observation, fence = None, None
                    if trigger == "drain":
                        observation = rows.insert(
                            "lifecycle_observations", resource_id=rid, status=UP,
                            observed_at=at(when), recorded_at=at(when), source="test")
                        fence = {"observation_id": observation,
                                 "observed_at": at(when).isoformat(), "source": "test",
                                 "status": UP, "expect": UP}
                        db.execute(text("UPDATE lifecycle_resources SET observation_id = :o, "
                                        "observed_at = :t WHERE id = :id").bindparams(
                            bindparam("t", type_=UtcDateTime())),
                            {"o": observation, "t": at(when), "id": rid})
                    rows.insert("lifecycle_journal", resource_id=rid, seq=seq,
                                kind="transition", trigger=trigger, source=source, dest=dest,
                                version=seq, spec_version=version, actor=None, at=at(when),
                                payload=None, guards={"fresh": True} if fence else None,
                                observation_id=observation, fence=fence)
                    if n >= OUTBOX and effect is not None:
                        done, claimed = effect == "done", effect in ("done", "running")
                        if done:
                            done_keys.add(f"old:{key}:{seq}:0:notify")
                        rows.insert(
                            "lifecycle_effects", resource_id=rid, seq=seq, position=0,
                            name="notify", args={}, status=effect, attempts=int(claimed),
                            next_attempt_at=at(when), last_error=None,
                            idempotency_key=f"old:{key}:{seq}:0:notify", fence=None,
                            on_failure=None, progress=None,
                            claimed_by="vm:1:old" if claimed else None,
                            lease_until=at(when + 300) if effect == "running" else None,
                            created_at=at(when), finished_at=at(when) if done else None,
                            claimant="boot/pid:[1]/1/1" if claimed else None,
                            head=None if done else 1)
                    if n >= OUTBOX and dest == "draining":
                        rows.insert("lifecycle_timers", resource_id=rid, seq=seq,
                                    state="draining", trigger="expire", due_at=at(when + 60),
                                    status="pending", outcome=None, created_at=at(when),
                                    finished_at=None)
    finally:
        store.dispose()
    return done_keys


KEPT = {  # what an upgrade must keep of each table, as columns to compare
    "lifecycle_specs": "machine, version",
    "lifecycle_journal": "resource_id, seq, kind, trigger, source, dest, version, spec_version",
    "lifecycle_resources": "id, machine, key",
    "lifecycle_observations": "id, resource_id, source",
    "lifecycle_effects": "resource_id, seq, name, idempotency_key",
    "lifecycle_timers": "resource_id, seq, state, trigger",
    "lifecycle_job_queue": "cluster, proc, job_status, updates, updated_by",
}


def _kept(store: Store) -> dict[str, set[tuple[Any, ...]]]:
    with store.engine.connect() as db:
        tables = set(inspect(db).get_table_names())
        return {t: {tuple(r) for r in db.execute(text(f"SELECT {columns} FROM {t}"))}
                for t, columns in KEPT.items() if t in tables}


def _unstored_stamps(store: Store) -> list[tuple[Any, ...]]:
    """The spec versions a resource or a journal row is stamped with that lifecycle_specs
    does not hold."""
    with store.engine.connect() as db:
        return [tuple(r) for r in db.execute(text(
            "SELECT 'resource', r.machine, r.spec_version FROM lifecycle_resources r "
            "WHERE NOT EXISTS (SELECT 1 FROM lifecycle_specs s "
            "                  WHERE s.machine = r.machine AND s.version = r.spec_version) "
            "UNION SELECT 'journal', r.machine, j.spec_version FROM lifecycle_journal j "
            "JOIN lifecycle_resources r ON r.id = j.resource_id "
            "WHERE NOT EXISTS (SELECT 1 FROM lifecycle_specs s "
            "                  WHERE s.machine = r.machine AND s.version = j.spec_version)"))]


@pytest.mark.parametrize("revision", EARLIER)
def test_a_database_written_at_each_earlier_revision_upgrades_fires_and_verifies(
        empty_db_url: str, revision: str) -> None:
    n = era(revision)
    done_before = _written_at(empty_db_url, revision)
    # upgraded as `lifecycle db upgrade` does: with the branch of job_exit, absent until now
    store = Store(empty_db_url, check=False, branches=[MIGRATIONS])
    try:
        before = _kept(store)
        assert ("lifecycle_job_queue" in before) == (n >= QUEUE)
        store.upgrade()
        after_upgrade = _kept(store)
        for table, rows in before.items():
            assert after_upgrade[table] == rows, f"{table} changed in the upgrade"
        assert store.branch_revision(MIGRATIONS) == migrate.branch_head(MIGRATIONS)
        assert "lifecycle_job_queue" in after_upgrade
        ran: list[str] = []

        def status(request: Any) -> dict[str, Any]:
            if request.key == "k5":
                raise ConnectionError("k5's site does not answer")
            return UP

        handlers: dict[str, Any] = {
            "effects": {"notify": lambda call: ran.append(call.idempotency_key)},
            "probes": {"status": status},
            "clock": SimulatedClock(at(3600))}   # k4's timer is due, its observation old
        engine = Engine(store, [], **handlers)   # the machine as the database holds it
        assert engine.spec("old").version == SPECS[OUTBOX if n >= OUTBOX else 1][0]
        assert engine.fire("old:k1", "start").dest == "running"
        engine.observe("old:k3", UP, source="test")
        assert engine.fire("old:k3", "drain").dest == "draining"
        drained = engine.fire("old:k2", "drain")    # no observation: the probe is asked
        assert (drained.dest, drained.probed) == ("draining", True)
        refused = engine.fire("old:k5", "drain", on_stale="return")   # journaled as refused
        assert (refused.fired, refused.error) == (False, "StaleObservation")
        engine.update("old:k1", {"note": "after the upgrade"})
        engine.create("old", "k6")
        Worker(engine).run_until_idle()
        if n >= OUTBOX:   # the timer the old code set fired
            assert [t.status for t in timer_records(engine, "old:k4")] == ["fired"]
            assert engine.get("old:k4").state == "gone"
        assert len(engine.observations("old:k4")) == int(n >= OBSERVATIONS)
        # the machine as today's code declares it: stored (where it is new) before it stamps
        engine = Engine(store, [SPEC], **handlers)
        assert engine.fire("old:k2", "end").dest == "gone"
        Worker(engine).run_until_idle()

        assert engine.verify() == []
        assert _unstored_stamps(store) == []
        kept = _kept(store)
        for table, rows in before.items():
            assert rows <= kept[table], f"{table} lost rows"
        effects = effect_records(engine)
        assert {e.status for e in effects} == {"done"}
        assert sorted(ran) == sorted(e.idempotency_key for e in effects
                                     if e.idempotency_key not in done_before)
        with store.engine.connect() as db:
            counted = dict(db.execute(text("SELECT state, count(*) FROM lifecycle_resources "
                                           "GROUP BY state")).all())
        assert engine.counts("old") == {"old": counted}
    finally:
        store.dispose()


def test_the_earlier_databases_cover_job_exits_branch_too() -> None:
    """Each database above is upgraded from the branch's absence to its one revision; a second
    revision of the branch would need databases at the first here too."""
    assert sorted(p.stem for p in Path(MIGRATIONS).glob("*.py")) == [
        migrate.branch_head(MIGRATIONS)]
    assert EARLIER[-1] == migrate.head_revision()   # the core's head, written without it
