"""``startd``: an HTCondor execute slot, its (state, activity) pairs, its claims and work
fetch, with the advertised claim kept valid across fetched jobs.

One resource per slot. The states are HTCondor's, nested as (state, activity): ``owner.idle``,
``unclaimed.idle``, ``unclaimed.benchmarking``, ``matched.idle``, ``claimed.idle``,
``claimed.busy``, ``claimed.suspended``, ``claimed.retiring``, ``preempting.vacating``,
``preempting.killing``, ``backfill.idle``, ``backfill.busy``, ``backfill.killing``,
``drained.retiring``, ``drained.idle``. Every transition of the manual ("State and Activity
Transitions" of the admin manual's policy chapter) is an edge carrying its letter and
number as ``ref`` (``describe --json`` prints them), so the spec reads beside the manual's
table. The manual contradicts itself twice; the machine follows its text: transitions
22/23 leave Vacating and 24/25 leave Killing (its diagram has them the other way round), and
"all slots drained" is 33 (its diagram says 34). Edges the manual has no number for (work
fetch, keep-alives) carry ``fetch`` or no ``ref``.

Claims are the slot's data (:mod:`.startd_claims`): current, preempting and pre-preempting,
moved by every transition in its own transaction. Claim requests are fenced by claim id: a
request must name the id the slot advertises (pre-preempting, else preempting, else
current), and while Claimed its rank must not be below the current claim's (nor, replacing
a pending request, below that one's). :class:`Startd` is the door claim ids come in by: it
checks a request's secret cookie, hands the engine the public form only, and says why a
request was refused (:class:`ClaimRefused`).

Policy (``START``, ``RANK``, ``PREEMPT``, ...) is evaluated by guards with HTCondor's ClassAd
library when it is installed (:mod:`.startd_policy`), against the slot ad (the slot's ``ad``
data with its newest observation on top) and the job ad; the trigger ``evaluate`` is
HTCondor's periodic policy evaluation.

Work fetch: ``fetch`` runs the slot's FETCH_WORK hook (an effect), whose answer comes back as
``fetched_work``; the slot fetches where today's startd does (Owner, Unclaimed, Backfill
but Killing, Claimed but Suspended and Cleaning). The job is accepted into a fetch claim
only when the slot is not Preempting, is willing (``START``), and, when Claimed, ranks the
job strictly above the current claim (an idle fetch claim is simply reused). With
``fetch_cycle: today`` (the default) a fetched job's end is today's startd's: Cleaning,
Claimed/Idle with the fetch claim, fetch again; no work (or work the slot will not run)
evicts the idle fetch claim: Preempting, EVICT_CLAIM, Owner. ``fetch_cycle: report`` takes
the slot from the job straight back to Owner, the branch the report's startd had.
``keep_advertised_claim`` (default true) keeps the advertised claim across either cycle
(the report's options C and D); false is the startd the report describes.

Also as today's startd has them: Cleaning (the starter's final update, ``job_done``, then
its reaping: a release, vacate or kill that comes meanwhile is remembered for then),
``CLAIM_WORKLIFE`` (``claim_worklife``), draining a running job (graceful: it retires;
``how: quick`` vacates, ``how: fast`` kills), shutdown (graceful retires, ``how: fast``
kills; then no claim, match or work is taken), and a match, claim or fetched job that
kills a backfill client remembered until the client is gone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..adapters.startd_hooks import (
    Collector,
    HookFailed,
    Hooks,
    RecordingCollector,
    Schedd,
    UnreadableOutput,
)
from ..compiled import GuardContext
from ..effects import Effect, EffectCall, FollowUp, Retry
from ..errors import Conflict
from ..logs import logger
from ..results import FireResult, Resource
from ..spec import MachineSpec
from . import startd_policy as policy
from .builtin import Builtin
from .startd_claims import Claim, ClaimIds, Claims, SlotData, public_form, sequence_of

log = logger(__name__)

MACHINE = "startd"
LEAVES = ("owner.idle", "unclaimed.idle", "unclaimed.benchmarking", "matched.idle",
          "claimed.idle", "claimed.busy", "claimed.suspended", "claimed.retiring",
          "claimed.cleaning",
          "preempting.vacating", "preempting.killing", "backfill.idle", "backfill.busy",
          "backfill.killing", "drained.retiring", "drained.idle")


# -- the spec -------------------------------------------------------------------------------

def _e(trigger: str, source: str | tuple[str, ...], dest: str, ref: str | None, description: str,
       guards: tuple[str, ...] = (), unless: tuple[str, ...] = (),
       effects: tuple[Any, ...] = ()) -> dict[str, Any]:
    edge: dict[str, Any] = {"trigger": trigger,
                            "source": list(source) if isinstance(source, tuple) else source,
                            "dest": dest,
                            "description": description, "merge_payload": False}
    if ref is not None:
        edge["ref"] = ref
    if guards:
        edge["guards"] = list(guards)
    if unless:
        edge["unless"] = list(unless)
    if effects:
        edge["effects"] = list(effects)
    return edge


NAMED = ("names_advertised_claim",)
"""The fence of a claim request: it names the claim the slot advertises."""


def _policy_edges() -> list[dict[str, Any]]:
    """HTCondor's periodic evaluation, as ``ResState::eval_policy`` has it; where the manual
    says otherwise the code is followed and the description says so."""
    ev, idle_ending = "evaluate", "claimed.idle"
    return [
        _e(ev, "owner.idle", "drained.retiring", "N, 36", "draining", ("draining",)),
        _e(ev, "owner.idle", "unclaimed.idle", "A, 1", "IS_OWNER is false",
           unless=("is_owner",)),
        _e(ev, "unclaimed", "drained.retiring", "P, 37", "draining", ("draining",)),
        _e(ev, "unclaimed", "owner.idle", "B, 2", "IS_OWNER is true", ("is_owner",)),
        # the code tests IS_OWNER here, not START (the manual: "START is false")
        _e(ev, idle_ending, "preempting", "H, 10", "IS_OWNER is true (the code's test; the "
           "manual says START is false)", ("is_owner",)),
        _e(ev, idle_ending, "preempting", "H, 10", "CLAIM_WORKLIFE passed since the claim "
           "began, and it ran a job", ("worklife_over",)),
        _e(ev, idle_ending, "preempting", "H, 10", "draining: the idle claim is vacated",
           ("draining",)),
        # WANT_SUSPEND decides: with it, SUSPEND is looked at and PREEMPT is not (13/14)
        _e(ev, "claimed.busy", "claimed.suspended", "14", "WANT_SUSPEND and SUSPEND",
           ("want_suspend", "suspend")),
        _e(ev, "claimed.busy", "claimed.retiring", "13", "PREEMPT, WANT_SUSPEND not true",
           ("preempt",), unless=("want_suspend",)),
        _e(ev, "claimed.retiring", "claimed.suspended", "20", "WANT_SUSPEND and SUSPEND",
           ("want_suspend", "suspend")),
        # PREEMPT alone retires a suspended job (manual l.1960, ResState.cpp)
        _e(ev, "claimed.suspended", "claimed.retiring", "16", "PREEMPT", ("preempt",)),
        _e(ev, "claimed.suspended", "claimed.retiring", "16",
           "CONTINUE, suspended in retirement", ("continue", "retiring_before_suspend")),
        _e(ev, "claimed.suspended", "claimed.busy", "15", "CONTINUE", ("continue",)),
        _e(ev, "preempting.vacating", "preempting.killing", "21", "KILL", ("kill",)),
        _e(ev, "preempting.vacating", "preempting.killing", "21", "WANT_VACATE is false",
           unless=("want_vacate",)),
        _e(ev, "backfill.idle", "owner.idle", "K, 30", "EVICT_BACKFILL",
           ("evict_backfill",)),
        _e(ev, "backfill.busy", "backfill.killing", "28", "EVICT_BACKFILL",
           ("evict_backfill",)),
    ]


RUNNING = ("claimed.busy", "claimed.retiring", "claimed.suspended")
"""The activities a starter runs a job in (Cleaning: it has finished and is being reaped)."""
CLAIMED = ("claimed.idle", *RUNNING)
"""Claimed but Cleaning: where a release, vacate or shutdown moves the slot at once."""


def _claim_edges() -> list[dict[str, Any]]:
    req, willing, rank = "request_claim", ("willing",), ("rank_not_below",)
    open_, killing = (*NAMED, "open"), "backfill.killing"
    return [
        _e("match", "unclaimed.idle", "matched.idle", "C, 6", "the negotiator's match "
           "notice", open_),
        _e("match", "backfill.idle", "matched.idle", "L, 32", "matched, no backfill client "
           "running", open_),
        _e("match", "backfill.busy", killing, "28", "matched: the backfill client is killed, "
           "and the match remembered", open_),
        _e("match_timeout", "matched.idle", "owner.idle", "F, 8", "MATCH_TIMEOUT: no claim "
           "came"),
        _e(req, "unclaimed.idle", "claimed.idle", "D, 5", "a schedd claims before the "
           "match notice", open_ + willing),
        _e(req, "matched.idle", "claimed.idle", "G, 9", "the schedd claims the match",
           open_ + willing),
        _e(req, "backfill.idle", "claimed.idle", "M, 31", "a schedd claims, no backfill "
           "client running", open_ + willing),
        _e(req, "backfill.busy", killing, "28", "a claim: the backfill client is killed, "
           "and the claim remembered", open_ + willing),
        _e(req, "claimed.busy", "claimed.retiring", "13", "a preempting claim (machine RANK "
           "or user priority): the job retires", open_ + willing + rank),
        _e(req, "claimed.idle", "preempting", "H, 10", "a preempting claim: the idle claim "
           "is vacated", open_ + willing + rank),
        _e(req, "claimed.retiring", "claimed.retiring", None, "a better request replaces "
           "the pending preempting claim", open_ + willing + rank),
        _e("activate", "claimed.idle", "claimed.busy", "11", "the claim is activated: a "
           "starter runs its job", ("names_current_claim",), unless=("worklife_over",)),
        # the starter's final update: the job is done, the starter is being reaped
        *(_e("job_done", leaf, "claimed.cleaning", "12", "the job is done: the starter "
             "is being reaped") for leaf in RUNNING),
        _e("starter_exited", "claimed.cleaning", "preempting", "H, 10", "the starter is "
           "reaped, and a release, vacate or preempting claim came while cleaning",
           ("preempt_pending",)),
        _e("starter_exited", "claimed.cleaning", "claimed.idle", "12a", "the starter is "
           "reaped"),
        _e("starter_exited", "claimed.busy", "owner.idle", "fetch", "a fetched job is done: "
           "back to Owner, as the report's startd (fetch_cycle: report)",
           ("fetch_claim", "report_cycle")),
        _e("starter_exited", ("claimed.busy", "claimed.suspended"), "claimed.idle", "12",
           "the starter exited without a final update"),
        _e("starter_exited", "claimed.retiring", "preempting", "H, 18", "the retiring job "
           "is done"),
        _e("retirement_expired", "claimed.retiring", "preempting", "H, 18",
           "MaxJobRetirementTime passed"),
        _e("retirement_expired", "claimed.suspended", "preempting", "H, 17",
           "retirement expired while suspended"),
        _e("release_claim", "claimed.retiring", "claimed.busy", "19", "the preempting "
           "claim was released: the job un-retires", ("names_preempting_claim",
                                                       "names_held_claim"),
           unless=("draining",)),
        _e("release_claim", "claimed.cleaning", "claimed.cleaning", None, "released while "
           "cleaning: remembered for when the starter is reaped", ("names_current_claim",)),
        _e("release_claim", CLAIMED, "preempting", "H, 10", "the schedd released the "
           "claim", ("names_current_claim",)),
        _e("lease_expired", "claimed.retiring", "claimed.busy", "19", "the preempting "
           "claim's lease expired", ("names_preempting_claim", "lease_over"),
           unless=("draining",)),
        _e("lease_expired", "claimed.cleaning", "claimed.cleaning", None, "the lease "
           "expired while cleaning: remembered", ("names_current_claim", "lease_over")),
        _e("lease_expired", CLAIMED, "preempting", "H, 10", "the claim's lease expired",
           ("names_current_claim", "lease_over")),
        *(_e("keep_alive", leaf, leaf, None, "the schedd renews the claim's lease",
             ("names_held_claim",)) for leaf in LEAVES if leaf.startswith("claimed.")),
    ]


def _leaving_edges() -> list[dict[str, Any]]:
    pending = ("has_preempting_claim",)
    fetched = ("fetch_waiting",)
    return [
        _e("vacate_timeout", "preempting.vacating", "preempting.killing", "21",
           "MachineMaxVacateTime elapsed"),
        _e("vacated", "preempting.vacating", "claimed.busy", "I, 23, 11", "vacated for "
           "fetched work: its fetch claim becomes current and its job starts", fetched),
        _e("vacated", "preempting.vacating", "claimed.idle", "I, 23", "vacated for a better "
           "match: the preempting claim becomes current", pending),
        _e("vacated", "preempting.vacating", "owner.idle", "J, 22", "vacated for the "
           "owner"),
        _e("vacated", "preempting.killing", "claimed.busy", "I, 24, 11", "killed for "
           "fetched work: its fetch claim becomes current and its job starts", fetched),
        _e("vacated", "preempting.killing", "claimed.idle", "I, 24", "killed for a better "
           "match: the preempting claim becomes current", pending),
        _e("vacated", "preempting.killing", "owner.idle", "J, 25", "killed for the owner"),
        _e("vacate", "matched.idle", "owner.idle", "F, 8", "condor_vacate"),
        _e("vacate", "claimed.cleaning", "claimed.cleaning", None, "condor_vacate while "
           "cleaning: remembered for when the starter is reaped"),
        _e("vacate", CLAIMED, "preempting", "H, 10", "condor_vacate"),
        _e("vacate", "backfill.idle", "owner.idle", "K, 30", "condor_vacate"),
        _e("vacate", "backfill.busy", "backfill.killing", "28", "condor_vacate"),
        # shutdown: graceful releases every claim (vacating), fast kills (ResMgr's
        # releaseAllClaims / killAllClaims); the slot takes no new claim or work after it
        *_shutdown_edges(),
        _e("run_benchmarks", "unclaimed.idle", "unclaimed.benchmarking", "3",
           "RUNBENCHMARKS", ("run_benchmarks",)),
        _e("benchmarks_done", "unclaimed.benchmarking", "unclaimed.idle", "4",
           "benchmarks done"),
        _e("backfill", "unclaimed.idle", "backfill.idle", "E, 7", "START_BACKFILL",
           ("start_backfill",)),
        _e("backfill_started", "backfill.idle", "backfill.busy", "26", "the backfill "
           "client runs"),
        _e("backfill_exited", "backfill.busy", "backfill.idle", "27", "the backfill client "
           "exited on its own"),
        _e("backfill_exited", "backfill.killing", "claimed.busy", "29, fetch", "the backfill "
           "client is gone: the fetched work that killed it starts", ("bound_for_work",)),
        _e("backfill_exited", "backfill.killing", "claimed.idle", "29, M, 31", "the backfill "
           "client is gone: the claim that killed it is taken", ("bound_for_claim",)),
        _e("backfill_exited", "backfill.killing", "matched.idle", "29, L, 32", "the backfill "
           "client is gone: the match that killed it is kept", ("bound_for_match",)),
        _e("backfill_exited", "backfill.killing", "owner.idle", "29, K, 30", "the backfill "
           "client is gone: vacated, evicted or shut down", ("bound_for_owner",)),
        _e("backfill_exited", "backfill.killing", "backfill.idle", "29", "the backfill "
           "client is gone"),
        _e("drain", "owner.idle", "drained.retiring", "N, 36", "draining starts"),
        _e("drain", "unclaimed", "drained.retiring", "P, 37", "draining starts"),
        _e("drain", "claimed.idle", "preempting", "H, 10", "draining: the idle claim is "
           "vacated"),
        # a graceful drain retires a running job (releaseAllClaimsReversibly); quick vacates
        # and fast kills it at once
        _e("drain", ("claimed.busy", "claimed.suspended"), "preempting.killing", "H, 10",
           "fast draining: the job is killed", ("fast",)),
        _e("drain", ("claimed.busy", "claimed.suspended"), "preempting", "H, 10",
           "quick draining: the job is vacated", ("quick",)),
        _e("drain", ("claimed.busy", "claimed.suspended"), "claimed.retiring", "13",
           "graceful draining: the job retires"),
        *_stays("drain", ("claimed.retiring", "claimed.cleaning", "preempting", "matched",
                          "backfill"), "draining: the slot drains once its claim is gone"),
        _e("all_drained", "drained.retiring", "drained.idle", "33", "all slots drained"),
        _e("drain_complete", "drained.idle", "owner.idle", "O, 34", "draining finalized"),
        _e("drain_cancel", "drained", "owner.idle", "O, 35", "draining cancelled"),
    ]


def _shutdown_edges() -> list[dict[str, Any]]:
    """Shutdown as ``Resource::shutdownAllClaims`` has it: graceful retires every claim
    (``retire_claim``: a running job retires, an idle claim goes), fast kills
    (``kill_claim``); after it the slot takes no claim, match or fetched work."""
    fast, go = ("fast",), "shutdown"
    return [
        _e(go, "claimed.cleaning", "claimed.cleaning", None, "shutdown while cleaning: "
           "remembered for when the starter is reaped"),
        _e(go, (*CLAIMED, "preempting"), "preempting.killing", "H, 10, 21", "fast "
           "shutdown: every claim is killed", fast),
        _e(go, ("claimed.busy", "claimed.suspended"), "claimed.retiring", "13", "graceful "
           "shutdown: the job retires"),
        _e(go, "claimed.idle", "preempting", "H, 10", "graceful shutdown: the idle claim "
           "is released"),
        _e(go, "matched.idle", "owner.idle", "F, 8", "shutdown"),
        _e(go, "backfill.idle", "owner.idle", "K, 30", "shutdown"),
        _e(go, "backfill.busy", "backfill.killing", "28", "shutdown: the backfill client is "
           "killed"),
        *_stays(go, ("owner", "unclaimed", "claimed.retiring", "preempting", "drained",
                     "backfill.killing"), "shutdown: no new claim or work"),
    ]


def _stays(trigger: str, under: tuple[str, ...], description: str) -> list[dict[str, Any]]:
    """``trigger`` recorded without a move in every leaf under ``under``: what it changes is
    the slot's data (draining, shutting down)."""
    return [_e(trigger, leaf, leaf, None, description) for leaf in LEAVES
            if any(leaf == top or leaf.startswith(f"{top}.") for top in under)]


FETCHING = ("owner.idle", "unclaimed.idle", "unclaimed.benchmarking", "claimed.idle",
            "claimed.busy", "claimed.retiring", "backfill.idle", "backfill.busy")
"""Where today's startd fetches work (``ResState::do_periodic_actions``): Owner, Unclaimed,
Backfill but Killing, and Claimed but Suspended and Cleaning."""


def _state_of(leaf: str) -> dict[str, str]:
    state, activity = leaf.split(".")
    return {"State": state.title(), "Activity": activity.title()}


def _fetch_edges() -> list[dict[str, Any]]:
    # every hook is given the slot ad with the slot's State and Activity when it runs: as
    # publish_single_slot_ad(for_workfetch) for FETCH_WORK, and r_classad for REPLY_FETCH,
    # which runs before the slot moves; a fetch that fails for good still ends
    # (fetched_work without a job clears fetching)
    def fetch(leaf: str) -> tuple[dict[str, Any], ...]:
        return ({"name": "fetch_work", "on_failure": "fetched_work", "args": _state_of(leaf)},)

    def reply(leaf: str, accept: bool) -> tuple[dict[str, Any], ...]:
        return ({"name": "reply_fetch", "args": {"accept": accept, **_state_of(leaf)}},)

    job = ("has_job", "willing")
    fw, idle = "fetched_work", "claimed.idle"
    edges = [_e("fetch", leaf, leaf, "fetch", "run FETCH_WORK", ("may_fetch",),
                effects=fetch(leaf))
             for leaf in FETCHING]
    edges += [_e(fw, leaf, "claimed.busy", "fetch", "fetched work accepted: a fetch claim, "
                 "and its job starts", job, effects=reply(leaf, True))
              for leaf in ("owner.idle", "unclaimed.idle", "unclaimed.benchmarking",
                           "backfill.idle")]
    accept, reject = reply(idle, True), reply(idle, False)
    edges += [
        _e(fw, "backfill.busy", "backfill.killing", "28, fetch", "fetched work accepted: "
           "the backfill client is killed, the job starts once it is gone", job,
           effects=reply("backfill.busy", True)),
        _e(fw, idle, "claimed.busy", "11", "fetched work for the idle fetch claim, which is "
           "reused", (*job, "idle_fetch_claim"), effects=accept),
        # the idle fetch claim with no work (or work it will not run) is evicted:
        # Resource::terminateFetchedWork, Preempting, then EVICT_CLAIM
        _e(fw, idle, "preempting", "H, 10", "no work for the idle fetch claim: it is "
           "evicted", ("idle_fetch_claim", "no_work"), effects=reject),
        _e(fw, idle, "preempting", "H, 10", "fetched work the idle fetch claim will not run: "
           "it is evicted", ("idle_fetch_claim", "has_job"), effects=reject),
        _e(fw, idle, "preempting", "H, 10", "fetched work ranked above the current claim: "
           "its fetch claim preempts", (*job, "rank_above"), effects=accept),
        _e(fw, "claimed.busy", "claimed.retiring", "13", "fetched work ranked above the "
           "current claim: the job retires for its fetch claim", (*job, "rank_above"),
           effects=reply("claimed.busy", True)),
        _e(fw, "claimed.retiring", "claimed.retiring", "fetch", "fetched work ranked above "
           "the current claim replaces the pending preempting claim", (*job, "rank_above"),
           effects=reply("claimed.retiring", True)),
    ]
    edges += [_e(fw, leaf, leaf, None, "no work, unreadable output, or rejected "
                 "(Preempting, not willing, or not ranked above the current claim)",
                 effects=reply(leaf, False))
              for leaf in LEAVES]
    return edges


def _publish(state: str, activity: str) -> dict[str, Any]:
    return {"name": "publish", "args": {"State": state.title(), "Activity": activity.title()}}


def _states() -> list[dict[str, Any]]:
    def leaves(*names: str, state: str = "") -> list[dict[str, Any]]:
        return [{"name": n, "effects": [_publish(state, n)]} for n in names]

    return [
        {"name": "owner", "initial": "idle", "states": leaves("idle", state="owner"),
         "description": "the machine's owner may be using it: no jobs from outside"},
        {"name": "unclaimed", "initial": "idle",
         "states": leaves("idle", "benchmarking", state="unclaimed"),
         "description": "willing to run jobs, not claimed"},
        {"name": "matched", "initial": "idle", "states": leaves("idle", state="matched"),
         "timeout": {"after": "match_timeout", "trigger": "match_timeout"},
         "description": "matched by the negotiator, waiting for the schedd's claim"},
        {"name": "claimed", "initial": "idle",
         "states": leaves("idle", "busy", "suspended", "retiring", "cleaning",
                          state="claimed"),
         "description": "claimed by a schedd or by fetched work"},
        {"name": "preempting", "initial": "vacating",
         "states": [{"name": "vacating", "effects": [_publish("preempting", "vacating")],
                     "timeout": {"after": "max_vacate_time", "trigger": "vacate_timeout"}},
                    {"name": "killing", "effects": [_publish("preempting", "killing")]}],
         "effects": [{"name": "vacate_claim", "on_failure": "vacated",
                      "args": {"State": "Preempting", "Activity": "Vacating"}}],
         "description": "getting rid of the current claim's job"},
        {"name": "backfill", "initial": "idle",
         "states": leaves("idle", "busy", "killing", state="backfill"),
         "description": "running backfill work"},
        {"name": "drained", "initial": "retiring",
         "states": leaves("retiring", "idle", state="drained"),
         "description": "drained: no new jobs"},
    ]


def startd_spec() -> MachineSpec:
    return MachineSpec.model_validate({
        "name": MACHINE,
        "description": "An HTCondor execute slot: (state, activity) pairs, claims fenced by "
                       "claim id, work fetch through hooks; the advertised claim stays "
                       "valid across fetched jobs.",
        "initial": "owner",
        "states": _states(),
        "transitions": [*_policy_edges(), *_claim_edges(), *_leaving_edges(),
                        *_fetch_edges()],
        "data_model": SlotData,
    })


# -- guards: on the data, the payload and the newest observation; no I/O -------------------

def slot_ad(state: str, data: Mapping[str, Any],
            status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The slot ad the policy sees as MY: the slot's own attributes, its newest observation
    on top, and its State and Activity (public claim ids only)."""
    top, _, activity = state.partition(".")
    ad = {**data.get("ad", {}), **(status or {})}
    ad.update({"State": top.title(), "Activity": activity.title(),
               "PublicClaimId": data.get("advertised_claim_id")})
    return ad


def _my(c: GuardContext) -> dict[str, Any]:
    return slot_ad(c.state, c.data, c.status)


def _claims(c: GuardContext) -> Claims:
    return Claims.model_validate(c.data.get("claims") or {})


def _policy(name: str) -> Callable[[GuardContext], bool]:
    def guard(c: GuardContext) -> bool:
        return policy.holds(c.data.get("policy", {}), name, _my(c), c.data.get("job"))
    return guard


def _request_job(c: GuardContext) -> dict[str, Any]:
    job = c.payload.get("job")
    return dict(job) if isinstance(job, Mapping) else {}


def _willing(c: GuardContext) -> bool:
    return policy.holds(c.data.get("policy", {}), "START", _my(c), _request_job(c))


def _rank_not_below(c: GuardContext) -> bool:
    claims = _claims(c)
    rank = policy.request_rank(c.data.get("policy", {}), c.data.get("ad", {}), c.payload)
    if claims.cur is not None and rank < claims.cur.rank:
        return False
    replacing = claims.pre_pre is not None and c.payload.get("claim_id") == claims.pre_pre.id
    return not (replacing and claims.pre is not None and rank < claims.pre.rank)


def _rank_above(c: GuardContext) -> bool:
    cur = _claims(c).cur
    rank = policy.job_rank(c.data.get("policy", {}), c.data.get("ad", {}), _request_job(c))
    return cur is None or rank > cur.rank


def _named(which: str) -> Callable[[GuardContext], bool]:
    def guard(c: GuardContext) -> bool:
        claim = getattr(_claims(c), which)
        return claim is not None and c.payload.get("claim_id") == claim.id
    return guard


def _held(c: GuardContext) -> bool:
    claim = _claims(c).named(str(c.payload.get("claim_id")))
    return claim is not None and claim.requester is not None


def _lease_over(c: GuardContext) -> bool:
    claim = _claims(c).named(str(c.payload.get("claim_id")))
    return (claim is not None and claim.lease_expires is not None
            and dt.datetime.fromisoformat(claim.lease_expires) <= c.now)


def _has_preempting_claim(c: GuardContext) -> bool:
    pre = _claims(c).pre
    return pre is not None and (pre.requester is not None or pre.type == "fetch")


def _may_fetch(c: GuardContext) -> bool:
    """HTCondor's conditions: a hook keyword, no fetch running, FetchWorkDelay passed since
    the last one, and START not locally false."""
    data = c.data
    if not data.get("hook_keyword") or data.get("fetching") or data.get("shutting_down"):
        return False
    last = data.get("last_fetch_at")
    if last is not None and (c.now - dt.datetime.fromisoformat(last)).total_seconds() < float(
            data.get("fetch_delay", 300.0)):
        return False
    return policy.evaluate(data.get("policy", {}), "START", _my(c), None) is not False


def _fetch_claim(c: GuardContext) -> bool:
    cur = _claims(c).cur
    return cur is not None and cur.type == "fetch"


def _worklife_over(c: GuardContext) -> bool:
    """``Resource::claimWorklifeExpired``: the current claim ran a job and is older than
    CLAIM_WORKLIFE."""
    cur, worklife = _claims(c).cur, c.data.get("claim_worklife")
    if cur is None or worklife is None or not cur.activations or cur.began is None:
        return False
    return (c.now - dt.datetime.fromisoformat(cur.began)).total_seconds() > float(worklife)


def _bound_for(where: str) -> Callable[[GuardContext], bool]:
    return lambda c: c.data.get("bound_for") == where


def _how(fast: str) -> Callable[[GuardContext], bool]:
    return lambda c: c.payload.get("how") == fast


GUARDS: dict[str, Callable[[GuardContext], bool]] = {
    "is_owner": lambda c: policy.is_owner(c.data.get("policy", {}), _my(c)),
    **{name.lower(): _policy(name) for name in (
        "PREEMPT", "SUSPEND", "CONTINUE", "KILL", "WANT_SUSPEND", "WANT_VACATE",
        "START_BACKFILL", "EVICT_BACKFILL", "RUNBENCHMARKS")},
    "retiring_before_suspend": lambda c: bool(c.data.get("retiring_before_suspend")),
    "names_advertised_claim": lambda c: c.payload.get("claim_id") is not None
    and c.payload.get("claim_id") == c.data.get("advertised_claim_id"),
    "names_current_claim": _named("cur"),
    "names_preempting_claim": _named("pre"),
    "names_held_claim": _held,
    "willing": _willing,
    "rank_not_below": _rank_not_below,
    "rank_above": _rank_above,
    "lease_over": _lease_over,
    "has_preempting_claim": _has_preempting_claim,
    "has_job": lambda c: isinstance(c.payload.get("job"), Mapping),
    "fetch_claim": _fetch_claim,
    "idle_fetch_claim": lambda c: _fetch_claim(c) and not c.data.get("starter"),
    "may_fetch": _may_fetch,
    "report_cycle": lambda c: c.data.get("fetch_cycle") == "report",
    "no_work": lambda c: c.payload.get("job") is None and not c.payload.get("unreadable"),
    "fetch_waiting": lambda c: (_claims(c).pre or Claim(id="#...")).type == "fetch"
    and c.data.get("pre_job") is not None,
    "worklife_over": _worklife_over,
    "draining": lambda c: bool(c.data.get("draining")),
    "open": lambda c: not c.data.get("shutting_down"),
    "preempt_pending": lambda c: bool(c.data.get("preempt_pending"))
    or _has_preempting_claim(c),
    **{f"bound_for_{name}": _bound_for(where) for name, where in (
        ("work", "claimed.busy"), ("claim", "claimed.idle"), ("match", "matched.idle"),
        ("owner", "owner.idle"))},
    "fast": _how("fast"),
    "quick": _how("quick"),
}
GUARDS["run_benchmarks"] = GUARDS.pop("runbenchmarks")


# -- effects: hooks, the collector and the schedds -------------------------------------------

def _public_ad(call: EffectCall) -> dict[str, Any]:
    """The slot ad given to hooks: the slot's own attributes, its Name, the State and
    Activity the effect's edge gives (the slot's when the hook runs) and the public claim
    id; the ClaimId goes separately."""
    state = {k: call.args[k] for k in ("State", "Activity") if k in call.args}
    return {**call.data.get("ad", {}), "Name": call.key, **state,
            "PublicClaimId": call.data.get("advertised_claim_id")}


def effects(hooks: Hooks, collector: Collector, schedds: Schedd,
            ids: ClaimIds) -> dict[str, Effect]:
    """The slot's effect handlers: hooks run as executables, ads to ``collector``,
    RELEASE_CLAIM to ``schedds``; full claim ids are made from ``ids`` only here."""

    def publish(call: EffectCall) -> None:
        advertised = call.data.get("advertised_claim_id")
        cur = call.data.get("claims", {}).get("cur") or {}
        ad = {**call.data.get("ad", {}), **call.args, "Name": call.key,
              "PublicClaimId": advertised, "RemoteOwner": cur.get("requester"),
              "EnteredCurrentState": int(call.now.timestamp())}
        # the private part of the ad: what the negotiator hands to the schedd it matches
        ad["ClaimId"] = ids.full(call.key, advertised) if advertised else None
        collector.publish(call.key, ad)
        # kept with the effect, so that the history shows which id each ad advertised
        call.save_progress({"advertised_claim_id": advertised})

    def fetch_work(call: EffectCall) -> FollowUp:
        keyword = str(call.data.get("hook_keyword"))
        try:
            job = hooks.fetch_work(keyword, _public_ad(call))
        except HookFailed as exc:
            log.warning("%s: fetch abandoned: %s", call.key, exc)
            unreadable = {"unreadable": True} if isinstance(exc, UnreadableOutput) else {}
            return FollowUp("fetched_work", {"job": None, "error": str(exc), **unreadable})
        if job is not None:  # as StartdHookMgr: what a static slot's job ad must have
            job = {"RequestCpus": 1, "RequestMemory": 1, "RequestDisk": 1, **job}
            job.setdefault("HookKeyword", keyword)
        return FollowUp("fetched_work", {"job": job})

    def reply_fetch(call: EffectCall) -> None:
        job = call.payload.get("job")
        if not isinstance(job, Mapping):
            return  # no work came: nothing to reply to
        accepted = bool(call.args.get("accept"))
        # as StartdHookMgr::hookReplyFetch: a ClaimId only on accept, and then the claim
        # that was current before the fetch claim was made; a rejection names no claim
        replied = call.data.get("replied_claim")
        claim = (ids.full(call.key, str(replied))
                 if accepted and replied and call.data.get("replied_seq") == call.seq
                 else None)
        try:
            hooks.reply_fetch(str(call.data.get("hook_keyword")), accepted, job,
                              _public_ad(call), claim)
        except HookFailed as exc:  # advisory, as in HTCondor: logged, and kept with the effect
            log.warning("%s: %s", call.key, exc)
            call.save_progress({"hook_failed": str(exc)})

    def vacate_claim(call: EffectCall) -> FollowUp:
        claim = call.data.get("vacating")
        if call.data.get("vacating_seq") != call.seq or not claim:
            return FollowUp("vacated")  # the slot has moved on: nothing left to vacate
        if claim.get("type") == "fetch":
            hooks.evict_claim(str(call.data.get("hook_keyword")), call.data.get("job") or {},
                              _public_ad(call), ids.full(call.key, claim["id"]))
        elif claim.get("requester"):
            schedds.release_claim(claim["requester"], ids.full(call.key, claim["id"]))
        return FollowUp("vacated")

    patient = Retry(max_attempts=5, base=5, cap=60)
    return {"publish": Effect(publish, patient),
            "fetch_work": Effect(fetch_work, Retry(max_attempts=1), timeout=None),
            "reply_fetch": Effect(reply_fetch, Retry(max_attempts=1), timeout=None),
            "vacate_claim": Effect(vacate_claim, patient, timeout=None)}


# -- the door claims come in by ---------------------------------------------------------------


class ClaimRefused(Conflict):
    """A claim request the slot refused: which id it named, which it expected, and why
    (public forms only)."""

    def __init__(self, slot: str, named: str, expected: str | None, why: str) -> None:
        self.slot, self.named, self.expected, self.why = slot, named, expected, why
        super().__init__(f"{slot}: claim request for {named} refused: {why}"
                         + (f"; the slot advertises {expected}" if expected else ""))


def refusal(data: Mapping[str, Any], claim_id: str) -> str:
    """Why a request naming ``claim_id`` (public form) is not for the advertised claim."""
    model = SlotData.model_validate(dict(data))
    claims, mine = model.claims, f"<{model.address}>#{model.birthdate}#"
    named = claims.named(claim_id)
    if named is not None and named is claims.cur and claims.pre is not None:
        return "it names the current claim, which is in use; a preempting request names " \
               "the preempting claim"
    if named is not None:
        return "it names a claim that is already taken"
    sequence = sequence_of(claim_id)
    if not claim_id.startswith(mine) or sequence is None:
        return "it is not an id of this startd (another startd, or one from before a " \
               "restart)"
    if sequence % model.sequence_stride != model.next_sequence % model.sequence_stride:
        return "it is an id of another slot of this startd"
    if sequence < model.next_sequence:
        return "it is stale: the slot made that claim and has since replaced it"
    return "this slot never made that claim"


@dataclass
class Startd:
    """A startd's slots on an engine: makes slots, checks the claim ids that come in, and
    hands the full advertised id out (what the collector's private ad carries)."""

    engine: Any
    address: str = "127.0.0.1:9618"
    birthdate: int | None = None
    ids: ClaimIds = field(default_factory=ClaimIds)
    slots: int = 1

    def __post_init__(self) -> None:
        if self.birthdate is None:  # when this startd started: part of every id it makes
            self.birthdate = int(self.engine.clock.now().timestamp())

    def add_slot(self, name: str, number: int = 1, **settings: Any) -> Resource:
        """Slot ``name``, the ``number``-th of ``slots``, in Owner (settings: any data of
        :class:`SlotData`: policy, ad, hook_keyword, keep_advertised_claim, ...)."""
        data = {"address": self.address, "birthdate": self.birthdate, "next_sequence": number,
                "sequence_stride": self.slots, **settings}
        return self.engine.create(MACHINE, name, data, actor="startd")  # type: ignore[no-any-return]

    def advertised(self, slot: str) -> str:
        """The full id the slot advertises (for the collector's private ad)."""
        public = self.engine.get(f"{MACHINE}:{slot}").data["advertised_claim_id"]
        return self.ids.full(slot, public)

    def expire_leases(self) -> list[FireResult]:
        """Fire ``lease_expired`` for every claim whose lease has run out (the startd's
        periodic check; the guard ``lease_over`` checks the lease again as it decides)."""
        now, fired = self.engine.clock.now(), []
        for resource in self.engine.resources(MACHINE):
            claims = Claims.model_validate(resource.data.get("claims") or {})
            for claim in (claims.cur, claims.pre):
                if claim is None or claim.lease_expires is None or \
                        dt.datetime.fromisoformat(claim.lease_expires) > now:
                    continue
                result = self.engine.fire(f"{MACHINE}:{resource.key}", "lease_expired",
                                          {"claim_id": claim.id}, actor="startd")
                if result.fired:
                    fired.append(result)
                    break
        return fired

    def request_claim(self, slot: str, claim_id: str, *, requester: str,
                      rank: float | None = None, job: Mapping[str, Any] | None = None,
                      actor: str | None = None) -> FireResult:
        """A schedd's claim request: fired when its id is genuine and the slot takes it;
        :class:`ClaimRefused` otherwise, saying which id the slot expected and why."""
        public = public_form(claim_id)
        key = f"{MACHINE}:{slot}"
        if not self.ids.genuine(slot, claim_id):
            resource = self.engine.get(key)
            raise ClaimRefused(slot, public, resource.data.get("advertised_claim_id"),
                               "its secret part is not this startd's for this slot")
        payload: dict[str, Any] = {"claim_id": public, "requester": requester}
        if rank is not None:
            payload["rank"] = rank
        if job is not None:
            payload["job"] = dict(job)
        result: FireResult = self.engine.fire(key, "request_claim", payload,
                                              actor=actor or requester)
        if not result.fired:
            resource = self.engine.get(key)
            raise ClaimRefused(slot, public, resource.data.get("advertised_claim_id"),
                               _why_refused(resource, public, result))
        return result


def _why_refused(resource: Resource, public: str, result: FireResult) -> str:
    guards = result.guards or {}
    if resource.data.get("advertised_claim_id") != public:
        return refusal(resource.data, public)
    if guards.get("rank_not_below") is False:
        return "its rank is below the current claim's"
    if guards.get("willing") is False:
        return "the slot is not willing to run its job (START)"
    return f"the slot takes no claim in {resource.state} ({result.reason})"


# -- the built-in ---------------------------------------------------------------------------


@dataclass
class ScenarioHooks(Hooks):
    """Hooks for scenario files: FETCH_WORK answers the world's ``fetch`` for the slot (a
    job ad, or nothing), and every hook run is recorded as an action."""

    world: Any = None

    def run(self, keyword: str, hook: str, stdin: str, args: Any = ()) -> str:
        raise AssertionError("scenario hooks run no executables")

    def fetch_work(self, keyword: str, slot_ad: Mapping[str, Any]) -> dict[str, Any] | None:
        slot = str(slot_ad.get("Name"))
        self.world.actions.append(("fetch_work", slot, {}))
        job = self.world.status.get(slot, {}).get("fetch")
        return dict(job) if isinstance(job, Mapping) else None

    def reply_fetch(self, keyword: str, accepted: bool, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str | None) -> None:
        self.world.actions.append(("reply_fetch", str(slot_ad.get("Name")),
                                   {"accept": accepted}))

    def evict_claim(self, keyword: str, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str) -> None:
        self.world.actions.append(("evict_claim", str(slot_ad.get("Name")), {}))


@dataclass
class _ScenarioSchedds:
    world: Any

    def release_claim(self, requester: str, claim_id: str) -> None:
        self.world.actions.append(("release_claim", requester, {"claim": public_form(
            claim_id)}))


def _simulation(world: Any) -> tuple[Any, Any, Any]:
    """For scenario files: FETCH_WORK answers the world's ``fetch`` for the slot; hook runs
    are actions of the slot, RELEASE_CLAIMs actions of the schedd."""
    return GUARDS, effects(ScenarioHooks(world=world), RecordingCollector(),
                           _ScenarioSchedds(world), ClaimIds()), {}


SPEC = startd_spec()
BUILTIN = Builtin(
    spec=SPEC,
    guards=GUARDS,
    summary="HTCondor slot: claims fenced by claim id, work fetch keeps the advertised claim",
    simulation=_simulation,
)

__all__ = ["BUILTIN", "GUARDS", "LEAVES", "MACHINE", "SPEC", "Claim", "ClaimIds",
           "ClaimRefused", "Claims", "SlotData", "Startd", "effects", "refusal", "slot_ad",
           "startd_spec"]
