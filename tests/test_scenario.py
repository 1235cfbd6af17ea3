"""Scenario files: every shipped scenario passes, and each kind of failure is reported with
its file, step, line, what was expected and what was found."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from asyncio_kinds import Blocking, BlockingWorker
from click.testing import CliRunner

from lifecycle import Engine, scenario
from lifecycle.cli import main
from lifecycle.errors import ScenarioError
from lifecycle.machines import builtins
from lifecycle.scenario import ScenarioResult
from lifecycle.scenario import replay as replay_with

SHIPPED = sorted((Path(__file__).parent / "scenarios").rglob("*.yaml"))


def replay(path: Path) -> ScenarioResult:
    """A scenario as `lifecycle replay` plays it: the built-in machines by name."""
    return replay_with(path, builtins())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_scenarios_pass(path: Path) -> None:
    result = replay(path)
    assert result.passed, str(result.failure)


# the drone's scenarios (risky edges, probes, fences, effects with follow-ups: the core set
# of what asyncio changes) and the batch job's again, on AsyncEngine and AsyncWorker
ASYNC_SET = [p for p in SHIPPED if p.parent.name in ("drone", "batch_job")]


@pytest.mark.parametrize("path", ASYNC_SET, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_scenarios_pass_on_asyncio(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engines: list[Blocking] = []

    def async_engine(*args: Any, **kwargs: Any) -> Blocking:
        engines.append(Blocking(Engine(*args, **kwargs)))
        return engines[-1]

    monkeypatch.setattr(scenario, "Engine", async_engine)
    monkeypatch.setattr(scenario, "Worker", BlockingWorker)
    try:
        result = replay(path)
    finally:
        for engine in engines:
            engine.close()
    assert engines, "the scenario ran on the sync engine"
    assert result.passed, str(result.failure)


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


TOGGLE = """\
name: toggle
initial: "off"
states: ["off", "on"]
transitions:
  - {trigger: flip, source: "off", dest: "on"}
  - {trigger: flip, source: "on", dest: "off"}
  - {trigger: check, source: "on", dest: "off", fresh: {max_age: 10}}
"""


@pytest.fixture
def toggle(tmp_path: Path) -> Path:
    return write(tmp_path, TOGGLE, "toggle.yaml")


def test_a_passing_file_with_a_spec_file_machine(tmp_path: Path, toggle: Path) -> None:
    path = write(tmp_path, """\
        machine: toggle.yaml
        steps:
          - create: {key: t}
          - fire: {key: t, trigger: flip}
          - expect: {key: t, state: "on"}
          - advance: 5
          - fire: {key: t, trigger: check}
          - expect_last: {fired: false, error: StaleObservation}
          - observe: {key: t, status: {lamp: lit}}
          - fire: {key: t, trigger: check}
          - expect_last: {fired: true, dest: "off"}
        """)
    result = replay(path)
    assert result.passed and result.steps == 9


@pytest.mark.parametrize(("steps", "step", "kind", "expected", "found"), [
    ('  - expect: {key: t, state: "on"}', 2, "expect", {"state": "on"}, {"state": "off"}),
    ('  - fire: {key: t, trigger: flip}\n  - expect_last: {fired: false}', 3, "expect_last",
     {"fired": False}, {"fired": True, "error": None, "dest": "on", "reason": None}),
    ("  - expect: {key: t, data: {room: b12}}", 2, "expect", {"data": {"room": "b12"}},
     {"data": {"room": "<missing>"}, "state": "off"}),
    ("  - fire: {key: t, trigger: flap}", 2, "fire",
     "no error (or an expect_last step naming it)",
     "UnknownTrigger: machine 'toggle' has no trigger 'flap'; its triggers: check, flip"),
    ("  - fire: {key: nobody, trigger: flip}", 2, "fire",
     "no error (or an expect_last step naming it)",
     "UnknownResource: no resource with key 'nobody'; `lifecycle create` makes one"),
])
def test_each_failure_names_step_line_expected_and_found(
        tmp_path: Path, toggle: Path, steps: str, step: int, kind: str, expected: object,
        found: object) -> None:
    path = write(tmp_path, "machine: toggle.yaml\nsteps:\n  - create: {key: t}\n" + steps + "\n")
    result = replay(path)
    assert not result.passed and result.failure is not None
    failure = result.failure
    assert (failure.step, failure.kind, failure.expected, failure.found) == (
        step, kind, expected, found)
    assert failure.line == step + 2  # "machine", "steps", then one line per step


def test_the_first_failure_stops_the_file(tmp_path: Path, toggle: Path) -> None:
    path = write(tmp_path, """\
        machine: toggle.yaml
        steps:
          - create: {key: t}
          - expect: {key: t, state: "on"}
          - expect: {key: t, state: "nowhere"}
        """)
    result = replay(path)
    assert result.failure is not None and result.failure.step == 2 and result.steps == 2


@pytest.mark.parametrize(("text", "message"), [
    ("machine: toggle.yaml\nsteps:\n  - create: {key: t\n", r"s\.yaml:4:\d+: invalid YAML"),
    ("machine: toggle.yaml\nsteps:\n  - crate: {key: t}\n",
     r"s\.yaml:3: step 1: unknown step 'crate'; did you mean 'create'\?"),
    ("machine: toggle.yaml\nsteps: []\n", r"s\.yaml:2: `steps` must be a non-empty list"),
    ("machine: toggle.yaml\nstart: tomorrow\nsteps:\n  - create: {key: t}\n",
     r"s\.yaml:2: 'tomorrow' is not an ISO 8601 time"),
    ("machine: toggle.yaml\nsteeps: []\n", r"s\.yaml:2: unknown field 'steeps'"),
    ("- create: x\n", r"s\.yaml:1: a scenario is a mapping"),
    ("machine: nosuch\nsteps:\n  - create: {key: t}\n",
     r"machine 'nosuch' is neither a built-in machine \(batch_job"),
])
def test_malformed_files_name_the_line(tmp_path: Path, toggle: Path, text: str,
                                       message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        replay(write(tmp_path, text))


def test_cli_summary_json_and_exit_status(tmp_path: Path, toggle: Path) -> None:
    good = write(tmp_path, "machine: toggle.yaml\nsteps:\n  - create: {key: t}\n", "good.yaml")
    bad = write(tmp_path, 'machine: toggle.yaml\nsteps:\n  - create: {key: t}\n'
                          '  - expect: {key: t, state: "on"}\n', "bad.yaml")
    runner = CliRunner()
    result = runner.invoke(main, ["replay", str(good)])
    assert result.exit_code == 0 and result.output.strip() == "1 scenario, 1 step, all passed"
    result = runner.invoke(main, ["replay", str(good), str(bad)])
    assert result.exit_code == 1
    assert "FAILED" in result.output and "bad.yaml: step 2 (line 4, expect)" in result.output
    assert "2 scenarios, 3 steps, 1 failed" in result.output
    result = runner.invoke(main, ["replay", "--json", str(good), str(bad)])
    doc = json.loads(result.output)
    assert [(d["file"].endswith("good.yaml"), d["passed"], d["steps"]) for d in doc] == [
        (True, True, 1), (False, False, 2)]
    assert doc[1]["failure"]["expected"] == {"state": "on"}


def test_a_file_that_is_no_scenario_file_is_said_so(tmp_path: Path) -> None:
    """Markdown (the startd's transition table, which only the suite replays) is not read as
    YAML and reported as bad YAML: the error says what a scenario file is."""
    page = tmp_path / "transitions.md"
    page.write_text("# a table\n\n| ref | from |\n|---|---|\n")
    with pytest.raises(ScenarioError, match=r"transitions\.md: not a scenario file: a "
                                            r"scenario is a YAML or JSON file"):
        replay(page)
