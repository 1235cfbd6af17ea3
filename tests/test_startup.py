"""The command line starts on what it needs: each command's module imported when it runs,
Alembic only to migrate, one built-in machine for a command about one resource. (What the
start costs is measured in benchmarks/, never asserted here.)"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from hostile_inputs import MARKUP

from lifecycle import revisions
from lifecycle.cli import COMMANDS, machine_commands, main
from lifecycle.store import migrate


def test_the_table_of_commands_says_what_the_commands_say() -> None:
    import importlib

    for name, (module, attribute, short) in COMMANDS.items():
        command = getattr(importlib.import_module(f"lifecycle.cli.{module}"), attribute)
        assert isinstance(command, click.Command), name
        assert command.name == name
        assert command.get_short_help_str(limit=10**6) == short, name
    context = click.Context(main)
    assert main.get_command(context, "no-such-command") is None
    # the machines' own commands come from their packages' entry points
    assert {"tardis", "reconcile", "hook", "queue"} <= set(machine_commands())
    assert sorted(main.list_commands(context)) == sorted({*COMMANDS, *machine_commands()})
    for name in machine_commands():
        command = main.get_command(context, name)
        assert isinstance(command, click.Command) and command.name == name


def test_one_machine_is_loaded_alone() -> None:
    done = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom lifecycle import machines\n"
        "assert machines.builtin('batch_job').spec.name == 'batch_job'\n"
        "assert machines.builtin('no-such-machine') is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('lifecycle.machines.')))")],
        capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == str(["lifecycle.machines.batch_job",
                                       "lifecycle.machines.builtin",
                                       "lifecycle.machines.index"])


def test_revisions_are_read_as_alembic_reads_them() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate._config())
    alembic_says = [(r.revision, r.down_revision, r.doc)
                    for r in reversed(list(script.walk_revisions()))]
    assert revisions.revisions() == alembic_says  # the one reader (the store's and show's)
    assert revisions.head_revision() == script.get_current_head()
    assert migrate.head_revision is revisions.head_revision


_LOADED = """
import sys
from lifecycle.cli import main
try:
    main(sys.argv[1:], prog_name="lifecycle")
except SystemExit as exit:
    code = exit.code
print("\\n" + __import__("json").dumps({"code": code, "modules": sorted(
    name for name in sys.modules if name.split(".")[0] in (
        "alembic", "sqlalchemy", "lifecycle", "rich", "pydantic", "transitions", "yaml",
        "psycopg", "logging", "importlib", "classad2", "smtplib"))}))
"""
LIBRARIES = ("alembic", "sqlalchemy", "pydantic", "transitions", "yaml", "psycopg",
             "logging")
"""What a command that reads one resource, or prints help, does not import."""


def _loaded(*args: str, plugins: str = "") -> tuple[int, set[str]]:
    """What a command imported, run in a fresh interpreter: its exit status, the modules."""
    environment = {k: v for k, v in os.environ.items() if k != "LIFECYCLE_PLUGINS"}
    if plugins:
        environment["LIFECYCLE_PLUGINS"] = plugins
    done = subprocess.run([sys.executable, "-c", _LOADED, *args], capture_output=True,
                          text=True, timeout=300, env=environment)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


_EACH = """
import atexit, gc, json, os, sys
preload, commands = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in preload:
    __import__(name)
assert not [m for m in sys.modules if m.split(".")[0] == "lifecycle"], "preloaded lifecycle"
gc.freeze()  # (out of the children's collections, which would copy every page of it)
reports = []
for args, env in commands:
    read, write = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the command, in a process of its own that has imported none of lifecycle
        os.close(read)
        os.environ.update(env)
        output = os.memfd_create("stdout")  # (a file, as capture_output's pipe is none)
        os.dup2(output, 1)
        from lifecycle.cli import main
        code = None
        try:
            main(args, prog_name="lifecycle")
        except SystemExit as exit:
            code = exit.code
        sys.stdout.flush()
        os.lseek(output, 0, os.SEEK_SET)
        with os.fdopen(write, "w") as report, os.fdopen(output) as printed:
            json.dump({"code": code, "output": printed.read(), "modules": sorted(
                name for name in sys.modules if name.split(".")[0] in (
                    "alembic", "sqlalchemy", "lifecycle", "rich", "pydantic", "transitions",
                    "yaml", "psycopg", "logging", "importlib", "classad2", "smtplib"))}, report)
        atexit._run_exitfuncs()  # the program's exit, but for the modules' teardown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as report:
        reports.append(json.loads(report.read() or "null"))
    os.waitpid(pid, 0)
print("\\n" + json.dumps(reports))
"""
ENGINE_LIBRARIES = ("sqlalchemy", "sqlalchemy.dialects.sqlite", "sqlite3", "pydantic",
                    "pydantic.main", "pydantic.fields", "transitions", "click", "asyncio")
"""Libraries every command that opens a database imports, whatever the machine: what
:func:`_loaded_each` imports once before its commands."""


def _loaded_each(*commands: list[str], plugins: str = "",
                 preload: tuple[str, ...] = ENGINE_LIBRARIES) -> list[tuple[int, set[str]]]:
    """What each command imported (see :func:`_reports`): its exit status, the modules."""
    return [(report["code"], set(report["modules"]))
            for report in _reports(*commands, plugins=plugins, preload=preload)]


def _reports(*commands: list[str], plugins: str = "",
             preload: tuple[str, ...] = ENGINE_LIBRARIES) -> list[dict[str, Any]]:
    """What each command imported, as :func:`_loaded` says, for several commands run one
    after the other, each in a fork of one fresh interpreter that has imported ``preload``
    and nothing of lifecycle's: the libraries every one of them imports anyway are imported
    once (they are 80% of a command's CPU), and which of lifecycle's modules, machines,
    dialects and adapters each command imports is still its own. (A preloaded library is in
    every command's modules, so that it cannot hide a module a check refuses: one it imports
    would show.) ``plugins`` is ``LIFECYCLE_PLUGINS`` for the last command. Each report:
    ``code``, ``modules`` and ``output`` (what it printed on stdout, a file)."""
    environment = {k: v for k, v in os.environ.items() if k != "LIFECYCLE_PLUGINS"}
    requests = [(list(args), {}) for args in commands]
    if plugins:
        requests[-1][1]["LIFECYCLE_PLUGINS"] = plugins
    done = subprocess.run([sys.executable, "-c", _EACH, json.dumps(list(preload)),
                           json.dumps(requests)], capture_output=True, text=True,
                          timeout=300, env=environment)
    reports = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else []
    assert len(reports) == len(commands) and None not in reports, done.stderr
    return list(reports)


def _libraries(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in LIBRARIES}


def test_help_imports_no_database_library() -> None:
    code, modules = _loaded("--help")
    assert code == 0
    assert not _libraries(modules)
    assert "lifecycle.engine" not in modules and "lifecycle.cli.resources" not in modules


def test_help_lists_the_machines_commands_from_the_index(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Reading the installed packages' entry points costs tens of milliseconds (importing
    importlib.metadata and what it needs): help reads them once and then lists the
    machines' commands from the index."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, modules = _loaded("--help")
    assert code == 0 and "importlib.metadata" in modules  # no index yet: read, and kept
    (report,) = _reports(["--help"], preload=())  # (a fork of a bare interpreter)
    assert report["code"] == 0 and "importlib.metadata" not in report["modules"]
    assert all(f" {name} " in report["output"] for name in ("tardis", "reconcile", "queue"))


def test_show_imports_no_database_library_nor_its_machine(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # (writable by any user)
    # a user's first command (the database is at the code's revision already): it writes
    # the machines' index, which show reads instead of loading the machines
    assert all(code in (0, None) for code, _ in _loaded_each(
        ["db", "upgrade", "--db", sqlite_url],
        ["create", "batch_job", "j1", "--data", '{"cmd": "x"}', "--db", sqlite_url]))
    (code, modules), (failed, failed_modules) = _loaded_each(  # in a bare interpreter
        ["show", "j1", "--db", sqlite_url], ["show", "no-such-key", "--db", sqlite_url],
        preload=())
    assert code in (0, None)
    assert not _libraries(modules)
    assert not {m for m in modules if m.startswith("lifecycle.machines.")} - {
        "lifecycle.machines.builtin", "lifecycle.machines.index"}
    assert not {"lifecycle.engine", "lifecycle.store", "lifecycle.spec",
                "lifecycle.compiled", "lifecycle.cli.context"} & modules
    assert failed == 1 and not _libraries(failed_modules)  # an error, as fast


def test_show_through_the_engine_loads_its_machine_alone(sqlite_url: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """With plugins (known only by importing them) the engine answers, loading the
    resource's machine and no other, and no Alembic."""
    (tmp_path / "empty_plugin.py").write_text("effects = {}\n")
    monkeypatch.chdir(tmp_path)
    (created, _), (code, modules) = _loaded_each(
        ["create", "batch_job", "j1", "--db", sqlite_url], ["show", "j1", "--db", sqlite_url],
        plugins="empty_plugin")
    assert created in (0, None) and code in (0, None)
    assert "lifecycle.engine" in modules and "lifecycle.machines.batch_job" in modules
    assert not {m for m in modules if m.startswith("alembic")}
    assert not {"lifecycle.machines.startd", "lifecycle.machines.job_exit",
                "lifecycle.machines.drone", "lifecycle.cli.sim", "lifecycle.worker",
                "lifecycle.scenario"} & modules


def test_lifecycle_logs_nowhere_unless_the_application_says_where() -> None:
    """A module's logger comes with the NullHandler on lifecycle's top logger (added with
    the first one, not on import: a command that never logs imports no logging)."""
    done = subprocess.run([sys.executable, "-c", (
        "import logging, lifecycle.engine\n"
        "print([type(h).__name__ for h in logging.getLogger('lifecycle').handlers])")],
        capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "['NullHandler']"


_UNFORCED = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
"""(Variables that would make rich style a pipe, which the commands then print through.)"""


def test_a_command_on_one_resource_loads_its_machine_alone(sqlite_url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """create, fire, observe, step and update import the machine of the resource they touch
    (at most) and no other (nor the others' adapters), no PostgreSQL dialect on SQLite, and no rich
    for the line they print on a pipe."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in _UNFORCED:
        monkeypatch.delenv(name, raising=False)
    commands = (["create", "batch_job", "j1", "--data", '{"cmd": "x"}'],
                ["fire", "j1", "hold"], ["step", "j1"], ["fire", "j1", "release"],
                ["observe", "j1", '{"up": true}'], ["update", "j1", '{"owner": "me"}'],
                ["fire", "j1", "start"], ["fire", "j1", "release"])
    for args, (code, modules) in zip(commands, _loaded_each(
            *([*args, "--db", sqlite_url] for args in commands)), strict=True):
        assert code in (0, None, 3), args
        assert {m for m in modules if m.startswith("lifecycle.machines.")} <= {
            "lifecycle.machines.batch_job", "lifecycle.machines.builtin",
            "lifecycle.machines.index"}, args
        assert not {m for m in modules if m.startswith(("lifecycle.adapters", "rich"))}, args
        assert not {m for m in modules if m.startswith("sqlalchemy.dialects.postgresql")}, args
        assert "lifecycle.engine" in modules, args
        assert args[0] in ("observe", "update") or "lifecycle.story" not in modules, args


def test_a_machine_not_built_in_still_has_every_built_in_guard(sqlite_url: str,
                                                               tmp_path: Path) -> None:
    """Meeting a machine from a spec file, the command line's engine has every built-in
    machine's guards, as when it loaded them all at its start."""
    spec = tmp_path / "reuse.json"
    spec.write_text(json.dumps({
        "name": "reuse", "initial": "a", "states": ["a", "b"], "final": ["b"],
        "transitions": [{"trigger": "go", "source": "a", "dest": "b",
                         "guards": ["holds_left"]}]}))  # (batch_job's)
    (code, modules), (fired, _) = _loaded_each(["create", str(spec), "r1", "--db", sqlite_url],
                                               ["fire", "r1", "go", "--db", sqlite_url])
    assert code in (0, None) and "lifecycle.machines.startd" in modules
    assert fired in (0, None)


@pytest.mark.parametrize("line", [
    "created a:b in [bold]queued[/] (version 1)", "a \\[bold]b[/] [red]c[/red] [x] [/]",
    "\\\\[bold]x[/] \\\\\\[dim]y[/dim] [bold][dim]z[/][/]", "é ü 你好 [bold red]!", "",
    "a\nb [bold]c\nd[/]", "a\tb", "a\rb\x07c", "x\x1b[31my", "postgresql://u:secret@h/db",
    *[f"k: [yellow]not fired[/]: {text}" for text in MARKUP]])
def test_a_line_is_written_as_rich_writes_it(line: str) -> None:
    """What a command prints without rich (common.say) is what rich's console prints,
    where it prints without rich at all."""
    from lifecycle.cli import common, console

    class Pipe(io.StringIO):
        def isatty(self) -> bool:
            return False

    printed = Pipe()
    console.SafeConsole(file=printed, highlight=False, soft_wrap=True, emoji=False).print(line)
    written = common.plain_line(line, Pipe())
    assert written is None or written == printed.getvalue()
    assert written is not None or any(c in line for c in "\t\r\x07\x1b")


def test_postgresql_gets_its_partial_indexes(postgres_url: str) -> None:
    """The partial indexes are partial on PostgreSQL too: their WHERE is given when a
    store on PostgreSQL is first opened (without one, the dialect is never imported)."""
    done = subprocess.run([sys.executable, "-c", (
        "import sys\nfrom sqlalchemy.schema import CreateIndex\n"
        "from lifecycle.store import Store, metadata\n"
        "assert not [m for m in sys.modules if 'postgresql' in m]\n"
        f"store = Store({postgres_url!r})\n"
        "print(sorted(str(CreateIndex(index).compile(store.engine)).split(' WHERE ')[-1]\n"
        "       for table in metadata.sorted_tables for index in table.indexes\n"
        "       if index.dialect_options['sqlite']['where'] is not None))\n"
        "store.dispose()")], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == str(sorted([
        "fence IS NOT NULL", "kind = 'refusal'", "head = 1 AND status IN ('pending', 'running')"]))


def test_machines_lists_the_built_in_ones_from_the_index(sqlite_url: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """`lifecycle machines` reads each built-in machine's spec version and summary from the
    machines' index: it imports none of them (and says what loading them all says)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    command = ["machines", "--json", "--db", sqlite_url]
    loading, indexed, plain = _reports(command, command, ["machines", "--db", sqlite_url])
    assert "lifecycle.machines.batch_job" in loading["modules"]  # no index yet: loaded, kept
    assert loading["code"] in (0, None) and indexed["code"] in (0, None)
    assert json.loads(indexed["output"]) == json.loads(loading["output"])
    for report in (indexed, plain):
        modules = set(report["modules"])
        assert report["code"] in (0, None)
        assert {m for m in modules if m.startswith("lifecycle.machines.")} == {
            "lifecycle.machines.builtin", "lifecycle.machines.index"}
        assert not {m for m in modules if m.startswith("lifecycle.adapters")}


def test_classads_and_mail_are_loaded_when_used(sqlite_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """HTCondor's ClassAd library is imported when an ad is printed or parsed, or a policy
    evaluated, and smtplib when a mail is sent: the worker, which loads every machine,
    imports neither for other work (nor rich, for the lines it prints on a pipe)."""
    for name in _UNFORCED:
        monkeypatch.delenv(name, raising=False)
    (created, _), (code, modules) = _loaded_each(["create", "batch_job", "j1", "--db", sqlite_url],
                                                 ["worker", "--until-idle", "--db", sqlite_url])
    assert created in (0, None) and code in (0, None)
    assert "lifecycle.machines.startd" in modules and "lifecycle.adapters.htcondor" in modules
    assert "classad2" not in modules and "smtplib" not in modules
    assert not {m for m in modules if m.startswith("rich")}
