"""``lifecycle show`` reads on the database's own driver (``lifecycle.bare_read``) and takes the
triggers from the stored spec (``lifecycle.graph.stored_triggers``); these tests hold it to
what the engine says: the same triggers from every state of every built-in machine and of
generated nested machines, the same output (text and --json) on the same resources on both
databases, the same errors, and the engine's answer wherever the read cannot give it."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from sqlalchemy import update
from test_nested_tables import SETTINGS, nested_specs

from lifecycle import MachineSpec
from lifecycle.cli import main
from lifecycle.cli import show as show_command
from lifecycle.cli.context import make_engine
from lifecycle.compiled import CompiledMachine, hierarchical
from lifecycle.graph import EVENTLESS, stored_triggers
from lifecycle.machines import builtins
from lifecycle.store import outbox

JOB = {"cluster": 42, "proc": 0, "owner": "alice", "userlog": "/nonexistent/log",
       "cmd": "/bin/true", "submit_host": "<127.0.0.1:9618>"}
"""The data a ``job_exit`` resource needs."""
FILED = {"name": "kettle", "initial": "cold",
         "states": ["cold", {"name": "hot", "timeout": {"after": 60, "trigger": "cool"}},
                    {"name": "on", "initial": "heating", "states": ["heating", "boiling"]}],
         "transitions": [{"trigger": "boil", "source": "cold", "dest": "on",
                          "effects": [{"name": "switch_on"}, {"name": "log"}]},
                         {"trigger": "bubble", "source": "on.heating", "dest": "on.boiling"},
                         {"trigger": "done", "source": "on", "dest": "hot",
                          "effects": ["switch_off"]},
                         {"trigger": "cool", "source": ["hot", "on"], "dest": "cold"},
                         {"trigger": "descale", "source": "*", "dest": "cold"}]}
"""A machine from a file (not built in): its spec is the one the database stores."""


@pytest.fixture(autouse=True)
def _no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIFECYCLE_PLUGINS", raising=False)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _both(monkeypatch: pytest.MonkeyPatch, *args: str,
          fast: bool = True) -> tuple[tuple[int, str], tuple[int, str]]:
    """``lifecycle ARGS`` as it runs (``fast``: it must not need the engine), and again with
    the engine answering every read."""
    with monkeypatch.context() as patched:
        if fast:
            def no_engine(*_: Any) -> Any:
                raise AssertionError("show asked the engine")
            patched.setattr(show_command, "by_engine", no_engine)
        ours = _cli(*args)
    with monkeypatch.context() as patched:
        patched.setattr(show_command, "peeked", lambda *_: None)
        theirs = _cli(*args)
    return ours, theirs


# -- triggers ------------------------------------------------------------------------------

def test_triggers_from_every_state_of_every_builtin_are_the_engines(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url, upgrade=True)
    try:
        asked = 0
        for name, builtin in sorted(builtins().items()):
            engine.load(name)  # the database stores the code's spec (compiled() never writes)
            for i, leaf in enumerate(builtin.spec.graph.leaves):
                data = {**JOB, "proc": i} if name == "job_exit" else {}
                key = f"{name}:42.{i}" if name == "job_exit" else f"{name}:r{i}"
                engine.create(name, key.split(":")[1], data, state=leaf)
                found = show_command.peeked(sqlite_url, key)
                assert found is not None, key
                assert found.resource.state == leaf
                assert found.triggers == engine.available_triggers(key), key
                asked += 1
        assert asked > 50
    finally:
        engine.store.dispose()


def test_triggers_of_generated_nested_machines_are_the_engines(slow: bool) -> None:
    """(30 machines find a read that drops a wildcard, a list's other sources or an edge;
    ``--slow`` tries 100.)"""
    @given(spec=nested_specs())
    @settings(SETTINGS, max_examples=100 if slow else 30)
    def triggers_are_the_engines(spec: MachineSpec) -> None:
        stored = json.loads(json.dumps(spec.to_json()))  # as the database gives it back
        compiled = CompiledMachine(spec, {})
        machine = hierarchical(spec, {})
        for leaf in spec.graph.leaves:
            ours = stored_triggers(stored, leaf)
            assert ours == sorted(compiled.triggers_from(leaf)), leaf  # available_triggers'
            assert set(ours) == set(machine.get_triggers(leaf)) - {EVENTLESS}, leaf

    triggers_are_the_engines()


# -- the same output as the engine's -------------------------------------------------------

def _populated(url: str, tmp_path: Path) -> list[str]:
    """Resources with data, observations, a nested state, pending timers, effects pending
    (with and without a handler here), running and failed; their keys."""
    spec_file = tmp_path / "kettle.json"
    spec_file.write_text(json.dumps(FILED))
    for args in (["db", "upgrade"], ["create", "batch_job", "job-1", "--data", '{"cmd": "x"}'],
                 ["fire", "job-1", "start"], ["fire", "job-1", "executing"],
                 ["observe", "job-1", '{"exit_code": 0, "note": "[red]x[/]"}'],
                 ["create", "job_exit", "42.0", "--data", json.dumps(JOB), "--state",
                  "writing_output_ad"],
                 ["fire", "42.0", "output_ad_written"],
                 ["create", "drone", "d1", "--state", "booting"],
                 ["update", "d1", '{"demand": 0}'],
                 ["observe", "d1", '{"resource_status": "Running", '
                                   '"machine_status": "NotAvailable"}'],
                 ["step", "d1"],
                 ["create", str(spec_file), "k1"], ["fire", "k1", "boil"],
                 ["create", str(spec_file), "k2"], ["fire", "k2", "boil"],
                 ["fire", "k2", "done"],
                 ["create", str(spec_file), "job-1"]):
        code, output = _cli(*args, "--db", url)
        assert code == 0, (args, output)
    engine = make_engine(url)
    try:
        with engine.store.begin() as db:  # one effect running under a worker, one stuck
            first, second = db.execute(outbox.select().where(  # k1's, asked first
                outbox.c.name.in_(["switch_on", "log"])).order_by(outbox.c.id)).all()[:2]
            db.execute(update(outbox).where(outbox.c.id == first.id).values(
                status="running", attempts=1, claimed_by="worker-7",
                lease_until=dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)))
            db.execute(update(outbox).where(outbox.c.id == second.id).values(
                status="failed", attempts=5, last_error="the switch [bold]stuck[/]"))
    finally:
        engine.store.dispose()
    return ["batch_job:job-1", "job_exit:42.0", "d1", "k1", "kettle:k2", "kettle:job-1"]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def populated(request: pytest.FixtureRequest, templates: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """A database of the module's own (on each of SQLite and PostgreSQL) with
    :func:`_populated`'s resources, and their keys: the tests that only read them share it
    (show, by its read or by the engine, writes nothing)."""
    directory = tmp_path_factory.mktemp("populated")
    with pytest.MonkeyPatch.context() as patched:
        patched.delenv("LIFECYCLE_PLUGINS", raising=False)
        if request.param == "sqlite":
            url = templates.sqlite(directory / "lifecycle.db")
            yield url, _populated(url, directory)
        else:
            with templates.postgres() as url:
                yield url, _populated(url, directory)


def test_show_prints_what_the_engine_shows(populated: tuple[str, list[str]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    db_url, keys = populated
    for key in keys:
        for shape in ([], ["--json"]):
            ours, theirs = _both(monkeypatch, "show", key, "--db", db_url, *shape)
            assert ours == theirs
            assert ours[0] == 0
    _, shown = _cli("show", "k1", "--db", db_url)
    assert "effect        switch_on running, attempt 1, held by worker worker-7" in shown
    assert "stuck         log failed, attempt 5: the switch [bold]stuck[/]" in shown
    drone = " ".join(_cli("show", "d1", "--db", db_url)[1].split())
    assert "integrate pending, attempt 0, due" in drone
    assert "no handler 'integrate' in this process" in drone
    _, job = _cli("show", "42.0", "--db", db_url)
    assert "update_job_queue pending" in job and "no handler" not in job  # (it has them)
    assert json.loads(_cli("show", "kettle:k2", "--db", db_url, "--json")[1])["timers"]
    _, nested = _cli("show", "batch_job:job-1", "--db", db_url, "--json")
    assert json.loads(nested)["state"] == "running.executing"


def test_errors_are_the_engines(populated: tuple[str, list[str]],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    db_url, _ = populated
    for key, said in (("no-such-key", "no-such-key"), ("job-1", "several machines"),
                      ("x" * 600, "invalid key"), ("nope:job-1", "nope")):
        ours, theirs = _both(monkeypatch, "show", key, "--db", db_url)
        assert ours == theirs
        assert ours[0] == 1 and said in ours[1]


def _databases(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """SQLite databases show cannot read: (URL, what the store says)."""
    yield f"sqlite:///{tmp_path / 'missing.db'}", "no lifecycle schema yet"
    sqlite3.connect(tmp_path / "empty.db").close()
    yield f"sqlite:///{tmp_path / 'empty.db'}", "no lifecycle schema yet"
    old = f"sqlite:///{tmp_path / 'old.db'}"
    assert _cli("db", "upgrade", "--db", old)[0] == 0
    assert _cli("db", "downgrade", "head-1", "--db", old)[0] == 0
    yield old, "is at schema revision"
    (tmp_path / "text.db").write_text("not a database")
    yield f"sqlite:///{tmp_path / 'text.db'}", "is not a SQLite database"
    yield f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}", "does not exist"


def test_a_database_show_cannot_read_is_the_stores_error(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for url, said in _databases(tmp_path):
        for key in ("job-1", "x" * 600):  # the database's problem first, as the store says
            ours, theirs = _both(monkeypatch, "show", key, "--db", url, fast=False)
            assert ours == theirs, url
            assert ours[0] == 1 and said in ours[1], ours
    assert not (tmp_path / "missing.db").exists()  # a read creates no file


def _engine_answers(monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """``lifecycle ARGS``'s output, checking that show's read left it to the engine."""
    asked: list[str] = []
    engine = show_command.by_engine

    def by_engine(db_url: str | None, key: str) -> Any:
        asked.append(key)
        return engine(db_url, key)

    with monkeypatch.context() as patched:
        patched.setattr(show_command, "by_engine", by_engine)
        code, output = _cli(*args)
    assert asked, args
    return f"{code}: {output}"


def test_the_engine_answers_what_the_read_cannot(sqlite_url: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _populated(sqlite_url, tmp_path)
    connection = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    with connection:  # as if the code's batch_job had changed since the database last saw it
        connection.execute("UPDATE lifecycle_machines SET spec_version = 'old' WHERE name = "
                           "'batch_job'")
        connection.execute("INSERT INTO lifecycle_specs SELECT machine, 'old', spec, "
                           "created_at FROM lifecycle_specs WHERE machine = 'batch_job'")
    connection.close()
    said = _engine_answers(monkeypatch, "show", "batch_job:job-1", "--db", sqlite_url)
    assert said.startswith("0: ") and "running.executing" in said
    connection = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    # the triggers are the code's spec's, and a read writes nothing: no spec registered
    assert connection.execute("SELECT spec_version FROM lifecycle_machines WHERE name = "
                              "'batch_job'").fetchone()[0] == "old"
    connection.close()
    # a machine whose guards this process lacks: shown from its stored spec all the same
    # (only deciding needs its guards)
    _cli("db", "upgrade", "--db", sqlite_url)
    connection = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    with connection:
        spec = json.loads(connection.execute(
            "SELECT spec FROM lifecycle_specs WHERE machine = 'kettle'").fetchone()[0])
        spec["transitions"][0]["guards"] = ["warm_enough"]
        connection.execute("UPDATE lifecycle_specs SET spec = ? WHERE machine = 'kettle'",
                           (json.dumps(spec),))
    connection.close()
    said = _engine_answers(monkeypatch, "show", "k1", "--db", sqlite_url)
    assert said.startswith("0: ") and "not registered" not in said
    # plugins: their handlers and guards are known only by importing them
    (tmp_path / "kettle_plugin.py").write_text("effects = {'switch_on': print}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LIFECYCLE_PLUGINS", "kettle_plugin")
    said = _engine_answers(monkeypatch, "show", "d1", "--db", sqlite_url)
    assert said.startswith("0: ")

