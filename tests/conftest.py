"""Shared fixtures: a fresh database per test on SQLite (a file) and on PostgreSQL (a schema
of its own, dropped afterwards)."""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle import Store

POSTGRES_URL = os.environ.get(
    "LIFECYCLE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
REQUIRE_POSTGRES = os.environ.get("LIFECYCLE_REQUIRE_POSTGRES") == "1"


def _postgres_reachable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(_libpq(POSTGRES_URL), connect_timeout=3):
            return None
    except Exception as exc:  # the reason is shown in the skip message
        return f"{type(exc).__name__}: {exc}"


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


_PG_PROBLEM: str | bool | None = False


def postgres_problem() -> str | None:
    global _PG_PROBLEM
    if _PG_PROBLEM is False:
        _PG_PROBLEM = _postgres_reachable()
    assert _PG_PROBLEM is not True
    return _PG_PROBLEM


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose search_path is a schema of this test's own."""
    problem = postgres_problem()
    if problem:
        if REQUIRE_POSTGRES:
            pytest.fail(f"LIFECYCLE_REQUIRE_POSTGRES=1 but PostgreSQL is unreachable: {problem}")
        pytest.skip(f"PostgreSQL unreachable at {POSTGRES_URL}: {problem}")
    import psycopg

    schema = f"lc_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        # the schema's name is also the connections' application_name: how they are counted
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}&application_name={schema}"
        leaked = _connections_left(schema)
    finally:
        with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    if leaked:
        pytest.fail(f"the test left {leaked} connections to PostgreSQL open (a Store not "
                    "disposed, or a process still running)", pytrace=False)


LEAK_GRACE_SECONDS = 30.0
"""How long a closed connection may take to leave pg_stat_activity (the server ends its
backend after the client said goodbye)."""


def _connections_left(application_name: str) -> int:
    """Connections still open under ``application_name`` once everything the test dropped was
    collected, waiting for the server to notice the ones already closed."""
    import psycopg

    gc.collect()
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name "
                               "= %s AND pid <> pg_backend_pid()", (application_name,)).fetchone()
            left = int(row[0]) if row else 0
            if left == 0 or time.monotonic() > deadline:
                return left
            time.sleep(0.05)


REQUIRE_SLURM = os.environ.get("LIFECYCLE_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A single-node Slurm (munged, slurmctld, slurmd) of the test module's own (the Slurm
    site's and the dispatcher's tests each leave jobs the other must not meet); skipped
    without the Slurm packages or root, unless LIFECYCLE_REQUIRE_SLURM=1."""
    from slurm_cluster import missing_binaries, start_cluster

    problem = None
    missing = missing_binaries()
    if missing:
        problem = f"Slurm binaries missing: {', '.join(missing)}"
    elif os.geteuid() != 0:
        problem = "starting slurmctld/slurmd needs root"
    if problem:
        if REQUIRE_SLURM:
            pytest.fail(f"LIFECYCLE_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lifecycle.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs once on a SQLite file and once on PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store(db_url, upgrade=True)
    try:
        yield store
    finally:
        store.dispose()
