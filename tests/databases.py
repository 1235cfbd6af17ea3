"""The tests' databases: a fresh one per test, at the code's revision without migrating it.

Migrating through Alembic costs 0.1 to 0.5 s a store on an idle machine (seconds under load),
more than most tests themselves; so the schema is built once per session (per pytest-xdist
worker) and copied per test: a SQLite file migrated once and copied with a file copy, and a
PostgreSQL database migrated once and used as the template of each test's own database
(``CREATE DATABASE ... TEMPLATE``, milliseconds). The migration tests ask for empty databases
(``empty=True``) and migrate them for real.

A test's PostgreSQL connections carry its database's name as their ``application_name``:
a test that leaves one open fails (a Store not disposed, a process still running). Where the
role may not create databases, each test gets a schema of its own in the configured
database instead, migrated when it asks for one at the code's revision."""

from __future__ import annotations

import gc
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from lifecycle import Store

POSTGRES_URL = os.environ.get(
    "LIFECYCLE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)
REQUIRE_POSTGRES = os.environ.get("LIFECYCLE_REQUIRE_POSTGRES") == "1"
LEAK_GRACE_SECONDS = 30.0
"""How long a closed connection may take to leave pg_stat_activity (the server ends its
backend after the client said goodbye)."""


def libpq(url: str) -> str:
    """The URL as psycopg (libpq) reads it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _reachable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(libpq(POSTGRES_URL), connect_timeout=3):
            return None
    except Exception as exc:  # the reason is shown in the skip message
        return f"{type(exc).__name__}: {exc}"


_PROBLEM: list[str | None] = []


def postgres_problem() -> str | None:
    """Why PostgreSQL cannot be used (None when it can); asked once per process."""
    if not _PROBLEM:
        _PROBLEM.append(_reachable())
    return _PROBLEM[0]


def require_postgres() -> None:
    """Skip the test when PostgreSQL is unreachable, or fail it under
    LIFECYCLE_REQUIRE_POSTGRES=1 (as .ci/run sets)."""
    problem = postgres_problem()
    if problem:
        if REQUIRE_POSTGRES:
            pytest.fail(f"LIFECYCLE_REQUIRE_POSTGRES=1 but PostgreSQL is unreachable: {problem}")
        pytest.skip(f"PostgreSQL unreachable at {POSTGRES_URL}: {problem}")


_ADMIN: list[Any] = []


def _admin(sql: str, params: tuple[Any, ...] | None = None) -> Any:
    """``sql`` run on this process's own connection to the configured database (opened on
    first use, and again if it broke), outside any test's database; its cursor."""
    import psycopg

    for attempt in (1, 2):
        if not _ADMIN or _ADMIN[0].closed:
            _ADMIN[:] = [psycopg.connect(libpq(POSTGRES_URL), autocommit=True)]
        try:
            return _ADMIN[0].execute(sql, params)
        except psycopg.OperationalError:
            _ADMIN[0].close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _url(database: str | None = None, schema: str | None = None, name: str = "") -> str:
    """POSTGRES_URL on another database, or with another schema first on its search_path,
    its connections named ``name``."""
    url = make_url(POSTGRES_URL)
    query = {"application_name": name} if name else {}
    if schema is not None:
        query["options"] = f"-csearch_path={schema}"
    url = url.set(database=database or url.database).update_query_dict(query)
    return url.render_as_string(hide_password=False)


class Templates:
    """This process's migrated templates, each built the first time a test needs it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._sqlite: Path | None = None
        self._postgres: str | None = None
        self._databases: bool | None = None

    # -- SQLite ------------------------------------------------------------------------------

    def sqlite(self, path: Path, *, empty: bool = False) -> str:
        """The URL of a SQLite file at ``path``: a copy of the template, or none yet."""
        if not empty:
            shutil.copyfile(self._sqlite_template(), path)
        return f"sqlite:///{path}"

    def _sqlite_template(self) -> Path:
        if self._sqlite is None:
            path = self.directory / "template.db"
            Store(f"sqlite:///{path}", upgrade=True).dispose()
            # closed, its write-ahead log is checkpointed into the file: the file is all of it
            assert not Path(f"{path}-wal").exists()
            self._sqlite = path
        return self._sqlite

    # -- PostgreSQL --------------------------------------------------------------------------

    @contextmanager
    def postgres(self, *, empty: bool = False) -> Iterator[str]:
        """The URL of a PostgreSQL database of the caller's own, dropped afterwards; fails
        when a connection to it is still open at the end."""
        require_postgres()
        name = f"lc_test_{uuid.uuid4().hex[:12]}"
        if self._can_create_databases():
            template = "" if empty else f' TEMPLATE "{self._postgres_template()}"'
            _admin(f'CREATE DATABASE "{name}"{template}')
            url = _url(database=name, name=name)
            drop = f'DROP DATABASE "{name}" WITH (FORCE)'  # with what leaked (PostgreSQL 13+)
        else:
            _admin(f'CREATE SCHEMA "{name}"')
            url = _url(schema=name, name=name)
            drop = f'DROP SCHEMA "{name}" CASCADE'
            if not empty:
                Store(url, upgrade=True).dispose()
        try:
            yield url
            leaked = _connections_left(name)
        finally:
            _admin(drop)
        if leaked:
            pytest.fail(f"the test left {leaked} connections to PostgreSQL open (a Store not "
                        "disposed, or a process still running)", pytrace=False)

    def _can_create_databases(self) -> bool:
        if self._databases is None:
            row = _admin("SELECT rolcreatedb OR rolsuper FROM pg_roles "
                         "WHERE rolname = current_user").fetchone()
            self._databases = bool(row and row[0])
        return self._databases

    def _postgres_template(self) -> str:
        if self._postgres is None:
            name = f"lc_template_{uuid.uuid4().hex[:12]}"
            _admin(f'CREATE DATABASE "{name}"')
            # no connection may be open on a template while a database is made from it
            Store(_url(database=name), upgrade=True).dispose()
            self._postgres = name
        return self._postgres

    def close(self) -> None:
        if self._postgres is not None:
            _admin(f'DROP DATABASE "{self._postgres}"')
            self._postgres = None
        if _ADMIN:
            _ADMIN.pop().close()


def _connections_left(application_name: str) -> int:
    """Connections still open under ``application_name`` once everything the test dropped was
    collected (a garbage collection only when some are open: it costs a tenth of a second),
    waiting for the server to notice the ones already closed."""
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    collected = False
    while True:
        row = _admin("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                     (application_name,)).fetchone()
        left = int(row[0]) if row else 0
        if left == 0 or time.monotonic() > deadline:
            return left
        if not collected:
            gc.collect()
            collected = True
        else:
            time.sleep(0.05)


def round_trips(proxy: Any, op: Callable[[], Any]) -> int:
    """The round trips ``op`` makes through ``proxy`` (the ``counted`` fixture's)."""
    before = proxy.round_trips()
    op()
    return int(proxy.round_trips() - before)
