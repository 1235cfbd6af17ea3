"""Every built-in machine works from the command line with no plugin: resources are created
(or adopted), observed, updated, shown, listed and moved; what needs a handler or a probe
this process lacks waits, or is refused saying which name is missing and how to provide it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from lifecycle.cli import main
from lifecycle.machines import builtins

Run = Callable[..., str]


@pytest.fixture
def run(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.delenv("LIFECYCLE_PLUGINS", raising=False)
    runner = CliRunner()
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


def test_a_new_drone_asks_for_its_deploy_and_waits_for_a_worker_that_can(run: Run) -> None:
    run("create", "drone", "d2")
    effects = json.loads(run("show", "d2", "--json"))["effects"]
    assert [(e["name"], e["status"]) for e in effects] == [("deploy", "pending")]
    worked = json.loads(run("worker", "--until-idle", "--json"))
    assert worked["done"] == 0 and worked["outbox"]["pending"] == 1  # not this worker's
