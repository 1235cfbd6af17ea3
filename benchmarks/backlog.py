"""Case 5: the worker's claim as the outbox's backlog grows.

Each case fills an outbox with ``N`` due pending effects in queues ten deep (``N / 10``
resources, each with ten effects waiting in order, so only the first of each may run), then
times one operation: claim a batch of four and give it back, which leaves the outbox as it
was. ``lifecycle`` runs the Worker's own claim (``WorkerCore.claim``, then ``give_back``);
``before`` runs, through the raw driver, the claim lifecycle used before queue heads were
kept: every due pending effect with no open predecessor on its resource (a correlated
``NOT EXISTS``), sorted, the first four taken. The figure that matters is each one's cost at
10,000 and 100,000 against its own cost at 500: flat for lifecycle, growing for ``before``.
``effect`` is the worker's whole cost per effect at that backlog: one claimed, recorded done
(its resource's head passed on), and a transition that asks for the next.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import insert

from lifecycle import Engine, Store, Worker
from lifecycle.store import journal, outbox, resources

from . import postgres
from .harness import Bench, BenchError, Case, Workspace

UTC = dt.UTC
SIZES = (500, 10_000, 100_000)
DEPTH = 10
BATCH = 4
MACHINE, EFFECT = "backlog", "noop"
SPEC: dict[str, Any] = {
    "name": MACHINE, "initial": "a", "states": ["a", "b"],
    "transitions": [{"trigger": "tick", "source": "a", "dest": "b", "effects": [EFFECT]},
                    {"trigger": "tick", "source": "b", "dest": "a", "effects": [EFFECT]}],
}

BEFORE_PICK = """
SELECT e.id FROM lifecycle_effects AS e
WHERE (e.status = 'pending' AND e.next_attempt_at <= {now}
       OR e.status = 'running' AND e.lease_until < {now})
  AND NOT (EXISTS (SELECT * FROM lifecycle_effects AS p
                   WHERE p.resource_id = e.resource_id AND p.id < e.id
                     AND p.status IN ('pending', 'running', 'failed')))
  AND e.name IN ('noop')
ORDER BY e.next_attempt_at, e.id
LIMIT 4
"""


def _fill(store: Store, engine: Engine, size: int) -> None:
    """``size`` due pending effects, ``DEPTH`` per resource, each with its journal row, the
    first of each resource its queue's head; written in bulk (untimed)."""
    spec_version = engine.spec(MACHINE).version
    past = dt.datetime(2026, 1, 1, tzinfo=UTC)
    count = size // DEPTH
    with store.begin() as db:
        db.execute(insert(resources), [
            {"machine": MACHINE, "key": f"r{i:06d}", "spec_version": spec_version,
             "state": "a" if DEPTH % 2 == 0 else "b", "version": DEPTH + 1, "seq": DEPTH + 1,
             "data": {}, "created_at": past, "updated_at": past, "last_transition_at": past}
            for i in range(count)])
        ids = [row[0] for row in db.exec_driver_sql(
            "SELECT id FROM lifecycle_resources ORDER BY id").all()]
        db.execute(insert(journal), [
            {"resource_id": rid, "seq": seq, "kind": "create" if seq == 1 else "transition",
             "trigger": None if seq == 1 else "tick", "source": None, "dest": "a",
             "version": seq, "spec_version": spec_version, "actor": None, "at": past}
            for rid in ids for seq in range(1, DEPTH + 2)])
        db.execute(insert(outbox), [
            {"resource_id": rid, "seq": seq, "position": 0, "name": EFFECT, "args": {},
             "status": "pending", "attempts": 0, "next_attempt_at": past,
             "idempotency_key": f"{MACHINE}:{rid}:{seq}:0:{EFFECT}", "created_at": past,
             "head": 1 if seq == 2 else None}
            for seq in range(2, DEPTH + 2) for rid in ids])


def _sqlite_time(value: dt.datetime) -> str:
    """UTC as sortable text, the format lifecycle stores on SQLite."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ",
                                                                timespec="microseconds")


_FILLED: dict[tuple[int, str, int], str] = {}
"""The outbox of each size, by workspace: filled once, shared by both cases of a size (each
operation leaves it as it found it)."""


@contextmanager
def _outbox(workspace: Workspace, db: str, size: int) -> Iterator[tuple[Store, Engine]]:
    filled = _FILLED.get((id(workspace), db, size))
    url = filled or (f"sqlite:///{workspace.sqlite_path(f'backlog_{size}')}" if db == "sqlite"
                     else workspace.postgres_schema(f"backlog_{size}"))
    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [SPEC], effects={EFFECT: lambda call: None})
        if filled is None:
            _fill(store, engine, size)
            if db == "postgresql":
                with store.begin() as connection:
                    connection.exec_driver_sql("ANALYZE lifecycle_effects")
            _FILLED[id(workspace), db, size] = url
        yield store, engine
    finally:
        store.dispose()


def _lifecycle(db: str, size: int) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _outbox(workspace, db, size) as (_store, engine):
            worker = Worker(engine, batch=BATCH)

            def op() -> None:
                claimed = worker.core.claim(BATCH, [])
                if len(claimed) != BATCH:
                    raise BenchError(f"claimed {len(claimed)} effects, not {BATCH}")
                worker.core.give_back(claimed)

            yield Bench(op)

    return Case(f"backlog.{db}.lifecycle.{size}", f"Worker claim, {size:,} pending",
                open_, needs="postgres" if db == "postgresql" else None)


def _effect(db: str, size: int) -> Case:
    """The worker's cost per effect at a steady backlog of ``size``: claim one effect, record
    it done (which passes its resource's queue head on), and fire the transition of its
    resource that asks for the next (so the backlog stays as it was)."""
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _outbox(workspace, db, size) as (_store, engine):
            worker = Worker(engine, batch=1)
            # a claim held throughout, as a busy worker holds some: its heartbeat thread
            # (and that thread's connection) lives on instead of starting with each effect
            anchor = worker.core.claim(1, [])

            def op() -> None:
                claimed = worker.core.claim(1, [])
                if len(claimed) != 1:
                    raise BenchError(f"claimed {len(claimed)} effects, not 1")
                call = claimed[0]
                worker.core.outcome(call, "ok", None)
                worker.core.record()  # done, its queue head passed on
                if not engine.fire(f"{MACHINE}:{call.key}", "tick"):
                    raise BenchError(f"{call.key}: tick did not fire")

            try:
                yield Bench(op)
            finally:
                worker.core.give_back(anchor)

    return Case(f"backlog.{db}.effect.{size}", f"Worker, one effect, {size:,} pending",
                open_, needs="postgres" if db == "postgresql" else None)


def _before(db: str, size: int) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _outbox(workspace, db, size) as (store, _engine):
            if db == "sqlite":
                assert store.url.startswith("sqlite:///")
                connection: Any = sqlite3.connect(store.url.removeprefix("sqlite:///"),
                                                  isolation_level=None)
                # the time from the clock, bound at each claim as the Worker's is: the
                # ``effect`` case of the same outbox adds effects due at the time it runs
                pick = BEFORE_PICK.format(now=":now")
                claim = (f"UPDATE lifecycle_effects SET status = 'running', "
                         f"attempts = attempts + 1 WHERE id IN ({pick}) RETURNING id")
                give = ("UPDATE lifecycle_effects SET status = 'pending', "
                        "attempts = attempts - 1 WHERE id IN ({})")
            else:
                import psycopg

                connection = psycopg.connect(postgres.libpq(store.url))
                pick = BEFORE_PICK.format(now="now()") + " FOR UPDATE OF e SKIP LOCKED"
                claim = (f"UPDATE lifecycle_effects SET status = 'running', "
                         f"attempts = attempts + 1 WHERE id IN ({pick}) RETURNING id")
                give = ("UPDATE lifecycle_effects SET status = 'pending', "
                        "attempts = attempts - 1 WHERE id IN ({})")

            def op() -> None:
                cursor = connection.cursor()
                if db == "sqlite":
                    cursor.execute("BEGIN IMMEDIATE")
                    now = {"now": _sqlite_time(dt.datetime.now(UTC))}
                    ids = [row[0] for row in cursor.execute(claim, now).fetchall()]
                else:
                    ids = [row[0] for row in cursor.execute(claim).fetchall()]
                connection.commit()
                if len(ids) != BATCH:
                    raise BenchError(f"claimed {len(ids)} effects, not {BATCH}")
                if db == "sqlite":
                    cursor.execute("BEGIN IMMEDIATE")
                cursor.execute(give.format(", ".join(str(i) for i in ids)))
                connection.commit()

            try:
                yield Bench(op)
            finally:
                connection.close()

    return Case(f"backlog.{db}.before.{size}", f"before: NOT EXISTS claim, {size:,} pending",
                open_, needs="postgres" if db == "postgresql" else None)


CASES: dict[str, list[Case]] = {
    db: [make(db, size) for size in SIZES for make in (_lifecycle, _before, _effect)]
    for db in ("sqlite", "postgresql")
}
