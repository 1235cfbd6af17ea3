"""The startd's claims: their ids, and the slot's data with the rules by which every
transition moves its claims (HTCondor's ``r_cur``, ``r_pre``, ``r_pre_pre``).

A claim id has HTCondor's form ``<ip:port>#birthdate#sequence#cookie``. Its public form
(everything up to the last ``#``, then ``#...``) is all the slot's data, the journal, the
logs and the diagrams ever hold; the cookie is an HMAC of the public part under a key the
startd draws from :mod:`secrets` when it starts (:class:`ClaimIds`), so the full id is
rebuilt only where it is handed out (the collector's private ad) and checked where it comes
back (a claim request), and a restarted startd (a new key, as HTCondor's new birthdate)
honours none of the old ids. Sequence numbers come from the slot's data, one stride per
slot, so two slots of one startd never share an id.

The rules live in :class:`SlotData`, whose class says ``follows_transitions``: the engine
validates the data on every transition with the transition in the validation context, and
:func:`follow` computes the claims that transition leaves, in the transition's own
transaction. They are the domain's, with the project's change (the report's option D):

- entering Owner deletes the current claim and makes a fresh one, dropping the preempting
  claims; except, when ``keep_advertised_claim`` is on and the slot leaves Claimed after
  fetched work, the parked claim (``pre``, the one the slot advertised) becomes current
  again, so the id a schedd read from the collector stays good across fetch cycles;
- accepting fetched work in Owner or Unclaimed makes a fetch claim current; with
  ``keep_advertised_claim`` the current claim is parked in ``pre`` (option C), without it
  the current claim is dropped (the report's code);
- entering Claimed from elsewhere makes a fresh ``pre`` (the claim that may preempt) when
  there is none;
- a claim request while Claimed stores the requester in ``pre`` (or, naming ``pre_pre``,
  replaces ``pre``) and makes a fresh ``pre_pre``;
- leaving Preempting for Claimed makes ``pre`` current (and ``pre_pre`` the next ``pre``);
- the advertised claim is ``pre_pre`` if it exists, else ``pre``, else ``cur``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from . import startd_policy as policy

HIDDEN = "..."
ClaimType = Literal["opportunistic", "fetch", "cod"]


def public_form(claim_id: str) -> str:
    """``<ip:port>#birthdate#sequence#...``: the id without its secret cookie."""
    head, sep, _ = claim_id.rpartition("#")
    return f"{head}#{HIDDEN}" if sep else HIDDEN


def sequence_of(claim_id: str) -> int | None:
    parts = claim_id.split("#")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return int(parts[2])


@dataclass(frozen=True)
class ClaimIds:
    """A startd's claim-id secret: the key its cookies are made with, from :mod:`secrets`
    unless given (a startd of several processes shares one)."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def cookie(self, slot: str, public: str) -> str:
        message = f"{slot}\n{public}".encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()[:32]

    def full(self, slot: str, public: str) -> str:
        """The full claim id of the public id ``public`` of ``slot``."""
        if not public.endswith(f"#{HIDDEN}"):
            raise ValueError(f"{public!r} is not the public form of a claim id")
        return public[: -len(HIDDEN)] + self.cookie(slot, public)

    def genuine(self, slot: str, claim_id: str) -> bool:
        """Whether ``claim_id`` carries the cookie this startd made for it on ``slot``."""
        public = public_form(claim_id)
        _, _, cookie = claim_id.rpartition("#")
        return sequence_of(claim_id) is not None and hmac.compare_digest(
            cookie.encode(), self.cookie(slot, public).encode())


class Claim(BaseModel):
    """One claim of a slot: its public id, its type, the rank the slot gave its job, who
    holds it and until when (None: nobody yet)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: ClaimType = "opportunistic"
    rank: float = Field(0.0, allow_inf_nan=False)
    requester: str | None = None
    lease_expires: str | None = None
    began: str | None = None
    """When the slot entered Claimed with this claim (``Claim::beginClaim``)."""
    activations: int = Field(0, ge=0)
    """How many jobs it started (``activationCount``): CLAIM_WORKLIFE ends only a claim
    that ran one."""

    @model_validator(mode="after")
    def _public_only(self) -> Claim:
        if not self.id.endswith(f"#{HIDDEN}"):
            raise ValueError(f"claim ids are kept in their public form (ending #...), "
                             f"not {public_form(self.id)!r} with its cookie")
        return self


class Claims(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cur: Claim | None = None
    pre: Claim | None = None
    pre_pre: Claim | None = None

    def advertised(self) -> Claim | None:
        """HTCondor's rule: pre-preempting, else preempting, else current."""
        return self.pre_pre or self.pre or self.cur

    def named(self, claim_id: str) -> Claim | None:
        for claim in (self.cur, self.pre, self.pre_pre):
            if claim is not None and claim.id == claim_id:
                return claim
        return None


class SlotData(BaseModel):
    """A slot's data: its claims, its policy (ClassAd expressions, or plain booleans
    without the ``htcondor`` extra), its own ad, the job it runs and its knobs."""

    model_config = ConfigDict(extra="forbid")
    follows_transitions: ClassVar[bool] = True

    address: str = "127.0.0.1:9618"
    """The startd's ``ip:port``: the first part of every claim id."""
    birthdate: int = 0
    """When the startd started (seconds since the epoch): the second part."""
    next_sequence: int = 1
    sequence_stride: int = Field(1, ge=1)
    claims: Claims = Field(default_factory=Claims)
    advertised_claim_id: str | None = None
    """The public id the slot advertises (kept by the rule above, for reading)."""
    keep_advertised_claim: bool = True
    """The report's options C and D; false is the startd as the report found it."""
    fetch_cycle: Literal["today", "report"] = "today"
    """After a fetched job: ``today`` as today's startd (Claimed/Idle, fetch again, and an
    idle fetch claim without work is evicted: Preempting, EVICT_CLAIM, Owner); ``report``
    straight back to Owner, the branch the report's startd had."""
    claim_worklife: float | None = Field(None, ge=0, allow_inf_nan=False)
    """``CLAIM_WORKLIFE`` in seconds: an idle claim that ran a job and is older is ended,
    and is activated no more; None (HTCondor's -1): no limit."""
    draining: bool = False
    shutting_down: bool = False
    """The startd is shutting down: no claim, match or fetched work is taken."""
    preempt_pending: bool = False
    """A release, vacate, lease expiry or kill came in Cleaning (HTCondor's
    ``r_cleaning_preempt_pending``): the reaped starter leads to Preempting, not Idle."""
    bound_for: Literal["claimed.busy", "claimed.idle", "matched.idle", "owner.idle"] | None \
        = None
    """Where the slot goes once the backfill client being killed is gone (HTCondor's
    destination state): the fetched work, claim or match that killed it is remembered."""
    policy: dict[str, bool | int | float | str] = Field(default_factory=dict)
    ad: dict[str, Any] = Field(default_factory=dict)
    job: dict[str, Any] | None = None
    starter: bool = False
    retiring_before_suspend: bool = False
    fetching: bool = False
    hook_keyword: str | None = None
    fetch_delay: float = Field(300.0, ge=0, allow_inf_nan=False)
    last_fetch_at: str | None = None
    lease_duration: float = Field(2400.0, gt=0, allow_inf_nan=False)
    match_timeout: float = Field(120.0, gt=0, allow_inf_nan=False)
    max_vacate_time: float = Field(600.0, gt=0, allow_inf_nan=False)
    vacating: Claim | None = None
    """The claim being vacated in Preempting (what RELEASE_CLAIM or EVICT_CLAIM is about)."""
    vacating_seq: int | None = None
    pre_job: dict[str, Any] | None = None
    """A fetched job waiting for its fetch claim (in ``pre``) to preempt the current one."""
    replied_claim: str | None = None
    """The claim that was current when fetched work was last accepted, and the transition
    that accepted it (``replied_seq``): the ``ClaimId`` REPLY_FETCH tells its hook on
    accept, as HTCondor's ``r_cur->id()`` before the fetch claim is made."""
    replied_seq: int | None = None

    @model_validator(mode="after")
    def _follow(self, info: ValidationInfo) -> SlotData:
        context = info.context if isinstance(info.context, dict) else {}
        transition = context.get("transition")
        if transition is not None:
            follow(self, transition)
        if self.claims.cur is None:
            self.claims.cur = self.mint()
        advertised = self.claims.advertised()
        self.advertised_claim_id = advertised.id if advertised is not None else None
        return self

    def mint(self, kind: ClaimType = "opportunistic", rank: float = 0.0) -> Claim:
        """A fresh claim with the next sequence number of this slot."""
        claim = Claim(id=f"<{self.address}>#{self.birthdate}#{self.next_sequence}#{HIDDEN}",
                      type=kind, rank=rank)
        self.next_sequence += self.sequence_stride
        return claim


def _top(state: str) -> str:
    return state.split(".", 1)[0]


def follow(data: SlotData, transition: dict[str, Any]) -> None:
    """Move ``data``'s claims as the ``transition`` (trigger, source, dest, payload, now,
    seq) does. Pure: the same data and transition always give the same result."""
    trigger, source, dest = transition["trigger"], transition["source"], transition["dest"]
    payload: dict[str, Any] = transition.get("payload") or {}
    now: dt.datetime = transition["now"]
    came, goes = _top(source), _top(dest)
    claims = data.claims
    _bookkeeping(data, trigger, source, dest, payload, now)
    if trigger == "request_claim" and (goes in ("claimed", "preempting")
                                       or dest == "backfill.killing"):
        _take_request(data, came, payload, now)
    elif trigger == "fetched_work" and source != dest and not _evicts(data, source, goes):
        cur = claims.cur  # accepted (a rejection stays, or evicts an idle fetch claim)
        data.replied_claim, data.replied_seq = (cur.id if cur else None), transition.get("seq")
        _take_fetch(data, came, dest, payload)
    elif trigger in ("release_claim", "lease_expired") and source == "claimed.retiring" \
            and dest == "claimed.busy":  # 19: the preempting claim went away
        claims.pre, claims.pre_pre = _unclaimed(claims.pre_pre) or data.mint(), None
    if came != "preempting" and goes == "preempting":
        data.vacating, data.vacating_seq = claims.cur, transition.get("seq")
    if came == "preempting" and goes != "preempting":
        data.vacating, data.vacating_seq = None, None
        data.job, data.starter = None, False
        if goes == "claimed":
            claims.cur, claims.pre, claims.pre_pre = claims.pre, claims.pre_pre, None
            data.job, data.pre_job = data.pre_job, None
        data.pre_job = None
    if goes == "owner" and came != "owner":
        _enter_owner(data)
    if goes == "claimed" and came != "claimed":
        if claims.cur is not None:
            claims.cur.began = now.isoformat()
        if claims.pre is None:
            claims.pre = data.mint()
    if dest == "claimed.busy" and source not in ("claimed.busy", "claimed.suspended",
                                                 "claimed.retiring"):
        data.starter = True  # a starter is spawned for the current claim's job
        if claims.cur is not None:
            claims.cur.activations += 1


def _evicts(data: SlotData, source: str, goes: str) -> bool:
    """Fetched work (or none) that ends an idle fetch claim (``terminateFetchedWork``)."""
    cur = data.claims.cur
    return source == "claimed.idle" and goes == "preempting" and cur is not None \
        and cur.type == "fetch"


BOUND = {"match": "matched.idle", "request_claim": "claimed.idle",
         "fetched_work": "claimed.busy"}
"""What a backfill client is killed for, and where the slot goes once it is gone; anything
else (vacate, EVICT_BACKFILL, shutdown) ends in Owner."""


def _bookkeeping(data: SlotData, trigger: str, source: str, dest: str,
                 payload: dict[str, Any], now: dt.datetime) -> None:
    if trigger == "fetch":
        data.fetching = True
    elif trigger == "fetched_work":
        data.fetching, data.last_fetch_at = False, now.isoformat()
    elif trigger == "activate":
        if isinstance(payload.get("job"), dict):
            data.job = dict(payload["job"])
    elif trigger == "starter_exited":
        data.starter = False
        cur = data.claims.cur
        if dest == "owner.idle" or (dest == "claimed.idle" and (cur is None
                                                               or cur.type != "fetch")):
            data.job = None  # a fetch claim keeps its job ad (EVICT_CLAIM is given it)
    elif trigger == "keep_alive":
        claim = data.claims.named(str(payload.get("claim_id")))
        if claim is not None and claim.requester is not None:
            claim.lease_expires = (now + dt.timedelta(seconds=data.lease_duration)).isoformat()
    elif trigger == "update_ad" and isinstance(payload.get("ad"), dict):
        data.ad = {**data.ad, **payload["ad"]}
    elif trigger == "drain":
        data.draining = True
    elif trigger in ("drain_cancel", "drain_complete"):
        data.draining = False
    elif trigger == "shutdown":
        data.shutting_down = True
    if source == dest == "claimed.cleaning" and (
            trigger in ("release_claim", "lease_expired", "vacate", "shutdown")
            or (trigger == "drain" and payload.get("how") in ("quick", "fast"))):
        data.preempt_pending = True  # absorbed: the reaped starter goes to Preempting
    if source == "claimed.cleaning" and dest != source:
        data.preempt_pending = False
    if source == "backfill.busy" and dest == "backfill.killing":
        data.bound_for = BOUND.get(trigger, "owner.idle")  # type: ignore[assignment]
    if source == "backfill.killing" and dest != source:
        data.bound_for = None
    if dest == "claimed.suspended" and source != dest:
        data.retiring_before_suspend = source == "claimed.retiring"


def _stamped(claim: Claim, payload: dict[str, Any], rank: float, now: dt.datetime,
             lease: float) -> Claim:
    return claim.model_copy(update={
        "type": "opportunistic", "rank": rank, "requester": str(payload.get("requester")),
        "lease_expires": (now + dt.timedelta(seconds=lease)).isoformat()})


def _unclaimed(claim: Claim | None) -> Claim | None:
    return None if claim is None else Claim(id=claim.id)


def _take_request(data: SlotData, came: str, payload: dict[str, Any],
                  now: dt.datetime) -> None:
    claims = data.claims
    rank = policy.request_rank(data.policy, data.ad, payload)
    if came in ("unclaimed", "matched", "backfill"):
        assert claims.cur is not None
        claims.cur = _stamped(claims.cur, payload, rank, now, data.lease_duration)
        return
    named = payload.get("claim_id")
    if claims.pre_pre is not None and named == claims.pre_pre.id:
        claims.pre = _stamped(claims.pre_pre, payload, rank, now, data.lease_duration)
    elif claims.pre is not None:
        claims.pre = _stamped(claims.pre, payload, rank, now, data.lease_duration)
    claims.pre_pre = data.mint()


def _take_fetch(data: SlotData, came: str, dest: str, payload: dict[str, Any]) -> None:
    claims = data.claims
    job = dict(payload.get("job") or {})
    rank = policy.job_rank(data.policy, data.ad, job)
    cur = claims.cur
    if came == "claimed":
        if cur is not None and cur.type == "fetch" and dest == "claimed.busy":
            claims.cur = cur.model_copy(update={"rank": rank})  # the idle fetch claim, reused
            data.job = job
        else:  # a better fetched job preempts the current claim: it waits in pre
            claims.pre, claims.pre_pre, data.pre_job = data.mint("fetch", rank), None, job
        return
    fetched = data.mint("fetch", rank)
    if data.keep_advertised_claim:
        claims.pre = cur  # option C: the advertised claim, parked
    claims.cur, data.job = fetched, job


def _enter_owner(data: SlotData) -> None:
    claims = data.claims
    cur, parked = claims.cur, claims.pre
    if (data.keep_advertised_claim and cur is not None and cur.type == "fetch"
            and parked is not None and parked.requester is None):
        claims.cur = _unclaimed(parked)  # option D: the advertised claim stays good
    else:
        claims.cur = data.mint()  # HTCondor (and the report's startd): a fresh claim
    claims.pre = claims.pre_pre = None
    data.job, data.starter, data.retiring_before_suspend = None, False, False


__all__ = ["HIDDEN", "Claim", "ClaimIds", "ClaimType", "Claims", "SlotData", "follow",
           "public_form", "sequence_of"]
