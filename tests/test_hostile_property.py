"""Generated hostile inputs of every kind issue 13 lists, against the command line (run in
this process, as a user types it) and the API, on SQLite and PostgreSQL: no exception other
than lifecycle's own escapes, every exit status is a documented one, nothing prints a
traceback, and after every refusal the database is exactly as it was (a dump of every table,
compared). What is accepted reads back as it was given, on both databases alike.

Each test prints how many inputs it ran and how many distinct error messages it saw (run
with ``-s``). The examples are bounded (no deadline: a busy machine only makes them slower).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from hostile_inputs import DOCUMENTED_EXITS, RISKY, TOGGLE, cli, dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle import Engine, LifecycleError, SimulatedClock, Store

SETTINGS = settings(max_examples=50, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
API_SETTINGS = settings(SETTINGS, max_examples=200)

# -- what users type ------------------------------------------------------------------------

PIECES = ["\x00", "\ud800", "\udcff", "[", "]", "[/]", "[bold]", "[red]x[/red]", "\\", "\\[",
          ":", "é", "\n", "\t", " ", "x", "y", "🙂", "://", "@", "'", '"', "%", "{", "}",
          ":smile:", "\x1b[31m", "\u202e"]
text = st.lists(st.sampled_from(PIECES), max_size=6).map("".join) | st.text(max_size=8)
keys = text.filter(lambda k: k != "") | st.sampled_from(["k1", "k2", "t1", "x[/]",
                                                          "batch_job:k1", "x" * 300])
scalars = (st.none() | st.booleans() | st.integers(-(2**66), 2**66)
           | st.sampled_from([2**63 - 1, -(2**63), 2**63, -0.0, 1e308, 5e-324])
           | st.integers(4300, 4400).map(lambda digits: 10**digits)
           | st.floats(allow_nan=True, allow_infinity=True) | text)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(text, inner, max_size=3), max_leaves=10)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


objects = (st.dictionaries(text, documents, max_size=4)
           | st.integers(50, 1100).map(nested)
           | documents)  # not always an object: a list, a number, a string


def json_text(value: Any, ascii_only: bool) -> str:
    try:
        return json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    except (ValueError, RecursionError):
        return "9" * 5000  # an integer Python will not even write


arguments = (st.builds(json_text, objects, st.booleans())
             | st.sampled_from(['{"a":1e999}', '{"a":1,"a":2}', "{", "", "null", "[]",
                                '{"a": NaN}', '{"a": Infinity}', '{"a":"\\u0000"}',
                                '{"a":"\\ud800"}', '{"\\u0000":0}'])
             | text)
numbers = st.sampled_from(["nan", "inf", "-inf", "NaN", "1e308", "1e999", "0", "-1",
                           "1e-300", "5", "abc", "", "0x10"])
URLS = ["://", "postgresql+psycopg2://root@127.0.0.1/test", "mysql://a:b@c/d",
        "postgresql://bob:Hunter2/Secret@127.0.0.1:1/x", "postgresql://bob:pw@127.0.0.1:port/x",
        "sqlite:////no/such/dir/x.db", "sqlite:///file:nowhere.db?mode=ro&uri=true",
        "smtp://bob:Hunter2/Secret@host", "/dev/null", "/", "sqlite://"]


@st.composite
def commands(draw: st.DrawFn) -> list[str]:
    kind = draw(st.sampled_from(["create", "fire", "observe", "update", "read", "list",
                                 "worker", "url", "step"]))
    key = draw(keys)
    if kind == "create":
        args = ["create", draw(st.sampled_from(["batch_job", "nosuch", "drone"])), key]
        if draw(st.booleans()):
            args += ["--data", draw(arguments)]
        if draw(st.booleans()):
            args += ["--actor", draw(text)]
        if draw(st.booleans()):
            args += ["--state", draw(st.sampled_from(["held", "running.starting", "nosuch"])
                                     | text)]
        return args
    if kind == "fire":
        args = ["fire", key, draw(st.sampled_from(["hold", "release", "start", "exit"])
                                  | text)]
        if draw(st.booleans()):
            args += ["--payload", draw(arguments)]
        return args + (["--actor", draw(text)] if draw(st.booleans()) else [])
    if kind == "observe":
        args = ["observe", key, draw(arguments)]
        if draw(st.booleans()):
            args += ["--source", draw(text | st.just("s" * 201))]
        if draw(st.booleans()):
            args += ["--at", draw(st.sampled_from(["0001-01-01T00:00:00+01:00", "nonsense",
                                                   "9999-12-31T23:59:59", "2026-01-01"]))]
        return args
    if kind == "update":
        return ["update", key, draw(arguments)]
    if kind == "read":
        return [draw(st.sampled_from(["show", "history", "retry"])), key] + (
            ["--json"] if draw(st.booleans()) else [])
    if kind == "step":
        return ["step", key]
    if kind == "list":
        return ["list", *draw(st.lists(text, max_size=1))]
    if kind == "worker":
        return ["worker", "--until-idle", draw(st.sampled_from(["--lease", "--poll"])),
                draw(numbers)]
    return ["list", "--db", draw(st.sampled_from(URLS) | text)]


# -- the command line -----------------------------------------------------------------------


def test_the_command_line_refuses_hostile_input_cleanly(db_url: str, tmp_path: Path) -> None:
    assert cli("db", "upgrade", db=db_url).code == 0
    assert cli("create", "batch_job", "k1", "--data", '{"owner": "alice"}', db=db_url).code == 0
    seen: dict[str, Any] = {"inputs": 0, "errors": set(), "refusals": 0}
    observer = Store(db_url, check=False)  # reads the dumps
    known: list[Any] = []  # the database as a refusal left it (as it found it): the next before

    @SETTINGS
    @given(commands())
    def run(args: list[str]) -> None:
        explicit_db = "--db" in args
        before = known.pop() if known else dump(observer)
        ran = cli(*args, db=None if explicit_db else db_url)
        seen["inputs"] += 1
        assert ran.exception is None, f"{args!r}: {type(ran.exception).__name__}: " \
                                      f"{ran.exception}"
        assert "Traceback" not in ran.output, f"{args!r}:\n{ran.output}"
        assert ran.code in DOCUMENTED_EXITS, f"{args!r}: exit {ran.code}:\n{ran.output}"
        assert "Hunter2" not in ran.output and "Secret" not in ran.output
        if ran.code != 0:
            seen["refusals"] += 1
            seen["errors"].add(ran.error_line())
            if ran.code == 1:
                lines = ran.stderr.strip().splitlines()
                assert lines[0].startswith("error: "), ran.stderr
                assert len(lines) == 1 or (  # a spec's problems: one line each
                    re.match(r"error: machine .* has \d+ problems?:$", lines[0])
                    and all(line.startswith("  - ") for line in lines[1:])), ran.stderr
            assert dump(observer) == before, f"{args!r} was refused and wrote:\n{ran.output}"
            known.append(before)
        elif args[0] == "create" and "--json" not in args:
            shown = json.loads(cli("show", f"{args[1]}:{args[2]}", "--json", db=db_url).stdout)
            assert shown["key"] == args[2]  # what was accepted reads back as it was given

    try:
        run()
    finally:
        observer.dispose()
    print(f"\ncommand line on {db_url.split(':')[0]}: {seen['inputs']} hostile inputs, "
              f"{seen['refusals']} refused, {len(seen['errors'])} distinct error messages, "
              "0 tracebacks")


# -- the API --------------------------------------------------------------------------------

calls = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(["toggle", "risky"]), keys, objects,
              st.none() | text),
    st.tuples(st.just("fire"), st.sampled_from(["t1", "toggle:t1", "r1"]) | keys,
              st.sampled_from(["flip", "remove", "_eventless"]) | text, objects,
              st.none() | text),
    st.tuples(st.just("update"), st.sampled_from(["t1"]) | keys, objects, st.none() | text),
    st.tuples(st.just("observe"), st.sampled_from(["t1", "r1"]) | keys, objects,
              text | st.just("s" * 201)),
    st.tuples(st.just("read"), keys),
    st.tuples(st.just("answer"), documents),  # what the probe answers next
)


def _equal(given: Any, stored: Any) -> bool:
    """JSON equality (a tuple reads back as a list; -0.0 as 0)."""
    if isinstance(given, list | tuple):
        return isinstance(stored, list) and len(given) == len(stored) and all(
            _equal(a, b) for a, b in zip(given, stored, strict=True))
    if isinstance(given, dict):
        return isinstance(stored, dict) and given.keys() == stored.keys() and all(
            _equal(v, stored[k]) for k, v in given.items())
    if isinstance(given, float) and isinstance(stored, int | float):
        return math.isclose(given, stored, rel_tol=0, abs_tol=0) or given == stored
    return bool(given == stored) and type(given) is type(stored)


def test_the_api_refuses_hostile_input_cleanly(store: Store, db_url: str) -> None:
    answer: list[Any] = [{"status": "up"}]
    engine = Engine(store, [TOGGLE, RISKY], clock=SimulatedClock(),
                    probes={"site": lambda request: answer[0]})
    engine.create("toggle", "t1", {"n": 1})
    engine.create("risky", "r1")
    seen: dict[str, Any] = {"inputs": 0, "errors": set(), "refusals": 0}
    # the database as it is now, where a dump says so: what a refusal left as it found it is
    # still the next call's before (nothing else writes it), so each call dumps it once
    known: list[Any] = []

    @API_SETTINGS
    @given(calls)
    def run(call: tuple[Any, ...]) -> None:
        seen["inputs"] += 1
        if call[0] == "answer":
            answer[0] = call[1]
            return
        before = known.pop() if known else dump(store)
        try:
            outcome = _call(engine, call)
        except LifecycleError as exc:  # the documented exceptions, and only those
            seen["refusals"] += 1
            seen["errors"].add(f"{type(exc).__name__}: {exc}"[:200])
            if type(exc).__name__ != "StaleObservation":  # a refusal journaled on purpose
                assert dump(store) == before, f"{call!r} raised {exc} and wrote"
                known.append(before)
            return
        if call[0] == "create":
            assert _equal(call[3], outcome.data) and _equal(call[3], engine.get(
                f"{call[1]}:{call[2]}").data)

    run()
    print(f"\nAPI on {db_url.split(':')[0]}: {seen['inputs']} hostile inputs, "
          f"{seen['refusals']} refused, {len(seen['errors'])} distinct error messages, "
          "0 tracebacks")


def _call(engine: Engine, call: tuple[Any, ...]) -> Any:
    kind = call[0]
    if kind == "create":
        return engine.create(call[1], call[2], call[3], actor=call[4])
    if kind == "fire":
        return engine.fire(call[1], call[2], call[3], actor=call[4], on_stale="return")
    if kind == "update":
        return engine.update(call[1], call[2], actor=call[3])
    if kind == "observe":
        return engine.observe(call[1], call[2], source=call[3])
    return engine.history(call[1])
