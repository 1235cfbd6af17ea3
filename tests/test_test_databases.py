"""The tests' own PostgreSQL databases (tests/databases.py): a test that leaves a connection
open fails, whichever process holds it, and one whose connections are closed is not kept
waiting for the server to end their backends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import databases
import psycopg
import pytest
from databases import Templates, libpq
from sqlalchemy.engine import make_url

from lifecycle import Engine, Store
from lifecycle.spec import load_spec

SPEC = {"name": "switch", "initial": "off", "states": ["off", "on"], "final": ["on"],
        "transitions": [{"trigger": "flip", "source": "off", "dest": "on"}]}

LEFT_ONE = "left 1 connections to PostgreSQL open"


@pytest.fixture
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check answers at once rather than giving what is open time to close."""
    monkeypatch.setattr(databases, "LEAK_GRACE_SECONDS", 0.0)


def test_a_connection_left_open_fails_the_test(templates: Templates, no_grace: None) -> None:
    leaked: list[Any] = []
    with pytest.raises(pytest.fail.Exception, match=LEFT_ONE), templates.postgres() as url:
        leaked.append(psycopg.connect(libpq(url)))
        leaked[0].execute("SELECT 1")
    leaked[0].close()


def test_a_connection_another_process_holds_fails_the_test(templates: Templates,
                                                           no_grace: None) -> None:
    holds = textwrap.dedent("""
        import sys, psycopg
        # autocommit: leaving the block only closes, and the teardown may already have ended
        # the backend (a COMMIT would then fail with AdminShutdown)
        with psycopg.connect(sys.argv[1], autocommit=True) as connection:
            connection.execute("SELECT 1")
            print("connected", flush=True)
            sys.stdin.read()  # until the test closes it
    """)
    with pytest.raises(pytest.fail.Exception, match=LEFT_ONE), templates.postgres() as url:
        process = subprocess.Popen([sys.executable, "-c", holds, libpq(url)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "connected\n"
        except BaseException:
            process.kill()
            process.wait()
            raise
    process.communicate("", timeout=60)
    assert process.returncode == 0


def test_a_closed_connection_whose_backend_lingers_is_not_a_leak(
        templates: Templates, no_grace: None) -> None:
    """The backend is busy in a statement when its client closes the connection, so it stays
    in pg_stat_activity until the database is dropped; the client's end is closed, and that
    is what counts."""
    with templates.postgres() as url:
        connection = psycopg.connect(libpq(url), autocommit=True)
        connection.pgconn.send_query(b"SELECT pg_sleep(600)")
        connection.close()
        with psycopg.connect(libpq(databases.POSTGRES_URL)) as admin:
            row = admin.execute("SELECT state FROM pg_stat_activity WHERE query LIKE %s "
                                "AND application_name = %s",
                                ("SELECT pg_sleep%", make_url(url).query["application_name"]))
            assert row.fetchall() == [("active",)]  # the backend is still there, sleeping


def _tables_and_rows(url: str) -> tuple[set[str], int]:
    with psycopg.connect(libpq(url)) as connection:
        tables = {row[0] for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        rows = connection.execute("SELECT count(*) FROM lifecycle_resources").fetchone()
    return tables, int(rows[0]) if rows else -1


def test_the_next_test_gets_a_database_as_the_template_made_it(templates: Templates) -> None:
    """Rows a test wrote are gone and the ids start again; a table it made is not met."""
    with templates.postgres() as url:
        fresh, _ = _tables_and_rows(url)
        with Store(url) as store:
            engine = Engine(store, [load_spec(SPEC)])
            engine.create("switch", "s1")
        with psycopg.connect(libpq(url)) as connection:
            first_id = connection.execute("SELECT id FROM lifecycle_resources").fetchone()
            connection.execute("CREATE TABLE left_behind (n INT)")
    for _ in range(2):  # the same database emptied, or a new one: either is as made
        with templates.postgres() as url:
            assert _tables_and_rows(url) == (fresh, 0)
            with Store(url) as store:
                Engine(store, [load_spec(SPEC)]).create("switch", "s1")
            with psycopg.connect(libpq(url)) as connection:
                assert connection.execute(
                    "SELECT id FROM lifecycle_resources").fetchone() == first_id


def _public_schema(url: str) -> tuple[Any, ...]:
    """The schemas, the tables, and the ``public`` schema's owner, rights and comment."""
    with psycopg.connect(libpq(url)) as connection:
        return tuple(connection.execute(
            "SELECT (SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace), "
            "(SELECT array_agg(tablename::text ORDER BY tablename) FROM pg_tables "
            "  WHERE schemaname NOT IN ('pg_catalog', 'information_schema')), "
            "nspowner::regrole::text, nspacl::text, obj_description(oid, 'pg_namespace') "
            "FROM pg_namespace WHERE nspname = 'public'").fetchone() or ())


def test_the_next_test_gets_an_empty_database_as_create_database_made_it(
        templates: Templates) -> None:
    """An empty database a test migrated (a migration test's) comes back with no table and
    its public schema as it was; one with a schema of the test's own is not met again."""
    with templates.postgres(empty=True) as url:
        fresh = _public_schema(url)
        assert fresh and fresh[1] is None  # no table
        Store(url, upgrade=True).dispose()
        assert _public_schema(url) != fresh
    for made in ("CREATE TABLE public.left_behind (n INT)", "CREATE SCHEMA left_behind"):
        with templates.postgres(empty=True) as url:
            assert _public_schema(url) == fresh
            with Store(url, check=False) as store:
                assert store.current_revision() is None
                store.upgrade()
            with psycopg.connect(libpq(url)) as connection:
                connection.execute(made)
    with templates.postgres(empty=True) as url:
        assert _public_schema(url) == fresh
