"""Case 6: a fleet's database: fires and reads among 100,000 resources and 1,000,000 journal
rows.

One database per dialect is built once, in bulk (``INSERT ... SELECT`` from a series, not
one write per row): ``RESOURCES`` resources of the toggle machine, each with ``DEPTH``
journal rows (its creation and the flips that brought it to its state), so that ``lifecycle
verify`` finds every journal right. Every case then runs on that same database, side by
side: ``Engine.fire`` and ``Engine.get`` on a random resource each time against the floor,
the same statements through the raw driver (read the row by key; for a fire, the
compare-and-swap and the journal row, then COMMIT); the first page of ``Engine.resources``,
a page after a random key, and ``Engine.counts``, each measured against a goal in
milliseconds. :func:`verify_figures` runs ``verify`` once per database in a process of its
own, for its time and its peak memory.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lifecycle import Engine, Store
from lifecycle import queries as lifecycle_queries

from . import postgres, toggle
from .harness import Bench, BenchError, Case, Workspace

RESOURCES, QUICK_RESOURCES = 100_000, 2_000
DEPTH = 10
"""Journal rows per resource: the creation and nine flips (so each ends in ``b``)."""
PAGE = 100
SEED = 20
_BUILT: dict[tuple[int, str], tuple[str, int]] = {}
"""The database of each dialect, by workspace: built once, shared by every case."""
QUICK = [False]
"""Set by ``--quick``: a fleet of :data:`QUICK_RESOURCES`."""


def size() -> int:
    return QUICK_RESOURCES if QUICK[0] else RESOURCES


_EVEN = "q.seq = (q.seq / 2) * 2"  # (no % : psycopg reads it as a parameter's mark)


def _fill_sql(db: str) -> list[str]:
    """The bulk statements: the resources, their journals (``:n`` resources, version and
    seq ``DEPTH``, state ``b``; a journal that replays to it), in the dialect's words."""
    if db == "sqlite":
        series = ("WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s "
                  "WHERE i < :n - 1) ")
        key, at = "printf('r%06d', i)", "'2026-01-01 00:00:00.000000'"
        steps = (f"(WITH RECURSIVE q(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM q "
                 f"WHERE seq < {DEPTH}) SELECT seq FROM q)")
        data = "'{}'"
    else:
        series = ""
        key, at = "'r' || lpad(i::text, 6, '0')", "'2026-01-01 00:00:00+00'"
        steps = f"(SELECT generate_series(1, {DEPTH}) AS seq)"
        data = "'{}'::jsonb"
    source = "FROM s" if db == "sqlite" else "FROM generate_series(0, %(n)s - 1) AS i"
    sv = ":sv" if db == "sqlite" else "%(sv)s"
    resources = (
        f"{series}INSERT INTO lifecycle_resources (machine, key, spec_version, state, version, "
        f"seq, data, created_at, updated_at, last_transition_at) SELECT '{toggle.MACHINE}', "
        f"{key}, {sv}, 'b', {DEPTH}, {DEPTH}, {data}, {at}, {at}, {at} {source}")
    journal = (
        "INSERT INTO lifecycle_journal (resource_id, seq, kind, trigger, source, dest, "
        "version, spec_version, at) SELECT r.id, q.seq, "
        "CASE WHEN q.seq = 1 THEN 'create' ELSE 'transition' END, "
        f"CASE WHEN q.seq = 1 THEN NULL ELSE '{toggle.TRIGGER}' END, "
        f"CASE WHEN q.seq = 1 THEN NULL WHEN {_EVEN} THEN 'a' ELSE 'b' END, "
        f"CASE WHEN {_EVEN} THEN 'b' ELSE 'a' END, "
        f"q.seq, {sv}, {at} FROM lifecycle_resources AS r CROSS JOIN {steps} AS q")
    if db == "postgresql":
        resources = resources.replace(":n", "%(n)s")
    return [resources, journal]


def _build(store: Store, engine: Engine, db: str, n: int) -> None:
    """The fleet, in bulk (untimed); the counts folded, the planner's statistics fresh."""
    spec_version = engine.spec(toggle.MACHINE).version
    with store.write() as cursor:
        for statement in _fill_sql(db):
            cursor.execute(statement, {"n": n, "sv": spec_version})
    lifecycle_queries.fold_counts(store)
    with store.write() as cursor:
        cursor.execute("ANALYZE" if db == "sqlite" else
                       "ANALYZE lifecycle_resources; ANALYZE lifecycle_journal")


@contextmanager
def _fleet(workspace: Workspace, db: str) -> Iterator[tuple[Store, Engine, str, int]]:
    built = _BUILT.get((id(workspace), db))
    n = size()
    url = built[0] if built else (
        f"sqlite:///{workspace.sqlite_path('fleet')}" if db == "sqlite"
        else workspace.postgres_schema("fleet"))
    store = Store(url, upgrade=True)
    try:
        engine = Engine(store, [toggle.spec()])
        if built is None:
            _build(store, engine, db, n)
            _BUILT[id(workspace), db] = (url, n)
        yield store, engine, url, n
    finally:
        store.dispose()


def _keys(n: int) -> Callable[[], str]:
    rng = random.Random(SEED)
    return lambda: f"r{rng.randrange(n):06d}"


# -- the floor: the raw driver on the same database -----------------------------------------

_READ = ("SELECT id, machine, key, state, version, seq, data, spec_version, "
         "last_transition_at, created_at FROM lifecycle_resources WHERE key = {p}")
_MOVE = ("UPDATE lifecycle_resources SET state = {p}, version = {p}, seq = {p}, "
         "updated_at = {p}, last_transition_at = {p} WHERE id = {p} AND version = {p} "
         "AND seq = {p}")
_RECORD = ("INSERT INTO lifecycle_journal (resource_id, seq, kind, trigger, source, dest, "
           "version, spec_version, at) VALUES ({p}, {p}, 'transition', {p}, {p}, {p}, {p}, "
           "{p}, {p})")


@contextmanager
def _raw(url: str, db: str) -> Iterator[tuple[Any, str, Callable[[], None], Callable[[], None]]]:
    """A raw connection as lifecycle opens it: (cursor, placeholder, begin, commit)."""
    if db == "sqlite":
        connection: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        cursor = connection.cursor()
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                       "busy_timeout=30000"):
            cursor.execute(f"PRAGMA {pragma}")
        try:
            yield (cursor, "?", lambda: cursor.execute("BEGIN IMMEDIATE"),
                   lambda: cursor.execute("COMMIT"))
        finally:
            connection.close()
    else:
        import psycopg

        connection = psycopg.connect(postgres.libpq(url))
        try:
            yield connection.cursor(), "%s", lambda: None, connection.commit
        finally:
            connection.close()


def _floor_fire(db: str) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _fleet(workspace, db) as (_store, _engine, url, n), \
                _raw(url, db) as (cursor, p, begin, commit):
            read, move, record = (s.format(p=p) for s in (_READ, _MOVE, _RECORD))
            key = _keys(n)

            def op() -> None:
                begin()
                cursor.execute(read, (key(),))
                rid, _m, _k, state, version, seq, _d, spec_version, _l, _c = cursor.fetchall()[0]
                dest = toggle.other(state)
                now = dt.datetime.now(dt.UTC)
                at: Any = now.replace(tzinfo=None).isoformat(" ") if db == "sqlite" else now
                cursor.execute(move, (dest, version + 1, seq + 1, at, at, rid, version, seq))
                if cursor.rowcount != 1:
                    raise BenchError("floor: the compare-and-swap lost with no other writer")
                cursor.execute(record, (rid, seq + 1, toggle.TRIGGER, state, dest, version + 1,
                                        spec_version, at))
                commit()

            yield Bench(op)

    return Case(f"fleet.{db}.floor_fire", "raw driver: fire a random resource", open_,
                needs="postgres" if db == "postgresql" else None)


def _floor_get(db: str) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _fleet(workspace, db) as (_store, _engine, url, n), \
                _raw(url, db) as (cursor, p, _begin, commit):
            read, key = _READ.format(p=p), _keys(n)

            def op() -> None:
                cursor.execute(read, (key(),))
                if len(cursor.fetchall()) != 1:
                    raise BenchError("floor: no such resource")
                if db == "postgresql":
                    commit()  # (psycopg opened a transaction for the read)

            yield Bench(op)

    return Case(f"fleet.{db}.floor_get", "raw driver: read a random resource", open_,
                needs="postgres" if db == "postgresql" else None)


def _lifecycle(db: str, what: str, label: str) -> Case:
    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _fleet(workspace, db) as (_store, engine, _url, n):
            key = _keys(n)
            ops: dict[str, Callable[[], Any]] = {
                "fire": lambda: engine.fire(key(), toggle.TRIGGER) or _missed("fire"),
                "get": lambda: engine.get(key()),
                "list": lambda: len(engine.resources(limit=PAGE)) == PAGE or _missed("page"),
                "list_after": lambda: engine.resources(limit=PAGE, after=f"toggle:{key()}"),
                "counts": lambda: engine.counts()["toggle"] or _missed("counts"),
            }
            yield Bench(ops[what])

    return Case(f"fleet.{db}.{what}", label, open_,
                needs="postgres" if db == "postgresql" else None)


def _missed(what: str) -> None:
    raise BenchError(f"lifecycle: {what} did not do what it should")


CASES: dict[str, list[Case]] = {db: [
    _floor_fire(db), _lifecycle(db, "fire", "Engine.fire, a random resource"),
    _floor_get(db), _lifecycle(db, "get", "Engine.get, a random resource"),
    _lifecycle(db, "list", f"Engine.resources, first page of {PAGE}"),
    _lifecycle(db, "list_after", f"Engine.resources, {PAGE} after a random key"),
    _lifecycle(db, "counts", "Engine.counts"),
] for db in ("sqlite", "postgresql")}


# -- verify, once, in a process of its own ------------------------------------------------

_VERIFY = """
import json, resource, sys, time
from lifecycle import Store
from lifecycle.verify import verify

def peak_kib():
    # the peak of this process's own memory (VmHWM); getrusage's ru_maxrss keeps the
    # parent's peak across fork and exec, so a benchmark process that grew earlier would
    # show as this one's
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

store = Store(sys.argv[1])
before = peak_kib()
start = time.perf_counter()
found = verify(store) if sys.argv[2] == "verify" else []
seconds = time.perf_counter() - start
store.dispose()
print(json.dumps({"seconds": seconds, "mismatches": len(found), "rss_before_kib": before,
                  "peak_kib": peak_kib()}))
"""


def verify_figures(workspace: Workspace, databases: list[str]) -> list[dict[str, Any]]:
    """``verify`` of each fleet's database, in a fresh process each: seconds, the peak
    resident memory of the process, and the same process's peak when it only opened the
    store (what verify added is the difference)."""
    figures = []
    for db in databases:
        with _fleet(workspace, db) as (_store, _engine, url, n):
            done = {}
            for what in ("open", "verify"):
                ran = subprocess.run([sys.executable, "-c", _VERIFY, url, what],
                                     capture_output=True, text=True, timeout=3600)
                if ran.returncode != 0:
                    raise BenchError(f"verify on {db} failed: {ran.stderr.strip()[-500:]}")
                done[what] = json.loads(ran.stdout.strip().splitlines()[-1])
            if done["verify"]["mismatches"]:
                raise BenchError(f"verify on {db} found {done['verify']['mismatches']} "
                                 "mismatches in a fleet built right")
            figures.append({
                "database": db, "resources": n, "journal_rows": n * DEPTH,
                "seconds": round(done["verify"]["seconds"], 2),
                "peak_mib": round(done["verify"]["peak_kib"] / 1024, 1),
                "open_only_peak_mib": round(done["open"]["peak_kib"] / 1024, 1),
            })
    return figures
