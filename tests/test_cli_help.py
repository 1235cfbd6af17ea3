"""``lifecycle --help`` lists a machine's command from the machines' index, with the help
the command's module gave it, without importing that module (nor rich: click prints the
help); the help is read again when the module changes. (A toy package with one command,
installed as a ``.dist-info`` directory on the path, is the machine package here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # (it starts processes)

PACKAGE = "toy_help_commands"
MODULE = '''
import click


def command(cli):
    @click.command()
    def teapot():
        """{help} It has a second sentence that help leaves out."""

    return teapot
'''

HELP = """
import json, sys
from lifecycle.cli import main
try:
    main(["--help"], prog_name="lifecycle")
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps(sorted(sys.modules)))
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / PACKAGE).mkdir(parents=True)
    info = site / f"{PACKAGE}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[lifecycle.commands]\nteapot = {PACKAGE}:command\n")
    return site


def _help(toy: Path, cache: Path) -> tuple[str, list[str]]:
    """The help's line for the toy's command, and the modules the help imported."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": "200",
                   "PYTHONPATH": os.pathsep.join(
                       [str(toy), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", HELP], capture_output=True, text=True,
                          timeout=300, env=environment)
    assert done.returncode == 0, done.stderr
    *text, modules = done.stdout.strip().splitlines()
    line = next(row.strip() for row in text if row.strip().startswith("teapot "))
    return line, list(json.loads(modules))


def test_help_reads_a_machines_command_from_the_index_until_its_module_changes(
        toy: Path, tmp_path: Path) -> None:
    module = toy / PACKAGE / "__init__.py"
    module.write_text(MODULE.format(help="Pour the tea."))
    cache = tmp_path / "cache"
    line, loaded = _help(toy, cache)  # no index yet: the command is made, its help kept
    assert line.split(None, 1) == ["teapot", "Pour the tea."]
    assert PACKAGE in loaded
    line, loaded = _help(toy, cache)
    assert line.split(None, 1) == ["teapot", "Pour the tea."]
    assert PACKAGE not in loaded and "lifecycle.cli.kit" not in loaded
    assert not {m for m in loaded if m.endswith("_commands")}  # no command's module
    assert "importlib.metadata" not in loaded
    assert not {m for m in loaded if m.split(".")[0] == "rich"}  # click prints the help
    module.write_text(MODULE.format(help="Pour the tea, slowly, into two cups."))
    line, loaded = _help(toy, cache)  # its module changed: the index is stale
    assert line.split(None, 1) == ["teapot", "Pour the tea, slowly, into two cups."]
    assert PACKAGE in loaded
    line, loaded = _help(toy, cache)
    assert line.split(None, 1) == ["teapot", "Pour the tea, slowly, into two cups."]
    assert PACKAGE not in loaded
