"""`lifecycle serve`: every page and its JSON over HTTP (a real uvicorn on loopback), on
SQLite and PostgreSQL, with hostile keys and data shown as text; an empty, a missing, an
un-migrated and an out-of-date database answered with a clear page; nothing ever written;
/metrics in Prometheus' format."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from databases import Templates
from hostile_inputs import MARKUP, RISKY, TOGGLE, cli, dump
from markupsafe import escape
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from lifecycle import Effect, EffectCall, Engine, Retry, Store, Worker
from lifecycle.clock import SimulatedClock
from lifecycle.dashboard.app import create_app
from lifecycle.dashboard.app import serve_in_thread as served
from lifecycle.dashboard.metrics import History, ProbeCalls
from lifecycle.errors import StaleObservation
from lifecycle.store.readonly import ReadOnlyDatabase
from lifecycle.store.statements.dashboard import Specs

START = "2026-01-01T00:00:00Z"
ERROR = "<b>site said</b> <script>no()</script> & gone"

JOBS: dict[str, Any] = {
    "name": "jobs", "initial": "new", "final": ["sent", "slow", "gone"],
    "states": ["new", "sent", "slow", {"name": "waiting",
                                       "timeout": {"after": 60, "trigger": "expire"}}, "gone"],
    "transitions": [
        {"trigger": "send", "source": "new", "dest": "sent", "effects": ["deliver"]},
        {"trigger": "crawl", "source": "new", "dest": "slow", "effects": ["dawdle"]},
        {"trigger": "wait", "source": "new", "dest": "waiting"},
        {"trigger": "expire", "source": "waiting", "dest": "gone"},
    ]}
"""Effects that fail for good (deliver) and that fail and wait to be tried again (dawdle),
and a timer that falls due."""


def _fail(_call: Any) -> None:
    raise RuntimeError(ERROR)


def _no_status(_request: Any) -> Any:
    raise RuntimeError("the site is down")


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock(START)


def _populate(db_url: str, clock: SimulatedClock) -> None:
    """Hostile keys, data, payloads, actors, statuses and errors on every page: toggles, a
    refused risky edge, failed and retrying effects, a due timer."""
    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [TOGGLE, RISKY, JOBS], clock=clock, probes={"site": _no_status},
                        effects={"deliver": Effect(_fail, Retry(max_attempts=1)),
                                 "dawdle": Effect(_fail, Retry(max_attempts=5, base=3600,
                                                               jitter=0))})
        for i, key in enumerate(MARKUP):
            engine.create("toggle", key, {"note": key, "ad": 'MY.Owner == "<i>x</i>"',
                                          "n": i}, actor=key)
            engine.observe(f"toggle:{key}", {"Status": key}, source="<src>")
            if i % 2:
                engine.fire(f"toggle:{key}", "flip", {"why": "</td></tr>" + key}, actor=key)
            engine.create("risky", key, {"where": key})
            clock.advance(1)
            with pytest.raises(StaleObservation):
                engine.fire(f"risky:{key}", "remove", actor="<op>")
        for i in range(3):
            engine.create("jobs", f"j{i}<x>")
        engine.fire("jobs:j0<x>", "send")
        engine.fire("jobs:j1<x>", "crawl")
        engine.fire("jobs:j2<x>", "wait")
        Worker(engine).run_until_idle()
        clock.advance(120)  # the timer is due; no worker runs it


@pytest.fixture
def populated(db_url: str, clock: SimulatedClock) -> str:
    """A database of the test's own populated by :func:`_populate`, for the tests that write
    to it (a worker); ``clock`` is where populating left it."""
    _populate(db_url, clock)
    return db_url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def _populated_once(request: pytest.FixtureRequest, templates: Templates,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dt.datetime]]:
    """One database populated by :func:`_populate` per database kind for the module, and
    the time populating ended."""
    clock = SimulatedClock(START)
    if request.param == "sqlite":
        url = templates.sqlite(tmp_path_factory.mktemp("populated") / "lifecycle.db")
        _populate(url, clock)
        yield url, clock.now()
    else:
        with templates.postgres() as url:
            _populate(url, clock)
            yield url, clock.now()


@pytest.fixture
def shared(_populated_once: tuple[str, dt.datetime], clock: SimulatedClock) -> str:
    """As ``populated``, shared by the module's tests that only read it (the dashboard and
    `lifecycle serve` write nothing: test_every_page_shows_hostile_data_as_text checks it)
    or roll back what they write; ``clock`` is set to where populating left it."""
    url, ended = _populated_once
    clock.set(ended)
    return url


class _TestsClock:
    """The clock of the module's shared server: the running test's ``clock`` (a test may
    move its own; time never goes backwards on one)."""

    def __init__(self) -> None:
        self.current = SimulatedClock(START)

    def now(self) -> dt.datetime:
        return self.current.now()


@pytest.fixture(scope="module")
def _served_once(_populated_once: tuple[str, dt.datetime]) -> Iterator[tuple[str, _TestsClock]]:
    relay = _TestsClock()
    with served(_populated_once[0], clock=relay) as base:
        yield base, relay


@pytest.fixture
def site(shared: str, clock: SimulatedClock, _served_once: tuple[str, _TestsClock]) -> str:
    """The base URL of the dashboard of ``shared``, on ``clock``: one server per database
    kind for the module's tests that only read (starting and stopping one per test cost
    more than most of their requests)."""
    base, relay = _served_once
    relay.current = clock
    return base


CLIENT = httpx.Client(timeout=60)
"""One client for the module's requests (a client of its own per request costs more than the
dashboard's answer)."""


@pytest.fixture(scope="module", autouse=True)
def _client() -> Iterator[None]:
    yield
    CLIENT.close()


def _get(base: str, path: str, **params: Any) -> httpx.Response:
    answer = CLIENT.get(base + path, params=params)
    assert "Traceback" not in answer.text
    assert answer.headers["x-content-type-options"] == "nosniff"
    return answer


def _pages() -> list[tuple[str, dict[str, str]]]:
    pages: list[tuple[str, dict[str, str]]] = [
        ("/", {}), ("/machines/toggle", {}), ("/machines/toggle", {"state": "on"}),
        ("/machines/risky", {"q": "<"}), ("/machines/jobs", {}), ("/effects", {}),
        ("/refusals", {}), ("/live", {})]
    for key in MARKUP:
        pages += [("/machines/toggle/resource", {"key": key}),
                  ("/machines/risky/resource", {"key": key})]
    return pages


UNSAFE = re.compile(r"<(script|img|i>|b>|br)")


def _markup_outside_the_pages_own(text: str) -> list[str]:
    """Tags and template syntax that came from data rather than from the templates: the
    pages' own markup has one <script> (the live page's), no <img> but diagrams', and no
    bold or italic tags."""
    found = []
    for match in UNSAFE.finditer(text):
        if match.group() == "<script" and 'script>\n(function () {' in text[match.start():][:30]:
            continue
        if match.group() == "<img" and 'class="diagram' in text[match.start():][:20]:
            continue
        found.append(text[max(0, match.start() - 40):match.end() + 40])
    return found


def test_every_page_shows_hostile_data_as_text(shared: str, site: str) -> None:
    before = dump(shared)
    base = site
    for path, params in _pages():
        answer = _get(base, path, **params)
        assert answer.status_code == 200, (path, params, answer.text)
        assert answer.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        assert not _markup_outside_the_pages_own(answer.text), (path, params)
    toggles = _get(base, "/machines/toggle").text
    for key in MARKUP:
        assert escape(key) in toggles
        page = _get(base, "/machines/toggle/resource", key=key).text
        assert escape(key) in page
        assert escape(json.dumps('MY.Owner == "<i>x</i>"')) in page  # data, as JSON
        risky = _get(base, "/machines/risky/resource", key=key).text
        assert 'class="refusal"' in risky
        assert '<span class="s-refused">refused </span><span class="s-plain">remove' in risky
    effects = _get(base, "/effects").text
    assert escape(ERROR) in effects
    assert "jobs:j0&lt;x&gt;" in effects and "jobs:j1&lt;x&gt;" in effects
    assert dump(shared) == before, "the dashboard wrote to the database"


def test_every_page_answers_json_with_the_data_as_stored(site: str) -> None:
    base = site
    for path, params in _pages():
        answer = _get(base, path, **params, format="json")
        assert answer.status_code == 200, (path, params, answer.text)
        assert answer.headers["content-type"] == "application/json"
    machines = {m["name"]: m for m in _get(base, "/", format="json").json()["machines"]}
    assert set(machines) == {"toggle", "risky", "jobs"}
    assert machines["toggle"]["total"] == len(MARKUP)
    assert {s["state"]: s["count"] for s in machines["toggle"]["states"]} == {
        "off": len(MARKUP) - len(MARKUP) // 2, "on": len(MARKUP) // 2}
    listed = _get(base, "/machines/toggle", format="json", limit=100).json()["listing"]
    assert sorted(r["key"] for r in listed["resources"]) == sorted(MARKUP)
    for i, key in enumerate(MARKUP):
        one = _get(base, "/machines/toggle/resource", key=key, format="json").json()
        assert one["key"] == key and one["data"]["note"] == key
        assert one["observation"]["status"] == {"Status": key}
        assert [e["kind"] for e in one["journal"]] == ["create"] + ["transition"] * (i % 2)
        assert one["journal"][0]["actor"] == key
        risky = _get(base, "/machines/risky/resource", key=key, format="json").json()
        assert [(e["kind"], e["refused"]) for e in risky["journal"]] == [
            ("create", False), ("refusal", True)]
    trouble = _get(base, "/effects", format="json").json()
    assert [(e["key"], e["name"], e["last_error"]) for e in trouble["failed"]] == [
        ("j0<x>", "deliver", f"RuntimeError: {ERROR}")]
    assert [(e["key"], e["attempts"]) for e in trouble["retrying"]] == [("j1<x>", 1)]
    refused = _get(base, "/refusals", format="json").json()
    assert refused["total"] == len(MARKUP)
    assert refused["edges"] == [{"machine": "risky", "trigger": "remove", "source": "up",
                                 "dest": "gone", "count": len(MARKUP)}]
    assert sorted(r["key"] for r in refused["refusals"]) == sorted(MARKUP)
    assert _get(base, "/refusals", format="json", hours="0.001").json()["total"] == 0
    live = _get(base, "/live", format="json").json()
    assert live["counts"]["jobs"] == {"sent": 1, "slow": 1, "waiting": 1}


def test_a_machines_resources_come_a_page_at_a_time(db_url: str,
                                                    clock: SimulatedClock) -> None:
    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [TOGGLE], clock=clock)
        keys = [f"k{i:03d}{'x' if i % 3 else ''}" for i in range(23)]
        for i, key in enumerate(keys):
            engine.create("toggle", key)
            if i % 2:
                engine.fire(f"toggle:{key}", "flip")
    with served(db_url, clock=clock) as base:
        for filters, expected in [({}, keys), ({"state": "on"}, keys[1::2]),
                                  ({"q": "x"}, [k for k in keys if "x" in k]),
                                  ({"state": "off", "q": "x"},
                                   [k for k in keys[0::2] if "x" in k])]:
            seen, pages, after = [], [], None
            while True:
                page = _get(base, "/machines/toggle", format="json", limit=4, **filters,
                            **({"after": after} if after else {})).json()["listing"]
                pages.append(page)
                seen += [r["key"] for r in page["resources"]]
                after = page["next_after"]
                if after is None:
                    break
            assert seen == sorted(expected), filters
            back, before = [], pages[-1]["previous_before"]
            while before is not None:
                page = _get(base, "/machines/toggle", format="json", limit=4, before=before,
                            **filters).json()["listing"]
                back = [r["key"] for r in page["resources"]] + back
                before = page["previous_before"]
            assert back + [r["key"] for r in pages[-1]["resources"]] == sorted(expected)
        first = _get(base, "/machines/toggle", limit=4).text
        assert 'id="next"' in first and 'id="previous"' not in first


def test_an_empty_database_has_pages_saying_so(db_url: str) -> None:
    with Store(db_url, upgrade=True):
        pass
    with served(db_url) as base:
        page = _get(base, "/")
        assert page.status_code == 200 and 'id="empty"' in page.text
        assert _get(base, "/", format="json").json() == {"machines": []}
        for path in ("/effects", "/refusals", "/live"):
            assert _get(base, path).status_code == 200
        assert _get(base, "/machines/toggle").status_code == 404
        assert "lifecycle_database_up 1.0" in _get(base, "/metrics").text


def _unavailable(base: str, words: str) -> None:
    """Every page says the database cannot be shown, why and what to do; none raises. (Each
    path once, with ``key=x``: the pages' own arguments would make the same requests again.)"""
    for path in dict.fromkeys(path for path, _ in _pages()):
        page = _get(base, path, key="x")
        assert page.status_code == 503, (path, page.text)
        assert 'id="reason"' in page.text and words in page.text
        assert "lifecycle db upgrade" in page.text
        answer = _get(base, path, key="x", format="json")
        assert answer.status_code == 503 and words in answer.json()["error"]
    assert "lifecycle_database_up 0.0" in _get(base, "/metrics").text


def test_a_missing_sqlite_file_is_a_clear_page_and_stays_missing(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    with served(f"sqlite:///{path}") as base:
        _unavailable(base, "there is no database at")
    assert not path.exists()


def test_an_unmigrated_database_is_a_clear_page_and_stays_unmigrated(empty_db_url: str) -> None:
    with Store(empty_db_url, check=False) as store:
        store.read().__enter__().close()  # an empty SQLite file, or an empty schema
        assert store.current_revision() is None
    with served(empty_db_url) as base:
        _unavailable(base, "has no lifecycle tables yet")
    with Store(empty_db_url, check=False) as store:
        assert store.current_revision() is None
        assert all(not rows for _, rows in dump(store))


def test_an_out_of_date_schema_is_a_clear_page_and_is_left_as_it_is(empty_db_url: str) -> None:
    with Store(empty_db_url, check=False) as store:
        store.upgrade("0006_claimants")
    with served(empty_db_url) as base:
        _unavailable(base, "is at schema revision 0006_claimants")
    with Store(empty_db_url, check=False) as store:
        assert store.current_revision() == "0006_claimants"


def test_bad_requests_are_answered_not_raised(site: str) -> None:
    base = site
    for path, params, status in [
            ("/", {"format": "xml"}, 400), ("/machines/toggle", {"limit": "0"}, 400),
            ("/machines/toggle", {"limit": "x"}, 400),
            ("/machines/toggle", {"after": "a\x00b"}, 400),
            ("/machines/toggle", {"q": "\x00"}, 400),
            ("/machines/toggle/resource", {}, 400),
            ("/machines/toggle/resource", {"key": "a\x00"}, 400),
            ("/machines/toggle/resource", {"key": "k" * 5000}, 400),
            ("/machines/toggle/resource", {"key": "nope"}, 404),
            ("/machines/nope", {}, 404), ("/machines/nope/resource", {"key": "x"}, 404),
            ("/machines/nope/diagram", {}, 404),
            ("/refusals", {"hours": "nan"}, 400), ("/refusals", {"hours": "-1"}, 400)]:
        for wanted in ("html", "json"):
            answer = _get(base, path, **params, **({"format": wanted} if wanted == "json"
                                                   and "format" not in params else {}))
            assert answer.status_code == status, (path, params, answer.text)


def _metrics(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = _get(base, "/metrics").text
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_metrics_are_prometheus_text_read_from_the_database(clock: SimulatedClock,
                                                             site: str) -> None:
    base = site
    found = _metrics(base)
    assert found["lifecycle_database_up"] == [({}, 1.0)]
    resources = {(m["machine"], m["state"]): v for m, v in found["lifecycle_resources"]}
    assert resources[("toggle", "on")] == len(MARKUP) // 2
    assert resources[("risky", "up")] == len(MARKUP)
    assert found["lifecycle_risky_refusals_total"] == [
        ({"machine": "risky", "trigger": "remove", "source": "up", "dest": "gone"},
         float(len(MARKUP)))]
    assert "lifecycle_risky_transitions_total" not in found  # none fired
    effects = {(m["name"], m["status"]): v for m, v in found["lifecycle_effects"]}
    assert effects == {("deliver", "failed"): 1.0, ("dawdle", "retrying"): 1.0}
    assert found["lifecycle_timers_due"] == [({}, 1.0)]
    assert found["lifecycle_oldest_due_effect_age_seconds"] == [({}, 0.0)]
    clock.advance(7200)  # dawdle's retry (an hour after its failure) is now overdue
    found = _metrics(base)
    age = found["lifecycle_oldest_due_effect_age_seconds"][0][1]
    assert 3600 < age < 7200
    overdue = _get(base, "/effects", format="json").json()["overdue"]
    assert [e["key"] for e in overdue] == ["j1<x>"]


def test_risky_transitions_and_probe_answers_are_counted(db_url: str,
                                                         clock: SimulatedClock) -> None:
    answers = iter([{"up": False}, {"up": False}])

    def site(_request: Any) -> Any:
        return next(answers), clock.now()

    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [RISKY], clock=clock, probes={"site": site})
        for key in ("a", "b"):
            engine.create("risky", key)
            clock.advance(1)
            assert engine.fire(f"risky:{key}", "remove").fired  # asks the probe, then fires
    with served(db_url, clock=clock) as base:
        found = _metrics(base)
    assert found["lifecycle_risky_transitions_total"] == [
        ({"machine": "risky", "trigger": "remove", "source": "up", "dest": "gone"}, 2.0)]
    assert found["lifecycle_probe_answers_total"] == [({"probe": "site"}, 2.0)]


def test_the_live_counts_follow_writes(db_url: str, clock: SimulatedClock) -> None:
    with Store(db_url, upgrade=True) as store, served(db_url, clock=clock) as base:
        engine = Engine(store, [TOGGLE], clock=clock)
        assert _get(base, "/live", format="json").json()["counts"] == {}
        engine.create("toggle", "a")
        assert _get(base, "/live", format="json").json()["counts"] == {"toggle": {"off": 1}}
        engine.fire("toggle:a", "flip")
        assert _get(base, "/live", format="json").json()["counts"] == {"toggle": {"on": 1}}


def test_refusals_are_those_of_the_window_asked_for(clock: SimulatedClock, site: str) -> None:
    clock.set(dt.datetime.fromisoformat(START.replace("Z", "+00:00"))
                   + dt.timedelta(hours=3))
    base = site
    assert _get(base, "/refusals", format="json").json()["total"] == 0
    assert _get(base, "/refusals", format="json", hours=4).json()["total"] == len(MARKUP)
    page = _get(base, "/refusals").text
    assert 'id="none"' in page
    # the refusals before the window are said, with the window that shows them (a
    # simulation's, written on its own clock, would otherwise not be found at all)
    earlier = _get(base, "/refusals", format="json").json()
    assert earlier["earlier"] == len(MARKUP) and earlier["reach_hours"] == 4
    assert f"{len(MARKUP)} earlier refusals" in page and 'href="?hours=4"' in page
    assert _get(base, "/refusals", format="json", hours=4).json()["earlier"] == 0



def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def lifecycle_cmd(forkserver: Any) -> list[str]:
    """`python -m lifecycle`, started warm (tests/zygote.py): a worker and `lifecycle serve`
    here end by the SIGTERM their client passes on, as the real program's would."""
    return forkserver.python("-m", "lifecycle")  # type: ignore[no-any-return]


def test_a_worker_serves_the_same_metrics_on_its_own_port(populated: str,
                                                          lifecycle_cmd: list[str]) -> None:
    port = _free_port()
    worker = subprocess.Popen(
        [*lifecycle_cmd, "worker", "--metrics-port", str(port), "--poll", "0.2",
         "--db", populated],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert worker.poll() is None, worker.communicate()
            try:
                text = CLIENT.get(f"http://127.0.0.1:{port}/metrics").text
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the worker's /metrics never answered"
                time.sleep(0.05)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {"lifecycle_database_up", "lifecycle_resources", "lifecycle_effects",
                "lifecycle_risky_refusals", "lifecycle_timers_due", "lifecycle_probe_calls",
                "lifecycle_probe_failures"} <= set(families)
        assert families["lifecycle_database_up"].samples[0].value == 1.0
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, out + err


def test_a_process_counts_its_probe_calls_and_failures() -> None:
    registry = CollectorRegistry()
    answers = iter([RuntimeError("down"), {"up": True}])

    def site(_request: Any) -> Any:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    counted = ProbeCalls(registry).wrap({"site": site})
    with pytest.raises(RuntimeError):
        counted["site"](None)
    assert counted["site"](None) == {"up": True}
    assert registry.get_sample_value("lifecycle_probe_calls_total", {"probe": "site"}) == 2
    assert registry.get_sample_value("lifecycle_probe_failures_total", {"probe": "site"}) == 1


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a TCP socket of this host listens on at ``port`` (Linux)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_lifecycle_serve_listens_on_loopback_and_stops_on_sigterm(
        shared: str, lifecycle_cmd: list[str]) -> None:
    port = _free_port()
    server = subprocess.Popen([*lifecycle_cmd, "serve", "--port", str(port), "--db", shared],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()
            try:
                page = CLIENT.get(f"http://127.0.0.1:{port}/machines/toggle")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "lifecycle serve never answered"
                time.sleep(0.05)
        assert page.status_code == 200 and escape(MARKUP[0]) in page.text
        assert _listening_addresses(port) == {"127.0.0.1"}
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    # uvicorn shuts down gracefully, then ends by the signal it was sent, as is conventional
    assert server.returncode in (0, -signal.SIGTERM), out + err
    assert "Traceback" not in err, err
    assert f"http://127.0.0.1:{port}/" in out and "read-only" in out


def test_pages_answer_while_a_writer_holds_its_transaction(shared: str,
                                                          clock: SimulatedClock) -> None:
    """A worker in the middle of a write (SQLite's write lock, PostgreSQL's row locks) holds
    up no page, and no page sees what it has not committed. (The write is rolled back, so
    the module's shared database serves; a server of the test's own opens its connections
    while the write holds its locks.)"""
    before = {"off": len(MARKUP) - len(MARKUP) // 2, "on": len(MARKUP) // 2}
    with Store(shared) as store, served(shared, clock=clock) as base:
        with store.write() as tx:
            tx.execute("UPDATE lifecycle_resources SET state = 'on' WHERE machine = 'toggle'")
            for path, params in [("/", {}), ("/machines/toggle", {"format": "json"}),
                                 ("/metrics", {}), ("/live", {"format": "json"})]:
                assert _get(base, path, **params).status_code == 200
            assert _get(base, "/live", format="json").json()["counts"]["toggle"] == before
            tx.rollback()
        assert _get(base, "/live", format="json").json()["counts"]["toggle"] == before


NESTED: dict[str, Any] = {
    "name": "nest", "initial": "a",
    "states": ["a", {"name": "b", "initial": "x", "states": ["x", "y"]}],
    "transitions": [{"trigger": "go", "source": "a", "dest": "b"},
                    {"trigger": "on", "source": "b.x", "dest": "b.y"},
                    {"trigger": "back", "source": "b", "dest": "a"}]}


def test_a_composite_state_lists_the_resources_in_the_states_inside_it(
        db_url: str, clock: SimulatedClock) -> None:
    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [NESTED], clock=clock)
        for key, triggers in (("r1", []), ("r2", ["go"]), ("r3", ["go", "on"])):
            engine.create("nest", key)
            for trigger in triggers:
                engine.fire(f"nest:{key}", trigger)
    with served(db_url, clock=clock) as base:
        for state, keys in (("b", ["r2", "r3"]), ("b.y", ["r3"]), ("a", ["r1"]), ("x", [])):
            page = _get(base, "/machines/nest", state=state, format="json").json()
            assert [r["key"] for r in page["listing"]["resources"]] == keys, state


def test_the_history_counters_are_read_again_in_the_background(
        db_url: str, clock: SimulatedClock) -> None:
    def refusals(found: Any) -> int:
        return sum(count for kind, *_, count in found[0] if kind == "refusal")

    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [RISKY], clock=clock, probes={"site": _no_status})
        engine.create("risky", "a")
        engine.fire("risky:a", "remove", on_stale="return")
        db = ReadOnlyDatabase(db_url)
        history = History(db, Specs(), every=0.01)
        try:
            assert refusals(history.latest()) == 1  # not started: read at each scrape
            history.start()
            engine.fire("risky:a", "remove", on_stale="return")
            deadline = time.monotonic() + 60
            while refusals(history.latest()) != 2:
                assert time.monotonic() < deadline, "the history was never read again"
                time.sleep(0.01)
        finally:
            history.stop()
            db.dispose()


def test_a_diagram_is_an_image_that_runs_no_script(site: str) -> None:
    base = site
    drawn = _get(base, "/machines/risky/diagram")
    machines = _get(base, "/").text
    assert drawn.status_code == 200
    if shutil.which("dot"):
        assert drawn.headers["content-type"] == "image/svg+xml"
        assert drawn.headers.get_list("content-security-policy") == [
            "default-src 'none'; style-src 'unsafe-inline'"]
        assert "<svg" in drawn.text and "<script" not in drawn.text
        assert '<img class="diagram thumbnail" alt="diagram of risky" ' \
            'src="/machines/risky/diagram">' in machines
    else:  # without Graphviz: the Mermaid text, linked
        assert drawn.headers["content-type"].startswith("text/plain")
        assert "stateDiagram-v2" in drawn.text
        assert 'href="/machines/risky/diagram">the diagram as Mermaid text' in machines


PILOT: dict[str, Any] = {
    "name": "pilot", "initial": "booting", "final": ["gone"], "states": ["booting", "gone"],
    "transitions": [{"trigger": "remove", "source": "booting", "dest": "gone",
                     "fresh": {"max_age": 30}, "effects": ["terminate"]}]}
"""A risky edge with a fence and an effect that leaves the world alone when it has changed
since (as the drone's terminate does)."""


def _terminate(call: EffectCall) -> None:
    expected = (call.fence or {})["expect"]["status"]
    call.save_progress({"acted": False,
                        "detail": f"left alone: the job is Running, not {expected}"})


@pytest.fixture
def pilots(db_url: str, clock: SimulatedClock) -> Iterator[str]:
    """p1: removed on a fresh Booting, its terminate left alone by the fence; p2: its
    removal refused for want of an observation."""
    with Store(db_url, upgrade=True) as store:
        engine = Engine(store, [PILOT], clock=clock,
                        effects={"terminate": Effect(_terminate)})
        for key in ("p1", "p2"):
            engine.create("pilot", key, actor="cobald")
        clock.advance(5)
        engine.observe("pilot:p1", {"status": "Booting"}, source="site")
        clock.advance(2)
        assert engine.fire("pilot:p1", "remove", actor="tardis").fired
        with pytest.raises(StaleObservation):
            engine.fire("pilot:p2", "remove", actor="tardis")
        Worker(engine).run_until_idle()
    yield db_url


def test_a_resource_page_tells_the_history_as_the_command_line_does(
        pilots: str, clock: SimulatedClock) -> None:
    with TestClient(create_app(pilots, clock=clock)) as client:
        told = client.get("/machines/pilot/resource", params={"key": "p1",
                                                               "format": "json"}).json()
        page = client.get("/machines/pilot/resource", params={"key": "p1"}).text
    rows = told["story"]["rows"]
    removal = next(r for r in rows if r["seq"] == 2)
    lines = ["".join(s["text"] for s in line["spans"]) for line in removal["details"]]
    assert lines == [
        "guards: fresh=yes",
        "on observation #1 above, 2.0 s old",
        "fence: its effects expect status=Booting",
        "effect terminate: done at 00:00:07.000 (1 attempt)",
        "acted=false",
        "detail=left alone: the job is Running, not Booting"]
    assert "".join(s["text"] for s in removal["heading"]) == "remove: booting -> gone, by tardis"
    assert [r["kind"] for r in rows] == ["create", "observed", "transition"]
    # the page shows each line, and the command line prints the same lines
    printed = cli("history", "pilot:p1", db=pilots, env={"COLUMNS": "200"})
    assert printed.code == 0, printed.output
    shown = [html.unescape(re.sub(r"<[^>]+>", "", line)) for line in
             re.findall(r'<div class="(?:heading|detail d\d)">(.*?)</div>', page)]
    told_lines = [
        "".join(s["text"] for s in line)
        for row in rows for line in [row["heading"], *(d["spans"] for d in row["details"])]]
    assert shown == told_lines
    for text in told_lines:
        assert text in printed.stdout, text
    assert '<span class="s-fence">fence</span>' in page


def test_refusals_show_those_of_the_engine_and_effects_the_fence_held_back(
        pilots: str, clock: SimulatedClock) -> None:
    with TestClient(create_app(pilots, clock=clock)) as client:
        found = client.get("/refusals", params={"format": "json"}).json()
        page = client.get("/refusals").text
        later = SimulatedClock(clock.now() + dt.timedelta(hours=5))
    assert found["total"] == 1 and [r["key"] for r in found["refusals"]] == ["p2"]
    alone = found["left_alone"]
    assert alone["total"] == 1
    assert alone["by_effect"] == [{"machine": "pilot", "effect": "terminate", "count": 1}]
    assert [(e["key"], e["effect"], e["fence"]["expect"], e["progress"]["detail"])
            for e in alone["effects"]] == [
        ("p1", "terminate", {"status": "Booting"}, "left alone: the job is Running, not "
         "Booting")]
    assert "left alone: the job is Running, not Booting" in page and "status=Booting" in page
    with TestClient(create_app(pilots, clock=later)) as client:
        earlier = client.get("/refusals", params={"format": "json"}).json()
    assert (earlier["total"], earlier["left_alone"]["total"], earlier["earlier"],
            earlier["reach_hours"]) == (0, 0, 2, 6)


def test_a_diagram_counts_the_resources_in_each_state(pilots: str,
                                                     clock: SimulatedClock) -> None:
    if not shutil.which("dot"):
        pytest.skip("Graphviz's dot is not installed")
    with TestClient(create_app(pilots, clock=clock)) as client:
        drawn = client.get("/machines/pilot/diagram")
        page = client.get("/machines/pilot").text
        with Store(pilots) as store:
            Engine(store, [PILOT], clock=clock,
                   effects={"terminate": Effect(_terminate)}).create("pilot", "p3")
        again = client.get("/machines/pilot/diagram")
    assert drawn.headers["cache-control"] == "no-cache"
    # booting (p2, whose removal was refused), then gone (p1); then p3 boots too
    assert re.findall(r">(\d+ resources?)<", drawn.text) == ["1 resource", "1 resource"]
    assert re.findall(r">(\d+ resources?)<", again.text) == ["2 resources", "1 resource"]
    # the machine's page draws it at its own size, to zoom
    assert 'id="diagram-image"' in page and 'id="zoom-fit"' in page


def test_metrics_have_prometheus_text_content_type(pilots: str) -> None:
    with TestClient(create_app(pilots)) as client:
        answer = client.get("/metrics")
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "lifecycle_risky_refusals_total" in answer.text


def test_effects_held_back_are_looked_for_among_the_newest_only(
        pilots: str, clock: SimulatedClock, monkeypatch: pytest.MonkeyPatch) -> None:
    from lifecycle.store.statements import dashboard as reads

    monkeypatch.setattr(reads, "LEFT_ALONE_SCANNED", 0)  # p1's terminate is now too old
    with TestClient(create_app(pilots, clock=clock)) as client:
        found = client.get("/refusals", params={"format": "json"}).json()
    assert (found["total"], found["left_alone"]["total"], found["left_alone"]["scanned"]) \
        == (1, 0, 0)
