"""Shared fixtures: a fresh database per test on SQLite (a file) and on PostgreSQL (a schema
of its own, dropped afterwards)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

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
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_libpq(POSTGRES_URL), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


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
