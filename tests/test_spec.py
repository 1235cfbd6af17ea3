"""Machine specs: loading, and every validation problem with its message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lifecycle import MachineSpec, load_spec
from lifecycle.errors import SpecError


def machine(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "slot",
        "initial": "unclaimed",
        "final": ["gone"],
        "states": [
            "unclaimed",
            {"name": "claimed", "initial": "idle", "states": ["idle", "busy"]},
            "cleanup",
            "gone",
        ],
        "transitions": [
            {"trigger": "claim", "source": "unclaimed", "dest": "claimed"},
            {"trigger": "activate", "source": "claimed.idle", "dest": "claimed.busy"},
            {"trigger": "release", "source": "claimed", "dest": "cleanup"},
            {"trigger": "finish", "source": "cleanup", "dest": "gone"},
        ],
    }
    spec.update(changes)
    return spec


def problems(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    return [str(p) for p in caught.value.problems]


def test_a_valid_spec_loads_with_nested_states_flattened() -> None:
    spec = load_spec(machine())
    assert spec.graph.names == [
        "unclaimed", "claimed", "claimed.idle", "claimed.busy", "cleanup", "gone"]
    assert spec.graph.enter("claimed") == "claimed.idle"
    assert spec.graph.covered_leaves(["claimed"]) == {"claimed.idle", "claimed.busy"}


def test_undefined_state_in_a_transition_is_named_with_a_suggestion() -> None:
    spec = machine()
    spec["transitions"][3] = {"trigger": "finish", "source": "cleanup", "dest": "goen"}
    assert "transitions[3].dest: 'goen' is not a state; did you mean 'gone'?" in problems(spec)


def test_bare_child_name_suggests_the_full_name() -> None:
    spec = machine()
    spec["transitions"][1]["source"] = "idle"
    assert ("transitions[1].source: 'idle' is not a state; did you mean 'claimed.idle'?"
            in problems(spec))


def test_duplicate_state_names() -> None:
    spec = machine(states=["unclaimed", "claimed", "cleanup", "gone", "cleanup"])
    spec["transitions"][1] = {"trigger": "activate", "source": "claimed", "dest": "claimed"}
    assert "states[4].name: duplicate state 'cleanup'" in problems(spec)


def test_initial_state_that_does_not_exist() -> None:
    assert "initial: 'unclamed' is not a state; did you mean 'unclaimed'?" in problems(
        machine(initial="unclamed"))


def test_unreachable_states() -> None:
    spec = machine(states=[*machine()["states"], "limbo"], final=["gone", "limbo"])
    found = problems(spec)
    assert ("states.limbo: state 'limbo' is unreachable from the initial state 'unclaimed'; "
            "add a transition into it, or remove it") in found


def test_non_final_state_without_a_way_out() -> None:
    spec = machine(final=[])
    assert ("states.gone: state 'gone' is not final and no transition leaves it; add a "
            "transition from it, or list it in `final`") in problems(spec)


def test_same_trigger_and_source_without_a_guard_to_tell_them_apart() -> None:
    spec = machine()
    spec["transitions"].append({"trigger": "release", "source": "claimed.busy", "dest": "gone"})
    found = problems(spec)
    expected = ("transitions[4]: trigger 'release' from claimed.busy is already taken by "
                "transitions[2], and no guard tells them apart")
    assert any(p.startswith(expected) for p in found)


def test_same_trigger_told_apart_by_guards_is_fine() -> None:
    spec = machine()
    spec["transitions"][2]["guards"] = ["gentle"]
    spec["transitions"].append(
        {"trigger": "release", "source": "claimed", "dest": "gone", "unless": ["gentle"]})
    assert load_spec(spec).name == "slot"


def test_composite_state_needs_a_valid_initial_child() -> None:
    spec = machine()
    spec["states"][1] = {"name": "claimed", "states": ["idle", "busy"]}
    assert ("states[1].initial: composite state 'claimed' needs an initial child; add "
            "`initial: idle`") in problems(spec)
    spec["states"][1] = {"name": "claimed", "initial": "idel", "states": ["idle", "busy"]}
    assert ("states[1].initial: 'idel' is not a child of 'claimed'; did you mean 'idle'?"
            in problems(spec))


def test_all_problems_are_reported_at_once() -> None:
    spec = machine(initial="nowhere")
    spec["transitions"][0]["dest"] = "clamed"
    spec["transitions"][3]["trigger"] = "bad trigger"
    found = problems(spec)
    assert len(found) >= 3
    assert found[0].startswith("initial:")
    assert any(p.startswith("transitions[0].dest: 'clamed'") for p in found)
    assert any(p.startswith("transitions[3].trigger: 'bad trigger' is not a valid trigger")
               for p in found)


def test_structural_errors_name_their_location() -> None:
    found = problems(machine(transitions=[{"trigger": "claim", "source": "unclaimed"}]))
    assert "transitions[0].dest: required field is missing" in found
    found = problems(machine(transitons=[]))
    assert "transitons: unknown field; did you mean 'transitions'?" in found


def test_reserved_and_invalid_names() -> None:
    spec = machine()
    spec["transitions"][0]["trigger"] = "state"
    assert any(p.startswith("transitions[0].trigger: 'state' is not a valid trigger name")
               for p in problems(spec))
    spec = machine(states=["un.claimed", *machine()["states"][1:]])
    assert any("'un.claimed' is not a valid state name" in p for p in problems(spec))


def test_yaml_and_json_files_load_the_same_spec(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "slot.yaml").write_text(yaml.safe_dump(machine()))
    (tmp_path / "slot.json").write_text(json.dumps(machine()))
    from_yaml = load_spec(tmp_path / "slot.yaml")
    from_json = load_spec(str(tmp_path / "slot.json"))
    assert from_yaml.version == from_json.version == load_spec(machine()).version


def test_malformed_files_point_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nstates: [a, b\ninitial: a\n")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(caught.value.problems[0]).startswith(f"{path}:")
    assert "invalid YAML" in str(caught.value)
    path = tmp_path / "bad.json"
    path.write_text('{"name": "x",\n "states": [}')
    with pytest.raises(SpecError, match=r"bad\.json:2:\d+: invalid JSON"):
        load_spec(path)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_version_is_a_content_hash() -> None:
    a = load_spec(machine())
    b = load_spec(machine())
    changed = machine()
    changed["transitions"][0]["description"] = "a schedd claims the slot"
    assert a.version == b.version
    assert load_spec(changed).version != a.version


def test_python_objects_are_validated_too() -> None:
    spec = MachineSpec.model_validate(machine(initial="nowhere"))
    with pytest.raises(SpecError, match="initial: 'nowhere' is not a state"):
        load_spec(spec)


def test_freshness_rule_needs_a_positive_age() -> None:
    spec = machine()
    spec["transitions"][2]["fresh"] = {"max_age": 0}
    assert any(p.startswith("transitions[2].fresh.max_age:") for p in problems(spec))


def test_a_machine_of_twenty_thousand_states_validates() -> None:
    """Validation is linear in the spec: edges sharing a trigger and guards are checked for
    overlaps leaf by leaf, not pair by pair (20,000 chained states took minutes that way)."""
    n = 20_000
    spec = load_spec({
        "name": "chain", "initial": "s0", "final": [f"s{n - 1}"],
        "states": [f"s{i}" for i in range(n)],
        "transitions": [{"trigger": "next", "source": f"s{i}", "dest": f"s{i + 1}"}
                        for i in range(n - 1)]})
    assert len(spec.graph.leaves) == n
    clash = {**spec.to_json(), "transitions": [
        *spec.to_json()["transitions"], {"trigger": "next", "source": "s7", "dest": "s0"}]}
    with pytest.raises(SpecError, match=r"transitions\[19999\]: trigger 'next' from s7 is "
                                        r"already taken by transitions\[7\]"):
        load_spec(clash)


def test_a_changed_copy_works_out_its_version_and_problems_anew() -> None:
    """A spec's derived views are worked out once (every engine that registers it asks), so
    a copy with a change must not carry the original's."""
    original = load_spec(machine())
    assert original.problems() == [] and original.uses("effect") == {} and original.version
    renamed = original.model_copy(update={"name": "other"})
    assert renamed.version != original.version
    assert renamed.version == load_spec(machine(name="other")).version
    broken = original.model_copy(update={"initial": "nowhere"})
    assert [p.location for p in broken.problems()] == ["initial"]
    assert original.problems() == []


def test_problems_and_uses_are_the_callers_to_change() -> None:
    spec = load_spec(machine(transitions=[
        {"trigger": "claim", "source": "unclaimed", "dest": "claimed", "guards": ["ok"],
         "effects": ["tell"]},
        *machine()["transitions"][1:]]))
    spec.problems().append("mine")  # type: ignore[arg-type]
    spec.uses("effect")["tell"].append("mine")
    assert spec.problems() == []
    assert spec.uses("effect") == {"tell": ["transitions[0]"]}
    assert spec.uses("guard") == {"ok": ["transitions[0]"]}
