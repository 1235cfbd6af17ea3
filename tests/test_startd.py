"""The startd machine: every transition of the manual (the table in
tests/scenarios/startd/transitions.md), the claim rules, work fetch, and hooks run as real
executables."""

from __future__ import annotations

import json
import logging
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from lifecycle import Engine, SimulatedClock, Store, Worker
from lifecycle.adapters.startd_hooks import (
    HookFailed,
    Hooks,
    RecordingCollector,
    RecordingSchedds,
    old_syntax,
    parse_job_ad,
)
from lifecycle.machines import startd as sd
from lifecycle.machines import startd_policy
from lifecycle.machines.startd_claims import ClaimIds, public_form
from lifecycle.scenario import World

TABLE = Path(__file__).parent / "scenarios" / "startd" / "transitions.md"
ADDRESS = "10.0.0.1:9618"
KEY = "startd:slot1"


def rows() -> list[dict[str, Any]]:
    found = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("ref", "---"):
            continue
        ref, source, policy, event, payload, dest, advertised = cells
        found.append({"ref": ref, "from": source, "policy": json.loads(policy),
                      "event": event, "payload": json.loads(payload), "to": dest,
                      "advertised": advertised})
    return found


ROWS = rows()


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Store]:
    """A store on SQLite alone, for the tests of the machine's own rules (its transitions,
    its claims under random lives): what they check is decided by the spec, its guards and
    its data model, the same on either database. The engine's transactions, its effects and
    its documents on PostgreSQL are tests/test_engine.py's, test_effects.py's and
    test_reads.py's; here the tests that read the stored rows or run workers and hooks keep
    ``store`` (both databases)."""
    store = Store(sqlite_url)
    try:
        yield store
    finally:
        store.dispose()


class Slot:
    """One slot on a fresh engine, with the simulated adapters of scenario files."""

    def __init__(self, store: Store, keep: bool = True, cycle: str = "today") -> None:
        self.clock = SimulatedClock("2026-01-01T00:00:00Z")
        self.world = World(clock=self.clock)
        self.collector, self.schedds = RecordingCollector(), RecordingSchedds()
        self.ids = ClaimIds()
        self.engine = Engine(store, [sd.SPEC], guards=sd.GUARDS, clock=self.clock,
                             effects=sd.effects(sd.ScenarioHooks(world=self.world),
                                                self.collector, self.schedds, self.ids))
        self.startd = sd.Startd(self.engine, address=ADDRESS, ids=self.ids)
        self.startd.add_slot("slot1", hook_keyword="FETCH", keep_advertised_claim=keep,
                             fetch_cycle=cycle)

    @property
    def data(self) -> dict[str, Any]:
        return self.engine.get(KEY).data

    @property
    def state(self) -> str:
        return self.engine.get(KEY).state

    def claim(self, role: str) -> str:
        claim = self.data["claims"][role]
        assert claim is not None, f"no {role} claim in {self.state}"
        return str(claim["id"])

    def policy(self, **entries: Any) -> None:
        self.engine.update(KEY, {"policy": entries})

    def fire(self, trigger: str, payload: dict[str, Any] | None = None, *,
             to: str | None = None) -> Any:
        result = self.engine.fire(KEY, trigger, payload or {})
        if to is not None:
            assert result.dest == to, (trigger, result.reason, self.state)
        return result

    def request(self, rank: float, requester: str = "schedd-a", to: str | None = None) -> Any:
        return self.fire("request_claim", {"claim_id": self.data["advertised_claim_id"],
                                           "requester": requester, "rank": rank}, to=to)


def reach(slot: Slot, where: str) -> None:
    """Bring the slot to ``where`` (a state, or ``state/how``) by the machine's own edges."""
    state, _, how = where.partition("/")
    job = {"Cmd": "/bin/true"}
    paths = {
        "owner.idle": lambda: None,
        "unclaimed.idle": lambda: slot.fire("evaluate", to="unclaimed.idle"),
        "unclaimed.benchmarking": lambda: (
            reach(slot, "unclaimed.idle"), slot.policy(RUNBENCHMARKS=True),
            slot.fire("run_benchmarks", to=state)),
        "matched.idle": lambda: (
            reach(slot, "unclaimed.idle"),
            slot.fire("match", {"claim_id": slot.claim("cur")}, to=state)),
        "claimed.idle": lambda: (reach(slot, "unclaimed.idle"), slot.request(1, to=state)),
        "claimed.busy": lambda: (
            reach(slot, "claimed.idle"),
            slot.fire("activate", {"claim_id": slot.claim("cur"), "job": job}, to=state)),
        "claimed.retiring": lambda: (
            reach(slot, "claimed.busy"), slot.request(2, "schedd-b", to=state)),
        "claimed.suspended": lambda: (
            reach(slot, "claimed.retiring" if how == "retiring" else "claimed.busy"),
            slot.policy(WANT_SUSPEND=True, SUSPEND=True, CONTINUE=False),
            slot.fire("evaluate", to=state)),
        "preempting.vacating": lambda: (
            reach(slot, "claimed.idle"),
            slot.request(2, "schedd-b", to=state) if how == "claim"
            else slot.fire("vacate", to=state)),
        "preempting.killing": lambda: (
            reach(slot, f"preempting.vacating/{how}"), slot.fire("vacate_timeout", to=state)),
        "backfill.idle": lambda: (
            reach(slot, "unclaimed.idle"), slot.policy(START_BACKFILL=True),
            slot.fire("backfill", to=state)),
        "backfill.busy": lambda: (reach(slot, "backfill.idle"),
                                  slot.fire("backfill_started", to=state)),
        "backfill.killing": lambda: (
            reach(slot, "backfill.busy"),
            slot.fire("vacate", to=state) if not how
            else slot.fire("match", {"claim_id": slot.claim("cur")}, to=state) if how == "match"
            else slot.request(1, to=state) if how == "claim"
            else slot.fire("fetched_work", {"job": job}, to=state)),
        "claimed.cleaning": lambda: (
            reach(slot, "claimed.busy"), slot.fire("job_done", to=state),
            slot.fire("release_claim", {"claim_id": slot.claim("cur")}, to=state)
            if how == "released" else None),
        "drained.retiring": lambda: slot.fire("drain", to=state),
        "drained.idle": lambda: (reach(slot, "drained.retiring"),
                                 slot.fire("all_drained", to=state)),
    }
    if state == "claimed.busy" and how in ("fetch", "seed", "report"):
        slot.fire("fetched_work", {"job": job}, to=state)
    elif state == "claimed.idle" and how == "fetched":
        reach(slot, "claimed.busy/fetch")
        slot.fire("job_done", to="claimed.cleaning")
        slot.fire("starter_exited", to=state)
    elif state == "preempting.vacating" and how == "fetch":
        reach(slot, "claimed.idle")
        slot.policy(RANK="TARGET.Prio")
        slot.fire("fetched_work", {"job": {"Prio": 5}}, to=state)
    else:
        paths[state]()
    assert slot.state == state


def _resolved(payload: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    claims = before["claims"]
    names = {"$advertised": before["advertised_claim_id"],
             "$cur": (claims["cur"] or {}).get("id"), "$pre": (claims["pre"] or {}).get("id")}
    return {k: names.get(v, v) if isinstance(v, str) else v for k, v in payload.items()
            if k != "_advance"}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['ref']}:{r['from']}:{r['event']}"
                                           for r in ROWS])
def test_every_transition_of_the_manual(sqlite_store: Store, row: dict[str, Any]) -> None:
    how = row["from"].partition("/")[2]
    slot = Slot(sqlite_store, keep=how != "seed", cycle="report" if how in ("seed", "report")
                else "today")
    reach(slot, row["from"])
    slot.engine.update(KEY, {"policy": row["policy"]})
    before = slot.data
    seen = {c["id"] for c in before["claims"].values() if c} | {before["advertised_claim_id"]}
    slot.clock.advance(float(row["payload"].get("_advance", 1)))
    result = slot.engine.fire(KEY, row["event"], _resolved(row["payload"], before))
    assert result.dest == row["to"], (result.reason, result.guards)
    # the edge taken carries the row's ref (a rejected fetch stays, on an edge without one)
    graph = sd.SPEC.graph
    taken = [t for t in sd.SPEC.transitions if t.trigger == row["event"]
             and result.source in graph.covered_leaves(t.sources)
             and graph.enter(t.dest) == result.dest]
    wanted = {part.strip() for part in row["ref"].split(",")}
    assert any(wanted <= {p.strip() for p in (t.ref or "fetch").split(",")} for t in taken)
    after = slot.data["advertised_claim_id"]
    expected = row["advertised"]
    if expected == "same":
        assert after == before["advertised_claim_id"]
    elif expected == "new":
        assert after not in seen
    else:
        assert after == before["claims"][expected]["id"]
    assert after.endswith("#...") and re.fullmatch(rf"<{ADDRESS}>#\d+#\d+#\.\.\.", after)


def test_the_table_and_the_spec_carry_every_letter_and_number() -> None:
    wanted = {*"ABCDEFGHIJKLMNOP", *(str(n) for n in range(1, 38))}

    def refs(texts: list[str]) -> set[str]:
        return {part.strip() for text in texts for part in text.split(",")}

    in_spec = refs([t.ref for t in sd.SPEC.transitions if t.ref])
    in_table = refs([r["ref"] for r in ROWS])
    assert wanted <= in_spec, sorted(wanted - in_spec)
    assert wanted <= in_table, sorted(wanted - in_table)


def test_the_manual_s_contradictions_follow_its_text() -> None:
    by_ref = {t.ref: t for t in sd.SPEC.transitions if t.trigger == "vacated"}
    assert (by_ref["J, 22"].source, by_ref["J, 22"].dest) == ("preempting.vacating",
                                                              "owner.idle")
    assert by_ref["I, 23"].source == "preempting.vacating"
    assert by_ref["I, 24"].source == "preempting.killing"
    assert by_ref["J, 25"].source == "preempting.killing"
    [all_drained] = [t for t in sd.SPEC.transitions if t.trigger == "all_drained"]
    assert all_drained.ref == "33"
    assert "22/23 leave Vacating" in (sd.__doc__ or "")


# -- the claim rules ---------------------------------------------------------------------------


def test_right_id_claims_and_only_the_public_form_is_kept(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "unclaimed.idle")
    full = slot.startd.advertised("slot1")
    assert public_form(full) == slot.data["advertised_claim_id"] != full
    slot.startd.request_claim("slot1", full, requester="schedd-a", rank=1)
    assert slot.state == "claimed.idle"
    cookie = full.rsplit("#", 1)[1]
    history = json.dumps([e.payload for e in slot.engine.history(KEY)], default=str)
    assert cookie not in json.dumps(slot.data) and cookie not in history
    assert public_form(full) in history


def test_wrong_id_is_refused_naming_the_expected_id(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "unclaimed.idle")
    full = slot.startd.advertised("slot1")
    forged = full[:-4] + "0000"
    with pytest.raises(sd.ClaimRefused) as refused:
        slot.startd.request_claim("slot1", forged, requester="mallory", rank=9)
    assert "secret part" in str(refused.value)
    assert refused.value.expected == slot.data["advertised_claim_id"]
    assert forged.rsplit("#", 1)[1] not in str(refused.value)
    other = sd.ClaimIds().full("slot1", slot.data["advertised_claim_id"])
    with pytest.raises(sd.ClaimRefused, match="secret part"):
        slot.startd.request_claim("slot1", other, requester="mallory")
    assert slot.state == "unclaimed.idle"


def test_a_stale_id_is_refused_as_stale(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "unclaimed.idle")
    old = slot.startd.advertised("slot1")
    slot.policy(IS_OWNER=True)
    slot.fire("evaluate", to="owner.idle")  # entering Owner makes a fresh claim
    slot.policy()
    slot.fire("evaluate", to="unclaimed.idle")
    with pytest.raises(sd.ClaimRefused) as refused:
        slot.startd.request_claim("slot1", old, requester="schedd-a")
    message = str(refused.value)
    assert "stale" in message and public_form(old) in message
    assert slot.data["advertised_claim_id"] in message
    slot.startd.request_claim("slot1", slot.startd.advertised("slot1"), requester="schedd-a")
    assert slot.state == "claimed.idle"


def test_the_current_claim_s_id_cannot_preempt(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")
    with pytest.raises(sd.ClaimRefused, match="current claim, which is in use"):
        slot.startd.request_claim("slot1", slot.ids.full("slot1", slot.claim("cur")),
                                  requester="schedd-b", rank=5)
    assert slot.state == "claimed.busy"


def test_rank_below_the_current_claim_is_refused(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")  # current claim at rank 1
    with pytest.raises(sd.ClaimRefused, match="rank is below"):
        slot.startd.request_claim("slot1", slot.startd.advertised("slot1"),
                                  requester="schedd-b", rank=0.5)
    slot.startd.request_claim("slot1", slot.startd.advertised("slot1"), requester="schedd-b",
                              rank=1)
    assert slot.state == "claimed.retiring"


def test_pre_preempting_replaces_preempting_when_ranked_as_high(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.retiring")  # schedd-b's request (rank 2) waits in pre
    pre, pre_pre = slot.claim("pre"), slot.claim("pre_pre")
    assert slot.data["advertised_claim_id"] == pre_pre
    with pytest.raises(sd.ClaimRefused, match="rank is below"):
        slot.startd.request_claim("slot1", slot.ids.full("slot1", pre_pre),
                                  requester="schedd-c", rank=1.5)
    slot.startd.request_claim("slot1", slot.ids.full("slot1", pre_pre), requester="schedd-c",
                              rank=2)
    claims = slot.data["claims"]
    assert (claims["pre"]["id"], claims["pre"]["requester"]) == (pre_pre, "schedd-c")
    assert claims["pre_pre"]["id"] not in (pre, pre_pre)
    assert slot.data["advertised_claim_id"] == claims["pre_pre"]["id"]
    assert slot.state == "claimed.retiring"
    # the job finishes; the preempting claim (schedd-c's) becomes current
    slot.fire("starter_exited", to="preempting.vacating")
    Worker(slot.engine).run_until_idle()
    assert slot.state == "claimed.idle"
    assert slot.data["claims"]["cur"]["requester"] == "schedd-c"
    assert slot.schedds.released == [("schedd-a", slot.ids.full("slot1", claims["cur"]["id"]))]


def test_lease_expiry_needs_the_lease_to_have_run_out(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")
    cur = slot.claim("cur")
    slot.clock.advance(2000)
    assert not slot.fire("lease_expired", {"claim_id": cur}).fired
    slot.fire("keep_alive", {"claim_id": cur}, to="claimed.busy")
    slot.clock.advance(2000)  # 4000 s since the claim, 2000 since the keep-alive
    assert not slot.fire("lease_expired", {"claim_id": cur}).fired
    slot.clock.advance(401)
    slot.fire("lease_expired", {"claim_id": cur}, to="preempting.vacating")


def test_the_match_timeout_is_a_timer(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "matched.idle")
    stale = slot.data["advertised_claim_id"]
    worker = Worker(slot.engine)
    slot.clock.advance(119)
    worker.run_until_idle()
    assert slot.state == "matched.idle"
    slot.clock.advance(2)
    worker.run_until_idle()
    assert slot.state == "owner.idle"
    assert slot.data["advertised_claim_id"] != stale


# -- work fetch --------------------------------------------------------------------------------


def test_fetch_waits_for_its_delay_and_for_the_running_fetch(store: Store) -> None:
    slot = Slot(store)
    slot.fire("fetch", to="owner.idle")
    assert slot.data["fetching"]
    assert not slot.fire("fetch").fired  # one fetch at a time
    slot.fire("fetched_work", {"job": None}, to="owner.idle")
    assert not slot.fire("fetch").fired  # FetchWorkDelay (300 s) not passed
    slot.clock.advance(300)
    slot.fire("fetch", to="owner.idle")


def _job_done(slot: Slot) -> None:
    """The starter's final update, then the starter reaped: Cleaning, then Claimed/Idle."""
    slot.fire("job_done", to="claimed.cleaning")
    slot.fire("starter_exited", to="claimed.idle")


def test_fetched_work_rules(store: Store) -> None:
    slot = Slot(store)
    slot.policy(START="TARGET.Owner == \"alice\"")
    slot.fire("fetched_work", {"job": {"Owner": "bob"}}, to="owner.idle")  # not willing
    slot.fire("fetched_work", {"job": {"Owner": "alice"}}, to="claimed.busy")
    assert slot.data["claims"]["cur"]["type"] == "fetch"
    # the advertised claim was parked, not destroyed, and comes back on return to Owner
    advertised = slot.data["advertised_claim_id"]
    assert slot.claim("pre") == advertised
    _job_done(slot)  # today's startd: the fetch claim stays, idle, and fetches again
    slot.fire("fetched_work", {"job": {"Owner": "alice"}}, to="claimed.busy")
    assert slot.data["claims"]["cur"]["activations"] == 2
    _job_done(slot)
    slot.fire("fetched_work", {"job": None}, to="preempting.vacating")  # no work: evicted
    assert slot.data["advertised_claim_id"] == advertised
    slot.fire("vacated", to="owner.idle")
    assert slot.data["advertised_claim_id"] == advertised == slot.claim("cur")


def test_unreadable_fetch_output_does_not_evict_the_idle_fetch_claim(store: Store) -> None:
    """FetchClient::hookExited drops a reply it cannot read without judging it; only no
    work (or work the slot will not run) evicts an idle fetch claim."""
    slot = Slot(store)
    slot.fire("fetched_work", {"job": {"Cmd": "/bin/true"}}, to="claimed.busy")
    _job_done(slot)
    slot.fire("fetched_work", {"job": None, "unreadable": True}, to="claimed.idle")
    slot.policy(START="TARGET.Owner == \"alice\"")
    slot.fire("fetched_work", {"job": {"Owner": "bob"}}, to="preempting.vacating")


@pytest.mark.parametrize("cycle", ["today", "report"])
def test_the_incidents_startd_throws_the_advertised_claim_away(store: Store, cycle: str) -> None:
    """Without option C, the report's cycle makes a new id at every step, so a schedd never
    catches one; today's keeps the id the slot advertised on entering Claimed for as long
    as fetched jobs follow one another."""
    slot = Slot(store, keep=False, cycle=cycle)
    advertised = {slot.data["advertised_claim_id"]}
    for _ in range(3):
        slot.fire("fetched_work", {"job": {"Cmd": "/bin/true"}}, to="claimed.busy")
        advertised.add(slot.data["advertised_claim_id"])
        if cycle == "report":
            slot.fire("starter_exited", to="owner.idle")
        else:
            _job_done(slot)
        advertised.add(slot.data["advertised_claim_id"])
    assert len(advertised) == (7 if cycle == "report" else 2)


# -- today's startd: Cleaning, CLAIM_WORKLIFE, draining, shutdown, conditions ------------------


def test_a_release_while_cleaning_is_kept_for_the_reaping(store: Store) -> None:
    """Resource::release_claim in Claimed/Cleaning: no state change, but the reaped starter
    leads to Preempting instead of Idle; with nothing remembered it leads to Idle (12a)."""
    slot = Slot(store)
    reach(slot, "claimed.busy")
    cur = slot.claim("cur")
    slot.fire("job_done", to="claimed.cleaning")
    slot.fire("release_claim", {"claim_id": cur}, to="claimed.cleaning")
    slot.fire("evaluate")
    slot.fire("fetch")   # no fetch while cleaning
    assert slot.state == "claimed.cleaning" and not slot.data["fetching"]
    slot.fire("starter_exited", to="preempting.vacating")
    assert not slot.data["preempt_pending"]
    Worker(slot.engine).run_until_idle()    # RELEASE_CLAIM to the schedd, then vacated
    assert slot.state == "owner.idle"
    assert slot.schedds.released == [("schedd-a", slot.ids.full("slot1", cur))]


def test_claim_worklife_ends_an_idle_claim_that_ran_a_job(store: Store) -> None:
    slot = Slot(store)
    slot.engine.update(KEY, {"claim_worklife": 600})
    reach(slot, "claimed.idle")
    slot.clock.advance(700)
    assert not slot.fire("evaluate").fired  # no job yet: activationCount is 0
    cur = slot.claim("cur")
    slot.fire("activate", {"claim_id": cur, "job": {"Cmd": "/bin/true"}}, to="claimed.busy")
    _job_done(slot)
    assert not slot.fire("activate", {"claim_id": cur, "job": {"Cmd": "/bin/true"}}).fired
    slot.fire("evaluate", to="preempting.vacating")


def test_a_graceful_drain_retires_a_running_job_for_good(store: Store) -> None:
    """releaseAllClaimsReversibly: the job retires; a preempting claim that goes away does
    not un-retire it while draining; once the claim is gone the slot is Drained."""
    slot = Slot(store)
    reach(slot, "claimed.retiring")
    slot.fire("drain", to="claimed.retiring")
    assert not slot.fire("release_claim", {"claim_id": slot.claim("pre")}).fired
    slot.fire("job_done", to="claimed.cleaning")
    slot.fire("starter_exited", to="preempting.vacating")  # the preempting claim waits
    slot.fire("vacated", to="claimed.idle")
    slot.fire("evaluate", to="preempting.vacating")         # draining: the idle claim goes
    slot.fire("vacated", to="owner.idle")
    slot.fire("evaluate", to="drained.retiring")            # 36
    slot.fire("drain_cancel", to="owner.idle")
    slot.fire("evaluate", to="unclaimed.idle")


def test_after_a_shutdown_the_slot_takes_no_claim_match_or_work(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")
    slot.fire("shutdown", to="claimed.retiring")
    slot.fire("shutdown", {"how": "fast"}, to="preempting.killing")
    slot.fire("vacated", to="owner.idle")
    slot.fire("evaluate", to="unclaimed.idle")
    assert not slot.fire("match", {"claim_id": slot.claim("cur")}).fired
    assert not slot.request(1).fired
    assert not slot.fire("fetch").fired
    assert slot.state == "unclaimed.idle"


def test_want_suspend_decides_between_suspend_and_preempt(store: Store) -> None:
    """ResState::eval_policy: with WANT_SUSPEND a busy job is suspended or left alone,
    PREEMPT is not looked at; without it PREEMPT retires it; a suspended job retires on
    PREEMPT alone (16), whatever CONTINUE says."""
    slot = Slot(store)
    reach(slot, "claimed.busy")
    slot.policy(WANT_SUSPEND=True, SUSPEND=False, PREEMPT=True)
    assert not slot.fire("evaluate").fired
    slot.policy(WANT_SUSPEND=True, SUSPEND=True, PREEMPT=True)
    slot.fire("evaluate", to="claimed.suspended")
    slot.policy(PREEMPT=True, CONTINUE=False)
    slot.fire("evaluate", to="claimed.retiring")


def test_a_claim_that_killed_a_backfill_client_is_not_asked_again(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "backfill.busy")
    slot.request(1, to="backfill.killing")
    assert not slot.request(1).fired               # taken already: nothing to send again
    slot.fire("backfill_exited", to="claimed.idle")  # M, 31 once the client is gone
    assert slot.data["claims"]["cur"]["requester"] == "schedd-a"


# -- hooks as executables ------------------------------------------------------------------------


def _hook(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_fetch_work_hook_reads_the_slot_ad_and_prints_a_job_ad(tmp_path: Path) -> None:
    seen = tmp_path / "stdin"
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(tmp_path, "fetch", f"""cat > {seen}
echo 'JobId = 7'
echo 'Cmd = "/bin/sleep"'
echo 'Requirements = TARGET.Memory > 100'
""")})
    job = hooks.fetch_work("FETCH", {"Name": "slot1", "Memory": 2048, "State": "Owner"})
    assert job == {"JobId": 7, "Cmd": "/bin/sleep", "Requirements": "TARGET.Memory > 100"}
    ad = parse_job_ad(seen.read_text())
    assert ad == {"Name": "slot1", "Memory": 2048, "State": "Owner"}


def test_fetch_work_hook_empty_output_is_no_work(tmp_path: Path) -> None:
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(tmp_path, "fetch", "cat > /dev/null\n")})
    assert hooks.fetch_work("FETCH", {"Name": "slot1"}) is None


def test_a_hook_that_prints_garbage_abandons_the_fetch(tmp_path: Path, store: Store) -> None:
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(
        tmp_path, "fetch", "echo 'JobId = 7'\necho '@@@ this is no ClassAd'\n")})
    with pytest.raises(HookFailed, match="line 2 is not"):
        hooks.fetch_work("FETCH", {"Name": "slot1"})
    # through the machine: the fetch is abandoned, the slot stays, fetching ends
    slot = Slot(store)
    engine = Engine(store, [sd.SPEC], guards=sd.GUARDS, clock=slot.clock,
                    effects=sd.effects(hooks, RecordingCollector(), RecordingSchedds(),
                                       slot.ids))
    engine.fire(KEY, "fetch")
    Worker(engine).run_until_idle()
    resource = engine.get(KEY)
    assert (resource.state, resource.data["fetching"]) == ("owner.idle", False)
    [done] = [e for e in engine.history(KEY) if e.trigger == "fetched_work"]
    assert done.payload is not None and "line 2" in done.payload["error"]


def test_a_hook_that_exits_non_zero_fails_with_its_status(tmp_path: Path) -> None:
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(
        tmp_path, "fetch", "echo 'JobId = 1'\necho 'no queue here' >&2\nexit 3\n")})
    with pytest.raises(HookFailed, match="exited with status 3: no queue here"):
        hooks.fetch_work("FETCH", {"Name": "slot1"})


def test_a_hook_that_hangs_is_killed_at_its_timeout(tmp_path: Path) -> None:
    started = tmp_path / "started"
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(
        tmp_path, "fetch", f"touch {started}\nsleep 600 &\nwait\n")}, timeout=0.5)
    outcome: list[BaseException] = []
    finished = threading.Event()

    def run() -> None:
        try:
            hooks.fetch_work("FETCH", {"Name": "slot1"})
        except HookFailed as exc:
            outcome.append(exc)
        finished.set()

    threading.Thread(target=run, daemon=True).start()
    assert finished.wait(120), "the hung hook was not given up"
    assert started.exists()
    assert "did not finish within 0.5 s and was killed" in str(outcome[0])


def _recording_hooks(tmp_path: Path, fetch: str) -> tuple[Hooks, Path]:
    """REPLY_FETCH and EVICT_CLAIM executables that write their argv and stdin to a file of
    their own per call; FETCH_WORK runs ``fetch``."""
    calls = tmp_path / "calls"
    calls.mkdir()
    body = f'n=$(ls {calls} | wc -l)\n{{ echo "$(basename $0) $*"; cat; }} > {calls}/$n\n'
    hooks = Hooks({f"FETCH_HOOK_{name}": _hook(tmp_path, name, body)
                   for name in ("REPLY_FETCH", "EVICT_CLAIM")}
                  | {"FETCH_HOOK_FETCH_WORK": _hook(tmp_path, "FETCH_WORK", fetch)})
    return hooks, calls


def _hook_calls(calls: Path) -> list[str]:
    return [path.read_text() for path in sorted(calls.iterdir(), key=lambda p: int(p.name))]


def _slot_engine(store: Store, hooks: Hooks) -> tuple[Slot, Engine]:
    slot = Slot(store)
    return slot, Engine(store, [sd.SPEC], guards=sd.GUARDS, clock=slot.clock,
                        effects=sd.effects(hooks, RecordingCollector(), RecordingSchedds(),
                                           slot.ids))


def _as_startd_hook_mgr(job: dict[str, Any], slot_ad: dict[str, Any],
                        claim_id: str | None) -> str:
    """What StartdHookMgr.cpp writes to REPLY_FETCH's and EVICT_CLAIM's stdin: sPrintAd of
    the job ad, "-----", sPrintAd of the slot ad, then ``ClaimId = "<id>"`` when it gives
    one (HTCondor's own unparser, classad2, prints the ads)."""
    import classad2

    def printed(ad: dict[str, Any]) -> str:
        return str(classad2.ClassAd(ad).printOld())

    return printed(job) + "-----\n" + printed(slot_ad) + (
        f'ClaimId = "{claim_id}"\n' if claim_id is not None else "")


def test_today_s_fetch_cycle_with_real_hooks(tmp_path: Path, store: Store) -> None:
    """Today's startd: a fetched job runs, its starter exits, the slot is Claimed/Idle with
    its fetch claim and fetches again; no work: Preempting, EVICT_CLAIM once, Owner.
    REPLY_FETCH accept gets the claim current before the fetch claim was made
    (r_cur->id()); EVICT_CLAIM the fetch claim it evicts; each stdin byte for byte as
    StartdHookMgr.cpp writes it for the same ads."""
    count = tmp_path / "count"
    hooks, calls = _recording_hooks(tmp_path, f"""n=$(cat {count} 2>/dev/null || echo 0)
echo $((n + 1)) > {count}
[ "$n" = 0 ] && echo 'JobId = 3' && echo 'Owner = "alice"'
exit 0
""")
    slot, engine = _slot_engine(store, hooks)
    engine.update(KEY, {"ad": {"Memory": 2048}})
    before = slot.claim("cur")                  # the advertised claim, current before
    engine.fire(KEY, "fetch")
    Worker(engine).run_until_idle()
    assert engine.get(KEY).state == "claimed.busy"
    fetch_claim = engine.get(KEY).data["claims"]["cur"]["id"]
    assert fetch_claim != before
    job = {"JobId": 3, "Owner": "alice", "HookKeyword": "FETCH", "RequestCpus": 1,
           "RequestMemory": 1, "RequestDisk": 1}
    assert engine.get(KEY).data["job"] == job
    engine.fire(KEY, "job_done")
    assert engine.fire(KEY, "starter_exited").dest == "claimed.idle"
    slot.clock.advance(300)                     # FetchWorkDelay
    assert engine.fire(KEY, "fetch").fired
    Worker(engine).run_until_idle()
    assert engine.get(KEY).state == "owner.idle"
    assert engine.get(KEY).data["advertised_claim_id"] == before   # option D
    reply, evict = _hook_calls(calls)           # no REPLY_FETCH for no work; one eviction
    advertised = {"Memory": 2048, "Name": "slot1", "PublicClaimId": before}
    assert reply == "REPLY_FETCH accept\n" + _as_startd_hook_mgr(
        job, {**advertised, "State": "Owner", "Activity": "Idle"},
        slot.ids.full("slot1", before))
    assert evict == "EVICT_CLAIM \n" + _as_startd_hook_mgr(
        job, {**advertised, "State": "Preempting", "Activity": "Vacating"},
        slot.ids.full("slot1", fetch_claim))


def test_the_report_s_fetch_cycle_goes_straight_back_to_owner(store: Store) -> None:
    slot = Slot(store, cycle="report")
    slot.fire("fetched_work", {"job": {"Cmd": "/bin/true"}}, to="claimed.busy")
    slot.fire("starter_exited", to="owner.idle")
    assert ("evict_claim", "slot1", {}) not in slot.world.actions


def test_fetch_work_is_given_the_slot_ad_with_its_state_and_activity(
        tmp_path: Path, store: Store) -> None:
    """As publish_single_slot_ad(for_workfetch): the slot's machine attributes, its Name,
    State and Activity, and its public claim id; no ClaimId."""
    seen = tmp_path / "fetch-stdin"
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(tmp_path, "fetch", f"cat > {seen}\n")})
    slot, engine = _slot_engine(store, hooks)
    engine.update(KEY, {"ad": {"Memory": 2048, "Cpus": 2}})
    engine.fire(KEY, "fetch")
    Worker(engine).run_until_idle()
    ad = parse_job_ad(seen.read_text())
    assert ad is not None
    assert {k: ad[k] for k in ("Name", "State", "Activity", "Memory", "Cpus")} == {
        "Name": "slot1", "State": "Owner", "Activity": "Idle", "Memory": 2048, "Cpus": 2}
    assert ad["PublicClaimId"] == slot.data["advertised_claim_id"] and "ClaimId" not in ad


def test_a_rejected_fetch_hands_out_no_claim_secret(
        tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The slot is not willing (START refuses the job): REPLY_FETCH reject gets the job and slot
    ads and no ClaimId, and no claim's secret part is in a hook's stdin, the log, the
    journal, the outbox or a page of the dashboard."""
    hooks, calls = _recording_hooks(tmp_path, "echo 'JobId = 4'\necho 'Owner = \"bob\"'\n")
    slot, engine = _slot_engine(store, hooks)
    slot.policy(START='TARGET.Owner == "alice"')
    secrets = {slot.ids.full("slot1", claim["id"]).rsplit("#", 1)[1]
               for claim in (slot.data["claims"]["cur"], slot.data["claims"]["pre"]) if claim}
    assert secrets and all(len(secret) >= 16 for secret in secrets)
    with caplog.at_level(logging.DEBUG):
        engine.fire(KEY, "fetch")
        Worker(engine).run_until_idle()
    assert engine.get(KEY).state == "owner.idle"
    [reply] = _hook_calls(calls)
    job = {"JobId": 4, "Owner": "bob", "HookKeyword": "FETCH", "RequestCpus": 1,
           "RequestMemory": 1, "RequestDisk": 1}
    assert reply == "REPLY_FETCH reject\n" + _as_startd_hook_mgr(job, {
        "Name": "slot1", "State": "Owner", "Activity": "Idle",
        "PublicClaimId": slot.data["advertised_claim_id"]}, None)
    assert not re.search(r"^ClaimId\b", reply, re.MULTILINE)   # PublicClaimId is public
    with store.read() as db:
        rows = [str(tuple(row)) for table in ("lifecycle_journal", "lifecycle_effects",
                                              "lifecycle_resources")
                for row in db.execute(text(f"SELECT * FROM {table}")).all()]
    import httpx

    from lifecycle.dashboard.app import serve_in_thread

    with serve_in_thread(store.url, clock=slot.clock) as base, httpx.Client() as client:
        pages = [client.get(base + path, params=params).text for path, params in (
            ("/", {}), ("/machines/startd", {}), ("/machines/startd/resource", {"key": "slot1"}),
            ("/effects", {}), ("/refusals", {}))]
    assert all("slot1" in page for page in pages[1:3])
    seen = [reply, caplog.text, *rows, *pages]
    assert not [secret for secret in secrets for text_ in seen if secret in text_]


def test_a_hook_that_prints_300_mb_is_killed_at_the_limit(tmp_path: Path) -> None:
    """FETCH_WORK's output is read as it comes: past the limit (1 MiB) the hook is killed
    and the fetch ends, and the process reading it never holds more than the limit."""
    flood = _hook(tmp_path, "flood", "head -c 300000000 /dev/zero | tr '\\0' 'a'\n")
    quiet = _hook(tmp_path, "quiet", "echo 'JobId = 1'\n")
    child = ("import resource, sys\n"
             "from lifecycle.adapters.startd_hooks import Hooks, HookFailed\n"
             "try:\n"
             "    Hooks({'FETCH_HOOK_FETCH_WORK': sys.argv[1]}).run('FETCH', 'FETCH_WORK', '')\n"
             "    print('ok')\n"
             "except HookFailed as exc:\n"
             "    print(exc)\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")

    def peak(hook: str) -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-c", child, hook], capture_output=True,
                              text=True, timeout=300, check=True)
        said, kib = done.stdout.strip().splitlines()
        return said, int(kib)

    said, flooded = peak(flood)
    assert "printed more than 1048576 bytes and was killed" in said
    _, baseline = peak(quiet)
    assert flooded - baseline < 16 * 1024, f"{(flooded - baseline) / 1024:.0f} MiB more"


def test_old_syntax_round_trips_through_classad2() -> None:
    ad = {"Name": "slot1", "Memory": 2048, "LoadAvg": 0.25, "Idle": True,
          "Note": 'say "hi"'}
    assert parse_job_ad(old_syntax(ad)) == ad


# -- policy -------------------------------------------------------------------------------------


def test_policy_is_evaluated_with_my_and_target() -> None:
    policy = {"START": "KeyboardIdle > 600 && TARGET.RequestMemory <= MY.Memory",
              "RANK": "TARGET.Owner == \"alice\" ? 10 : 1"}
    my = {"KeyboardIdle": 900, "Memory": 1024}
    assert startd_policy.holds(policy, "START", my, {"RequestMemory": 512})
    assert not startd_policy.holds(policy, "START", my, {"RequestMemory": 4096})
    assert startd_policy.job_rank(policy, my, {"Owner": "alice"}) == 10
    assert not startd_policy.is_owner(policy, my)  # HTCondor's default: False
    desktop = {**policy, "IS_OWNER": "START =?= False"}  # POLICY : Desktop
    assert not startd_policy.is_owner(desktop, my)  # START needs a job: not locally false
    assert startd_policy.is_owner(desktop, {"KeyboardIdle": 5, "Memory": 1024})
    with pytest.raises(startd_policy.PolicyError, match="not a ClassAd expression"):
        startd_policy.evaluate({"START": "a &&& b"}, "START", my, None)


def test_observed_machine_attributes_drive_the_policy(store: Store) -> None:
    slot = Slot(store)
    slot.policy(START="KeyboardIdle > 600", IS_OWNER="START =?= False")
    slot.engine.observe(KEY, {"KeyboardIdle": 30})
    assert not slot.fire("evaluate").fired
    slot.engine.observe(KEY, {"KeyboardIdle": 900})
    slot.fire("evaluate", to="unclaimed.idle")
    slot.engine.observe(KEY, {"KeyboardIdle": 0})
    slot.fire("evaluate", to="owner.idle")


def test_without_classad2_constants_run_and_expressions_say_what_they_need(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startd_policy, "classads", lambda: None)  # (as if not installed)
    assert startd_policy.holds({"START": True}, "START", {}, None)
    assert startd_policy.job_rank({"RANK": 3}, {}, {}) == 3
    with pytest.raises(startd_policy.PolicyError, match=r"lifecycle-fsm\[htcondor\]"):
        startd_policy.evaluate({"START": "KeyboardIdle > 600"}, "START", {}, None)
    from lifecycle.adapters import htcondor, startd_hooks

    monkeypatch.setattr(startd_hooks, "classads", lambda: None)
    monkeypatch.setattr(htcondor, "classads", lambda: None)
    assert startd_hooks.old_syntax({"Name": "slot1", "Cpus": 4, "Idle": True}) == \
        'Name = "slot1"\nCpus = 4\nIdle = true\n'
    with pytest.raises(HookFailed, match=r"lifecycle-fsm\[htcondor\]"):
        parse_job_ad("JobId = 1\n")


@pytest.fixture
def published(store: Store) -> Iterator[Slot]:
    slot = Slot(store)
    yield slot


def test_the_collector_gets_the_full_advertised_id_privately(published: Slot) -> None:
    slot = published
    reach(slot, "unclaimed.idle")
    Worker(slot.engine).run_until_idle()
    name, ad = slot.collector.ads[-1]
    assert name == "slot1"
    assert ad["PublicClaimId"] == slot.data["advertised_claim_id"]
    assert ad["ClaimId"] == slot.startd.advertised("slot1")
    assert public_form(ad["ClaimId"]) == ad["PublicClaimId"]


# -- the simulation ------------------------------------------------------------------------------


def test_the_simulation_reproduces_the_incident_and_the_fix() -> None:
    """On the demo's options. (That a seed gives the same report again is
    tests/test_sim.py's test_the_same_seed_gives_identical_json, for every simulation.)"""
    from lifecycle.sim import simulations

    simulation = simulations()["startd-fetch"]
    first = simulation.run(seed=3, **simulation.demo)
    report, today = first["cycles"]["report"], first["cycles"]["today"]
    assert (first["before"], first["after"]) == (today["before"], today["after"])
    before, after = report["before"], report["after"]
    assert before["attempts"] > 5 and after["attempts"] > 0
    assert before["success_percent"] < 20 < 90 < after["success_percent"]
    assert set(before["refusals"]) == {"it is stale"}
    assert after["mean_wait_seconds"] < before["mean_wait_seconds"]
    assert before["fetched_jobs"] > 20 and after["fetched_jobs"] > 20
    # today's cycle keeps one advertised id through a run of fetched jobs: only a return
    # to Owner (after a schedd's claim) makes a new one
    assert today["before"]["success_percent"] > 50
    assert today["after"]["success_percent"] > 90 and not today["after"]["refusals"]
    assert {r["fetch_cycle"] for r in (*report.values(), *today.values())} == {
        "report", "today"}


def test_expired_leases_are_found_and_vacated(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")
    slot.clock.advance(2399)
    assert slot.startd.expire_leases() == []
    slot.clock.advance(2)
    [result] = slot.startd.expire_leases()
    assert (result.trigger, result.dest) == ("lease_expired", "preempting.vacating")


def test_another_slot_s_id_is_named_as_such(store: Store) -> None:
    engine = Slot(store).engine
    two = sd.Startd(engine, address=ADDRESS, slots=2)
    a = two.add_slot("a", 1)  # sequences 1, 3, 5, ...
    b = two.add_slot("b", 2)  # 2, 4, 6, ...
    engine.fire("startd:a", "evaluate")
    engine.fire("startd:b", "evaluate")
    theirs = b.data["advertised_claim_id"]
    assert theirs != a.data["advertised_claim_id"]
    with pytest.raises(sd.ClaimRefused, match="secret part"):  # the cookie is b's
        two.request_claim("a", two.ids.full("b", theirs), requester="schedd-a")
    assert sd.refusal(engine.get("startd:a").data, theirs) == \
        "it is an id of another slot of this startd"
    assert not engine.fire("startd:a", "request_claim",
                           {"claim_id": theirs, "requester": "x"}).fired
    two.request_claim("b", two.ids.full("b", theirs), requester="schedd-a")
    assert engine.get("startd:b").state == "claimed.idle"


def test_describe_prints_each_edge_with_the_manual_s_ref(db_url: str) -> None:
    from click.testing import CliRunner

    from lifecycle.cli import main

    result = CliRunner().invoke(main, ["describe", "startd", "--json", "--db", db_url])
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)
    edges = described["transitions"] if "transitions" in described else described["edges"]
    refs = {(e["trigger"], str(e["source"]), e.get("ref")) for e in edges}
    assert ("evaluate", str(["owner.idle"]) if isinstance(edges[0]["source"], list)
            else "owner.idle", "A, 1") in refs
    assert {e.get("ref") for e in edges} >= {"A, 1", "J, 22", "I, 23", "I, 24", "J, 25", "33"}


def test_a_failing_reply_fetch_is_logged_and_the_job_runs(tmp_path: Path,
                                                        store: Store) -> None:
    hooks = Hooks({"FETCH_HOOK_FETCH_WORK": _hook(tmp_path, "fetch", "echo 'JobId = 9'\n"),
                   "FETCH_HOOK_REPLY_FETCH": _hook(tmp_path, "reply", "exit 2\n")})
    slot = Slot(store)
    engine = Engine(store, [sd.SPEC], guards=sd.GUARDS, clock=slot.clock,
                    effects=sd.effects(hooks, RecordingCollector(), RecordingSchedds(),
                                       slot.ids))
    engine.fire(KEY, "fetch")
    stats = Worker(engine).run_until_idle()
    assert engine.get(KEY).state == "claimed.busy"
    assert engine.get(KEY).data["job"]["JobId"] == 9
    assert stats.failed == 0


def test_un_retiring_needs_a_preempting_claim_that_was_taken(store: Store) -> None:
    slot = Slot(store)
    reach(slot, "claimed.busy")
    slot.policy(PREEMPT=True)
    slot.fire("evaluate", to="claimed.retiring")  # retiring for PREEMPT: nobody waits in pre
    assert not slot.fire("release_claim", {"claim_id": slot.claim("pre")}).fired
    assert slot.state == "claimed.retiring"


TRIGGERS = sorted(sd.SPEC.triggers)
POLICY = ("START", "PREEMPT", "SUSPEND", "CONTINUE", "KILL", "WANT_SUSPEND", "WANT_VACATE",
          "START_BACKFILL", "EVICT_BACKFILL", "RUNBENCHMARKS")


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("keep", [True, False])
def test_random_lives_keep_the_claim_rules(sqlite_store: Store, seed: int, keep: bool) -> None:
    """Random events, payloads, policies and waits: after each, the advertised claim is
    HTCondor's, the claims are distinct, an id the slot let go never comes back, and the
    states hold the claims they should."""
    import random

    rng = random.Random(seed)
    slot = Slot(sqlite_store, keep=keep)
    gone: set[str] = set()
    held = {slot.claim("cur")}
    for _ in range(300):
        if rng.random() < 0.2:
            slot.policy(**{name: rng.random() < 0.5 for name in rng.sample(POLICY, 3)})
        slot.clock.advance(rng.choice([0, 1, 30, 200, 2500]))
        data = slot.data
        ids = [c["id"] for c in data["claims"].values() if c] + ["<elsewhere>#1#1#..."]
        payload: dict[str, Any] = {"claim_id": rng.choice([data["advertised_claim_id"],
                                                           *ids]),
                                   "requester": rng.choice(["schedd-a", "schedd-b"]),
                                   "rank": rng.choice([0, 1, 2, 3])}
        if rng.random() < 0.5:
            payload["job"] = {"Cmd": "/bin/true"} if rng.random() < 0.8 else None
        slot.engine.fire(KEY, rng.choice(slot.engine.available_triggers(KEY) if rng.random() < 0.9
                                             else TRIGGERS), payload)
        data, state = slot.data, slot.state
        claims = data["claims"]
        now = {c["id"] for c in claims.values() if c}
        advertised = claims["pre_pre"] or claims["pre"] or claims["cur"]
        assert data["advertised_claim_id"] == advertised["id"]
        assert len(now) == len([c for c in claims.values() if c])
        assert not (now & gone), f"an id came back in {state}"
        gone |= held - now
        held = now
        top = state.split(".")[0]
        if top == "claimed":
            assert claims["pre"] is not None
        if top not in ("claimed", "preempting"):
            assert claims["pre_pre"] is None
        if top == "owner":
            assert claims["pre"] is None
        assert all(i.endswith("#...") for i in now)
