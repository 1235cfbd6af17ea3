"""Diagrams: the graph drawn from a spec, its Mermaid and DOT text, the `diagram` and
`diagrams` commands, and the output checked by the real renderers: Graphviz's `dot`, and the
official `mermaid` library in headless Chromium (one browser for every diagram).

Tests that need a renderer skip when it is missing, unless LIFECYCLE_REQUIRE_RENDERERS=1 (as
in .ci/run). Screenshots of the Mermaid diagrams go to $LIFECYCLE_SCREENSHOTS at their own
size, or to a temporary directory at half of it.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from render.chromium import (
    Chromium,
    MermaidPage,
    RenderError,
    Unavailable,
    chromium_executable,
    mermaid_js,
)

from lifecycle import MachineSpec, load_spec
from lifecycle.cli import main  # before lifecycle.diagram_cli, which cli.py imports
from lifecycle.machines import builtins
from lifecycle.render import (
    RISKY_COLOR,
    Diagram,
    RendererMissing,
    dot,
    dot_program,
    mermaid,
    mermaid_ids,
    svg,
)

REPO = Path(__file__).resolve().parent.parent
REQUIRE_RENDERERS = os.environ.get("LIFECYCLE_REQUIRE_RENDERERS") == "1"

SLOT = load_spec(Path(__file__).parent / "render" / "slot.yaml")
# state names that are words of Mermaid's grammar, a hyphen, the same child name at two
# depths, a timeout read from a data field, and a transition from every state
AWKWARD = load_spec({
    "name": "awkward-names",
    "initial": "state",
    "final": ["end"],
    "states": [
        "state",
        {"name": "note", "initial": "end",
         "states": ["end", "a-b", {"name": "class", "initial": "end", "states": ["end"]}]},
        {"name": "default", "timeout": {"after": "wait_s", "trigger": "style"}},
        "click", "end",
    ],
    "transitions": [
        {"trigger": "go", "source": "state", "dest": "note"},
        {"trigger": "hop", "source": "note.end", "dest": "note.a-b"},
        {"trigger": "dive", "source": "note.a-b", "dest": "note.class"},
        {"trigger": "leave", "source": "note", "dest": "default", "effects": ["tidy"],
         "description": 'quotes " and <tags> & \\ backslashes'},
        {"trigger": "style", "source": "default", "dest": "click"},
        {"trigger": "finish", "source": "click", "dest": "end", "fresh": {"max_age": 0.5}},
        {"trigger": "abort", "source": "*", "dest": "end", "unless": ["careful"]},
        {"trigger": "again", "source": "note", "dest": "note"},
        {"trigger": "back", "source": "note", "dest": "note.end"},
    ],
})


def machines() -> dict[str, MachineSpec]:
    """Every built-in machine (those added later too), and the two test machines."""
    found = {name: b.spec for name, b in sorted(builtins().items())}
    return {**found, "slot (test)": SLOT, "awkward-names (test)": AWKWARD}


def unavailable(reason: str) -> None:
    if REQUIRE_RENDERERS:
        pytest.fail(f"LIFECYCLE_REQUIRE_RENDERERS=1 but {reason}")
    pytest.skip(reason)


# -- the graph ---------------------------------------------------------------------------


def test_the_graph_has_nesting_initial_and_final_states() -> None:
    d = Diagram.from_spec(builtins()["batch_job"].spec)
    assert [s.name for s in d.states] == [
        "failed", "held", "queued", "running", "running.executing", "running.starting",
        "succeeded"]
    running = d.state("running")
    assert running.composite and running.children == ("running.executing",
                                                       "running.starting")
    assert running.initial_child == "running.starting"
    assert d.state("running.starting").label == "starting"
    assert d.initial == "queued"
    assert [s.name for s in d.finals] == ["failed", "succeeded"]
    labels = {(e.source, e.dest): e.label() for e in d.edges}
    assert labels[("running.executing", "succeeded")] == "exit [exit_ok]"
    assert labels[("running.executing", "failed")] == "exit [not exit_ok]"
    assert labels[("held", "failed")] in ("(eventless) [not holds_left]", "remove")
    assert {e.label() for e in d.edges if e.eventless} == {"(eventless) [not holds_left]"}
    # a transition from two sources is drawn from each
    assert {e.source for e in d.edges if e.trigger == "remove"} == {"queued", "held"}


def test_a_risky_edge_carries_its_rule_and_looks_different() -> None:
    d = Diagram.from_spec(SLOT)
    vacate = next(e for e in d.edges if e.trigger == "vacate")
    assert vacate.risky and (vacate.source, vacate.dest) == ("claimed", "preempting")
    assert vacate.label() == ("vacate [job_not_running] [fresh 30 s, probe starter] "
                              "/ release_claim")
    evicted = next(e for e in d.edges if e.trigger == "evicted")
    assert evicted.label() == "evicted [fresh 10 s]"

    text = dot(d)
    line = next(x for x in text.splitlines() if "vacate" in x and "->" in x)
    assert f'color="{RISKY_COLOR}"' in line and "style=dashed" in line
    assert '"claimed/start" -> "preempting/start"' in line
    assert 'ltail="cluster_claimed"' in line and 'lhead="cluster_preempting"' in line
    plain = next(x for x in text.splitlines() if "activate" in x and "->" in x)
    assert RISKY_COLOR not in plain and "dashed" not in plain

    # Mermaid: the CSS in the front matter addresses the risky arrows by their number
    text = mermaid(d)
    arrows = [x.strip() for x in text.splitlines() if "-->" in x]
    css = re.search(r"themeCSS: (.*)", text)
    assert css is not None
    red_rule = css.group(1).split("{stroke:" + RISKY_COLOR)[0]
    red = {int(n) for n in re.findall(r'edge(\d+)', red_rule)}
    assert red == {i for i, a in enumerate(arrows) if "[fresh" in a}
    assert arrows[min(red)].startswith(("any_state --> gone : shutdown [fresh 60 s, probe "
                                        "master]", "claimed --> preempting : vacate"))


def test_timeouts_entry_effects_and_any_state_are_shown() -> None:
    d = Diagram.from_spec(SLOT)
    assert d.state("matched").timeout == "after 120 s / match_timeout"
    assert d.state("claimed.retiring").timeout == (
        "after data.max_job_retirement_time s / retirement_expired")
    assert d.state("claimed").entry_effects == ("advertise",)
    timed = next(e for e in d.edges if e.trigger == "match_timeout")
    assert timed.label() == "match_timeout (after 120 s) / forget_match"
    assert next(e for e in d.edges if e.trigger == "vacate_timeout").timer == "after 600 s"
    shutdown = [e for e in d.edges if e.trigger == "shutdown"]
    assert [(e.source, e.dest) for e in shutdown] == [("*", "gone")]

    text = dot(d)
    assert "after 120 s / match_timeout" in text and "entry / advertise" in text
    assert '"*" [label=<<i>any state</i>>' in text
    text = mermaid(d)
    assert 'state "matched (after 120 s / match_timeout)" as matched {' in text
    assert 'claimed__retiring : after data.max_job_retirement_time s / retirement_expired' \
        in text
    assert 'state "any state" as any_state' in text
    assert "any_state --> gone : shutdown [fresh 60 s, probe master]" in text


def test_guards_and_effects_can_be_left_out() -> None:
    d = Diagram.from_spec(SLOT)
    vacate = next(e for e in d.edges if e.trigger == "vacate")
    assert vacate.label(guards=False) == "vacate [fresh 30 s, probe starter] / release_claim"
    assert vacate.label(effects=False) == "vacate [job_not_running] [fresh 30 s, probe starter]"
    compact = mermaid(d, guards=False, effects=False)
    assert "claimed --> preempting : vacate [fresh 30 s, probe starter]\n" in compact
    assert "job_not_running" not in compact and "release_claim" not in compact
    assert "advertise" not in compact  # entry effects are effects too
    compact = dot(d, guards=False, effects=False)
    assert "claim_id_matches" not in compact and "reply_claimed" not in compact
    assert "[fresh 30 s, probe starter]" in compact  # the rule is never hidden


def test_transitions_told_apart_only_by_guards_share_one_arrow() -> None:
    spec = load_spec({
        "name": "m", "initial": "a", "final": ["z"], "states": ["a", "z"],
        "transitions": [{"trigger": "t", "source": "a", "dest": "z", "guards": ["x"]}],
        "eventless": [
            {"source": "a", "dest": "z", "guards": ["p", "q"], "fresh": {"max_age": 5}},
            {"source": "a", "dest": "z", "guards": ["r"], "fresh": {"max_age": 5}},
            {"source": "a", "dest": "z", "guards": ["s"]},
        ],
    })
    assert [e.label() for e in Diagram.from_spec(spec).edges] == [
        "(eventless) [p, q] or [r] [fresh 5 s]",
        "(eventless) [s]",
        "t [x]",
    ]


def test_output_is_sorted_so_declaration_order_does_not_matter() -> None:
    document = SLOT.to_json()
    shuffled = {**document, "states": list(reversed(document["states"])),
                "transitions": list(reversed(document["transitions"]))}
    again = load_spec(shuffled)
    assert again.version != SLOT.version
    for render in (mermaid, dot):
        assert render(Diagram.from_spec(again)) == render(Diagram.from_spec(SLOT))
        assert render(Diagram.from_spec(SLOT)) == render(Diagram.from_spec(SLOT))


def test_counts_show_in_each_state() -> None:
    d = Diagram.from_spec(builtins()["batch_job"].spec,
                          {"running.starting": 2, "running.executing": 1, "queued": 1})
    assert d.state("running").count == 3
    assert d.state("running.starting").notes() == ["2 resources"]
    assert d.state("queued").notes() == ["1 resource"]
    assert d.state("held").notes() == ["0 resources"]
    text = mermaid(d)
    assert 'state "running (3 resources)" as running {' in text
    assert "running__starting : 2 resources" in text
    assert "class queued,running__executing,running__starting occupied" in text
    assert "2 resources" in dot(d)


def test_mermaid_ids_avoid_keywords_and_collisions() -> None:
    ids = mermaid_ids(Diagram.from_spec(AWKWARD))
    assert ids == {"click": "s_click", "default": "s_default", "end": "s_end",
                   "note": "s_note", "note.a-b": "note__a_b", "note.class": "note__class",
                   "note.class.end": "note__class__end", "note.end": "note__end",
                   "state": "s_state", "*": "any_state"}


# -- the commands ------------------------------------------------------------------------


def invoke(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, f"exit {result.exit_code} != {code}:\n{result.output}"
    return result.output


def test_diagram_command_formats_and_files(tmp_path: Path) -> None:
    assert invoke("diagram", "batch_job") == mermaid(Diagram.from_spec(
        builtins()["batch_job"].spec))
    assert invoke("diagram", "batch_job", "--format", "dot").startswith('digraph "batch_job"')
    compact = invoke("diagram", "batch_job", "--no-guards", "--no-effects")
    assert "exit_ok" not in compact and "running__executing --> succeeded : exit\n" in compact

    spec_file = tmp_path / "slot.yaml"
    spec_file.write_text((Path(__file__).parent / "render" / "slot.yaml").read_text())
    target = tmp_path / "slot.dot"
    invoke("diagram", str(spec_file), "-o", str(target))  # the format follows the suffix
    assert target.read_text() == dot(Diagram.from_spec(SLOT))
    invoke("diagram", str(spec_file), "-o", str(tmp_path / "slot.txt"), "--format", "mermaid")
    assert (tmp_path / "slot.txt").read_text().startswith("---\ntitle: \"slot\"")

    database = str(tmp_path / "x.db")
    assert "no lifecycle schema yet" in invoke("diagram", "nope", "--db", database, code=1)
    invoke("db", "upgrade", "--db", database)
    assert "unknown machine 'nope' (known machines: batch_job" in invoke(
        "diagram", "nope", "--db", database, code=1)
    assert "Invalid value for '--format'" in invoke("diagram", "batch_job", "--format", "png",
                                                    code=2)


def test_svg_without_graphviz_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lifecycle.render.shutil.which", lambda name: None)
    with pytest.raises(RendererMissing, match="apt-get install graphviz"):
        svg(Diagram.from_spec(SLOT))
    output = invoke("diagram", "batch_job", "--format", "svg", code=1)
    assert "error: cannot draw SVG: Graphviz's 'dot' is not on PATH" in output
    assert "apt-get install graphviz" in output and "brew install graphviz" in output


def test_diagram_counts_resources_from_the_database(sqlite_url: str) -> None:
    invoke("db", "upgrade", "--db", sqlite_url)
    for key in ("j1", "j2", "j3"):
        invoke("create", "batch_job", key, "--db", sqlite_url)
    invoke("fire", "j1", "start", "--db", sqlite_url)
    invoke("fire", "j2", "start", "--db", sqlite_url)
    invoke("fire", "j2", "executing", "--db", sqlite_url)
    text = invoke("diagram", "batch_job", "--counts", "--db", sqlite_url)
    assert 'state "running (2 resources)" as running {' in text
    assert "running__starting : 1 resource\n" in text
    assert "running__executing : 1 resource\n" in text
    assert "queued : 1 resource\n" in text and "held : 0 resources\n" in text
    text = invoke("diagram", "batch_job", "--counts", "--format", "dot", "--db", sqlite_url)
    assert "1 resource<" in text and "fillcolor=\"#fff3c4\"" in text


def test_diagrams_writes_every_builtin_and_check_names_stale_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[str] = []
    names = sorted(builtins())

    def fake_svg(text: str) -> str:
        drawn.append(text)
        return "<svg/>\n"

    monkeypatch.setattr("lifecycle.cli.machines.dot_program", lambda: "/usr/bin/dot")
    monkeypatch.setattr("lifecycle.cli.machines.dot_to_svg", fake_svg)
    folder = tmp_path / "diagrams"

    def check(code: int = 0) -> str:
        """--check draws each SVG to compare its text; those drawings are not writes."""
        before = len(drawn)
        output = invoke("diagrams", "--check", "--dir", str(folder), code=code)
        assert len(drawn) == before + len(names)
        del drawn[before:]
        return output

    invoke("diagrams", "--dir", str(folder))
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["README.md", *(f"{n}{s}" for n in names for s in (".mmd", ".dot", ".svg"))])
    readme = (folder / "README.md").read_text()
    for name in names:
        assert f"```mermaid\n{(folder / f'{name}.mmd').read_text()}```" in readme
    assert len(drawn) == len(names)
    assert f"{folder}: {len(names) * 3 + 1} files up to date" in check()

    # a second run draws no SVG again: their DOT did not change
    assert f"0 written, {len(names) * 3 + 1} unchanged" in invoke("diagrams", "--dir",
                                                                  str(folder))
    assert len(drawn) == len(names)

    first = names[0]
    (folder / f"{first}.mmd").write_text("stateDiagram-v2\n")
    (folder / f"{first}.dot").unlink()
    (folder / f"{first}.svg").unlink()
    (folder / "retired.mmd").write_text("old")
    with (folder / "README.md").open("a") as f:
        f.write("edited by hand\n")
    before = len(drawn)
    output = invoke("diagrams", "--check", "--dir", str(folder), code=1)
    del drawn[before:]
    assert f"stale: {folder / (first + '.mmd')}" in output
    assert f"missing: {folder / (first + '.dot')}" in output
    assert f"missing: {folder / (first + '.svg')}" in output
    assert f"stale: {folder / 'README.md'}" in output
    assert f"not a built-in machine's diagram: {folder / 'retired.mmd'}" in output
    assert "5 diagram files are out of date; run `lifecycle diagrams`" in output

    invoke("diagrams", "--dir", str(folder))
    assert not (folder / "retired.mmd").exists()
    check()
    assert len(drawn) == len(names) + 1  # only the SVG whose DOT was written again


def test_diagrams_without_graphviz_writes_the_text_and_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lifecycle.cli.machines.dot_program", lambda: None)
    output = invoke("diagrams", "--dir", str(tmp_path), code=1)
    assert (tmp_path / "batch_job.mmd").exists() and (tmp_path / "README.md").exists()
    assert not (tmp_path / "batch_job.svg").exists()
    assert "cannot draw" in output and "apt-get install graphviz" in output


def test_the_checked_in_diagrams_are_current() -> None:
    """`diagrams/` holds every built-in machine's diagrams as the code draws them now; after
    changing a machine or the renderers, run `make diagrams`."""
    invoke("diagrams", "--check", "--dir", str(REPO / "diagrams"))


# -- Graphviz ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(machines()))
def test_graphviz_draws_every_machine(name: str) -> None:
    program = dot_program()
    if program is None:
        unavailable("Graphviz's dot is not installed (`apt-get install graphviz`)")
        return
    d = Diagram.from_spec(machines()[name])
    done = subprocess.run([program, "-Tsvg"], input=dot(d), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"dot warned: {done.stderr}"  # e.g. a misplaced lhead
    drawn = done.stdout
    for state in d.states:
        kind = "cluster_" if state.composite else ""
        assert f"<title>{kind}{state.name}</title>" in drawn.replace("&#45;", "-")
    red = re.findall(rf'<path fill="none" stroke="{RISKY_COLOR}" [^>]*stroke-dasharray', drawn)
    assert len(red) == sum(e.risky for e in d.edges)


# -- Mermaid in Chromium -------------------------------------------------------------------


@pytest.fixture(scope="module")
def mermaid_page() -> Iterator[MermaidPage]:
    try:  # Chromium is looked for first: the mermaid package (200 MB from npm) is
        # downloaded only when it will be used
        executable = chromium_executable()
        script = mermaid_js()
        browser = Chromium(executable)
    except Unavailable as exc:
        unavailable(str(exc))
        return
    try:
        page = MermaidPage(browser, script)
        yield page
        page.close()
    finally:
        browser.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Where the screenshots go, and their scale: 1 (the text at its own size) in
    $LIFECYCLE_SCREENSHOTS, kept for a person to look at; else half that in a temporary
    directory, whose pictures no one reads (a quarter of the pixels: half of Chromium's CPU
    for the capture, and the same proof that it holds the whole drawing)."""
    chosen = os.environ.get("LIFECYCLE_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder, 1.0 if chosen else 0.5


def _rgb(color: str) -> str:
    return "rgb({}, {}, {})".format(*(int(color[i:i + 2], 16) for i in (1, 3, 5)))


@pytest.mark.parametrize("name", list(machines()))
def test_mermaid_draws_every_machine(name: str, mermaid_page: MermaidPage,
                                     screenshots: tuple[Path, float]) -> None:
    d = Diagram.from_spec(machines()[name])
    drawn = mermaid_page.render(mermaid(d))
    assert drawn.width > 50 and drawn.height > 50, "an empty drawing"

    boxes = [s for s in d.states if not s.composite]
    assert len(drawn.states) == len(boxes) + any(e.source == "*" for e in d.edges)
    for state in boxes:
        assert any(text.startswith(state.label) for text in drawn.states), state.name
    assert sorted(c.split(" (")[0] for c in drawn.clusters) == sorted(
        s.label for s in d.states if s.composite)

    expected = (1 + sum(s.composite for s in d.states) + len(d.edges)
                + sum(1 for s in d.finals if not s.composite))
    assert len(drawn.edges) == expected
    red, blue = _rgb(RISKY_COLOR), "rgb(21, 101, 192)"
    for edge in drawn.edges:  # the CSS picked exactly the risky and the eventless arrows
        assert (edge["stroke"] == red) == ("[fresh" in edge["label"]), edge
        eventless = edge["label"].startswith("(eventless)") and "[fresh" not in edge["label"]
        assert (edge["stroke"] == blue) == eventless, edge
        dash = {red: "8px, 4px", blue: "2px, 3px"}.get(edge["stroke"])
        assert dash is None or edge["dash"] == dash, edge
    labels = sorted(e["label"] for e in drawn.edges if e["label"])
    assert labels == sorted(e.label() for e in d.edges)

    folder, scale = screenshots
    picture = mermaid_page.screenshot(drawn, folder / f"{d.machine}.png", scale)
    assert picture.startswith(b"\x89PNG") and len(picture) > 5000
    width, height = struct.unpack(">II", picture[16:24])  # the PNG header: the whole drawing
    assert width >= drawn.width * scale and height >= drawn.height * scale, (width, height)


def test_mermaid_refuses_what_it_cannot_parse(mermaid_page: MermaidPage) -> None:
    """The check above would notice a diagram Mermaid cannot read."""
    with pytest.raises(RenderError, match="parse error"):
        mermaid_page.render("stateDiagram-v2\n    a --> b : one; two\n    state {\n")
