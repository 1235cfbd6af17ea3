"""What a person reads in an 80-column terminal: no name cut, no line wider than the
terminal, documents as ``key=value`` lines; and the demo's next steps, run as printed, show
what the demo says they show.

The commands run as a user runs them: the installed ``lifecycle`` program with ``COLUMNS``
set (rich reads the width when the program starts), as a fork of the session's fork server
(conftest.py's ``forkserver``), which starts it as a new process would."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from lifecycle import Store
from lifecycle.cli.machines import describe_json
from lifecycle.machines import builtins
from lifecycle.render import dot_program
from lifecycle.store import journal, resources

PROGRAM = Path(sys.executable).with_name("lifecycle")
FORKS: list[Any] = []
"""The session's fork server (conftest.py's ``forkserver``), while this module's tests run."""


@pytest.fixture(autouse=True, scope="module")
def _forks(forkserver: Any) -> Iterator[None]:
    FORKS.append(forkserver)
    yield
    FORKS.remove(forkserver)


def user_env(columns: int) -> dict[str, str]:
    """A new user's environment: the virtualenv not activated, no database or plugins set."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != PROGRAM.parent.resolve()]
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("LIFECYCLE_")}  # no database, plugins or settings
    return {**env, "COLUMNS": str(columns), "PATH": os.pathsep.join(path)}


def lifecycle(*args: str, cwd: Path, columns: int = 80, code: int = 0,
              server: Any = None) -> str:
    """``lifecycle ARGS`` as a new user runs it in ``cwd``, through ``server`` (the session's
    fork server; by default the one this module's tests hold)."""
    done = (server or FORKS[-1]).run([str(PROGRAM), *args], cwd=str(cwd), env=user_env(columns),
                         timeout=600)
    assert done.returncode == code, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return "".join(line.rstrip() + "\n" for line in done.stdout.splitlines())


def assert_fits(text: str, columns: int) -> None:
    wide = [line for line in text.splitlines() if len(line.rstrip()) > columns]
    assert not wide, f"lines wider than {columns} columns:\n" + "\n".join(wide)
    assert "…" not in text, f"something was cut:\n{text}"


def assert_whole(text: str, names: set[str]) -> None:
    """Every name appears whole: as a word of its own, not cut or broken over a line."""
    words = set(re.findall(r"[\w.]+", text))
    missing = sorted(n for n in names if n not in words)
    assert not missing, f"not shown whole: {missing}\n{text}"


def spec_names(machine: str) -> set[str]:
    doc = describe_json(builtins()[machine].spec)
    names = {s["name"] for s in doc["states"]}
    for t in doc["transitions"]:
        names |= {t["trigger"] or "eventless", t["dest"], *t["source"], *t["guards"],
                  *t["unless"], *t["effects"]}
        if t["fresh"] and t["fresh"]["probe"]:
            names.add(t["fresh"]["probe"])
    return names


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("machine", sorted(builtins()))
def test_describe_cuts_no_name(machine: str, columns: int, tmp_path: Path) -> None:
    text = lifecycle("describe", machine, cwd=tmp_path, columns=columns)
    assert_fits(text, columns)
    assert_whole(text, spec_names(machine))


def test_describe_is_a_table_when_it_fits_and_blocks_when_not(tmp_path: Path) -> None:
    narrow = lifecycle("describe", "batch_job", cwd=tmp_path, columns=80)
    assert "exit: running.executing -> succeeded\n    guards: exit_ok\n" in narrow
    wide = lifecycle("describe", "batch_job", cwd=tmp_path, columns=160)
    assert re.search(r"┃ trigger +┃ source +┃ dest +┃ guards +┃ about", wide)
    assert "running.executing" in wide and "not holds_left" in wide


def test_machines_list_show_and_history_fit_80_columns(tmp_path: Path) -> None:
    lifecycle("db", "upgrade", cwd=tmp_path)
    text = lifecycle("machines", cwd=tmp_path)
    assert_fits(text, 80)
    assert_whole(text, set(builtins()))
    long_key = "slot1@a-worker-node-with-a-rather-long-name.example.org"
    lifecycle("create", "drone", long_key, "--state", "booting", cwd=tmp_path)
    lifecycle("update", long_key, json.dumps({"demand": 0, "drain_requested": True,
                                              "note": "a long note " * 8}), cwd=tmp_path)
    lifecycle("observe", long_key, '{"resource_status": "Running", "machine_status": '
              '"NotAvailable"}', "--source", "status-cache", cwd=tmp_path)
    lifecycle("step", long_key, cwd=tmp_path)
    shown = {args[0]: lifecycle(*args, cwd=tmp_path)
             for args in (("list",), ("show", long_key), ("history", long_key))}
    for text in shown.values():
        assert_fits(text, 80)
        assert long_key in text.replace("\n", "") or long_key in text
    history = shown["history"]
    # payloads and statuses are key=value lines, not JSON
    assert '{"' not in history
    for line in ("demand=0", "drain_requested=true", "resource_status=Running",
                 "machine_status=NotAvailable"):
        assert re.search(rf"^ +{line}$", history, re.MULTILINE), line
    assert "observed by status-cache (#1)" in history
    assert "booting -> integrate" in history
    assert "effect integrate: pending" in history
    assert re.search(r"^ data +demand=0$", shown["show"], re.MULTILINE)


# -- the demo, run once for the tests that read it ----------------------------------------------


@dataclass
class Demo:
    folder: Path
    first: str
    second: str
    journals: dict[str, int]
    """Each resource's journal length after the first run."""


def figures_of(output: str) -> list[str]:
    """The demo table's lines with figures."""
    return [line.strip() for line in output.splitlines()
            if re.search(r"\s\d[\d,.]*\s+\d[\d,.]*\s*$", line)]


def journal_lengths(folder: Path) -> dict[str, int]:
    """How many journal rows each resource of the demo's database has, ``MACHINE:KEY``: one
    query (a history read per resource cost a second of the session's CPU)."""
    with Store(f"sqlite:///{folder / 'lifecycle.db'}") as store, store.read() as db:
        rows = db.execute(select(resources.c.machine, resources.c.key, func.count())
                          .join(journal, journal.c.resource_id == resources.c.id)
                          .group_by(resources.c.id, resources.c.machine, resources.c.key))
        return {f"{machine}:{key}": int(count) for machine, key, count in rows}


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory, forkserver: Any) -> Demo:
    """`lifecycle demo` as a user runs it, twice in one new folder: once per test session,
    whichever pytest-xdist worker asks first (the others wait for it and read what it saw)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' base folders are in the session's
    folder, seen = shared / "demo", shared / "demo.json"
    with (shared / "demo.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not seen.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed run left
            folder.mkdir()
            # (a session's fixture is made before the module's _forks: the server is passed)
            first = lifecycle("demo", cwd=folder, server=forkserver)
            journals = journal_lengths(folder)
            second = lifecycle("demo", cwd=folder, server=forkserver)
            seen.write_text(json.dumps({"first": first, "second": second,
                                        "journals": journals}))
    return Demo(folder, **json.loads(seen.read_text()))


def test_lifecycle_demo_twice_in_one_folder_prints_the_same_figures(demo: Demo) -> None:
    assert figures_of(demo.first) == figures_of(demo.second)
    assert len(figures_of(demo.first)) >= 3
    assert "drone_tardis:demo1-" in demo.first and "drone_tardis:demo2-" in demo.second
    # the first run's resources are as it left them: the second wrote nothing to them
    after = journal_lengths(demo.folder)
    assert {key: after.get(key) for key in demo.journals} == demo.journals


def test_the_demo_next_steps_run_as_printed_and_show_the_story(demo: Demo) -> None:
    text, folder = demo.first, demo.folder
    after = text.split("Look further with:\n", 1)[1]
    commands = [line.strip() for line in after.splitlines()
                if line.startswith("  ") and not line.startswith("      ")]
    assert len(commands) >= 5, after  # the simulations' hints, then three of its own
    program = shlex.split(commands[0])[0]  # as the demo spells it from here
    assert Path(program).resolve() == PROGRAM.resolve(), commands[0]
    activate = shlex.quote(str(Path(program).parent / "activate"))
    assert f"(`. {activate}` puts lifecycle on your PATH, for this shell)\n" in after
    # every line fits but for the program's path, which is wherever the clone is: as long as
    # the path of a clone in the user's folder
    assert_fits(text.replace(shlex.quote(program), ".venv/bin/lifecycle")
                .replace(activate, ".venv/bin/activate"), 80)
    outputs = {}
    # side by side: each reads the demo's database, or writes a file of its own
    running = []
    try:
        for command in commands:
            argv = shlex.split(command)
            assert Path(argv[0]).resolve() == PROGRAM.resolve(), command  # not on $PATH
            running.append((command, argv, subprocess.Popen(
                [*FORKS[-1].client_command(argv[0]), *argv[1:]], cwd=folder,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(80))))
        for command, argv, process in running:
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, f"{command}:\n{stdout}{stderr}"
            outputs[" ".join(argv[1:3])] = "\n".join(
                line.rstrip() for line in (stdout + stderr).splitlines())
    finally:
        for _, _, process in running:
            if process.poll() is None:
                process.kill()
                process.communicate()
    killed = next(v for k, v in outputs.items() if k.startswith("history drone_tardis:"))
    assert_fits(killed, 80)
    # the removal, the status it rested on and its age, and what the site said it removed
    removal = re.search(r"\(eventless\): booting -> cleanup, by tardis\n(.*?)\n +\d+ ",
                        killed, re.DOTALL)
    assert removal, killed
    # the status it rested on, shown with it or on the lines just above it
    rested = re.search(r"on observation #(\d+) (by status-cache|above), \d+\.\d s old",
                       removal[1])
    assert rested, removal[1]
    assert rested[2] == "above" or "resource_status=" in removal[1]
    assert f"observed by status-cache (#{rested[1]}" in killed or f"#{rested[1]})" in killed
    assert re.search(r"detail=removed the job while it was Running .*its payload was\s+killed",
                     removal[1], re.DOTALL), removal[1]
    saved = next(v for k, v in outputs.items() if k.startswith("history drone:"))
    assert "fresh=yes" in saved  # the removal rested on a fresh status, asked for if need be
    assert ("detail=left alone: the job is Running" in saved  # the fence kept the job
            or "booting -> integrate" in saved), saved  # or a fresh Running did
    picture = next(v for k, v in outputs.items() if k.startswith("diagram drone"))
    if dot_program() is not None:
        assert picture.strip() == "wrote drone.svg"
        assert "<svg" in (folder / "drone.svg").read_text()
    else:
        # front matter (title, the risky edges' CSS) comes first, then the diagram itself
        mermaid = (folder / "drone.mmd").read_text()
        assert mermaid.startswith("---\n") and "\n---\nstateDiagram-v2\n" in mermaid, mermaid[:300]
