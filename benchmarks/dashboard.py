"""Case 6: the dashboard's pages and /metrics on a large database.

A database of ``LARGE`` resources (100,000) of one machine, ten journal rows each (1,000,000:
a creation, transitions, one in ten a risky edge's with its fence, one in 37 a refusal,
spread over 30 days), two observations each, an effect each (1% failed, 1% retrying, 1% due
and waiting, 1% running on an expired claim) and a timer per ten, is written in bulk with
``INSERT ... SELECT`` over a generated series (seconds, not minutes). The same at ``SMALL``
(1,000 resources) is the reference: each page's ratio says how its cost grows with the data.
Each operation is one HTTP request to a real uvicorn serving the dashboard on loopback, over
a kept-alive connection; the page must answer 200. Goals: every page under 200 ms, /metrics
under 100 ms.

The SQLite file of each size is kept in ``~/.cache/lifecycle/`` (``$LIFECYCLE_BENCH_CACHE``),
named by the schema's revision, and reused by the next run; PostgreSQL's are made once per
run, in schemas dropped afterwards. The dashboard's clock is fixed at the data's end, so a
kept file's "last hour" stays the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lifecycle import Engine, Store
from lifecycle.clock import SimulatedClock
from lifecycle.store import migrate

from .harness import Bench, BenchError, Case, Workspace

LARGE, SMALL = 100_000, 1_000
JOURNAL_ROWS = 10
MACHINE = "fleet"
END = "2026-06-01T00:00:00+00:00"
SPEC: dict[str, Any] = {
    "name": MACHINE, "initial": "new", "final": ["rare"],
    "states": ["new", "booting", "running", "draining", "gone", "rare"],
    "transitions": [
        {"trigger": "boot", "source": "new", "dest": "booting", "effects": ["deploy"]},
        {"trigger": "up", "source": "booting", "dest": "running"},
        {"trigger": "drain", "source": "running", "dest": "draining",
         "fresh": {"max_age": 30, "probe": "site"}},
        {"trigger": "stop", "source": "draining", "dest": "gone"},
        {"trigger": "back", "source": "gone", "dest": "new"},
        {"trigger": "odd", "source": "*", "dest": "rare"},
    ],
}
STATES = ("new", "booting", "running", "draining", "gone")
PAGES: dict[str, tuple[str, str, float]] = {
    # id: (label, path, budget in ms)
    "machines": ("machines", "/", 200),
    "machine": ("a machine's first page", f"/machines/{MACHINE}", 200),
    "deep": ("a machine's page 1,900 (keyset)", f"/machines/{MACHINE}?after=r{LARGE - 2_000:06d}",
             200),
    "rare": ("a machine's rare state", f"/machines/{MACHINE}?state=rare", 200),
    "search": ("a search by key", f"/machines/{MACHINE}?q=0777", 200),
    "resource": ("one resource", f"/machines/{MACHINE}/resource?key=r{SMALL // 2:06d}", 200),
    "effects": ("stuck effects", "/effects", 200),
    "refusals": ("refusals, last hour", "/refusals", 200),
    "live": ("live counts (JSON)", "/live?format=json", 200),
    "metrics": ("/metrics", "/metrics", 100),
}


# -- the data -------------------------------------------------------------------------------


def _sql(dialect: str) -> dict[str, str]:
    """The dialect's words for a series of integers, a time some seconds before END, a
    key, and a JSON object."""
    if dialect == "sqlite":
        return {
            "series": "WITH RECURSIVE series(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM series "
                      "WHERE i < {n}) ",
            "before": "(strftime('%Y-%m-%d %H:%M:%f', '" + END[:19] + "', "
                      "printf('%+.3f seconds', -1.0 * ({s}))) || '000')",
            "key": "printf('r%06d', {i})",
            "json": "json_object({pairs})",
        }
    return {
        "series": "WITH series(i) AS (SELECT generate_series(1, {n})) ",
        "before": f"(TIMESTAMPTZ '{END}' - ({{s}}) * INTERVAL '1 second')",
        "key": "('r' || lpad(({i})::text, 6, '0'))",
        "json": "jsonb_build_object({pairs})",
    }


def _statements(dialect: str, n: int, version: str) -> list[str]:
    w = _sql(dialect)

    def before(seconds: str) -> str:
        return w["before"].format(s=seconds)

    series = w["series"].format(n=n)
    rows = n * JOURNAL_ROWS
    step = f"(30.0 * 86400 / {rows})"  # the journal spans 30 days
    at = before(f"(({n} - r.id) * {JOURNAL_ROWS} + ({JOURNAL_ROWS} - s.i)) * {step}")
    state = ("CASE WHEN i % 1000 = 0 THEN 'rare' ELSE (CASE i % 5 "
             + " ".join(f"WHEN {k} THEN '{name}'" for k, name in enumerate(STATES))
             + " END) END")
    updated = before(f"({n} - i) * {JOURNAL_ROWS} * {step}")
    refused = "(s.i > 1 AND (r.id + s.i) % 37 = 0)"
    risky = f"(s.i = 5 OR {refused})"
    kind = f"CASE WHEN s.i = 1 THEN 'create' WHEN {refused} THEN 'refusal' ELSE 'transition' END"
    fence = w["json"].format(pairs="'observation_id', r.id * 2, 'expect', 'Running'")
    return [
        series + "INSERT INTO lifecycle_resources (id, machine, key, spec_version, state, "
        "version, seq, data, created_at, updated_at, last_transition_at, observation_id, "
        f"observed_at) SELECT i, '{MACHINE}', {w['key'].format(i='i')}, '{version}', {state}, "
        f"{JOURNAL_ROWS}, {JOURNAL_ROWS}, "
        + w["json"].format(pairs="'n', i, 'site', 'site-' || (i % 7), 'ad', "
                                 "'MY.Owner == \"<b>x</b>\"'")
        + f", {before(f'{n} * 30')}, {updated}, {updated}, i * 2, {updated} FROM series",
        "WITH steps(i) AS (SELECT 1" + "".join(f" UNION ALL SELECT {k}" for k in
                                              range(2, JOURNAL_ROWS + 1)) + ") "
        "INSERT INTO lifecycle_journal (resource_id, seq, kind, trigger, source, dest, "
        "version, spec_version, actor, at, fence, observation_id) "
        f"SELECT r.id, s.i, {kind}, CASE WHEN s.i = 1 THEN NULL WHEN {risky} THEN 'drain' "
        f"ELSE 'up' END, CASE WHEN s.i = 1 THEN NULL WHEN {risky} THEN 'running' "
        f"ELSE 'booting' END, CASE WHEN {risky} THEN 'draining' ELSE 'running' END, s.i, "
        f"'{version}', 'bench', {at}, CASE WHEN {risky} AND NOT {refused} THEN {fence} END, "
        f"CASE WHEN {risky} THEN r.id * 2 END "
        "FROM lifecycle_resources AS r CROSS JOIN steps AS s",
        w["series"].format(n=2 * n) + "INSERT INTO lifecycle_observations (id, resource_id, "
        "status, observed_at, recorded_at, source) SELECT i, (i + 1) / 2, "
        + w["json"].format(pairs="'resource_status', 'Running', 'i', i")
        + f", {before(f'({2 * n} - i) * 13')}, {before(f'({2 * n} - i) * 13')}, "
        "CASE WHEN i % 2 = 0 THEN 'site' ELSE 'status-cache' END FROM series",
        series + "INSERT INTO lifecycle_effects (id, resource_id, seq, position, name, args, "
        "status, attempts, next_attempt_at, last_error, idempotency_key, created_at, "
        "finished_at, head, claimed_by, lease_until) SELECT i, i, 2, 0, 'deploy', "
        + w["json"].format(pairs="'n', i")
        + ", CASE i % 100 WHEN 1 THEN 'failed' WHEN 2 THEN 'pending' WHEN 3 THEN 'pending' "
        "WHEN 4 THEN 'running' ELSE 'done' END, CASE i % 100 WHEN 2 THEN 2 ELSE 1 END, "
        f"CASE i % 100 WHEN 2 THEN {before('-3600')} ELSE {before('i % 5000')} END, "
        "CASE WHEN i % 100 IN (1, 2) THEN 'the site said <no>' END, "
        f"'{MACHINE}:' || i || ':2:0:deploy', {before(f'{n} * 20 - i')}, "
        f"CASE WHEN i % 100 NOT IN (2, 3, 4) THEN {before('i % 5000')} END, "
        "CASE WHEN i % 100 IN (1, 2, 3, 4) THEN 1 END, "
        "CASE i % 100 WHEN 4 THEN 'gone-worker' END, "
        f"CASE i % 100 WHEN 4 THEN {before('600')} END FROM series",
        w["series"].format(n=n // 10) + "INSERT INTO lifecycle_timers (resource_id, seq, state, "
        f"trigger, due_at, status, created_at) SELECT i * 10, 3, 'booting', 'up', "
        f"{before('(i % 2) * 7200 - 3600')}, 'pending', {before('86400')} FROM series",
    ]


def _fill(store: Store, n: int) -> None:
    engine = Engine(store, [SPEC], probes={"site": lambda request: None},
                    effects={"deploy": lambda call: None})
    version = engine.spec(MACHINE).version
    with store.begin() as db:
        for statement in _statements(store.dialect, n, version):
            # psycopg reads % as a placeholder's start: %% is the operator
            db.exec_driver_sql(statement.replace("%", "%%") if store.dialect == "postgresql"
                               else statement)
        if store.dialect == "postgresql":
            for table in ("resources", "journal", "observations", "effects", "timers"):
                db.exec_driver_sql(f"ANALYZE lifecycle_{table}")


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lifecycle"
    return Path(os.environ.get("LIFECYCLE_BENCH_CACHE") or default)


_DATABASES: dict[tuple[int, str, int], str] = {}


def database(workspace: Workspace, db: str, n: int) -> str:
    """The URL of a database of ``n`` resources: a kept SQLite file, or a schema of this run."""
    found = _DATABASES.get((id(workspace), db, n))
    if found is not None:
        return found
    if db == "sqlite":
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"dashboard-{n}-{migrate.head_revision()}.db"
        if not path.exists():
            building = path.with_suffix(f".building-{os.getpid()}")
            for stale in (building, building.with_name(building.name + "-wal"),
                          building.with_name(building.name + "-shm")):
                stale.unlink(missing_ok=True)
            with Store(f"sqlite:///{building}", upgrade=True) as store:
                _fill(store, n)
            building.rename(path)
        url = f"sqlite:///{path}"
    else:
        url = workspace.postgres_schema(f"dashboard_{n}")
        with Store(url, upgrade=True) as store:
            _fill(store, n)
    _DATABASES[id(workspace), db, n] = url
    return url


# -- the server -----------------------------------------------------------------------------


_SERVERS: dict[str, tuple[Any, int]] = {}
"""The dashboard served for each database URL, and how many open cases use it."""


@contextmanager
def _served(url: str) -> Iterator[Any]:
    """An HTTP client of the dashboard of ``url``, one server per database."""
    import httpx

    from lifecycle.dashboard.app import serve_in_thread

    if url not in _SERVERS:
        context = serve_in_thread(url, clock=SimulatedClock(END))
        base = context.__enter__()
        _SERVERS[url] = ((context, base), 0)
    (context, base), users = _SERVERS[url]
    _SERVERS[url] = ((context, base), users + 1)
    client = httpx.Client(base_url=base, timeout=60)
    try:
        yield client
    finally:
        client.close()
        (context, base), users = _SERVERS[url]
        if users == 1:
            del _SERVERS[url]
            context.__exit__(None, None, None)
        else:
            _SERVERS[url] = ((context, base), users - 1)


def _case(db: str, n: int, page: str) -> Case:
    label, path, _budget = PAGES[page]

    @contextmanager
    def open_(workspace: Workspace) -> Iterator[Bench]:
        with _served(database(workspace, db, n)) as client:
            def op() -> None:
                answer = client.get(path)
                if answer.status_code != 200:
                    raise BenchError(f"{path}: HTTP {answer.status_code}: {answer.text[:300]}")

            yield Bench(op)

    return Case(f"dashboard.{db}.{page}.{n}", f"{label}, {n:,} resources", open_,
                needs="postgres" if db == "postgresql" else None)


CASES: dict[str, list[Case]] = {
    db: [_case(db, n, page) for page in PAGES for n in (LARGE, SMALL)]
    for db in ("sqlite", "postgresql")
}
