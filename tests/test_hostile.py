"""The corpus of issue 13: each hostile input once seen to end in a traceback, a hang, a silent
acceptance or a misleading message, now a clear refusal that changes nothing. Data cases run
on SQLite and PostgreSQL, which must accept and refuse exactly the same values."""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_inputs import RISKY, TOGGLE, assert_clean, cli, dump

from lifecycle import Engine, LifecycleError, SimulatedClock, Store, redact, storable
from lifecycle.adapters.smtp import MailConfigError, SmtpMailer, SmtpServer, build_message
from lifecycle.errors import DatabaseError, InvalidData, PermanentError, SchemaOutOfDate, SpecError
from lifecycle.store import migrate
from lifecycle.urls import display_url, resolve_url

# -- the rules of a storable value ----------------------------------------------------------

BAD_VALUES = [
    ({"a": "x\x00y"}, "data.a", "NUL"),
    ({"a": "\ud800"}, "data.a", "lone surrogate"),
    ({"x\x00": 1}, "data['x\\x00']", "NUL"),
    ({"\udcff": 1}, "data['\\udcff']", "lone surrogate"),
    ({"a": math.inf}, "data.a", "not a finite number"),
    ({"a": [1, math.nan]}, "data.a[1]", "not a finite number"),
    ({"a": 2**63}, "data.a", "64-bit"),
    ({"a": -(2**63) - 1}, "data.a", "64-bit"),
    ({"a": 10**5000}, "data.a", "64-bit"),
    ({1: "a"}, "data", "JSON keys are strings"),
    ({"when": object()}, "data.when", "not a JSON value"),
    ({"odd key": {"b": b"bytes"}}, "data['odd key'].b", "not a JSON value"),
]


@pytest.mark.parametrize(("document", "path", "reason"), BAD_VALUES)
def test_a_value_the_store_cannot_keep_is_named_by_its_path(document: Any, path: str,
                                                            reason: str) -> None:
    with pytest.raises(storable.ValueProblem) as refused:
        storable.check(document, "data")
    assert refused.value.path == path
    assert reason in refused.value.reason


def test_the_limits_are_where_the_documentation_says() -> None:
    storable.check({"a": [2**63 - 1, -(2**63), 1e308, -0.0, True, None, "é\n\t"]}, "data")
    nested: Any = 1
    for _ in range(storable.MAX_DEPTH):
        nested = [nested]
    storable.check(nested, "data")  # 64 levels
    with pytest.raises(storable.ValueProblem, match="nested deeper than 64 levels"):
        storable.check([nested], "data")
    with pytest.raises(storable.ValueProblem, match="more than 100,000 values"):
        storable.check(list(range(storable.MAX_VALUES)), "data")
    with pytest.raises(storable.ValueProblem, match="characters of text"):
        storable.check({"a": "x" * (storable.MAX_TEXT + 1)}, "data")


# -- data, payloads, observations, probe answers, on both databases --------------------------


@pytest.fixture
def engine(store: Store) -> Engine:
    probes = {"site": lambda request: {"status": "answer\x00with a NUL"}}
    return Engine(store, [TOGGLE, RISKY], probes=probes, clock=SimulatedClock())


HOSTILE_DOCUMENTS = [{"a": "\x00"}, {"a": "\ud800"}, {"\x00": 1}, {"a": math.inf},
                     {"a": math.nan}, {"a": 10**4400}, {"a": 2**64}]


def test_hostile_data_is_refused_alike_and_writes_nothing(engine: Engine, db_url: str) -> None:
    engine.create("toggle", "t1", {"ok": 1})
    before = dump(db_url)
    deep: Any = {}
    for _ in range(990):
        deep = {"a": deep}
    for document in [*HOSTILE_DOCUMENTS, deep]:
        with pytest.raises(InvalidData):
            engine.create("toggle", "t2", document)
        with pytest.raises(InvalidData):
            engine.fire("t1", "flip", document)
        with pytest.raises(InvalidData):
            engine.update("t1", document)
        with pytest.raises(InvalidData):
            engine.observe("t1", document)
    for key in ("k\x00", "\udcff", "x" * 300):
        with pytest.raises(LifecycleError, match="invalid key"):
            engine.create("toggle", key)
    for key in ("k\x00", "\udcff"):
        for lookup in (engine.get, engine.history, engine.observations):
            with pytest.raises(LifecycleError, match="invalid key"):
                lookup(key)
    with pytest.raises(InvalidData, match="actor"):
        engine.fire("t1", "flip", actor="a\x00b")
    with pytest.raises(InvalidData, match="source"):
        engine.observe("t1", {"ok": 1}, source="s" * 201)
    assert dump(db_url) == before


def test_a_probe_answer_that_cannot_be_stored_is_a_failed_probe(engine: Engine,
                                                                db_url: str) -> None:
    engine.create("risky", "r1")
    result = engine.fire("r1", "remove", on_stale="return")
    assert result.error == "StaleObservation" and not result.fired
    assert "cannot be stored" in (result.reason or "") and "NUL" in (result.reason or "")
    assert engine.observations("r1") == []


def test_a_data_field_timeout_out_of_range_is_refused_on_create(store: Store) -> None:
    spec = {"name": "timed", "initial": "waiting", "states": [
        {"name": "waiting", "timeout": {"after": "patience", "trigger": "give_up"}}, "done"],
        "transitions": [{"trigger": "give_up", "source": "waiting", "dest": "done"},
                        {"trigger": "again", "source": "done", "dest": "waiting"}]}
    engine = Engine(store, [spec], clock=SimulatedClock())
    with pytest.raises(InvalidData, match="patience"):
        engine.create("timed", "t", {"patience": 1e300})


def test_nan_in_effect_args_or_an_infinite_timeout_is_a_spec_problem() -> None:
    spec = json.loads(json.dumps(TOGGLE))
    spec["transitions"][0]["effects"] = [{"name": "e", "args": {"x": math.nan}}]
    with pytest.raises(SpecError, match=r"transitions\[0\].effects\[0\].args.x: is nan"):
        Engine(Store("sqlite://", upgrade=True), [spec], effects={"e": lambda call: None})
    timed = {**TOGGLE, "states": [{"name": "off", "timeout": {"after": math.inf,
                                                              "trigger": "flip"}}, "on"]}
    with pytest.raises(SpecError, match="finite"):
        Engine(Store("sqlite://", upgrade=True), [timed])


def test_eventless_is_not_a_trigger_name() -> None:
    spec = json.loads(json.dumps(TOGGLE))
    spec["transitions"][0]["trigger"] = "_eventless"
    with pytest.raises(SpecError, match="'_eventless' is not a valid trigger name"):
        Engine(Store("sqlite://", upgrade=True), [spec])


# -- passwords ------------------------------------------------------------------------------

URLS = [
    "postgresql://bob:Hunter2/Secret@db.example.org/lc",
    "postgresql://bob:a@b@db.example.org/lc",
    "postgresql://bob:a:b/c@db.example.org:5433/lc?sslmode=require",
    "postgresql+psycopg://bob:p%40ss@db.example.org/lc",
    "postgresql://db.example.org/lc?user=bob&password=Hunter2",
    "smtp://bob:Hunter2/Secret@mail.example.org",
    "smtps://bob:Hun@ter2:x@mail.example.org:465",
]


@pytest.mark.parametrize("url", URLS)
def test_no_url_form_shows_its_password(url: str) -> None:
    for shown in (redact.url(url), display_url(resolve_url(url)),
                  redact.text(f"cannot reach {url!r}: refused")):
        assert "Hunter2" not in shown and "Secret" not in shown and "p%40ss" not in shown
        assert "a@b" not in shown and ":b/c" not in shown and "***" in shown
    assert "db.example.org" in redact.url(url) or "mail.example.org" in redact.url(url)


def test_a_password_holding_an_at_sign_reaches_the_database_whole() -> None:
    url = resolve_url("postgresql://bob:a@b@db.example.org/lc")
    assert url == "postgresql+psycopg://bob:a%40b@db.example.org/lc"


def test_smtp_errors_and_stored_effect_errors_show_no_password() -> None:
    server = SmtpServer.from_url("smtp://bob:Hunter2/Secret@mail:2525")  # '/' in a password
    assert (server.host, server.port, server.user, server.password) == (
        "mail", 2525, "bob", "Hunter2/Secret")
    with pytest.raises(MailConfigError) as refused:
        SmtpServer.from_url("smtp://bob:Hunter2/Secret@mail:port")
    assert "Hunter2" not in str(refused.value) and "Secret" not in str(refused.value)
    mailer = SmtpMailer("smtp://bob:Hunter2/Secret@mail:port")
    message = build_message(sender="a@example.org", recipient="b@example.org", subject="s",
                            body="b", message_id="<1@example.org>",
                            date=SimulatedClock().now())
    with pytest.raises(PermanentError) as failed:  # what the worker stores as last_error
        mailer.send(message, "b@example.org")
    assert "Hunter2" not in str(failed.value) and "Secret" not in str(failed.value)


def test_a_database_url_is_shown_without_its_password_in_errors(postgres_url: str) -> None:
    url = postgres_url.replace("root@", "root:Hunter2%2FSecret@", 1).replace(
        "127.0.0.1:5432", "127.0.0.1:1")
    with pytest.raises(DatabaseError) as refused:
        Store(url)
    assert "Hunter2" not in str(refused.value) and "root:***@" in str(refused.value)
    ran = cli("list", db=url)
    assert_clean(ran, 1)
    assert "Hunter2" not in ran.output and "Secret" not in ran.output


def test_the_worker_log_shows_no_database_password(sqlite_url: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    url = "postgresql://bob:Hunter2/Secret@127.0.0.1:1/none"
    with caplog.at_level(logging.DEBUG):
        ran = cli("worker", "--until-idle", db=url)
    assert_clean(ran, 1)
    assert "Hunter2" not in ran.output + caplog.text


# -- the command line -----------------------------------------------------------------------


@pytest.fixture
def db(db_url: str) -> str:
    """A database at the code's revision (db_url's): the commands here use batch_job, which
    needs no `db upgrade` first (that would add job_exit's migration branch, seconds of DDL
    on PostgreSQL, for nothing these tests read)."""
    return db_url


@pytest.mark.parametrize("key", ["x[/]", "y[bold]z", "[red]", "a\\[b", "q[/bold]", "[red]x[/]",
                                 "[bold]k[/bold]"])
def test_a_key_with_markup_prints_as_itself_and_breaks_nothing(db: str, key: str) -> None:
    ran = cli("create", "batch_job", key, db=db)
    assert_clean(ran, 0)
    assert f"batch_job:{key} in queued" in ran.stdout
    for args in (["list"], ["show", key], ["history", key]):
        ran = cli(*args, db=db)
        assert_clean(ran, 0)
        assert key in ran.stdout, args
    ran = cli("fire", key, "hold", "--actor", "[/]op[bold]", db=db)
    assert_clean(ran, 0)  # it committed: exit 0
    assert f"batch_job:{key}: hold: queued -> held" in ran.stdout
    assert "[/]op[bold]" in cli("history", key, db=db).stdout


def test_bad_json_arguments_are_usage_errors(db: str) -> None:
    cli("create", "batch_job", "j1", db=db)
    before = dump(db)
    for text in ['{"a":1e999}', '{"a": NaN}', '{"a":1, "a":2}', "9" * 5000,
                 '{"a":' + "9" * 5000 + "}", '{"a":' * 990 + "1" + "}" * 990, "[1]", "{"]:
        ran = cli("fire", "j1", "hold", "--payload", text, db=db)
        assert_clean(ran, 2)
        assert "Invalid value for --payload" in ran.stderr
    for text in ['{"a":"\\u0000"}', '{"a":"\\ud800"}', '{"\\u0000":1}',
                 '{"a":' + str(2**63) + "}"]:
        for args in (["create", "batch_job", "j2", "--data", text],
                     ["fire", "j1", "hold", "--payload", text], ["observe", "j1", text],
                     ["update", "j1", text]):
            ran = cli(*args, db=db)
            assert_clean(ran, 1)
            assert "invalid data" in ran.stderr, ran.stderr
    assert dump(db) == before


def test_a_key_that_is_not_utf8_is_one_line(db: str) -> None:
    ran = cli("show", "\udcff\udcfe", db=db)  # what Python makes of the bytes ff fe in argv
    assert_clean(ran, 2)
    assert "argument 2 ('\\udcff\\udcfe') contains a lone surrogate" in ran.stderr
    ran = cli("retry", "k\x00", db=db)
    assert_clean(ran, 2)
    assert "contains a NUL character" in ran.stderr


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(bytes(range(256)) * 20)
    for args in (["list"], ["db", "upgrade"], ["db", "current"], ["worker", "--until-idle"]):
        ran = cli(*args, db=str(junk))
        assert_clean(ran, 1)
        assert "is not a SQLite database" in ran.stderr


def test_a_directory_that_does_not_exist_is_named(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "x.db"
    for args in (["list"], ["db", "upgrade"]):
        ran = cli(*args, db=str(path))
        assert_clean(ran, 1)
        assert f"the directory {str(path.parent)!r} does not exist" in ran.stderr
        assert "db upgrade" not in ran.stderr


def test_a_read_only_sqlite_uri_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    assert_clean(cli("db", "upgrade", db=str(path)), 0)
    assert_clean(cli("create", "batch_job", "b1", db=str(path)), 0)
    uri = f"sqlite:///file:{path}?mode=ro&uri=true"
    ran = cli("list", db=uri)
    assert_clean(ran, 0)
    assert "batch_job:b1" in ran.stdout
    ran = cli("create", "batch_job", "b2", db=uri)
    assert_clean(ran, 1)
    assert "readonly" in ran.stderr and "no lifecycle schema" not in ran.stderr


@pytest.mark.parametrize(("url", "said"), [
    ("://", "invalid database URL"),
    ("postgresql+psycopg2://root@127.0.0.1/test", "asks for the driver 'psycopg2'"),
    ("mysql://root@localhost/x", "unsupported database 'mysql'"),
    ("postgresql://bob:pw@127.0.0.1:port/x", "its port is not a number"),
])
def test_a_url_lifecycle_cannot_use_is_one_line(url: str, said: str) -> None:
    ran = cli("list", db=url)
    assert_clean(ran, 1)
    assert said in ran.stderr
    assert "pw@" not in ran.stderr


def test_unknown_revisions_and_a_newer_database(tmp_path: Path) -> None:
    path = tmp_path / "rev.db"
    for args in (["db", "upgrade", "nosuch"], ["db", "downgrade", "nosuch"]):
        ran = cli(*args, db=str(path))
        assert_clean(ran, 1)
        assert "unknown schema revision 'nosuch'" in ran.stderr
    assert_clean(cli("db", "upgrade", db=str(path)), 0)
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '0099_future' "
                           f"WHERE version_num = '{migrate.head_revision()}'")
    ran = cli("db", "current", db=str(path))
    assert_clean(ran, 1)
    assert "newer than this lifecycle" in ran.stdout and "db upgrade" not in ran.stdout
    for args in (["db", "upgrade"], ["db", "downgrade", "base"], ["list"]):
        ran = cli(*args, db=str(path))
        assert_clean(ran, 1)
        assert "0099_future" in ran.stderr and "upgrade lifecycle" in ran.stderr


def test_errors_give_the_command_line_remedy(tmp_path: Path) -> None:
    ran = cli("list", db=str(tmp_path / "new.db"))
    assert_clean(ran, 1)
    assert "run `lifecycle db upgrade`" in ran.stderr and "upgrade=True" not in ran.stderr
    with pytest.raises(SchemaOutOfDate, match=r"Store\(url, upgrade=True\)"):
        Store(str(tmp_path / "new.db"))
    spec = tmp_path / "guarded.yaml"
    spec.write_text(json.dumps({**TOGGLE, "transitions": [
        {"trigger": "flip", "source": "off", "dest": "on", "guards": ["lucky"]},
        {"trigger": "flip", "source": "on", "dest": "off"}]}))
    db = str(tmp_path / "g.db")
    assert_clean(cli("db", "upgrade", db=db), 0)
    ran = cli("create", str(spec), "g1", db=db)
    assert_clean(ran, 1)
    assert "LIFECYCLE_PLUGINS" in ran.stderr and "Engine(" not in ran.stderr
    with pytest.raises(SpecError, match=r"Engine\(guards="):
        Engine(Store("sqlite://", upgrade=True), [json.loads(spec.read_text())])


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory, holding plugin modules; they are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    return tmp_path


@pytest.mark.parametrize(("body", "said"), [
    ("raise RuntimeError('boom')", "RuntimeError: boom"),
    ("x = 1 / 0", "ZeroDivisionError"),
    ("def (", "SyntaxError"),
    ("import no_such_module_anywhere", "imports 'no_such_module_anywhere'"),
    ("guards = 5", "defines guards as int"),
])
def test_a_plugin_that_fails_is_named(plugin_dir: Path, body: str, said: str) -> None:
    (plugin_dir / "broken_plugin.py").write_text(body + "\n")
    ran = cli("list", db=str(plugin_dir / "p.db"),
              env={"LIFECYCLE_PLUGINS": "broken_plugin"})
    assert_clean(ran, 1)
    assert "LIFECYCLE_PLUGINS" in ran.stderr and "broken_plugin" in ran.stderr
    assert said in ran.stderr


def test_a_plugin_in_the_current_directory_needs_no_pythonpath(plugin_dir: Path) -> None:
    (plugin_dir / "local_guards.py").write_text("guards = {'lucky': lambda context: True}\n")
    spec = plugin_dir / "guarded.yaml"
    spec.write_text(json.dumps({**TOGGLE, "transitions": [
        {"trigger": "flip", "source": "off", "dest": "on", "guards": ["lucky"]},
        {"trigger": "flip", "source": "on", "dest": "off"}]}))
    db = str(plugin_dir / "p.db")
    assert_clean(cli("db", "upgrade", db=db), 0)
    env = {"LIFECYCLE_PLUGINS": "local_guards"}
    assert_clean(cli("create", str(spec), "g1", db=db, env=env), 0)
    assert "off -> on" in cli("fire", "g1", "flip", db=db, env=env).stdout
    ran = cli("list", db=db, env={"LIFECYCLE_PLUGINS": "not_here_at_all"})
    assert_clean(ran, 1)
    assert "no module 'not_here_at_all'" in ran.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e308", "0"])
def test_number_options_are_finite_and_refused_at_start(tmp_path: Path, value: str) -> None:
    db = str(tmp_path / "w.db")
    for option in ("--lease", "--poll"):
        ran = cli("worker", "--until-idle", option, value, db=db)
        assert_clean(ran, 2)
        assert f"Invalid value for '{option}'" in ran.stderr
    if value in ("nan", "inf", "-inf", "0"):  # (1e308 is a max_age; it would run)
        ran = cli("simulate", "drone-race", "--set", f"max_age={value}")
        assert_clean(ran, 2)
        assert "max_age takes a finite float, more than 0" in ran.stderr


@pytest.mark.parametrize(("setting", "says"), [
    ("drone-race drones=-5", "drones takes an int, 1 or more"),
    ("drone-race drones=0", "drones takes an int, 1 or more"),
    ("drone-race hours=-1", "hours takes a finite float, more than 0"),
    ("drone-race policy=random", "policy takes one of established_first, newest_first, cobald"),
    ("drone-race start_gate=maybe", "start_gate takes true or false"),
    ("job-exit-crash crashes=7", "crashes takes a finite float, from 0 to 1"),
    ("scancel-flood poll_interval=0", "poll_interval takes a finite float, more than 0"),
    ("scancel-flood delay_a=-1", "delay_a takes a finite float, 0 or more"),
    ("startd-fetch schedds=0", "schedds takes an int, 1 or more"),
])
def test_simulation_options_out_of_range_are_refused_before_anything_runs(
        setting: str, says: str) -> None:
    """A negative count or a zero interval would give an empty report, or a simulated loop
    that never ends, instead of an error."""
    name, option = setting.split()
    ran = cli("simulate", name, "--set", option)
    assert_clean(ran, 2)
    assert says in ran.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1"])
def test_job_exit_settings_are_refused_at_start(tmp_path: Path, value: str) -> None:
    db = str(tmp_path / "j.db")
    assert_clean(cli("db", "upgrade", db=db), 0)
    # a process of its own: the settings are read when the machine is first made (a new
    # interpreter: the fork server's has job_exit imported, and would run one anyway)
    ran = subprocess.run([sys.executable, "-m", "lifecycle", "worker", "--until-idle",
                          "--db", db], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "LIFECYCLE_JOB_EXIT_RETRY_DELAY": value})
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.stderr.startswith("error: LIFECYCLE_JOB_EXIT_RETRY_DELAY=")
    assert "Traceback" not in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_an_unexpected_failure_is_one_line_with_its_own_exit(plugin_dir: Path) -> None:
    # a plugin whose guards cannot be read: nothing lifecycle checks for by name
    (plugin_dir / "odd_effects.py").write_text(
        "from collections.abc import Mapping\n"
        "class Odd(Mapping):\n"
        "    def __getitem__(self, name): raise ValueError('odd plugin')\n"
        "    def __iter__(self): return iter(['g'])\n"
        "    def __len__(self): return 1\n"
        "guards = Odd()\n")
    db = str(plugin_dir / "u.db")
    assert_clean(cli("db", "upgrade", db=db), 0)
    ran = cli("list", db=db, env={"LIFECYCLE_PLUGINS": "odd_effects"})
    assert ran.exception is None and "Traceback" not in ran.output
    assert ran.code == 4, ran.output
    assert ran.stderr.startswith("error: unexpected ") and "LIFECYCLE_TRACEBACK=1" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_a_handler_error_with_a_url_is_shown_and_logged_without_its_password(
        plugin_dir: Path) -> None:
    (plugin_dir / "leaky.py").write_text(
        "from lifecycle import PermanentError\n"
        "def send(call):\n"
        "    raise PermanentError('cannot reach smtp://bob:Hunter2/Secret@mail.example.org')\n"
        "effects = {'send': send}\n")
    spec = plugin_dir / "mailing.yaml"
    spec.write_text(json.dumps({**TOGGLE, "transitions": [
        {"trigger": "flip", "source": "off", "dest": "on", "effects": ["send"]},
        {"trigger": "flip", "source": "on", "dest": "off"}]}))
    db, env = str(plugin_dir / "m.db"), {"LIFECYCLE_PLUGINS": "leaky"}
    assert_clean(cli("db", "upgrade", db=db), 0)
    assert_clean(cli("create", str(spec), "m1", db=db, env=env), 0)
    assert_clean(cli("fire", "m1", "flip", db=db, env=env), 0)
    shown = [cli("worker", "--until-idle", db=db, env=env), cli("stuck", db=db, env=env),
             cli("stuck", "--json", db=db, env=env), cli("show", "m1", db=db, env=env)]
    for ran in shown:
        assert_clean(ran, 0)
        assert "Hunter2" not in ran.output and "Secret" not in ran.output, ran.output
    assert "smtp://bob:***@mail.example.org" in shown[2].stdout
    assert json.loads(shown[2].stdout)[0]["name"] == "send"  # still JSON


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_command_that_committed_exits_0_when_its_output_is_lost(tmp_path: Path,
                                                                  forkserver: Any) -> None:
    db = str(tmp_path / "full.db")
    assert_clean(cli("db", "upgrade", db=db), 0)
    command = forkserver.python("-m", "lifecycle")  # (started warm, tests/zygote.py)
    with open("/dev/full", "w") as full:
        for args in (["create", "batch_job", "lost[/]"], ["fire", "lost[/]", "hold", "--json"]):
            ran = subprocess.run([*command, *args, "--db", db], stdout=full, stderr=subprocess.PIPE,
                                 text=True, timeout=120)
            assert ran.returncode == 0, ran.stderr
            assert "Traceback" not in ran.stderr and "Exception ignored" not in ran.stderr
    assert json.loads(cli("show", "lost[/]", "--json", db=db).stdout)["state"] == "held"
    closed = subprocess.Popen([*command, "history", "lost[/]", "--db", db],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert closed.stdout is not None and closed.stderr is not None
    closed.stdout.close()  # the reader went away (| head)
    assert closed.wait(timeout=120) == 0
    assert "Traceback" not in closed.stderr.read()
