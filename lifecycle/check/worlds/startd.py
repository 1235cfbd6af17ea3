"""The startd's world: a slot with work to fetch, a collector that publishes the slot's ad
late, and a schedd that claims the slot with the claim id it read there.

The slot starts in Owner with a FETCH_WORK hook that always has a short job to give. The world
may then, in any order: have the startd fetch work (the hook's answer is the slot's next
job), end the fetched job, evaluate the slot's policy (Owner -> Unclaimed), let the
collector publish the slot's ad (the advertised claim id at that moment), and have the
schedd, once, claim the slot with the id the collector published, while the slot is
claimable (Unclaimed). The invariant is the incident's: that claim is not refused. The
startd the report describes (``keep_advertised_claim: false``, without options C and D)
throws the advertised claim away on every fetch cycle. The slot runs the report's fetch
cycle (``fetch_cycle: report``), the one the incident happened in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...machines.startd import BUILTIN
from ..explore import Invariant, Model
from ..memory import Actions
from ..moves import Action, Create, Fire, Move, Note, SetWorld
from ..state import View

SLOT = "slot1"
CLAIMABLE = "unclaimed.idle"
JOB = {"JobId": 1, "Cmd": "/bin/true"}


def _setup(keep: bool) -> Any:
    def setup(resources: int) -> list[Move]:
        # the report's fetch cycle (a fetched job's end goes straight back to Owner): the one
        # the incident happened in, and the one that makes a new claim id on every job
        data: dict[str, Any] = {"address": "10.0.0.1:9618", "birthdate": 1767225600,
                                "hook_keyword": "FETCH", "fetch_cycle": "report"}
        if not keep:
            data["keep_advertised_claim"] = False
        return [Create(SLOT, data=data), SetWorld(SLOT, {"fetch": JOB})]
    return setup


def actions(view: View) -> Iterator[Action]:
    state = view.machine_state(SLOT)
    advertised = view.data(SLOT).get("advertised_claim_id")
    published = view.extra("published")
    if state in ("owner.idle", CLAIMABLE):
        yield Action("the startd fetches work", (Fire(SLOT, "fetch"),))
    # the job as the startd keeps it: the hook's ad and what the startd adds (HookKeyword, ...)
    job = view.data(SLOT).get("job") or {}
    if state == "claimed.busy" and job.get("JobId") == JOB["JobId"]:
        yield Action("the fetched job ends", (Fire(SLOT, "starter_exited"),))
    if state == "owner.idle":
        yield Action("the startd evaluates its policy", (Fire(SLOT, "evaluate"),))
    if advertised != published:
        yield Action("the collector publishes the slot's ad",
                     (Note((("published", advertised),), f"the collector has {advertised}"),))
    if state == CLAIMABLE and published is not None and not view.extra("tried", False):
        yield Action("schedd-a claims with the id it read from the collector", (
            Note((("tried", True),), "schedd-a asks"),
            Fire(SLOT, "request_claim", {"claim_id": published, "requester": "schedd-a",
                                         "rank": 1})))


def _refused(before: View, after: View, actions: Actions) -> str | None:
    if before.extra("tried", False) or not after.extra("tried", False):
        return None
    if after.machine_state(SLOT) == CLAIMABLE:
        return (f"the claim naming {after.extra('published')}, the id the collector "
                f"published, was refused; the slot advertises "
                f"{after.data(SLOT).get('advertised_claim_id')}")
    return None


def _expect(view: View, before: Actions, hop: Actions) -> list[dict[str, Any]]:
    return [{"expect_last": {"fired": True}}]


CLAIM = Invariant("claim", "never refuses a schedd's claim with the id the slot advertised, "
                  "while the slot is claimable", _refused, _expect)


def model(keep: bool = True) -> Model:
    """The slot's world; ``keep=False``: the startd the report describes."""
    return Model(BUILTIN, _setup(keep), actions, (CLAIM,), steps=False,
                 label=None if keep else "startd_without_cd")


MODELS = {"startd": lambda: model(True), "startd_without_cd": lambda: model(False)}
