"""Risky edges: observations, freshness rules, probes, refusals, redirection and fences."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asyncio_kinds import KINDS, closing, engine_of

from lifecycle import Engine, GuardContext, ProbeRequest, SimulatedClock, Store, load_spec
from lifecycle.errors import SpecError, StaleObservation
from lifecycle.freshness import HUNG_PER_PROBE

START = "2026-03-01T12:00:00Z"

# booting --release--> cleanup when the site does not run the drone, --> integrate when it
# does: the fresh answer redirects the same trigger.
DRONE: dict[str, Any] = {
    "name": "drone_lite",
    "initial": "booting",
    "final": ["down"],
    "states": ["booting", "integrate", "cleanup", "down"],
    "transitions": [
        {"trigger": "release", "source": "booting", "dest": "cleanup", "guards": ["not_running"],
         "fresh": {"max_age": 30, "probe": "site"}, "fence": {"expect_job_status": 1}},
        {"trigger": "release", "source": "booting", "dest": "integrate", "guards": ["running"],
         "fresh": {"max_age": 30, "probe": "site"}},
        {"trigger": "refresh", "source": "booting", "dest": "booting"},
        {"trigger": "booted", "source": "booting", "dest": "integrate"},
        {"trigger": "finish", "source": ["integrate", "cleanup"], "dest": "down"},
    ],
}


def running(c: GuardContext) -> bool:
    return c.status.get("resource_status") == "Running"


def not_running(c: GuardContext) -> bool:
    return not running(c)


GUARDS = {"running": running, "not_running": not_running}


def no_probe(spec: dict[str, Any]) -> dict[str, Any]:
    out = {**spec, "name": spec["name"] + "_np", "transitions": []}
    for t in spec["transitions"]:
        t = dict(t)
        if "fresh" in t:
            t["fresh"] = {"max_age": t["fresh"]["max_age"]}
        out["transitions"].append(t)
    return out


class Site:
    """A probe that answers what the test says, and counts its calls."""

    def __init__(self, status: str = "Booting") -> None:
        self.status = status
        self.calls: list[ProbeRequest] = []
        self.before_answer: Any = None

    def __call__(self, request: ProbeRequest) -> dict[str, Any]:
        self.calls.append(request)
        if self.before_answer is not None:
            hook, self.before_answer = self.before_answer, None
            hook()
        return {"resource_status": self.status}


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock(START)


@pytest.fixture
def site() -> Site:
    return Site()


@pytest.fixture(params=KINDS)
def engine(store: Store, clock: SimulatedClock, site: Site,
           request: pytest.FixtureRequest) -> Iterator[Any]:
    """The Engine, and the same engine driven as an AsyncEngine (tests/asyncio_kinds.py)."""
    engine = engine_of(request.param, store, [DRONE, no_probe(DRONE)], guards=GUARDS,
                       probes={"site": site}, clock=clock)
    yield engine
    closing(engine)()


def at(clock: SimulatedClock, seconds: float) -> dt.datetime:
    return dt.datetime.fromisoformat(START) + dt.timedelta(seconds=seconds)


def test_observation_too_old_is_refused_and_journaled(engine: Engine,
                                                       clock: SimulatedClock) -> None:
    engine.create("drone_lite_np", "d1")
    clock.advance(5)
    engine.observe("d1", {"resource_status": "Booting"}, source="pool")
    clock.advance(60)
    with pytest.raises(StaleObservation) as caught:
        engine.fire("d1", "release", actor="cobald")
    message = str(caught.value)
    assert message == (  # the message says what happened; the class says it is stale
        "drone_lite_np 'd1' edge booting->cleanup (release, fresh 30 s) "
        "needs an observation newer than its last transition at 12:00:00 and at most 30 s "
        "old; the newest observation is from 12:00:05, 60 s old (no probe is named to ask "
        "for a fresh one)")
    resource = engine.get("d1")
    assert (resource.state, resource.version, resource.seq) == ("booting", 1, 2)
    refusal = engine.history("d1")[-1]
    assert (refusal.kind, refusal.trigger, refusal.source, refusal.dest, refusal.version,
            refusal.actor) == ("refusal", "release", "booting", "cleanup", 1, "cobald")
    assert refusal.observation is not None
    assert refusal.observation.status == {"resource_status": "Booting"}
    # the guards were asked first, on the held observation; then the freshness rule
    assert refusal.guards == {"not_running": True, "fresh": False, "running": False}
    assert engine.verify() == []


def test_observation_older_than_the_last_transition_is_refused(engine: Engine,
                                                               clock: SimulatedClock) -> None:
    engine.create("drone_lite_np", "d1")
    clock.advance(10)
    engine.fire("d1", "refresh")  # the last transition is now at 12:00:10
    clock.advance(1)
    # the pool's cached status, true at 12:00:08: before the last transition
    engine.observe("d1", {"resource_status": "Booting"}, at(clock, 8))
    result = engine.fire("d1", "release", on_stale="return")
    assert not result.fired and result.error == "StaleObservation"
    assert ("the newest observation is from 12:00:08, before the last transition at "
            "12:00:10") in (result.reason or "")


def test_fresh_observation_fires_with_a_fence(engine: Engine, clock: SimulatedClock,
                                              site: Site) -> None:
    engine.create("drone_lite", "d1")
    clock.advance(5)
    seen = engine.observe("d1", {"resource_status": "Booting"}, source="squeue")
    clock.advance(20)
    result = engine.fire("d1", "release")
    assert (result.fired, result.dest, result.probed) == (True, "cleanup", False)
    assert site.calls == []  # fresh enough: no probe
    assert result.fence == {
        "observation_id": seen.id, "observed_at": at(clock, 5).isoformat(),
        "source": "squeue", "status": {"resource_status": "Booting"},
        "expect": {"expect_job_status": 1}}
    entry = engine.history("d1")[-1]
    assert entry.observation == seen and entry.fence == result.fence
    assert entry.guards == {"fresh": True, "not_running": True}


def test_fresh_running_redirects_to_integrate(engine: Engine, clock: SimulatedClock) -> None:
    engine.create("drone_lite", "d1")
    clock.advance(5)
    seen = engine.observe("d1", {"resource_status": "Running"})
    result = engine.fire("d1", "release")
    assert (result.dest, result.fence["expect"]) == (  # type: ignore[index]
        "integrate", {"resource_status": "Running"})
    assert result.fence["observation_id"] == seen.id  # type: ignore[index]


def test_probe_is_called_once_when_needed(engine: Engine, clock: SimulatedClock,
                                          site: Site) -> None:
    engine.create("drone_lite", "d1")
    clock.advance(5)
    engine.observe("d1", {"resource_status": "Booting"})
    clock.advance(100)  # the held Booting is too old
    site.status = "Running"  # ... and the payload has started meanwhile
    result = engine.fire("d1", "release")
    assert (result.fired, result.dest, result.probed) == (True, "integrate", True)
    assert len(site.calls) == 1
    assert (site.calls[0].key, site.calls[0].state, site.calls[0].version) == ("d1", "booting", 1)
    newest = engine.get("d1").observation
    assert newest is not None and (newest.source, newest.status) == (
        "site", {"resource_status": "Running"})
    assert newest.observed_at == clock.now()
    assert engine.history("d1")[-1].observation == newest


def test_probe_answer_with_its_own_time(store: Store, clock: SimulatedClock) -> None:
    stale_answer = {"resource_status": "Booting"}

    def cached_site(request: ProbeRequest) -> tuple[dict[str, Any], dt.datetime]:
        return stale_answer, at(clock, -5)  # the site's own cache predates the drone

    engine = Engine(store, [DRONE], guards=GUARDS, probes={"site": cached_site}, clock=clock)
    engine.create("drone_lite", "d1")
    clock.advance(1)
    with pytest.raises(StaleObservation, match="the probe's answer was not fresh either"):
        engine.fire("d1", "release")


def test_probe_timeout_refuses(store: Store, clock: SimulatedClock) -> None:
    release, answered = threading.Event(), threading.Event()

    def hanging(request: ProbeRequest) -> dict[str, Any]:
        release.wait(300)
        answered.set()
        return {"resource_status": "Running"}

    engine = Engine(store, [DRONE], guards=GUARDS, probes={"site": hanging}, clock=clock,
                    probe_timeout=0.2)
    engine.create("drone_lite", "d1")
    try:
        with pytest.raises(StaleObservation, match=r"there is no observation \(probe site "
                                                   r"timed out after 0.2 s\)"):
            engine.fire("d1", "release")
        assert not answered.is_set()  # refused without waiting for the hung probe
    finally:
        release.set()
    assert [e.kind for e in engine.history("d1")] == ["create", "refusal"]
    assert engine.get("d1").state == "booting"


def test_probe_exception_refuses(store: Store, clock: SimulatedClock) -> None:
    def broken(request: ProbeRequest) -> dict[str, Any]:
        raise ConnectionError("squeue: Unable to contact slurm controller")

    engine = Engine(store, [DRONE], guards=GUARDS, probes={"site": broken}, clock=clock)
    engine.create("drone_lite", "d1")
    with pytest.raises(StaleObservation) as caught:
        engine.fire("d1", "release")
    assert caught.value.probe_error == (
        "probe site failed: ConnectionError: squeue: Unable to contact slurm controller")
    assert (caught.value.source, caught.value.dest) == ("booting", "cleanup")


def test_out_of_order_observations(engine: Engine, clock: SimulatedClock) -> None:
    engine.create("drone_lite", "d1")
    clock.advance(10)
    running_now = engine.observe("d1", {"resource_status": "Running"}, at(clock, 10))
    late = engine.observe("d1", {"resource_status": "Booting"}, at(clock, 8))
    assert engine.get("d1").observation == running_now
    assert engine.observations("d1") == [running_now, late]
    # a future time is taken as now, never as a promise of freshness
    clock.advance(1)
    ahead = engine.observe("d1", {"resource_status": "Running"}, at(clock, 3600))
    assert ahead.observed_at == clock.now()


def test_a_transition_during_the_probe_makes_it_decide_again(
        engine: Engine, store: Store, clock: SimulatedClock, site: Site) -> None:
    engine.create("drone_lite", "d1")
    other = Engine(Store(store.url), [DRONE], guards=GUARDS, probes={"site": Site()},
                   clock=clock)

    def meanwhile() -> None:  # another process acts on the drone while the probe runs
        clock.advance(1)
        other.fire("d1", "refresh")

    site.before_answer = meanwhile
    clock.advance(100)
    result = engine.fire("d1", "release")
    # the first answer predates the refresh: the engine probed again, on the new version
    assert len(site.calls) == 2
    assert [c.version for c in site.calls] == [1, 2]
    assert (result.fired, result.source, result.dest, result.version) == (
        True, "booting", "cleanup", 3)
    entries = engine.history("d1")
    assert [(e.kind, e.trigger) for e in entries] == [
        ("create", None), ("transition", "refresh"), ("transition", "release")]
    assert entries[-1].observation is not None
    assert entries[-1].observation.observed_at >= entries[1].at
    assert entries[-1].observation.id == engine.observations("d1")[-1].id == 2


def test_a_transition_during_the_probe_can_remove_the_edge(
        engine: Engine, store: Store, clock: SimulatedClock, site: Site) -> None:
    engine.create("drone_lite", "d1")
    other = Engine(Store(store.url), [DRONE], guards=GUARDS, probes={"site": Site()},
                   clock=clock)
    site.before_answer = lambda: other.fire("d1", "booted")
    result = engine.fire("d1", "release")
    assert not result.fired
    assert result.reason == ("no transition for 'release' from 'integrate' (triggers here: "
                             "finish)")
    assert [e.trigger for e in engine.history("d1")] == [None, "booted"]


def test_an_observation_arriving_between_decision_and_commit(postgres_url: str) -> None:
    """On PostgreSQL a risky decision commits only if it rested on the newest observation."""
    clock = SimulatedClock(START)
    store = Store(postgres_url, upgrade=True)
    other = Engine(Store(postgres_url), [DRONE], guards=GUARDS, probes={"site": Site()},
                   clock=clock)
    arrived: list[int] = []

    def not_running_but_racy(c: GuardContext) -> bool:
        if not arrived:  # a status report commits while this decision is being taken
            arrived.append(other.observe("d1", {"resource_status": "Running"}).id)
        return not running(c)

    engine = Engine(store, [DRONE], guards={**GUARDS, "not_running": not_running_but_racy},
                    probes={"site": Site()}, clock=clock)
    engine.create("drone_lite", "d1")
    clock.advance(1)
    engine.observe("d1", {"resource_status": "Booting"})
    clock.advance(1)
    result = engine.fire("d1", "release")
    assert result.dest == "integrate"
    assert result.fence is not None and result.fence["observation_id"] == arrived[0]


def test_an_observation_superseded_between_read_and_write_is_refused_when_decided_again(
        postgres_url: str) -> None:
    """The write of a risky edge is sent after its read (pipelined, one round trip later),
    conditional on the observation it was decided on: one superseded in between writes
    nothing; decided again, the edge is refused on the new one (too old by then) and the
    refusal is journaled with it."""
    clock = SimulatedClock(START)
    spec = no_probe(DRONE)
    with Store(postgres_url, upgrade=True) as store, Store(postgres_url) as elsewhere:
        other = Engine(elsewhere, [spec], guards=GUARDS, clock=clock)
        arrived: list[int] = []

        def not_running_but_superseded(c: GuardContext) -> bool:
            if not arrived:  # after the read: a report of the same moment, then time passes
                arrived.append(other.observe("d1", {"resource_status": "Booting"},
                                             observed_at=c.observation.observed_at).id)
                clock.advance(60)
            return not running(c)

        engine = Engine(store, [spec], clock=clock,
                        guards={**GUARDS, "not_running": not_running_but_superseded})
        engine.create("drone_lite_np", "d1")
        clock.advance(1)
        first = engine.observe("d1", {"resource_status": "Booting"})
        clock.advance(1)
        with pytest.raises(StaleObservation):
            engine.fire("d1", "release")
        history = engine.history("d1")
        assert [(e.kind, e.trigger) for e in history] == [("create", None),
                                                         ("refusal", "release")]
        assert history[-1].observation is not None
        assert history[-1].observation.id == arrived[0] != first.id
        assert engine.get("d1").state == "booting"


def test_fence_needs_a_freshness_rule() -> None:
    spec = {**DRONE, "transitions": [*DRONE["transitions"],
                                     {"trigger": "kill", "source": "integrate", "dest": "down",
                                      "fence": {"expect_job_status": 2}}]}
    with pytest.raises(SpecError, match=r"transitions\[5\]\.fence: a fence needs a freshness"):
        load_spec(spec)


def test_unregistered_probe_is_named(store: Store) -> None:
    with pytest.raises(SpecError, match="probe 'site' is not registered with this engine"):
        Engine(store, [DRONE], guards=GUARDS)


def test_no_probe_when_the_guards_would_not_let_the_edge_fire(engine: Engine,
                                                            clock: SimulatedClock,
                                                            site: Site) -> None:
    """A stale observation on which the risky edge's guards fail costs no probe: the edge
    is held back, which is safe; only an edge that could fire needs a fresh answer."""
    spec_guarded = {**DRONE, "name": "gated", "transitions": [
        {"trigger": "release", "source": "booting", "dest": "cleanup",
         "guards": ["not_running", "no_demand"], "fresh": {"max_age": 30, "probe": "site"}},
        {"trigger": "release", "source": "booting", "dest": "booting"},
        {"trigger": "finish", "source": "cleanup", "dest": "down"},
        {"trigger": "booted", "source": "booting", "dest": "integrate"},
        {"trigger": "finish", "source": "integrate", "dest": "down"}]}
    engine.guards["no_demand"] = lambda c: c.data.get("demand") == 0
    engine.register(spec_guarded)
    engine.create("gated", "g1", {"demand": 1})
    clock.advance(100)
    result = engine.fire("g1", "release")  # demand is 1: the risky edge cannot fire
    assert (result.dest, result.probed, site.calls) == ("booting", False, [])
    engine.update("g1", {"demand": 0})
    clock.advance(1)
    result = engine.fire("g1", "release")  # now it could: a fresh answer is needed
    assert (result.dest, result.probed, len(site.calls)) == ("cleanup", True, 1)


def probed_by(probe: str) -> dict[str, Any]:
    """DRONE, asking ``probe`` instead of ``site``."""
    out = {**DRONE, "name": f"drone_{probe}", "transitions": []}
    for t in DRONE["transitions"]:
        t = dict(t)
        if "fresh" in t:
            t["fresh"] = {**t["fresh"], "probe": probe}
        out["transitions"].append(t)
    return out


def test_hung_probes_cost_their_own_decisions_only(store: Store, clock: SimulatedClock) -> None:
    """Ten calls of one probe hang past their timeout (the last ones refused at once as
    saturated); another probe is still asked, and the
    healthy resource's risky edge fires on its answer."""
    release = threading.Event()

    def stuck(request: ProbeRequest) -> dict[str, Any]:
        release.wait(30)
        return {"resource_status": "Booting"}

    engine = Engine(store, [DRONE, probed_by("stuck")], guards=GUARDS, clock=clock,
                    probes={"site": Site("Running"), "stuck": stuck}, probe_timeout=0.05)
    try:
        for i in range(10):
            engine.create("drone_stuck", f"hung{i}")
            result = engine.fire(f"hung{i}", "release", on_stale="return")
            reason = result.reason or ""
            assert result.error == "StaleObservation", reason
            assert ("timed out" if i < HUNG_PER_PROBE else "is saturated") in reason, reason
        engine.create("drone_lite", "healthy")
        result = engine.fire("healthy", "release")
        assert (result.fired, result.dest, result.probed) == (True, "integrate", True)
    finally:
        release.set()


def test_a_probe_whose_calls_all_hang_is_refused_as_saturated(store: Store,
                                                              clock: SimulatedClock) -> None:
    release = threading.Event()
    calls: list[str] = []

    def stuck(request: ProbeRequest) -> dict[str, Any]:
        calls.append(request.key)
        release.wait(30)
        return {"resource_status": "Booting"}

    engine = Engine(store, [probed_by("saturating")], guards=GUARDS, clock=clock,
                    probes={"saturating": stuck}, probe_timeout=0.05)
    try:
        for i in range(HUNG_PER_PROBE + 1):
            engine.create("drone_saturating", f"d{i}")
        for i in range(HUNG_PER_PROBE):
            engine.fire(f"d{i}", "release", on_stale="return")
        with pytest.raises(StaleObservation, match=f"probe saturating is saturated: "
                                                   f"{HUNG_PER_PROBE} earlier calls"):
            engine.fire(f"d{HUNG_PER_PROBE}", "release")
        assert len(calls) == HUNG_PER_PROBE  # the last one was not asked at all
    finally:
        release.set()
    deadline = time.monotonic() + 30
    from lifecycle import freshness

    while freshness._hung.get("saturating"):  # the hung calls return, and the count with them
        assert time.monotonic() < deadline
        time.sleep(0.01)
    clock.advance(1)
    engine.fire(f"d{HUNG_PER_PROBE}", "release", on_stale="return")
    assert calls[-1] == f"d{HUNG_PER_PROBE}"  # asked again once the probe recovered


def test_an_engine_that_is_not_strict_runs_a_spec_without_its_probe(
        store: Store, clock: SimulatedClock) -> None:
    with pytest.raises(SpecError, match="probe 'site' is not registered with this engine"):
        Engine(store, [DRONE], guards=GUARDS, clock=clock)
    engine = Engine(store, [DRONE], guards=GUARDS, clock=clock, strict=False)
    engine.create("drone_lite", "d1")
    with pytest.raises(StaleObservation, match=r"\(probe 'site' is not registered with this "
                                               r"engine, so none was asked\)"):
        engine.fire("d1", "release")
    engine.observe("d1", {"resource_status": "Running"})
    assert engine.fire("d1", "release").dest == "integrate"  # a fresh status is enough
    with pytest.raises(SpecError, match="guard 'running' is not registered"):
        Engine(store, [DRONE], clock=clock, strict=False)  # guards it still needs


def test_probed_says_a_probe_ran_when_its_answer_made_the_guard_false(
        store: Store, clock: SimulatedClock, site: Site) -> None:
    """The held Booting lets `remove` through but is too old: the probe is asked, answers
    Running, and the guard is false. Nothing fired, and the result says the probe ran."""
    spec = {"name": "remover", "initial": "booting", "states": ["booting", "gone"],
            "final": ["gone"],
            "transitions": [{"trigger": "remove", "source": "booting", "dest": "gone",
                             "guards": ["not_running"],
                             "fresh": {"max_age": 30, "probe": "site"}}]}
    engine = Engine(store, [spec], guards=GUARDS, probes={"site": site}, clock=clock)
    engine.create("remover", "r1")
    engine.observe("r1", {"resource_status": "Booting"})
    clock.advance(100)
    site.status = "Running"
    result = engine.fire("r1", "remove")
    assert (result.fired, result.probed, len(site.calls)) == (False, True, 1)
    assert "not_running" in (result.reason or "")
