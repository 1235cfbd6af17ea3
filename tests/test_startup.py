"""The command line starts on what it needs: each command's module imported when it runs,
Alembic only to migrate, one built-in machine for a command about one resource. (What the
start costs is measured in benchmarks/, never asserted here.)"""

from __future__ import annotations

import json
import subprocess
import sys

import click

from lifecycle import machines
from lifecycle.cli import COMMANDS, main
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
    assert sorted(main.list_commands(context)) == sorted(COMMANDS)


def test_the_table_of_built_in_machines_names_their_modules() -> None:
    found = machines.builtins()
    assert sorted(found) == sorted(machines.MODULES)
    for name, builtin in found.items():
        assert builtin.spec.name == name
        assert type(builtin).__module__ == "lifecycle.machines.builtin"
    assert machines.builtin("no-such-machine") is None


def test_revisions_are_read_as_alembic_reads_them() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate._config())
    alembic_says = [(r.revision, r.down_revision, r.doc)
                    for r in reversed(list(script.walk_revisions()))]
    assert migrate.revisions() == alembic_says
    assert migrate.head_revision() == script.get_current_head()


_LOADED = """
import sys
from lifecycle.cli import main
try:
    main(sys.argv[1:], prog_name="lifecycle")
except SystemExit as exit:
    code = exit.code
print("\\n" + __import__("json").dumps({"code": code, "modules": sorted(
    name for name in sys.modules if name.split(".")[0] in (
        "alembic", "sqlalchemy", "lifecycle", "rich", "pydantic", "transitions"))}))
"""


def _loaded(*args: str) -> tuple[int, set[str]]:
    """What a command imported, run in a fresh interpreter: its exit status, the modules."""
    done = subprocess.run([sys.executable, "-c", _LOADED, *args], capture_output=True,
                          text=True, timeout=300)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], set(report["modules"])


def test_help_imports_no_database_library() -> None:
    code, modules = _loaded("--help")
    assert code == 0
    assert not {m for m in modules if m.split(".")[0] in ("alembic", "sqlalchemy", "pydantic",
                                                          "transitions")}
    assert "lifecycle.engine" not in modules and "lifecycle.cli.resources" not in modules


def test_show_loads_its_machine_alone_and_no_alembic(sqlite_url: str) -> None:
    code, _ = _loaded("db", "upgrade", "--db", sqlite_url)
    assert code in (0, None)
    code, _ = _loaded("create", "batch_job", "j1", "--db", sqlite_url)
    assert code in (0, None)
    code, modules = _loaded("show", "j1", "--db", sqlite_url)
    assert code in (0, None)
    assert not {m for m in modules if m.startswith("alembic")}
    assert "lifecycle.machines.batch_job" in modules
    assert not {"lifecycle.machines.startd", "lifecycle.machines.job_exit",
                "lifecycle.machines.drone", "lifecycle.cli.sim"} & modules
