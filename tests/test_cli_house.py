"""The command line as a new user first meets it: help that says what the commands do, the
demo's next steps runnable as printed, counts in good English, a diagram check that sees an
edited SVG, and listings by a composite state."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lifecycle.cli import main
from lifecycle.demo import _runnable, command_name
from lifecycle.render import dot_program

REPO = Path(__file__).resolve().parents[1]


def invoke(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, f"exit {result.exit_code} != {code}:\n{result.output}"
    return result.output


def test_help_describes_the_demo_as_it_is() -> None:
    for text in (invoke("--help"), invoke("demo", "--help")):
        assert "tutorial" not in text
    assert "incident" in invoke("demo", "--help")
    assert "incident" in invoke("--help")


def test_the_demo_names_a_command_that_runs_here(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    program = venv / "lifecycle"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    # not on $PATH: the path of the program, relative to where the user stands
    assert command_name(str(program), path="/nonexistent") == ".venv/bin/lifecycle"
    # on $PATH (an activated venv): the plain name
    assert command_name(str(program), path=str(venv)) == "lifecycle"
    # another `lifecycle` first on $PATH is not this one
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(program, other / "lifecycle")
    assert command_name(str(program), path=f"{other}{os.pathsep}{venv}") == \
        ".venv/bin/lifecycle"
    # beside it: relative, the shorter
    monkeypatch.chdir(other)
    assert command_name(str(program), path="/nonexistent") == "../.venv/bin/lifecycle"
    # in its own folder: a path, not a name $PATH would look up
    monkeypatch.chdir(venv)
    assert command_name(str(program), path="/nonexistent") == "./lifecycle"
    # far away (more ../ than the absolute path has characters): absolute, the shorter
    far = tmp_path.joinpath(*["d"] * (len(str(program.resolve())) // 3 + 1))
    far.mkdir(parents=True)
    monkeypatch.chdir(far)
    assert command_name(str(program), path="/nonexistent") == str(program.resolve())


def test_the_demo_quotes_a_program_path_with_a_space(tmp_path: Path) -> None:
    program = tmp_path / "a clone" / ".venv" / "bin" / "lifecycle"
    shown = _runnable("lifecycle history drone:d1", str(program))
    assert shlex.split(shown) == [str(program), "history", "drone:d1"]
    assert _runnable("lifecycle history drone:d1", "lifecycle") == "lifecycle history drone:d1"


def test_counts_are_in_good_english(db_url: str) -> None:
    invoke("db", "upgrade", "--db", db_url)
    invoke("create", "batch_job", "j1", "--db", db_url)
    assert invoke("list", "--db", db_url).rstrip().endswith("\n1 resource")
    assert "1 resource verified" in invoke("verify", "--db", db_url)
    invoke("create", "batch_job", "j2", "--db", db_url)
    assert invoke("list", "--db", db_url).rstrip().endswith("\n2 resources")
    assert "2 resources verified" in invoke("verify", "--db", db_url)
    assert invoke("stuck", "--db", db_url).rstrip().endswith("0 failed effects")


def test_list_by_a_composite_state_takes_in_its_children(db_url: str) -> None:
    invoke("db", "upgrade", "--db", db_url)
    invoke("create", "batch_job", "queued1", "--db", db_url)
    invoke("create", "batch_job", "busy1", "--db", db_url)
    invoke("fire", "busy1", "start", "--db", db_url)
    invoke("fire", "busy1", "executing", "--db", db_url)
    listed = invoke("list", "--state", "running", "--db", db_url)
    assert "batch_job:busy1" in listed and "running.executing" in listed
    assert "queued1" not in listed
    assert listed.rstrip().endswith("1 resource")
    assert "busy1" in invoke("list", "--state", "running.executing", "--db", db_url)
    assert "busy1" not in invoke("list", "--state", "running.starting", "--db", db_url)


def test_diagrams_check_sees_an_edited_svg(tmp_path: Path) -> None:
    if dot_program() is None:
        if os.environ.get("LIFECYCLE_REQUIRE_RENDERERS") == "1":
            pytest.fail("LIFECYCLE_REQUIRE_RENDERERS=1 but Graphviz's dot is not installed")
        pytest.skip("Graphviz's dot is not installed")
    copy = tmp_path / "diagrams"
    shutil.copytree(REPO / "diagrams", copy)
    assert "up to date" in invoke("diagrams", "--check", "--dir", str(copy))
    svg = copy / "drone.svg"
    svg.write_text(svg.read_text().replace(">booting<", ">b00ting<", 1))
    result = CliRunner().invoke(main, ["diagrams", "--check", "--dir", str(copy)])
    assert result.exit_code == 1
    assert f"stale (its text differs): {svg}" in result.output
    assert "1 diagram file is out of date" in result.output


def test_a_worker_start_is_quiet(sqlite_url: str, forkserver: Any) -> None:
    """Checking the schema revision is no news: Alembic's INFO lines stay out of the
    worker's log (an upgrade still reports what it did)."""
    import subprocess

    invoke("db", "upgrade", "--db", sqlite_url)
    # started warm (tests/zygote.py): the program's logging is set up in the child
    done = subprocess.run([*forkserver.python("-m", "lifecycle"), "worker", "--until-idle",
                           "--db", sqlite_url], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "Context impl" not in done.stderr and "Will assume" not in done.stderr, done.stderr
    assert "effects: 0 done" in done.stdout
