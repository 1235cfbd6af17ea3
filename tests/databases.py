"""The tests' databases: one per test, at the code's revision without migrating it.

Migrating through Alembic costs 0.1 to 0.5 s a store on an idle machine (seconds under load),
more than most tests themselves; so the schema is built once per session (per pytest-xdist
worker) and copied per test: a SQLite file migrated once and copied with a file copy, and a
PostgreSQL database migrated once and used as the template of each test's own database
(``CREATE DATABASE ... TEMPLATE``). The migration tests ask for empty databases
(``empty=True``) and migrate them for real.

A test's PostgreSQL connections carry its database's name as their ``application_name``:
a test that leaves one open fails (a Store not disposed, a process still running). Where the
role may not create databases, each test gets a schema of its own in the configured
database instead, migrated when it asks for one at the code's revision.

Making and dropping a PostgreSQL database each take 0.2 to 1 s on a loaded machine (both
write and sync files; a drop also waits for every backend of the server to let go of the
dropped files), more than most tests. So a database a test leaves as its template made it
(its schema, settings and the template's rows; checked, ``_Reset``) is emptied and its
sequences restarted, in milliseconds, and the next test of the process gets it; one the test
changed otherwise, or left a connection open to, is dropped. An empty database (the
migration tests') is given again the same way: its ``public`` schema is dropped and made
again as it was, and it is checked to be as ``CREATE DATABASE`` made it. Making and dropping
run on a thread of each process's, beside the tests (``_Janitor``): when a test's database
is dropped, the next one is made while the next test runs. The check that a test left no
connection open counts a backend whose client has closed its end of the connection as gone:
the server ends such a backend at its own pace (tenths of a second under load), and waiting
for it proved nothing."""

from __future__ import annotations

import gc
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
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
"""How long a connection whose client end is still open, or cannot be seen (a Unix socket,
a server elsewhere), may take to leave pg_stat_activity (a process the test started may
still be exiting)."""


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


def _admin(sql: str, params: tuple[Any, ...] | None = None, held: list[Any] = _ADMIN) -> Any:
    """``sql`` run on this process's own connection to the configured database (opened on
    first use, and again if it broke), outside any test's database; its cursor. ``held`` is
    where the connection is kept: the janitor's thread keeps one of its own."""
    import psycopg

    for attempt in (1, 2):
        if not held or held[0].closed:
            held[:] = [psycopg.connect(libpq(POSTGRES_URL), autocommit=True)]
        try:
            return held[0].execute(sql, params)
        except psycopg.OperationalError:
            held[0].close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _Janitor:
    """A thread that runs the statements no test need wait for (making the next test's
    database, dropping the last one's) in order, on a connection of its own."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[str, Future[None]] | None] = queue.Queue()
        self._held: list[Any] = []
        self._pending: list[Future[None]] = []
        self._thread = threading.Thread(target=self._work, name="test-databases", daemon=True)
        self._thread.start()

    def run(self, sql: str) -> Future[None]:
        """``sql``, run once the statements asked for before it ran; its future."""
        done: Future[None] = Future()
        self._jobs.put((sql, done))
        self._pending = [f for f in self._pending if not f.done()] + [done]
        return done

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            sql, done = job
            try:
                _admin(sql, held=self._held)
            except BaseException as exc:  # given to whoever waits on it
                done.set_exception(exc)
            else:
                done.set_result(None)

    def close(self) -> None:
        """Run what is queued, then stop; raise the first statement's error that no one
        waited for (a drop that failed)."""
        self._jobs.put(None)
        self._thread.join()
        if self._held:
            self._held.pop().close()
        for done in self._pending:
            done.result()


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
        self._janitor: _Janitor | None = None
        self._next: tuple[str, Future[None]] | None = None
        """The next test's database, being made from the template (once one was dropped)."""
        self._free: list[str] = []
        """Databases a test used and left as the template is: emptied, ready again."""
        self._free_empty: list[str] = []
        """Empty databases a test used, made empty again."""
        self._resets: dict[str, _Reset] = {}

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
        """The URL of a PostgreSQL database of the caller's own, emptied for the next caller
        or dropped afterwards; fails when a connection to it is still open at the end."""
        require_postgres()
        if self._can_create_databases():
            name = self._database(empty)
            url = _url(database=name, name=name)
            drop = f'DROP DATABASE "{name}" WITH (FORCE)'  # with what leaked (PostgreSQL 13+)
        else:
            name = f"lc_test_{uuid.uuid4().hex[:12]}"
            _admin(f'CREATE SCHEMA "{name}"')
            url = _url(schema=name, name=name)
            drop = f'DROP SCHEMA "{name}" CASCADE'
            if not empty:
                Store(url, upgrade=True).dispose()
        leaked = -1
        try:
            yield url
            leaked = _connections_left(name)
        finally:
            reset = self._resets.get(name)
            if leaked == 0 and reset is not None and reset.reset():
                (self._free_empty if reset.empty else self._free).append(name)
            else:
                if reset is not None:
                    self._resets.pop(name).close()
                if self._janitor is not None:
                    if not empty and not self._free and self._next is None:
                        # the next test's, made first: a drop waits for every backend
                        self._next = self._copy(self._janitor, self._postgres_template())
                    self._janitor.run(drop)  # while the next test runs
                else:
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

    def _database(self, empty: bool) -> str:
        """A database of the caller's own: one a test before it left as it was made (emptied
        again), else a new one, empty or a copy of the template (the one the janitor began
        when the last test's was dropped)."""
        janitor = self._janitor or _Janitor()
        self._janitor = janitor
        free = self._free_empty if empty else self._free
        if free:
            return free.pop()
        if empty:
            name = f"lc_test_{uuid.uuid4().hex[:12]}"
            janitor.run(f'CREATE DATABASE "{name}"').result()
        else:
            if self._next is None:
                self._next = self._copy(janitor, self._postgres_template())
            (name, made), self._next = self._next, None
            made.result()
        try:
            self._resets[name] = _Reset(name, empty=empty)
        except BaseException:
            janitor.run(f'DROP DATABASE "{name}" WITH (FORCE)')
            raise
        return name

    @staticmethod
    def _copy(janitor: _Janitor, template: str) -> tuple[str, Future[None]]:
        name = f"lc_test_{uuid.uuid4().hex[:12]}"
        return name, janitor.run(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def _postgres_template(self) -> str:
        if self._postgres is None:
            name = f"lc_template_{uuid.uuid4().hex[:12]}"
            _admin(f'CREATE DATABASE "{name}"')
            # no connection may be open on a template while a database is made from it
            Store(_url(database=name), upgrade=True).dispose()
            self._postgres = name
        return self._postgres

    def close(self) -> None:
        for reset in self._resets.values():
            reset.close()
        for name in self._free + self._free_empty:
            _admin(f'DROP DATABASE "{name}" WITH (FORCE)')
        self._resets.clear()
        self._free.clear()
        self._free_empty.clear()
        if self._next is not None:
            name, _made = self._next
            assert self._janitor is not None
            self._janitor.run(f'DROP DATABASE IF EXISTS "{name}"')
            self._next = None
        if self._janitor is not None:
            self._janitor.close()  # the drops it was asked for, done
            self._janitor = None
        if self._postgres is not None:
            _admin(f'DROP DATABASE "{self._postgres}"')
            self._postgres = None
        if _ADMIN:
            _ADMIN.pop().close()


SYSTEM_SCHEMAS = "('pg_catalog', 'information_schema', 'pg_toast')"
SCHEMA = f"""
SELECT md5(string_agg(item, E'\\n' ORDER BY item)) FROM (
  SELECT 'schema ' || nspname || ' ' || coalesce(nspacl::text, '') FROM pg_namespace
   WHERE nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%'
  UNION ALL
  SELECT 'relation ' || c.oid::regclass::text || ' ' || c.relkind::text || ' '
         || coalesce(c.reloptions::text, '') || coalesce(c.relacl::text, '')
         || c.relrowsecurity::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname NOT LIKE 'pg_temp%'
     AND n.nspname NOT LIKE 'pg_toast_temp%'
  UNION ALL
  SELECT 'column ' || a.attrelid::regclass::text || ' ' || a.attname || ' '
         || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' '
         || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped AND n.nspname NOT IN {SYSTEM_SCHEMAS}
     AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%'
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' '
         || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace NOT IN
         (SELECT oid FROM pg_namespace WHERE nspname IN {SYSTEM_SCHEMAS})
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname NOT IN {SYSTEM_SCHEMAS}
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL
  SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname NOT IN {SYSTEM_SCHEMAS}
  UNION ALL
  SELECT 'type ' || t.oid::regtype::text || ' ' || coalesce(
         (SELECT string_agg(enumlabel::text, ',' ORDER BY enumsortorder) FROM pg_enum
           WHERE enumtypid = t.oid), '')
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
   WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname NOT LIKE 'pg_temp%'
     AND n.nspname NOT LIKE 'pg_toast_temp%'
  UNION ALL
  SELECT 'policy ' || polname || ' ' || polrelid::regclass::text FROM pg_policy
  UNION ALL
  SELECT 'extension ' || extname || ' ' || extversion FROM pg_extension
  UNION ALL
  SELECT 'setting ' || setrole::text || ' ' || array_to_string(setconfig, ',')
    FROM pg_db_role_setting WHERE setdatabase =
         (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL
  SELECT 'prepared ' || gid FROM pg_prepared_xacts WHERE database = current_database()
  UNION ALL
  SELECT 'large object ' || oid::text FROM pg_largeobject_metadata
) AS items(item)"""
"""A digest of a database's schema and of what else outlives a connection (its settings,
prepared transactions, large objects): a test that changed any of it is not given again."""
TABLES = f"""
SELECT c.oid::regclass::text,
       array(SELECT f.conrelid::regclass::text FROM pg_constraint f
              WHERE f.contype = 'f' AND f.confrelid = c.oid AND f.conrelid <> c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN {SYSTEM_SCHEMAS}
   AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%'"""
"""Each table, and the other tables whose foreign keys refer to it."""
SEQUENCES = f"""
SELECT format('SELECT setval(%L, %s, false)', schemaname || '.' || sequencename, start_value)
  FROM pg_sequences WHERE schemaname NOT IN {SYSTEM_SCHEMAS}"""


PUBLIC_SCHEMA = """
SELECT format('CREATE SCHEMA public AUTHORIZATION %I', pg_get_userbyid(nspowner)),
       format('COMMENT ON SCHEMA public IS %L', obj_description(oid, 'pg_namespace')),
       array(SELECT format('GRANT %s ON SCHEMA public TO %s', a.privilege_type,
                           CASE a.grantee WHEN 0 THEN 'PUBLIC'
                           ELSE quote_ident(pg_get_userbyid(a.grantee)) END)
               FROM aclexplode(nspacl) AS a WHERE a.grantee <> nspowner)
  FROM pg_namespace WHERE nspname = 'public'"""
"""The statements that make an empty database's ``public`` schema again as it is."""


WAIT_FOR_LOCKS = "SET LOCAL lock_timeout = '10s'"
"""No connection of the test's is open when its database is emptied, but one it could not
name (a program given the URL without its application_name) may still hold a lock: the
database is then dropped (with the connection) rather than the emptying waiting for ever."""


class _Reset:
    """A database given to tests again and again: after each, its tables are emptied and its
    sequences restarted (an ``empty`` one: its ``public`` schema dropped and made again as
    ``CREATE DATABASE`` made it, unless it is as made already), and it is checked to be as
    it was made (schema, rows, settings); else it is dropped and the next test gets a new
    one. Emptying small tables takes milliseconds; making a database takes 0.2 to 1 s,
    dropping one as long."""

    def __init__(self, name: str, *, empty: bool = False) -> None:
        import psycopg

        self.empty = empty
        self._connection = psycopg.connect(libpq(_url(database=name, name="lc_test_reset")),
                                           autocommit=True)
        if empty:
            self._contents = "SELECT 1"
            self._expected = self._state()
            assert self._expected is not None
            public = self._connection.execute(PUBLIC_SCHEMA).fetchone()
            remake = [*public[:2], *public[2]] if public else []
            self._emptying = ";\n".join([WAIT_FOR_LOCKS, "DROP SCHEMA IF EXISTS public CASCADE",
                                         *remake])
            return
        tables = dict(self._connection.execute(TABLES).fetchall())
        self._contents = "SELECT " + ", ".join(
            f"(SELECT md5(coalesce(string_agg(r::text, ',' ORDER BY r::text), '')) "
            f"FROM {table} AS r)" for table in sorted(tables)) if tables else "SELECT 1"
        self._expected = self._state()
        assert self._expected is not None
        empty_md5 = "d41d8cd98f00b204e9800998ecf8427e"
        with_rows = {t for t, digest in zip(sorted(tables), self._expected[1], strict=True)
                     if digest != empty_md5}  # the template's own rows (Alembic's revision)
        order: list[str] = []  # the tables referring to a table are emptied before it
        left = {table: set(refs) for table, refs in tables.items()}
        while left:
            ready = sorted(t for t, refs in left.items() if not refs & left.keys()) or \
                sorted(left)  # a cycle: its deletes fail, and the database is not reused
            order += ready
            for table in ready:
                del left[table]
        deletes = [f"DELETE FROM {table}" for table in order if table not in with_rows]
        restarts = [row[0] for row in self._connection.execute(SEQUENCES).fetchall()]
        # twice: for what triggers kept
        self._emptying = ";\n".join([WAIT_FOR_LOCKS, *deletes, *deletes, *restarts])

    def _state(self) -> tuple[str, tuple[str, ...]] | None:
        try:
            schema = self._connection.execute(SCHEMA).fetchone()
            contents = self._connection.execute(self._contents).fetchone()
        except Exception:  # a table the test dropped, a connection it cut
            return None
        return (schema[0] if schema else ""), tuple(contents or ())

    def reset(self) -> bool:
        """Empty the database again; whether it is now as the template made it."""
        if self.empty and self._state() == self._expected:
            return True  # (a test that migrated nothing)
        try:
            with self._connection.transaction():
                self._connection.execute(self._emptying)
        except Exception:  # a table the test dropped, a connection it cut
            return False
        return self._state() == self._expected

    def close(self) -> None:
        self._connection.close()


def _connections_left(application_name: str) -> int:
    """Connections still open under ``application_name`` once everything the test dropped was
    collected (a garbage collection only when some are open: it costs a tenth of a second).
    A backend whose client closed its end (seen in this machine's TCP sockets: the server is
    usually here) is on its way out and does not count; for one whose client end cannot be
    seen, the server is given time to notice."""
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    server_port = make_url(POSTGRES_URL).port or 5432
    collected = False
    while True:
        ports = [row[0] for row in _admin(
            "SELECT client_port FROM pg_stat_activity WHERE application_name = %s",
            (application_name,)).fetchall()]
        closed = _closed_clients(server_port) if ports else set()
        left = sum(1 for port in ports if port not in closed)
        if left == 0 or time.monotonic() > deadline:
            return left
        if not collected:
            gc.collect()
            collected = True
        else:
            time.sleep(0.05)


ESTABLISHED = "01"
"""A TCP socket's state in /proc/net/tcp: open both ways."""


def _closed_clients(server_port: int) -> set[int]:
    """The client ports of this machine's connections to ``server_port`` that are closed or
    closing: seen, at the client's end or the server's, and established at neither."""
    states: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no /proc: nothing is known to be closed
            continue
        for line in lines:
            local, remote, state = line.split()[1:4]
            ends = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
            if server_port in ends:  # (client, server) or (server, client)
                client = ends[1] if ends[0] == server_port else ends[0]
                states.setdefault(client, set()).add(state)
    return {port for port, seen in states.items() if ESTABLISHED not in seen}


def round_trips(proxy: Any, op: Callable[[], Any]) -> int:
    """The round trips ``op`` makes through ``proxy`` (the ``counted`` fixture's), each
    message held 50 ms on its way to the server while ``op`` runs (see ``counted``)."""
    proxy.set_delay(50)
    try:
        before = proxy.round_trips()
        op()
        return int(proxy.round_trips() - before)
    finally:
        proxy.set_delay(0)
