"""Spec and scenario files as users write them, and as attackers do: YAML 1.2 booleans,
duplicate keys, encodings, sizes, depths, alias bombs and non-finite numbers each get one
clear problem with its place, and nothing hangs or raises anything else."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from lifecycle import Engine, SimulatedClock, Store, load_spec, user_documents
from lifecycle.errors import InvalidData, ScenarioError, SpecError
from lifecycle.scenario import load as load_scenario

ON_OFF = """\
name: switch
initial: off
states: [on, off, yes, no]
transitions:
  - {trigger: press, source: off, dest: on}
  - {trigger: press, source: on, dest: off}
  - {trigger: agree, source: off, dest: yes}
  - {trigger: agree, source: yes, dest: no}
  - {trigger: reset, source: no, dest: off}
"""


def write(tmp_path: Path, text: str | bytes, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(textwrap.dedent(text))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return [str(p) for p in caught.value.problems]


def test_states_named_on_and_off_are_strings(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, ON_OFF))
    assert spec.graph.names == ["on", "off", "yes", "no"]
    assert spec.initial == "off"
    engine = Engine(Store("sqlite://", upgrade=True), [spec], clock=SimulatedClock())
    engine.create("switch", "s")
    assert engine.fire("s", "press").dest == "on"


def test_yaml_numbers_follow_yaml_1_2(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 012\nb: 0o17\nc: 0x1f\nd: 1:20\ne: 1.5e3\nf: null\ng: True\n")
    assert user_documents.load_yaml(path.read_text(), str(path)) == {
        "a": 12, "b": 15, "c": 31, "d": "1:20", "e": 1500.0, "f": None, "g": True}


@pytest.mark.parametrize(("text", "expected"), [
    ("name: a\nname: b\nstates: [x]\ninitial: x\n", r"m\.yaml:2:1: invalid YAML: key 'name' is "
                                                    r"given twice \(first on line 1\)"),
    ("name: a\nstates:\n  - {name: x, name: y}\ninitial: x\n", "key 'name' is given twice"),
])
def test_duplicate_yaml_keys_are_refused_with_their_line(tmp_path: Path, text: str,
                                                          expected: str) -> None:
    [problem] = problems(write(tmp_path, text))
    assert re.search(expected, problem), problem


def test_duplicate_json_keys_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '{"name": "a", "name": "b", "states": ["x"], "initial": "x"}',
                 "m.json")
    assert problems(path) == [f"{path}: invalid JSON: key 'name' is given twice in one object"]


@pytest.mark.parametrize(("content", "expected"), [
    ("name: x\n".encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
    (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
    (b"\x00\x01\x02binary", "contains NUL characters"),
    (b"a: " + b"b" * (user_documents.MAX_BYTES + 10), "larger than 4 MiB"),
])
def test_files_that_are_not_small_utf8_text(tmp_path: Path, content: bytes,
                                             expected: str) -> None:
    [problem] = problems(write(tmp_path, content))
    assert expected in problem


def test_an_endless_file_is_read_only_up_to_the_limit() -> None:
    [problem] = problems(Path("/dev/zero"))
    assert "larger than 4 MiB" in problem


def test_a_utf8_byte_order_mark_is_fine(tmp_path: Path) -> None:
    assert load_spec(write(tmp_path, "\ufeff" + ON_OFF)).name == "switch"


@pytest.mark.parametrize("name", ["m.yaml", "m.json"])
def test_deep_nesting_is_refused(tmp_path: Path, name: str) -> None:
    depth = 100_000
    [problem] = problems(write(tmp_path, "[" * depth + "]" * depth, name))
    assert f"nested deeper than {user_documents.MAX_DEPTH} levels" in problem


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(lines) + textwrap.dedent("""
        name: bomb
        initial: x
        states: [x]
        eventless:
          - {source: x, dest: x, effects: [{name: e, args: {lol: *a8}}]}
        """)
    [problem] = problems(write(tmp_path, bomb))
    assert "more than 200,000 values once its aliases are expanded" in problem


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    [problem] = problems(write(tmp_path, "name: r\nstates: &s [x, *s]\ninitial: x\n"))
    assert "an alias refers to the mapping or list that holds it" in problem


@pytest.mark.parametrize(("text", "expected"), [
    ("name: t\nstates: [{name: a, timeout: {after: .inf, trigger: go}}, b]\ninitial: a\n"
     "transitions: [{trigger: go, source: a, dest: b}]\nfinal: [b]\n",
     ".inf is not a finite number"),
    ('{"name": "t", "states": ["a"], "initial": "a", "x": Infinity}',
     "Infinity is not a finite number"),
    ("name: t\nstates: [a, b]\ninitial: a\nfinal: [b]\ntransitions:\n"
     "  - {trigger: go, source: a, dest: b, fresh: {max_age: 1e300}}\n",
     "transitions[0].fresh.max_age: Input should be less than or equal to 315360000"),
    ("name: t\nstates: [a]\ninitial: a\nx: " + "9" * 5000 + "\n", "the integer is too long"),
])
def test_numbers_must_be_finite_and_sensible(tmp_path: Path, text: str, expected: str) -> None:
    name = "m.json" if text.startswith("{") else "m.yaml"
    found = problems(write(tmp_path, text, name))
    assert any(expected in p for p in found), found


def test_the_internal_eventless_name_is_not_a_trigger() -> None:
    with pytest.raises(SpecError, match=r"transitions\[0\]\.trigger: '_eventless' is not a "
                                        "valid trigger name"):
        load_spec({"name": "t", "states": ["a", "b"], "initial": "a", "final": ["b"],
                   "transitions": [{"trigger": "_eventless", "source": "a", "dest": "b"}]})


def test_a_data_field_timeout_out_of_range_is_invalid_data() -> None:
    spec = {"name": "t", "initial": "a", "final": ["b"],
            "states": [{"name": "a", "timeout": {"after": "wait", "trigger": "go"}}, "b"],
            "transitions": [{"trigger": "go", "source": "a", "dest": "b"}]}
    engine = Engine(Store("sqlite://", upgrade=True), [spec], clock=SimulatedClock())
    with pytest.raises(InvalidData, match=r"data field .wait., which is 1e\+300, not a number "
                                          r"of seconds from 0 to 3\.1536e\+08"):
        engine.create("t", "k", {"wait": 1e300})
    assert engine.resources() == []  # nothing half-written


def test_scenario_files_are_read_the_same_way(tmp_path: Path) -> None:
    write(tmp_path, ON_OFF, "switch.yaml")
    path = write(tmp_path, "machine: switch.yaml\nsteps:\n  - create: {key: s}\n  - fire: "
                 "{key: s, trigger: press}\n  - expect: {key: s, state: on}\n", "s.yaml")
    assert load_scenario(path).steps[2].args == {"key": "s", "state": "on"}
    dup = write(tmp_path, "machine: a\nmachine: b\nsteps: []\n", "d.yaml")
    with pytest.raises(ScenarioError, match=r"d\.yaml:2:1: invalid YAML: key 'machine' is "
                                            "given twice"):
        load_scenario(dup)
