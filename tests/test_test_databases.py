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
        with psycopg.connect(sys.argv[1]) as connection:
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
