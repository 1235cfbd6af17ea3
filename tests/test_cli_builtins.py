"""Every built-in machine works from the command line with no plugin: resources are created
(or adopted), observed, updated, shown, listed and moved; what needs a handler or a probe
this process lacks waits, or is refused saying which name is missing and how to provide it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from lifecycle.cli import main
from lifecycle.machines import builtins

Run = Callable[..., str]


@pytest.fixture
def run(db_url: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Run:
    monkeypatch.delenv("LIFECYCLE_PLUGINS", raising=False)
    runner = CliRunner()
    # db_url is at the code's revision already; `db upgrade` adds the migration branches of
    # the machines that have one (job_exit's tables), which only those machines' commands
    # use: it runs where the test's machine has one (on PostgreSQL, about a second of DDL)
    callspec = getattr(request.node, "callspec", None)
    machine = callspec.params.get("machine") if callspec is not None else None
    if machine is not None and builtins()[machine].migrations:
        assert runner.invoke(main, ["db", "upgrade", "--db", db_url]).exit_code == 0

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, [*args, "--db", db_url], catch_exceptions=False)
        assert result.exit_code == code, f"exit {result.exit_code} != {code}:\n{result.output}"
        return result.output

    return invoke


@pytest.mark.parametrize("machine", sorted(builtins()))
def test_a_builtin_is_recorded_and_inspected_without_plugins(run: Run, machine: str) -> None:
    key = "42.0" if machine == "job_exit" else "r1"
    data = {"cluster": 42, "proc": 0, "owner": "alice",
            "userlog": "/nonexistent/log", "cmd": "/bin/true",
            "submit_host": "<127.0.0.1:9618>"} if machine == "job_exit" else {}
    created = json.loads(run("create", machine, key, "--data", json.dumps(data), "--json"))
    assert created["state"] == builtins()[machine].spec.graph.enter(
        builtins()[machine].spec.initial)
    run("observe", f"{machine}:{key}", '{"note": "seen"}')
    shown = json.loads(run("show", f"{machine}:{key}", "--json"))
    assert shown["observation"]["status"] == {"note": "seen"}
    assert f"{machine}:{key}" in run("list", machine)
    assert [e["kind"] for e in json.loads(run("history", f"{machine}:{key}", "--json"))] == [
        "create"]
    run("step", f"{machine}:{key}", code=3)  # nothing to take yet, and it says so


def test_a_drone_is_adopted_observed_and_moved_without_a_site(run: Run) -> None:
    assert "in booting" in run("create", "drone", "d1", "--state", "booting")
    run("update", "d1", '{"demand": 0}')
    refused = run("step", "d1", code=3)  # the removal needs a fresh status, and no site is here
    assert "probe 'site' is not registered with this engine, so none was asked" in refused
    assert "hint: a module named in LIFECYCLE_PLUGINS provides probes" in refused
    assert json.loads(run("show", "d1", "--json"))["state"] == "booting"
    run("observe", "d1", '{"resource_status": "Running", "machine_status": "NotAvailable"}')
    moved = json.loads(run("step", "d1", "--json"))
    assert (moved["fired"], moved["dest"]) == (True, "integrate")  # on the fresh Running
    effects = json.loads(run("show", "d1", "--json"))["effects"]
    assert [(e["name"], e["status"]) for e in effects] == [("integrate", "pending")]
    kinds = [e["kind"] for e in json.loads(run("history", "d1", "--json"))]
    assert kinds == ["adopt", "update", "refusal", "transition"]
    text = " ".join(run("history", "d1").split())
    assert "refused (eventless): booting -> cleanup guards: fresh=no, no_demand=yes, " \
           "not_running=yes, rs_deleted=no, rs_error=no, rs_running=no, rs_stopped=no" in text
    assert "on no observation: none was recorded, and no probe answered" in text
    assert "(eventless): booting -> integrate guards: no_demand=yes, not_running=no, " \
           "rs_running=yes on observation #" in text


def test_a_new_drone_asks_for_its_deploy_and_waits_for_a_worker_that_can(run: Run) -> None:
    run("create", "drone", "d2")
    effects = json.loads(run("show", "d2", "--json"))["effects"]
    assert [(e["name"], e["status"]) for e in effects] == [("deploy", "pending")]
    worked = json.loads(run("worker", "--until-idle", "--json"))
    assert worked["done"] == 0 and worked["outbox"]["pending"] == 1  # not this worker's


# Each built-in machine: its first trigger fired and a data change made from the command
# line, with no plugin; the machine's own effects wait for a worker or run built in.
FIRST_MOVE = {  # key, data, a data change, trigger, payload, where it goes
    "batch_job": ("b1", {}, {"max_holds": 5}, "start", {}, "running.starting"),
    "drone": ("d1", {}, {"minimum_lifetime": 600}, "deployed", {"remote_id": "job-1"},
              "booting"),
    "drone_tardis": ("t1", {}, {"minimum_lifetime": 600}, "deployed",
                     {"remote_id": "job-1"}, "booting"),
    "job_exit": ("7.0", {"cluster": 7, "proc": 0, "owner": "alice", "cmd": "/bin/true",
                         "submit_host": "submit.example.org", "userlog": None,
                         "output_ad": None}, {"notification": "Always"},
                 "exited", {"exit_code": 0}, "writing_userlog"),
    "slurm_dispatch": ("c1", {}, {"priority": 5}, "lock", {}, "locked"),
    "startd": ("s1", {}, {"match_timeout": 300}, "drain", {}, "drained.retiring"),
}


def test_every_builtin_has_a_first_move() -> None:
    missing = sorted(set(builtins()) - set(FIRST_MOVE))
    assert not missing, f"add the first move of {missing} to FIRST_MOVE"


@pytest.mark.parametrize("machine", sorted(set(FIRST_MOVE) & set(builtins())))
def test_a_builtin_is_fired_and_updated_without_plugins(run: Run, machine: str) -> None:
    key, data, change, trigger, payload, dest = FIRST_MOVE[machine]
    run("create", machine, key, "--data", json.dumps(data))
    updated = run("update", key, json.dumps(change))
    (name, value), = change.items()
    assert f"{machine}:{key}: data updated (version 2):\n  {name}={value}\n" in updated
    fired = json.loads(run("fire", key, trigger, "--payload", json.dumps(payload), "--json"))
    assert (fired["fired"], fired["dest"], fired["version"]) == (True, dest, 3)
    shown = json.loads(run("show", key, "--json"))
    assert shown["state"] == dest and shown["data"][name] == value
    history = json.loads(run("history", key, "--json"))
    assert [(h["kind"], h["trigger"]) for h in history] == [
        ("create", None), ("update", None), ("transition", trigger)]
    refused = run("fire", key, "no_such_trigger", code=1)
    assert "no_such_trigger" in refused


def test_a_tardis_drone_is_released_on_its_stale_status_without_a_probe(run: Run) -> None:
    # drone_tardis has no risky edge: it moves on whatever status it holds (the incident)
    run("create", "drone_tardis", "t2", "--state", "booting")
    run("observe", "t2", '{"resource_status": "Booting"}', "--at", "2001-01-01T00:00:00Z")
    run("update", "t2", '{"demand": 0}')
    moved = json.loads(run("step", "t2", "--json"))
    assert (moved["fired"], moved["dest"]) == (True, "cleanup")
    effects = json.loads(run("show", "t2", "--json"))["effects"]
    assert [(e["name"], e["status"]) for e in effects] == [("terminate", "pending")]
    text = run("history", "t2")
    assert "on observation #1 by cli" in text  # the status the removal rested on, and its age
    assert "resource_status=Booting" in text


def test_a_missing_probe_names_itself_and_the_remedy_on_fire_too(run: Run,
                                                                  tmp_path: Path) -> None:
    spec = {"name": "lease", "initial": "held", "final": ["gone"], "states": ["held", "gone"],
            "transitions": [{"trigger": "reclaim", "source": "held", "dest": "gone",
                             "fresh": {"max_age": 60, "probe": "lease_db"}}]}
    path = tmp_path / "lease.json"
    path.write_text(json.dumps(spec))
    run("create", str(path), "l1")
    refused = run("fire", "l1", "reclaim", code=3)
    assert "probe 'lease_db' is not registered with this engine" in refused
    assert "LIFECYCLE_PLUGINS" in refused


def test_show_names_the_handler_this_process_lacks(run: Run) -> None:
    run("create", "drone", "d3")
    text = " ".join(run("show", "d3").split())
    assert ("deploy pending, attempt 0, due" in text
            and "no handler 'deploy' in this process: a worker with a module in "
                "LIFECYCLE_PLUGINS that provides it carries it out" in text), text
