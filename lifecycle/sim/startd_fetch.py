"""``lifecycle simulate startd-fetch``: HTCondor slots busy with short fetched jobs, and
schedds that try to claim them with the claim id they read from the collector.

Each slot fetches a job through its FETCH_WORK hook, runs it (``job_length`` seconds on
average) and fetches again ``fetch_delay`` seconds later: in today's startd's cycle from
Claimed/Idle with its fetch claim (the job's starter goes through Cleaning), in the
report's cycle after going back to Owner and Unclaimed. The collector shows each slot's
ad ``collector_delay`` seconds after the slot published it (HTCondor's update interval and
negotiation cycle, folded into one delay). Every schedd ranks its jobs above fetched
work; now and then it wants a slot, reads the slot's ClaimId from the collector and sends
a claim request, again every ``retry`` seconds until it gets the slot, which it then
holds for ``hold`` seconds.

Both cycles run before and after. Before (``keep_advertised_claim: false``): in the
report's cycle every fetched job and every return to Owner makes new claim ids, so the id
in the collector is stale by the time a schedd uses it; in today's cycle the id advertised
on entering Claimed lasts as long as fetched jobs follow one another. After, the ``startd``
machine: the advertised claim is parked while a fetched job runs and comes back
afterwards, so the id stays good. All four runs meet the same jobs and the same schedds'
wishes, drawn from the seed.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.startd_hooks import Hooks
from ..clock import SimulatedClock
from ..engine import Engine
from ..machines import startd as sd
from ..machines.startd_claims import ClaimIds
from ..store import Store
from .loop import EventLoop, Progress
from .simulation import Option, Simulation, new_database
from .worker import InlineWorker

START = "2026-01-01T00:00:00Z"
ADDRESS = "192.168.1.10:9618"


@dataclass
class DelayedCollector:
    """A collector whose readers see each slot's ad ``delay`` seconds after it was sent."""

    loop: EventLoop
    delay: float
    ads: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)

    def publish(self, slot: str, ad: Mapping[str, Any]) -> None:
        self.ads.setdefault(slot, []).append((self.loop.elapsed, dict(ad)))

    def view(self, slot: str) -> dict[str, Any] | None:
        seen = [ad for at, ad in self.ads.get(slot, []) if at <= self.loop.elapsed - self.delay]
        if len(self.ads.get(slot, [])) > 64:  # keep what a reader may still see
            self.ads[slot] = self.ads[slot][-64:]
        return seen[-1] if seen else None


@dataclass
class FetchQueue(Hooks):
    """FETCH_WORK that always has a job (numbered per slot); the other hooks do nothing."""

    made: dict[str, int] = field(default_factory=dict)

    def fetch_work(self, keyword: str, slot_ad: Mapping[str, Any]) -> dict[str, Any] | None:
        slot = str(slot_ad.get("Name"))
        self.made[slot] = self.made.get(slot, 0) + 1
        return {"JobId": f"{slot}.{self.made[slot]}", "Cmd": "/usr/bin/fetched-work"}

    def reply_fetch(self, keyword: str, accepted: bool, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str | None) -> None:
        return None

    def evict_claim(self, keyword: str, job_ad: Mapping[str, Any],
                    slot_ad: Mapping[str, Any], claim_id: str) -> None:
        return None


@dataclass
class Released:
    count: int = 0

    def release_claim(self, requester: str, claim_id: str) -> None:
        self.count += 1


@dataclass
class Tally:
    attempts: int = 0
    succeeded: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    unserved: list[float] = field(default_factory=list)
    example: str | None = None


class Run:
    """One variant: the slots, the schedds and the engine on one database."""

    def __init__(self, *, seed: int, keep: bool, cycle: str, options: dict[str, Any],
                 store: Store, prefix: str) -> None:
        self.options, self.keep, self.cycle, self.seed = options, keep, cycle, seed
        self.clock = SimulatedClock(START)
        self.loop = EventLoop(self.clock, seed)
        self.collector = DelayedCollector(self.loop, float(options["collector_delay"]))
        ids = ClaimIds()
        self.queue = FetchQueue()
        self.engine = Engine(store, [sd.SPEC], guards=sd.GUARDS, clock=self.clock,
                             effects=sd.effects(self.queue, self.collector, Released(), ids))
        self.worker = InlineWorker(self.engine, seed=seed)
        slots = int(options["slots"])
        self.startd = sd.Startd(self.engine, address=ADDRESS, ids=ids, slots=slots)
        self.names = [f"{prefix}{cycle}-{'renewed' if not keep else 'kept'}-slot{i + 1}"
                      for i in range(slots)]
        self.tally = Tally()
        self.pending: set[str] = set()
        self.wishes: dict[str, random.Random] = {}
        self.since: dict[str, float] = {}  # slot -> when its schedd began to want it
        self.duration = float(options["hours"]) * 3600
        for number, name in enumerate(self.names, start=1):
            self.startd.add_slot(name, number, hook_keyword="FETCH",
                                 fetch_delay=float(options["fetch_delay"]),
                                 keep_advertised_claim=keep, fetch_cycle=cycle)
        self.worker.run_until_idle()

    def key(self, slot: str) -> str:
        return f"{sd.MACHINE}:{slot}"

    def fire(self, slot: str, trigger: str, payload: dict[str, Any] | None = None,
             actor: str = "startd") -> bool:
        fired = self.engine.fire(self.key(slot), trigger, payload or {}, actor=actor).fired
        self.worker.run_until_idle()
        return fired

    # -- the slots ------------------------------------------------------------------------

    def drive(self, slot: str) -> None:
        """What the startd does next for ``slot``, by the state it is in."""
        resource = self.engine.get(self.key(slot))
        if resource.state == "owner.idle":
            self.fire(slot, "evaluate")
            resource = self.engine.get(self.key(slot))
        cur = resource.data["claims"]["cur"]
        idle_fetch_claim = resource.state == "claimed.idle" and cur["type"] == "fetch"
        if (resource.state == "unclaimed.idle" or idle_fetch_claim) \
                and slot not in self.pending:
            self.pending.add(slot)
            self.loop.after(float(self.options["fetch_delay"]), lambda: self.fetch(slot))
        if resource.state == "claimed.idle" and cur["requester"] is not None:
            self.schedd_job(slot, cur)

    def fetch(self, slot: str) -> None:
        self.pending.discard(slot)
        state = self.engine.get(self.key(slot)).state
        if state not in ("unclaimed.idle", "owner.idle", "claimed.idle"):
            return
        if not self.fire(slot, "fetch"):  # FetchWorkDelay not passed yet: try again
            self.drive(slot)
            return
        resource = self.engine.get(self.key(slot))
        if resource.state == "claimed.busy" and resource.data["job"]:
            self.run_job(slot, resource.data["job"]["JobId"])
        else:
            self.drive(slot)

    def run_job(self, slot: str, job: Any) -> None:
        # the same job in both variants, whatever the slots are called
        rng = random.Random(f"{self.seed}:{self.names.index(slot)}:{job.rsplit('.')[-1]}")
        length = rng.expovariate(1 / float(self.options["job_length"]))
        self.loop.after(length, lambda: self.job_done(slot, job))

    def finish(self, slot: str, actor: str = "startd") -> None:
        """The job's starter is done: its final update (Cleaning), then it is reaped; the
        report's startd had no Cleaning."""
        if self.cycle == "today":
            self.fire(slot, "job_done", actor=actor)
        self.fire(slot, "starter_exited", actor=actor)

    def job_done(self, slot: str, job: Any) -> None:
        resource = self.engine.get(self.key(slot))
        if (resource.data.get("job") or {}).get("JobId") != job or not resource.data["starter"]:
            return
        self.finish(slot)
        resource = self.engine.get(self.key(slot))
        if resource.state == "claimed.busy":  # a fetched job waiting for its claim started
            self.run_job(slot, resource.data["job"]["JobId"])
        self.drive(slot)

    def schedd_job(self, slot: str, claim: dict[str, Any]) -> None:
        """The schedd's job starts on its claim: its wait for the slot is over."""
        self.tally.waits.append(self.loop.elapsed - self.since.pop(slot, self.loop.elapsed))
        self.fire(slot, "activate", {"claim_id": claim["id"], "job": {
            "JobId": f"{claim['requester']}:{claim['id']}"}}, actor=claim["requester"])

        def done() -> None:
            self.finish(slot, actor=claim["requester"])
            self.fire(slot, "release_claim", {"claim_id": claim["id"]},
                      actor=claim["requester"])
            self.drive(slot)
            self.loop.after(self.wish_rng(claim["requester"]).expovariate(
                1 / float(self.options["want_interval"])),
                lambda: self.want(claim["requester"]))

        self.loop.after(float(self.options["hold"]), done)

    # -- the schedds -----------------------------------------------------------------------

    def wish_rng(self, schedd: str) -> random.Random:
        """The schedd's own draws: the same wishes in both variants."""
        return self.wishes.setdefault(schedd, random.Random(f"{self.seed}:{schedd}"))

    def open_to(self, schedd: str, slot: str) -> bool:
        """Whether the negotiator, reading the collector, would match ``slot`` to
        ``schedd``: its ad is there and shows no schedd's claim (fetched work is none)."""
        ad = self.collector.view(slot)
        return ad is not None and not ad.get("RemoteOwner")

    def want(self, schedd: str) -> None:
        free = [s for s in self.names if self.open_to(schedd, s)]
        if not free:
            self.loop.after(float(self.options["retry"]), lambda: self.want(schedd))
            return
        slot = self.wish_rng(schedd).choice(free)
        self.attempt(schedd, slot, self.loop.elapsed)

    def attempt(self, schedd: str, slot: str, since: float) -> None:
        tally = self.tally
        if not self.open_to(schedd, slot):  # another schedd got it first: want another
            self.want(schedd)
            return
        ad = self.collector.view(slot)
        if ad is not None and ad.get("ClaimId"):
            tally.attempts += 1
            rank = float(schedd.rsplit("-", 1)[1])
            try:
                self.startd.request_claim(slot, ad["ClaimId"], requester=schedd, rank=rank)
            except sd.ClaimRefused as refused:
                reason = refused.why.split(":")[0]
                tally.refusals[reason] = tally.refusals.get(reason, 0) + 1
                tally.example = tally.example or slot
            else:
                tally.succeeded += 1
                self.since[slot] = since
                self.worker.run_until_idle()
                self.drive(slot)  # Claimed/Idle: its job starts; Retiring: once it is free
                return
        if self.loop.elapsed + float(self.options["retry"]) > self.duration:
            tally.unserved.append(self.duration - since)  # waited to the end, and more
        self.loop.after(float(self.options["retry"]),
                        lambda: self.attempt(schedd, slot, since))

    def run(self, progress: Progress | None) -> dict[str, Any]:
        for slot in self.names:
            self.drive(slot)
        for i in range(int(self.options["schedds"])):
            schedd = f"schedd-{i + 1}"
            first = self.wish_rng(schedd).expovariate(1 / float(self.options["want_interval"]))
            self.loop.at(first, lambda schedd=schedd: self.want(schedd))  # type: ignore[misc]
        self.loop.run(self.duration, progress)
        tally = self.tally
        waited = tally.waits + tally.unserved
        return {
            "keep_advertised_claim": self.keep,
            "fetch_cycle": self.cycle,
            "attempts": tally.attempts,
            "succeeded": tally.succeeded,
            "success_percent": round(100 * tally.succeeded / tally.attempts, 1)
            if tally.attempts else 0.0,
            "refusals": dict(sorted(tally.refusals.items())),
            "slots_won": len(tally.waits),
            "mean_wait_won_seconds": round(statistics.fmean(tally.waits), 1)
            if tally.waits else 0.0,
            "wishes_unserved": len(tally.unserved),
            "mean_wait_seconds": round(statistics.fmean(waited), 1) if waited else 0.0,
            "fetched_jobs": sum(self.queue.made.values()),
            "example": tally.example,
        }


DEFAULTS: dict[str, Any] = {
    "slots": 2, "hours": 2.5, "job_length": 20.0, "fetch_delay": 5.0,
    "collector_delay": 60.0, "schedds": 1, "want_interval": 60.0, "retry": 30.0,
    "hold": 60.0,
}
"""Long enough for each of the four runs to make at least 50 claim attempts, with one
schedd per two slots so that schedds seldom race each other for a slot (a refusal then is
the incident's, not a race's)."""
CYCLES = ("report", "today")
"""After a fetched job: straight back to Owner (the report's startd), or Claimed/Idle and
fetch again (today's); see ``SlotData.fetch_cycle``."""


def simulate(*, seed: int = 1, progress: Progress | None = None, store: Store | None = None,
             prefix: str = "", **changes: Any) -> dict[str, Any]:
    """Both variants, on ``store`` (default: temporary databases of their own)."""
    options = {**DEFAULTS, **{k: v for k, v in changes.items() if v is not None}}
    started = time.perf_counter()
    variants = [(cycle, keep) for cycle in CYCLES for keep in (False, True)]
    runs: dict[str, dict[str, Any]] = {cycle: {} for cycle in CYCLES}
    with tempfile.TemporaryDirectory(prefix="lifecycle-startd-fetch-") as directory:
        for i, (cycle, keep) in enumerate(variants):
            def step_progress(done: float, total: float, i: int = i) -> None:
                if progress is not None:
                    progress(i * total + done, len(variants) * total)

            target = store or new_database(Path(directory) / f"run{i}.db")
            try:
                runs[cycle]["after" if keep else "before"] = Run(
                    seed=seed, keep=keep, cycle=cycle, options=options, store=target,
                    prefix=prefix).run(step_progress)
            finally:
                if store is None:
                    target.dispose()
    today, report = runs["today"], runs["report"]
    measures = []
    for cycle, name in (("report", "the report's cycle"), ("today", "today's cycle")):
        before, after = runs[cycle]["before"], runs[cycle]["after"]
        measures += [
            {"what": f"schedd claim attempts, {name}",
             "before": before["attempts"], "after": after["attempts"]},
            {"what": f"schedd claim attempts that succeed (%), {name}",
             "before": before["success_percent"], "after": after["success_percent"]},
            {"what": f"mean wait of a higher-ranked schedd for the slot (s), {name}",
             "before": before["mean_wait_seconds"], "after": after["mean_wait_seconds"]},
            {"what": f"schedds' wishes still unserved at the end, {name}",
             "before": before["wishes_unserved"], "after": after["wishes_unserved"]},
        ]
    result: dict[str, Any] = {
        "simulation": "startd-fetch", "seed": seed, "options": options,
        "before": today["before"], "after": today["after"], "cycles": runs,
        "timing": {"seconds": round(time.perf_counter() - started, 2)},
        "measures": measures,
    }
    hints = []
    example = report["before"]["example"]
    if example:
        hints.append(f"lifecycle history startd:{example}   a slot of the report's "
                     "startd that refused schedds: each ad it published advertised another "
                     "claim id")
    result["hints"] = hints
    return result


SIMULATION = Simulation(
    name="startd-fetch",
    summary="HTCondor slots busy with fetched work: schedds claiming with the advertised id",
    run=simulate,
    options={
        "slots": Option(int, DEFAULTS["slots"], "slots of the startd", ">=1"),
        "hours": Option(float, DEFAULTS["hours"], "simulated hours", ">0"),
        "job_length": Option(float, DEFAULTS["job_length"], "mean seconds a fetched job runs",
                             ">0"),
        "fetch_delay": Option(float, DEFAULTS["fetch_delay"],
                              "seconds between a fetched job's end and the next fetch", ">=0"),
        "collector_delay": Option(float, DEFAULTS["collector_delay"],
                                  "seconds before schedds see a slot ad the startd sent", ">=0"),
        "schedds": Option(int, DEFAULTS["schedds"], "schedds, each ranked above fetched work",
                          ">=1"),
        "retry": Option(float, DEFAULTS["retry"], "seconds between a schedd's claim attempts",
                        ">0"),
    },
    demo={"slots": 2, "hours": 0.25},
)
