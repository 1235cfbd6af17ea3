"""A machine is found through the entry points of ``lifecycle.machines``, so a package that is
not lifecycle ships one the way lifecycle ships its own: a module and one entry-point line.
Here a toy package, installed as a ``.dist-info`` directory on the path (what pip writes),
is listed, created, configured from a plugin module's settings and shown by the command line
without a line of lifecycle changed; it carries a command of its own (an entry point of
``lifecycle.commands``) and a table on a migration branch of its own (``Builtin.migrations``),
which ``lifecycle db upgrade`` applies; the index that ``show`` reads is the machines' and
goes stale when a file they come from changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from lifecycle import machines
from lifecycle.check import worlds
from lifecycle.cli import main
from lifecycle.cli.context import make_engine
from lifecycle.errors import SetupError
from lifecycle.machines import index

PACKAGE = "toy_kettle_machines"
TOY = '''
import os

import click

from lifecycle import MachineSpec
from lifecycle.machines import Builtin

SPEC = MachineSpec.model_validate({
    "name": "kettle", "initial": "cold", "states": ["cold", "hot"],
    "transitions": [{"trigger": "boil", "source": "cold", "dest": "hot",
                     "effects": [{"name": "whistle"}]},
                    {"trigger": "cool", "source": "hot", "dest": "cold"}]})


def whistle(call):
    return None


def configure(settings):
    """A plugin module's ``kettle_volume`` gives the kettle its ``loud`` probe."""
    volume = getattr(settings, "kettle_volume", None)
    if volume is None:
        return None
    return {}, {"loud": lambda request: {"volume": volume}}


def command(cli):
    """The kettle's own command: how many whistles its table holds."""

    @click.command()
    @cli.db_option
    def kettle(db_url):
        """Count the kettles' whistles."""
        from sqlalchemy import text

        store = cli.open_store(db_url)
        with store.read() as db:
            count = db.execute(text("SELECT count(*) FROM toy_kettle_whistles")).scalar_one()
        cli.out.print(f"{count} whistles")

    return kettle


KETTLE = Builtin(spec=SPEC, effects={"whistle": whistle}, summary="a toy kettle",
                 configure=configure,
                 migrations=os.path.join(os.path.dirname(__file__), "migrations"))
NOT_A_MACHINE = 42
'''

BRANCH = '''"""kettle: the whistles table

Revision ID: kettle_0001_whistles
"""

import sqlalchemy as sa
from alembic import op

revision: str = "kettle_0001_whistles"
down_revision: str | None = None
branch_labels = ("kettle",)
depends_on = None


def upgrade() -> None:
    op.create_table("toy_kettle_whistles", sa.Column("id", sa.Integer(), primary_key=True))


def downgrade() -> None:
    op.drop_table("toy_kettle_whistles")
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy package installed on the path; a cache of its own; the directory."""
    site = tmp_path / "site"
    (site / PACKAGE).mkdir(parents=True)
    (site / PACKAGE / "__init__.py").write_text(TOY)
    (site / PACKAGE / "migrations").mkdir()
    (site / PACKAGE / "migrations" / "kettle_0001_whistles.py").write_text(BRANCH)
    info = site / f"{PACKAGE}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[lifecycle.machines]\nkettle = {PACKAGE}:KETTLE\n"
                                           f"[lifecycle.worlds]\nkettle = {PACKAGE}:KETTLE\n"
                                           f"[lifecycle.commands]\nkettle = {PACKAGE}:command\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LIFECYCLE_PLUGINS", raising=False)
    yield site
    sys.modules.pop(PACKAGE, None)


def test_a_machine_in_another_package_is_a_builtin(toy: Path) -> None:
    found = machines.builtins()
    assert found["kettle"].summary == "a toy kettle"
    assert {"batch_job", "drone", "job_exit", "slurm_dispatch", "startd"} < set(found)
    assert machines.builtin("kettle") is found["kettle"]
    assert machines.shipped()["kettle"] == (found["kettle"].spec.version, ("whistle",))


def test_the_command_line_lists_creates_and_configures_it(toy: Path, sqlite_url: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(main, [*args, "--db", sqlite_url], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    listed = {row["name"]: row for row in json.loads(run("machines", "--json"))}
    assert listed["kettle"]["kind"] == "built-in"
    assert listed["kettle"]["summary"] == "a toy kettle"
    run("create", "kettle", "k1")
    assert "hot" in run("fire", "k1", "boil")
    (toy / "kettle_settings.py").write_text("kettle_volume = 11\n")
    monkeypatch.setenv("LIFECYCLE_PLUGINS", "kettle_settings")
    engine = make_engine(sqlite_url, machines=["kettle"])
    assert engine.probes["loud"](None) == {"volume": 11}
    assert "whistle" in engine.handlers
    sys.modules.pop("kettle_settings", None)


def test_it_carries_a_command_and_a_migration_branch(toy: Path, sqlite_url: str) -> None:
    """The toy's table is on a branch of its own, which `lifecycle db upgrade` applies with
    job_exit's (the database was at the core's head); its command is the command line's."""
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(main, [*args, "--db", sqlite_url], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert "kettle" in CliRunner().invoke(main, ["--help"]).output
    upgraded = run("db", "upgrade")
    assert "branch kettle: empty -> kettle_0001_whistles" in upgraded
    assert "branch job_exit: empty -> job_exit_0001_queue" in upgraded
    assert "branch kettle: kettle_0001_whistles (up to date)" in run("db", "current")
    assert run("kettle") == "0 whistles\n"
    history = CliRunner().invoke(main, ["db", "history"]).output
    assert "base -> kettle_0001_whistles: kettle: the whistles table" in history


def test_show_knows_it_from_the_index_without_importing_it(toy: Path, tmp_path: Path,
                                                          sqlite_url: str) -> None:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(toy), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def run(*commands: list[str]) -> list[dict[str, bool]]:
        """Run the commands one after the other in one fresh interpreter: after each, whether
        the toy's package and the engine were imported, and whether the index is written."""
        done = subprocess.run(
            [sys.executable, "-c", "import json, sys, lifecycle.cli, lifecycle.machines.index\n"
             "for args in json.loads(sys.argv[1]):\n"
             "    try:\n        lifecycle.cli.main(args, prog_name='lifecycle')\n"
             "    except SystemExit as e:\n        assert not e.code, e.code\n"
             f"    print('\\nafter:', json.dumps({{'package': {PACKAGE!r} in sys.modules, "
             "'engine': 'lifecycle.engine' in sys.modules, "
             "'index': lifecycle.machines.index.fresh() is not None}))",
             json.dumps([[*args, "--db", sqlite_url] for args in commands])],
            capture_output=True, text=True, timeout=300, env=environment)
        assert done.returncode == 0, done.stderr
        return [json.loads(line.removeprefix("after: "))
                for line in done.stdout.splitlines() if line.startswith("after: ")]

    # a user's first commands, in one process (each imports the machines it needs)
    created, shown = run(["create", "kettle", "k1"], ["show", "k1"])
    assert created["package"]  # (loads its machine alone)
    assert shown["index"]  # (no index yet: loads every machine, writes it)
    (loaded,) = run(["show", "k1"])  # a fresh process reads the index instead
    assert not loaded["package"] and not loaded["engine"]
    assert machines.index.fresh() is not None
    (toy / PACKAGE / "__init__.py").write_text(TOY + "\n# changed\n")
    assert machines.index.fresh() is None  # the machine may have changed: ask it again


def test_an_entry_point_must_name_the_machine_it_gives(toy: Path) -> None:
    with pytest.raises(SetupError, match=r"gives an int, not a lifecycle\.machines\.Builtin"):
        machines.load("kettle", f"{PACKAGE}:NOT_A_MACHINE")
    with pytest.raises(SetupError, match="gives the machine 'kettle'"):
        machines.load("teapot", f"{PACKAGE}:KETTLE")
    with pytest.raises(SetupError, match="cannot be loaded"):
        machines.load("kettle", f"{PACKAGE}:NOWHERE")
    info = toy / f"{PACKAGE}-1.0.dist-info" / "entry_points.txt"
    info.write_text(f"[lifecycle.machines]\nbatch_job = {PACKAGE}:KETTLE\n")
    with pytest.raises(SetupError, match="two installed packages ship a machine 'batch_job'"):
        machines.entry_points()


def test_the_index_is_what_the_machines_say(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert index.fresh() is None
    found = machines.builtins()
    assert machines.shipped() == {name: (b.spec.version, tuple(sorted(b.effects)))
                                  for name, b in found.items()}
    assert set(index.fresh() or {}) == set(found)
    for builtin in found.values():  # the engine refuses no built-in spec for its guards
        assert builtin.spec.guard_names() <= set(builtin.guards)


def test_without_a_place_for_the_index_the_machines_answer(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))  # (not a directory)
    job_exit = machines.builtin("job_exit")
    assert job_exit is not None
    assert machines.shipped()["job_exit"] == (job_exit.spec.version,
                                              tuple(sorted(job_exit.effects)))
    assert index.fresh() is None
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]  # (no temporary file left)


def test_a_world_model_in_another_package_is_found_by_name(toy: Path) -> None:
    assert {"kettle", "drone", "startd_without_cd"} <= set(worlds.names())
    assert worlds.world_model("no-such-model") is None
    with pytest.raises(SetupError, match=r"gives Builtin, not a lifecycle\.check\.Model"):
        worlds.world_model("kettle")  # (the toy's entry point names its machine)
