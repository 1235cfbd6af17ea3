"""Read-only commands read any database: a machine an application stored, whose guards this
process has not loaded, is listed, described, drawn, shown, listed, its history read and
verified; the commands that decide (fire) say what is missing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lifecycle import Engine, Store
from lifecycle.cli import main

SPEC = {"name": "vm", "initial": "free", "states": ["free", "taken"],
        "transitions": [
            {"trigger": "take", "source": "free", "dest": "taken", "guards": ["has_owner"],
             "effects": ["provision"]},
            {"trigger": "give", "source": "taken", "dest": "free", "guards": ["idle"]}]}


def test_read_only_commands_read_a_machine_whose_guards_are_not_loaded(
        db_url: str, tmp_path: Path) -> None:
    store = Store(db_url, upgrade=True)
    try:
        app = Engine(store, [SPEC], guards={"has_owner": lambda c: True,
                                            "idle": lambda c: True},
                     effects={"provision": lambda c: None})
        app.create("vm", "v1")
        app.fire("vm:v1", "take")
    finally:
        store.dispose()
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, [*args, "--db", db_url], catch_exceptions=False)
        return result.exit_code, result.output

    for args in (["machines"], ["describe", "vm"], ["show", "vm:v1"], ["list", "vm"],
                 ["history", "vm:v1"], ["verify"],
                 ["diagram", "vm", "-o", str(tmp_path / "vm.mmd")]):
        code, output = run(*args)
        assert code == 0, (args, output)
        assert "not registered" not in output, (args, output)
    code, output = run("show", "vm:v1")
    assert "give" in output                      # the triggers out of `taken`, from the spec
    code, output = run("describe", "vm")
    assert "not loaded in this process: guards has_owner, idle; effects provision" in output
    code, output = run("describe", "vm", "--json")
    assert json.loads(output)["not_loaded"] == {"guards": ["has_owner", "idle"],
                                                "effects": ["provision"], "probes": []}
    assert (tmp_path / "vm.mmd").read_text().count("-->") >= 2
    code, output = run("fire", "vm:v1", "give")
    assert code != 0 and "guard 'idle' is not registered" in output
    # a worker of this process cannot run vm's provision: it says so, and leaves it be
    code, output = run("worker", "--until-idle")
    assert code == 0 and "outbox: 1 pending" in output
    assert ("not run here: vm's provision (1): no handler in this process; name the module "
            "that defines it in LIFECYCLE_PLUGINS") in output
    code, output = run("worker", "--until-idle", "--json")
    assert json.loads(output)["not_run_here"] == {"vm": {"provision": 1}}
