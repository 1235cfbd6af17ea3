"""The `lifecycle` command as a user types it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lifecycle.cli import main
from lifecycle.store import migrate

TOGGLE = {"name": "toggle", "initial": "off", "final": ["broken"],
          "states": ["off", "on", "broken"],
          "transitions": [{"trigger": "flip", "source": "off", "dest": "on"},
                          {"trigger": "flip", "source": "on", "dest": "off"},
                          {"trigger": "smash", "source": "*", "dest": "broken",
                           "description": "for good", "ref": "manual 3.1"}]}


@pytest.fixture
def run(empty_db_url: str):  # type: ignore[no-untyped-def]
    """The command on a database with no lifecycle schema yet (``upgraded`` migrates it)."""
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, [*args, "--db", empty_db_url], catch_exceptions=False)
        output = result.output
        assert result.exit_code == code, f"exit {result.exit_code} != {code}:\n{output}"
        return output

    return invoke


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "toggle.yaml"
    # quoted keys: YAML 1.1 would read a bare off/on as booleans
    path.write_text(yaml.safe_dump(TOGGLE))
    return path


@pytest.fixture
def upgraded(run) -> None:  # type: ignore[no-untyped-def]
    assert f"-> {migrate.head_revision()}" in run("db", "upgrade")


def test_a_tour(run, upgraded, spec_file: Path) -> None:  # type: ignore[no-untyped-def]
    assert "created toggle:t1 in off" in run("create", str(spec_file), "t1", "--data",
                                             '{"room": "b12"}')
    assert "toggle:t1: flip: off -> on (version 2)" in run("fire", "t1", "flip")
    shown = json.loads(run("show", "t1", "--json"))
    assert (shown["state"], shown["version"], shown["data"]) == ("on", 2, {"room": "b12"})
    assert shown["triggers"] == ["flip", "smash"]
    history = json.loads(run("history", "toggle:t1", "--json"))
    assert [(h["kind"], h["trigger"], h["dest"]) for h in history] == [
        ("create", None, "off"), ("transition", "flip", "on")]
    # the machine is found again from the file, and from the database by key alone
    run("create", str(spec_file), "t2")
    assert "t2: flip: off -> on" in run("fire", "t2", "flip", "--actor", "me")
    listed = json.loads(run("list", "toggle", "--json"))
    assert [r["key"] for r in listed] == ["t1", "t2"]
    assert "2 resources verified" in run("verify")
    machines = json.loads(run("machines", "--json"))
    assert {"name": "toggle", "kind": "stored"}.items() <= next(
        m for m in machines if m["name"] == "toggle").items()


def test_refused_fire_exits_3_with_the_reason(run, upgraded, spec_file: Path) -> None:  # type: ignore[no-untyped-def]
    run("create", str(spec_file), "t")
    run("fire", "t", "smash")
    out = run("fire", "t", "flip", code=3)
    assert "not fired: no transition for 'flip' from 'broken'" in out
    result = json.loads(run("fire", "t", "flip", "--json", code=3))
    assert result["fired"] is False and "no transition" in result["reason"]


def test_describe_json(run, spec_file: Path) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(run("describe", str(spec_file), "--json"))
    assert doc["name"] == "toggle" and doc["initial"] == "off"
    assert doc["states"][2] == {"name": "broken", "parent": None, "final": True}
    smash = doc["transitions"][2]
    assert {k: smash[k] for k in ("trigger", "source", "dest", "guards", "effects", "fresh",
                                  "ref", "description")} == {
        "trigger": "smash", "source": ["*"], "dest": "broken", "guards": [], "effects": [],
        "fresh": None, "ref": "manual 3.1", "description": "for good"}


def test_describe_nested_builtin(run) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(run("describe", "batch_job", "--json"))
    assert {"name": "running.executing", "parent": "running", "final": False} in doc["states"]
    text = run("describe", "batch_job")
    assert "running.starting" in text and "holds_left" in text


def test_bad_input_is_one_clear_line_and_writes_nothing(  # type: ignore[no-untyped-def]
        run, upgraded, spec_file: Path) -> None:
    run("create", str(spec_file), "t")
    out = run("create", "nosuchmachine", "x", code=1)
    assert "error: unknown machine 'nosuchmachine'" in out and "batch_job" in out
    assert "Traceback" not in out
    assert "error: no resource with key 'nope'" in run("fire", "nope", "flip", code=1)
    out = run("fire", "t", "flip", "--payload", "{not json", code=2)
    assert "Invalid value for --payload: not JSON" in out
    out = run("fire", "t", "flip", "--payload", "[1, 2]", code=2)
    assert "must be a JSON object" in out
    out = run("fire", "t", "flip", "--payload", '{"x": NaN}', code=2)
    assert "not JSON: NaN is not a JSON number" in out
    assert "error: machine 'toggle' has no trigger 'flop'" in run("fire", "t", "flop", code=1)
    bad = spec_file.parent / "bad.yaml"
    bad.write_text("name: bad\nstates: [a]\ninitial: b\n")
    out = run("create", str(bad), "x", code=1)
    assert "initial: 'b' is not a state" in out
    history = json.loads(run("history", "t", "--json"))
    assert [h["kind"] for h in history] == ["create"]  # nothing else was written


def test_never_upgraded_database(tmp_path: Path, spec_file: Path) -> None:
    path = tmp_path / "fresh.db"
    runner = CliRunner()
    for args in (["create", str(spec_file), "t"], ["show", "t"], ["verify"], ["machines"]):
        result = runner.invoke(main, [*args, "--db", str(path)])
        assert result.exit_code == 1, result.output
        assert "has no lifecycle schema yet; run `lifecycle db upgrade`" in result.output
        assert not path.exists()
    result = runner.invoke(main, ["db", "current", "--db", str(path)])
    assert "empty" in result.output and result.exit_code == 1


def test_db_commands(run) -> None:  # type: ignore[no-untyped-def]
    head = migrate.head_revision()
    assert "empty" in run("db", "current", code=1)
    assert f": empty -> {head}\n" in run("db", "upgrade")
    assert "up to date" in run("db", "current")
    assert f"already at {head}" in run("db", "upgrade")
    assert f"{head} -> 0001_core" in run("db", "downgrade", "0001_core")
    assert "behind" in run("db", "current", code=1)
    assert "0001_core -> empty" in run("db", "downgrade", "base")
    history = CliRunner().invoke(main, ["db", "history"]).output
    assert "base -> 0001_core" in history
    # each revision's description whole, on its line (its file wraps it at 90 columns)
    assert ("0001_core -> 0002_observations: observations: status reports from outside, the "
            "newest one per resource, and the observation and fence each decision rested on\n"
            ) in history


def test_console_script_and_module_entry_point(sqlite_url: str) -> None:
    """Both run a command and exit with its status, printing its error; both print the
    version or the help. (A migration through the console script is the pages' first
    example, tests/test_readme.py; here it would cost either half a second.)"""
    module = [sys.executable, "-m", "lifecycle"]
    script = [str(Path(sys.executable).parent / "lifecycle")]
    for command in (module, script):
        done = subprocess.run([*command, "show", "nope", "--db", sqlite_url],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, command
        assert done.stderr.strip() == (
            "error: no resource with key 'nope'; `lifecycle create` makes one")
    done = subprocess.run([*module, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("lifecycle, version ")
    done = subprocess.run([*script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: lifecycle ") and "\n  db " in done.stdout


def test_observe_and_a_refused_risky_edge(run, upgraded, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = {"name": "lease", "initial": "held", "final": ["gone"], "states": ["held", "gone"],
            "transitions": [{"trigger": "reclaim", "source": "held", "dest": "gone",
                             "fresh": {"max_age": 60}}]}
    path = tmp_path / "lease.json"
    path.write_text(json.dumps(spec))
    run("create", str(path), "l1")
    out = run("fire", "l1", "reclaim", code=3)
    assert "StaleObservation: lease 'l1' edge held->gone" in out
    assert "there is no observation (no probe is named" in out
    assert "observed {\"holder\": \"none\"}" in run("observe", "l1", '{"holder": "none"}',
                                                     "--source", "lease-db")
    out = run("observe", "l1", '{"holder": "x"}', "--at", "2001-01-01T00:00:00Z")
    assert "at 2001-01-01T00:00:00.000Z" in out
    assert "held -> gone" in run("fire", "l1", "reclaim")
    history = json.loads(run("history", "l1", "--json"))
    assert [h["kind"] for h in history] == ["create", "refusal", "transition"]
    assert history[1]["observation"] is None
    assert history[2]["observation"]["status"] == {"holder": "none"}
    assert history[2]["observation"]["source"] == "lease-db"
    assert history[2]["fence"]["expect"] == {"holder": "none"}
    assert "refused" in run("history", "l1")
    assert "Invalid value for --at" in run("observe", "l1", "{}", "--at", "yesterday", code=2)
    fresh = json.loads(run("describe", str(path), "--json"))["transitions"][0]["fresh"]
    assert fresh == {"max_age": 60.0, "probe": None}


def test_worker_timers_stuck_and_retry(run, upgraded, tmp_path: Path,  # type: ignore[no-untyped-def]
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "procs"))
    monkeypatch.setenv("LIFECYCLE_PLUGINS", "plugin")
    notes = tmp_path / "notes.txt"
    monkeypatch.setenv("PLUGIN_NOTES", str(notes))
    spec = {"name": "memo", "initial": "draft", "final": ["filed"],
            "states": ["draft", "noting", {"name": "waiting",
                                            "timeout": {"after": 0.05, "trigger": "expire"}},
                       "printing", "filed"],
            "transitions": [
                {"trigger": "send", "source": "draft", "dest": "noting", "guards": ["urgent"],
                 "effects": [{"name": "note", "args": {"copies": 2}}]},
                {"trigger": "noted", "source": "noting", "dest": "waiting"},
                {"trigger": "expire", "source": "waiting", "dest": "printing",
                 "effects": ["print"]},
                {"trigger": "file", "source": "printing", "dest": "filed"}]}
    path = tmp_path / "memo.yaml"
    path.write_text(yaml.safe_dump(spec))
    run("create", str(path), "m1")
    assert "guard 'urgent' is false" in run("fire", "m1", "send", code=3)
    run("fire", "m1", "send", "--payload", '{"urgent": true}')
    shown = json.loads(run("show", "m1", "--json"))
    assert [e["name"] for e in shown["effects"]] == ["note"]
    assert "effect" in run("show", "m1") and "note pending" in run("show", "m1")
    report = json.loads(run("worker", "--until-idle", "--json"))
    assert report["done"] == 1
    assert notes.read_text() == "m1 {'copies': 2}\n"
    shown = json.loads(run("show", "m1", "--json"))
    # the 0.05 s timeout may have come due during that run (a busy machine) or not yet
    fired, failed = report["timers_fired"], report["failed"]
    if fired:
        assert shown["state"] == "printing"
    else:  # set on entering waiting, and pending
        assert shown["state"] == "waiting" and shown["timers"][0]["trigger"] == "expire"
    while not fired:
        time.sleep(0.05)
        report = json.loads(run("worker", "--until-idle", "--json"))
        fired, failed = fired + report["timers_fired"], failed + report["failed"]
    assert (fired, failed) == (1, 1)
    assert "m1" in run("stuck") and "the printer is on fire" in run("stuck")
    assert "stuck" in run("show", "m1")
    notes.with_suffix(".allow").touch()
    assert "1 failed effect queued again" in run("retry", "m1")
    assert json.loads(run("worker", "--until-idle", "--json"))["done"] == 1
    assert "0 failed effects" in run("stuck")
