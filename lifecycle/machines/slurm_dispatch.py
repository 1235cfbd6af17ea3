"""``slurm_dispatch``: a container's dispatch on Slurm, with a safe, rate-limited, quiet
cancel (docs/incidents.md tells the incident: Arvados' scancel loop).

One resource per container, keyed by its uuid, which is also its Slurm job's name; the job
itself is known by the id sbatch gave it (``job_id`` in the container's data), never by a
name read back from squeue. The container's own states come from its API (``lock``,
``unlock``, ``started``, ``container_done``, ``cancel``); the job's from one ``squeue``
poll that serves every container (:class:`Dispatcher`), recorded as observations
``{"in_squeue": ..., "job_id": ...}`` and acted on by stepping each resource:

- ``queued`` --lock--> ``locked`` (entry effect: sbatch) --submitted--> ``submitted``
  --started--> ``running``; ``unlock`` (or a job that left squeue before its container
  started) returns a container to ``queued``.
- ``container_done`` (Complete or Cancelled) --> ``finished``: the job may linger in squeue.
  Delay A (``delay_a``, a timer) lets it leave by itself; then ``cancelling.due``.
- ``cancelling.due`` --[in squeue, fresh]--> ``cancelling.scancelling`` (entry effect: one
  scancel of the job id, the step that reaches the job in the state that squeue showed)
  --scancelled--> ``cancelling.waiting``, which waits delay B (``next_delay``: ``delay_b``
  after a scancel that acted; none after the first that matched nothing, since the job
  left or changed state, and the next fresh squeue says which; after a failed one
  ``error_delay`` doubled for each failure in a row, up to ``error_cap``) and goes back to
  ``due``. The edge out of ``due`` is a risky edge: it fires only on an squeue observation
  made after the resource's last transition, so never on a poll that predates the previous
  scancel.
- ``cancel`` (the API: priority 0, cancelled by a user) goes to ``scancelling`` at once,
  without delay A.
- A scancel the rate limit cannot grant now waits in ``cancelling.throttled`` for its turn
  (the cancels in the order they fell due).
- Whenever a fresh poll no longer lists the job: ``gone``; before the container started:
  ``queued``. Either way the container API is told (entry effect of ``gone``, effect of the
  edges to ``queued``): a container still Running is marked Cancelled, one still Locked
  unlocked (:mod:`lifecycle.adapters.container_api`).
- The dispatcher polls every ``poll_interval``, and ``quick_poll`` after the last while a
  container waits in ``cancelling.due`` (:meth:`Dispatcher.poll_if_due`).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field

from ..adapters.container_api import ContainerAPI, job_left
from ..adapters.sites import SiteError
from ..adapters.slurm import job_name_problem
from ..adapters.slurm_dispatch import (
    CancelOutcome,
    Listing,
    QueueEntry,
    ScancelRate,
    cancel_step,
)
from ..clock import Clock
from ..compiled import GuardContext
from ..effects import Effect, EffectCall, FollowUp, Retry
from ..errors import PermanentError, raise_first
from ..logs import logger
from ..results import FireResult
from ..spec import MachineSpec
from .builtin import Builtin

log = logger(__name__)

MACHINE = "slurm_dispatch"
REF = "Arvados crunch-dispatch-slurm"
LOW_PRIORITY = 20000
"""A pending job at or below this Slurm priority draws a warning (Arvados' threshold)."""
WATCHED = ("submitted", "running", "finished", "cancelling")
"""The states (``cancelling`` with its children) in which a container's job is looked for
in squeue."""
AFTER_SCANCEL = ("cancelling.due",)
"""The state in which a job still listed is "still in squeue after scancel": delay B has
passed since a scancel (a job still leaving within delay B is no news)."""


@dataclass(frozen=True)
class Settings:
    """The dispatcher's knobs (seconds unless said)."""

    delay_a: float = 2.0
    """How long a finished container's job may leave squeue by itself before the first
    scancel (Arvados: 0). Longer saves the scancels of jobs that leave by themselves, and
    adds as much to the linger of those that do not."""
    delay_b: float = 10.0
    """Between scancels of one job, after one that exited 0 (Arvados: 1 s after the next
    poll)."""
    error_delay: float = 30.0
    """After a scancel that failed; doubled for each failure in a row..."""
    error_cap: float = 600.0
    """...up to this."""
    poll_interval: float = 10.0
    """Between squeue polls (Arvados' PollInterval)."""
    log_interval: float = 60.0
    """"still in squeue after scancel" is logged once per container, then at most once per
    this interval, with the count of repeats left out."""
    priority_spread: int = 10
    """Room between adjacent niceness values when renicing (Arvados' PrioritySpread)."""
    quick_poll: float = 1.0
    """The soonest poll after the last while a container waits in ``cancelling.due`` for a
    fresh squeue (:meth:`Dispatcher.poll_if_due`): its scancel need not wait a whole poll
    interval."""


class ContainerData(BaseModel):
    """A container's data; the delays are copied from :class:`Settings` at creation."""

    model_config = ConfigDict(extra="allow")

    priority: int = Field(default=1, ge=0)
    """The container's priority in its API: 1 to 1000 user-assigned, larger as is."""
    created_at: str | None = None
    """When the container was created (ISO 8601): breaks priority ties, oldest first."""
    container_state: str | None = None
    delay_a: float = Field(default=Settings.delay_a, ge=0)
    delay_b: float = Field(default=Settings.delay_b, ge=0)
    error_delay: float = Field(default=Settings.error_delay, ge=0)
    error_cap: float = Field(default=Settings.error_cap, ge=0)
    next_delay: float = Field(default=Settings.delay_b, ge=0)
    throttle_wait: float = Field(default=0.0, ge=0)
    job_id: str | None = None
    """The Slurm job's id, as sbatch gave it."""
    scancels: int = 0
    """scancel invocations run."""
    scancel_failures: int = 0
    """Failed scancels in a row."""
    scancel_missed: int = 0
    """scancels in a row that matched nothing (the job had left or changed state)."""
    scancel_exit: int | None = None
    job_state: str | None = None
    """The job's state as squeue showed it when its cancel was decided (the API's, or one
    that waits for its turn under the rate limit): its scancel is the step for it."""


def dispatch_spec(max_age: float = 30.0) -> MachineSpec:
    """The machine; ``max_age``: the oldest squeue observation a scancel or a ``gone`` may
    rest on (keep it above the poll interval)."""
    fresh = {"max_age": max_age}
    alive = ["finished", "cancelling.due", "cancelling.waiting", "cancelling.throttled"]
    return MachineSpec.model_validate({
        "name": MACHINE,
        "description": "A container dispatched as a Slurm job, known by its job id; its "
                       "cancel waits delay A, then scancels the job in the state squeue "
                       "showed, each further time only on a fresh squeue after delay B, "
                       "within global limits.",
        "initial": "queued",
        "final": ["gone"],
        "states": [
            {"name": "queued", "description": "queued in the API, not locked by us"},
            {"name": "locked", "effects": [{"name": "submit", "on_failure": "submit_failed"}],
             "description": "locked by this dispatcher: submit the job (sbatch)"},
            {"name": "submitted", "description": "the job is in Slurm's queue"},
            {"name": "running", "description": "the container runs (its API says so)"},
            {"name": "finished", "timeout": {"after": "delay_a", "trigger": "linger_over"},
             "description": "the container is Complete or Cancelled; its job may linger: "
                            "delay A for it to leave by itself"},
            {"name": "cancelling", "initial": "due", "states": [
                {"name": "due", "description": "scancel on the next fresh squeue that still "
                                               "lists the job"},
                {"name": "scancelling", "effects": ["scancel"],
                 "description": "scancel the job id: pending, or TERM to running or to "
                                "suspended, as squeue showed it"},
                {"name": "throttled", "timeout": {"after": "throttle_wait",
                                                  "trigger": "slot_reached"},
                 "description": "waiting for a slot of the scancel rate limit"},
                {"name": "waiting", "timeout": {"after": "next_delay", "trigger": "delay_over"},
                 "description": "delay B (longer after a failed scancel)"},
            ]},
            {"name": "gone", "effects": ["tell_api"],
             "description": "the job has left squeue: the API is told (a Running "
                            "container is Cancelled, a Locked one unlocked)"},
        ],
        "transitions": [
            {"trigger": "lock", "source": "queued", "dest": "locked", "ref": REF},
            {"trigger": "submitted", "source": "locked", "dest": "submitted",
             "description": "sbatch accepted the job"},
            {"trigger": "submit_failed", "source": "locked", "dest": "queued",
             "effects": ["tell_api"], "description": "sbatch failed for good: unlock"},
            {"trigger": "unlock", "source": ["locked", "submitted"], "dest": "queued",
             "ref": REF},
            {"trigger": "started", "source": "submitted", "dest": "running",
             "description": "the container is Running"},
            {"trigger": "container_done", "source": ["submitted", "running"],
             "dest": "finished", "description": "the container is Complete or Cancelled"},
            {"trigger": "cancel", "source": ["submitted", "running", "finished",
                                             "cancelling.due", "cancelling.waiting"],
             "dest": "cancelling.scancelling",
             "description": "the API cancels (priority 0, or a user): scancel at once"},
            {"trigger": "linger_over", "source": "finished", "dest": "cancelling.due",
             "description": "delay A is over"},
            {"trigger": "scancelled", "source": "cancelling.scancelling",
             "dest": "cancelling.waiting"},
            {"trigger": "throttled", "source": "cancelling.scancelling",
             "dest": "cancelling.throttled", "description": "no scancel slot free now"},
            {"trigger": "slot_reached", "source": "cancelling.throttled",
             "dest": "cancelling.scancelling"},
            {"trigger": "delay_over", "source": "cancelling.waiting", "dest": "cancelling.due",
             "description": "delay B is over"},
        ],
        "eventless": [
            {"source": "cancelling.due", "dest": "cancelling.scancelling",
             "guards": ["in_squeue"], "fresh": fresh,
             "description": "still listed by an squeue made after the last scancel"},
            {"source": alive, "dest": "gone", "guards": ["not_in_squeue"], "fresh": fresh,
             "description": "the job has left squeue"},
            {"source": "running", "dest": "gone", "guards": ["not_in_squeue"],
             "fresh": fresh, "description": "the job left while the container ran: the "
                                            "container is Cancelled",
             "ref": REF},
            {"source": "submitted", "dest": "queued", "guards": ["not_in_squeue"],
             "fresh": fresh, "effects": ["tell_api"],
             "description": "the job left before the container started: unlock",
             "ref": REF},
        ],
        "data_model": ContainerData,
    })


SPEC = dispatch_spec()

GUARDS: dict[str, Callable[[GuardContext], bool]] = {
    "in_squeue": lambda c: c.status.get("in_squeue") is True,
    "not_in_squeue": lambda c: c.status.get("in_squeue") is False,
}


class DispatchSlurm(Protocol):
    """What the machine needs of Slurm (:class:`~lifecycle.adapters.slurm_dispatch.
    SlurmDispatch` on a real one)."""

    rate: ScancelRate

    def submit(self, name: str) -> str: ...

    def queue(self) -> Listing: ...

    def cancel(self, job_id: str, steps: Sequence[int] = ...) -> CancelOutcome: ...

    def renice(self, job_id: str, nice: int) -> None: ...


def next_delay(data: Mapping[str, Any], failures: int, missed: int = 0) -> float:
    """Delay B: ``delay_b`` after a good scancel; none after the first in a row that matched
    nothing (``missed``: look again at once); ``error_delay * 2**(failures - 1)`` up to
    ``error_cap`` after ``failures`` failed ones in a row."""
    if failures == 0 and missed == 1:
        return 0.0
    if failures == 0:
        return float(data.get("delay_b", Settings.delay_b))
    base = float(data.get("error_delay", Settings.error_delay))
    cap = float(data.get("error_cap", Settings.error_cap))
    return min(cap, base * 2.0 ** min(failures - 1, 60))


def effects(slurm: DispatchSlurm, api: ContainerAPI, *,
            timeout: float = 300.0) -> dict[str, Effect]:
    """The machine's effect handlers, through ``slurm`` and the container ``api``."""

    def submit(call: EffectCall) -> FollowUp:
        try:
            job_id = slurm.submit(call.key)
        except ValueError as exc:           # a name Slurm cannot hold: no retry can help
            raise PermanentError(str(exc)) from None
        return FollowUp("submitted", {"job_id": job_id})

    def tell_api(call: EffectCall) -> None:
        done = job_left(api, call.key)
        if done is not None:
            log.info("container %s: its job left squeue; %s in the API", call.key, done)

    return {
        "submit": Effect(submit, Retry(max_attempts=3, base=10, cap=60), timeout=timeout),
        "scancel": Effect(scancel_handler(slurm), Retry(max_attempts=None, base=10, cap=300),
                          timeout=timeout),
        "tell_api": Effect(tell_api, Retry(max_attempts=None, base=10, cap=300),
                           timeout=timeout),
    }


def scancel_handler(slurm: DispatchSlurm) -> Callable[[EffectCall], FollowUp]:
    """One scancel of the job id under the rate limit: the step that reaches the job in the
    state the squeue this decision rested on showed (or, cancelled by the API, the last one
    seen). A turn that must wait goes to ``cancelling.throttled`` and comes back."""

    def scancel(call: EffectCall) -> FollowUp:
        seen = (call.fence or {}).get("status") or {}
        job_id = seen.get("job_id") or call.data.get("job_id")
        if not job_id:   # submitted before ids were kept, and not yet seen by a poll
            log.info("container %s: no job id known yet; the next squeue finds its job",
                     call.key)
            return FollowUp("scancelled", {"next_delay": 0.0})
        state = seen.get("state") or call.data.get("job_state")
        wait = slurm.rate.reserve(call.key)
        if wait > 0:     # to the next whole microsecond (the clock's): the timer is never early
            return FollowUp("throttled", {"throttle_wait": math.ceil(wait * 1e6 + 1) / 1e6,
                                          "job_id": str(job_id), "job_state": state})
        outcome = slurm.cancel(str(job_id), [cancel_step(str(state) if state else None)])
        failures = 0 if outcome.ok else int(call.data.get("scancel_failures", 0)) + 1
        missed = (int(call.data.get("scancel_missed", 0)) + 1
                  if outcome.ok and not outcome.acted else 0)
        if not outcome.ok:
            log.warning("container %s: scancel failed (%d in a row): %s", call.key, failures,
                        outcome.detail)
        return FollowUp("scancelled", {
            "job_id": str(job_id),
            "scancels": int(call.data.get("scancels", 0)) + outcome.invocations,
            "scancel_failures": failures, "scancel_missed": missed,
            "scancel_exit": outcome.exit,
            "next_delay": next_delay(call.data, failures, missed)})

    return scancel


# -- priority: Arvados' renice rule ----------------------------------------------------------


def wanted_priority(priority: int, created_at: str | None) -> int:
    """The Slurm priority a container wants: a user-assigned priority (1 to 1000) shifted
    left 50 bits, less its creation time in units of 2**14 ns, so that of equal priorities
    the older runs first; a larger one as it is; 0: none."""
    if priority <= 0 or priority > 1000:
        return max(priority, 0)
    nanoseconds = 0
    if created_at is not None:
        when = dt.datetime.fromisoformat(created_at)
        nanoseconds = int(when.timestamp()) * 10**9 + when.microsecond * 1000
    return (priority << 50) - (nanoseconds >> 14)


def want_nice(jobs: Sequence[tuple[QueueEntry, int]], spread: int) -> list[int]:
    """Niceness for jobs sorted by wanted priority, highest first (Arvados' ``wantNice``):
    the first gets 0; a job already in order, less than ``(spread - 1) * 10`` below the one
    before, keeps its niceness; any other is reniced to sit ``spread - 1`` below the one
    before, or to 0 when it cannot reach that high."""
    spread = spread if spread >= 1 else 10
    renice = [0] * len(jobs)
    target = 0
    for i, (job, _want) in enumerate(jobs):
        if i == 0:
            target = job.priority + job.nice
        elif 0 <= target - job.priority < (spread - 1) * 10:
            renice[i] = job.nice
            target = job.priority
        else:
            target -= spread - 1
            possible = job.priority + job.nice
            if target > possible:
                target = possible
            else:
                renice[i] = possible - target
        target -= 1
    return renice


# -- the throttled log -----------------------------------------------------------------------


class LogThrottle:
    """Lets a message about a key through the first time, then at most once per
    ``interval`` seconds of ``clock``, counting the repeats it held back."""

    def __init__(self, interval: float, clock: Clock) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, tuple[dt.datetime, int]] = {}
        self.emitted = 0
        self.suppressed = 0

    def allow(self, key: str) -> int | None:
        """None: hold this one back; else the number held back since the last one let
        through."""
        now = self.clock.now()
        last = self._last.get(key)
        if last is not None and (now - last[0]).total_seconds() < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            self.suppressed += 1
            return None
        self._last[key] = (now, 0)
        self.emitted += 1
        return 0 if last is None else last[1]

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


# -- the dispatcher's poll -------------------------------------------------------------------


@dataclass
class PollReport:
    jobs: int = 0
    containers: int = 0
    moved: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    unsure: int = 0
    """Containers whose job the squeue listed more than once (a forged line): not observed."""
    reniced: int = 0
    error: str | None = None


class Dispatcher:
    """Containers and their jobs: one ``squeue`` per :meth:`poll` serves them all."""

    def __init__(self, engine: Any, slurm: DispatchSlurm, settings: Settings | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.engine = engine
        self.slurm = slurm
        self.settings = settings or Settings()
        self.log = logger or log
        self.still_in_squeue = LogThrottle(self.settings.log_interval, engine.clock)
        self.last_poll: dt.datetime | None = None

    def add(self, uuid: str, *, priority: int = 1, created_at: str | None = None,
            state: str | None = None, **data: Any) -> Any:
        """A container under this dispatcher, with its delays from the settings. ValueError,
        changing nothing, for a uuid that cannot be a Slurm job's name (see
        :func:`~lifecycle.adapters.slurm.job_name_problem`)."""
        problem = job_name_problem(uuid)
        if problem:
            raise ValueError(f"container {uuid!r} cannot be dispatched to Slurm: {problem} "
                             "(its job is named after it, and squeue prints names verbatim)")
        s = self.settings
        return self.engine.create(MACHINE, uuid, {
            "priority": priority, "created_at": created_at, "delay_a": s.delay_a,
            "delay_b": s.delay_b, "next_delay": s.delay_b, "error_delay": s.error_delay,
            "error_cap": s.error_cap, **data}, state=state, actor="dispatcher")

    def set_priority(self, uuid: str, priority: int) -> Any:
        """The container's priority changed in its API: 0 cancels at once (its lead step
        the one for the job's state in the last squeue); any other is kept, and the next
        poll renices."""
        key = f"{MACHINE}:{uuid}"
        if priority == 0:
            seen = self.engine.get(key).observation
            state = seen.status.get("state") if seen is not None else None
            return self.engine.fire(key, "cancel", {"job_state": state}, actor="api")
        return self.engine.update(key, {"priority": priority}, actor="api")

    def poll_if_due(self) -> PollReport | None:
        """Poll when it is time: ``poll_interval`` after the last poll, or ``quick_poll``
        after it while a container waits in ``cancelling.due`` for a fresh squeue. Call it
        every ``quick_poll`` seconds or so (it costs a count in the database)."""
        now = self.engine.clock.now()
        since = math.inf if self.last_poll is None else (
            now - self.last_poll).total_seconds()
        # (a millisecond early counts as on time: a loop's sleeps are not exact)
        if since + 1e-3 < self.settings.quick_poll:
            return None
        if since + 1e-3 < self.settings.poll_interval and not self.engine.counts(MACHINE).get(
                MACHINE, {}).get("cancelling.due"):
            return None
        return self.poll()

    def poll(self) -> PollReport:
        """Ask squeue once; record what it says of every watched container, step each, log
        the jobs still there after a scancel (throttled), and renice."""
        report = PollReport()
        asked_at = self.last_poll = self.engine.clock.now()
        try:
            listing = self.slurm.queue()
        except SiteError as exc:  # nothing observed, nobody moves: as a failed poll
            self.log.warning("squeue failed, no container moves this time: %s", exc)
            report.error = str(exc)
            return report
        report.jobs = len(listing.jobs)
        watched = [r for state in WATCHED for r in self.engine.resources(MACHINE, state=state)]
        report.containers = len(watched)
        jobs: dict[str, QueueEntry] = {}
        seen: list[tuple[Any, QueueEntry | None]] = []
        for resource in watched:
            job, sure = listing.find(resource.data.get("job_id"), resource.key)
            if not sure:
                report.unsure += 1
                continue
            if job is not None:
                jobs[resource.key] = job
            seen.append((resource, job))
        self._observe(seen, asked_at, report)
        report.reniced = self._renice(watched, jobs)
        return report

    def _observe(self, seen: Sequence[tuple[Any, QueueEntry | None]], asked_at: dt.datetime,
                 report: PollReport) -> None:
        """Record what the squeue said of each container and step each: the engine's
        batches (``observe_many``, then ``step_many``), a few transactions for a thousand
        containers, not two each. A container the engine refuses (gone from the store
        meanwhile) raises, once the others are recorded."""
        keys: list[str] = []
        statuses: list[tuple[str, dict[str, Any]]] = []
        for resource, job in seen:
            key = f"{MACHINE}:{resource.key}"
            status: dict[str, Any] = {"in_squeue": job is not None}
            if job is not None:
                status.update(job_id=job.job_id, state=job.state, nice=job.nice,
                              priority=job.priority, reason=job.reason)
            keys.append(key)
            statuses.append((key, status))
        raise_first(self.engine.observe_many(statuses, asked_at, source="squeue"))
        for resource, job in seen:
            if (job is not None and resource.state in AFTER_SCANCEL
                    and resource.data.get("scancels", 0) > 0
                    and asked_at >= resource.updated_at):
                held_back = self.still_in_squeue.allow(resource.key)
                if held_back is not None:
                    self.log.info("container %s is still in squeue after scancel (%s%s)",
                                  resource.key, job.state, f"; {held_back} repeats of this "
                                  "message left out" if held_back else "")
        results = self.engine.step_many(keys, actor="dispatcher", on_stale="return")
        raise_first(results)
        for (resource, _), result in zip(seen, cast(list[FireResult], results), strict=True):
            if result.fired:
                move = f"{result.source} -> {result.dest}"
                report.moved[move] = report.moved.get(move, 0) + 1
                if result.dest in ("gone", "queued"):
                    self.still_in_squeue.forget(resource.key)
                    self.slurm.rate.forget(resource.key)  # the rest of its cancel: not needed
            elif result.error:
                report.refused += 1

    def _renice(self, watched: Sequence[Any], jobs: Mapping[str, QueueEntry]) -> int:
        """Renice the jobs (``jobs``: by container) of containers yet to run or running whose
        niceness must change for Slurm's order to follow the containers' priorities."""
        ours = []
        for r in watched:
            job = jobs.get(r.key) if r.state in ("submitted", "running") else None
            want = wanted_priority(int(r.data.get("priority", 0)), r.data.get("created_at"))
            if job is None or want == 0:
                continue
            ours.append((job, want))
            if job.state == "PENDING" and job.priority <= LOW_PRIORITY:
                self.log.warning("job %s (%s) has low priority %d, nice %d, state %s, "
                                 "reason %s", job.job_id, r.key, job.priority, job.nice,
                                 job.state, job.reason)
        ours.sort(key=lambda pair: (pair[1], pair[0].name, pair[0].job_id), reverse=True)
        reniced = 0
        for (job, _want), nice in zip(ours, want_nice(ours, self.settings.priority_spread),
                                      strict=True):
            if nice == job.nice:
                continue
            try:
                self.slurm.renice(job.job_id, nice)
                reniced += 1
            except SiteError as exc:
                self.log.warning("could not renice job %s to %d: %s", job.job_id, nice, exc)
        return reniced


# -- the built-in and its simulation ---------------------------------------------------------


class ScenarioSlurm:
    """For scenario files: a container's job id is its uuid; squeue lists it while
    ``world.status[key]`` says ``in_squeue: true``; a scancel exits ``scancel_exit``
    (default 0) and acts while the job is listed; what was done is recorded in
    ``world.actions`` (a ``scancel`` with its ``steps``). Rate limit: ``scancels_per_second``
    (default none)."""

    def __init__(self, world: Any, scancels_per_second: float | None = None) -> None:
        self.world = world
        self.rate = ScancelRate(scancels_per_second, world.clock)

    def submit(self, name: str) -> str:
        self.world.actions.append(("submit", name, {}))
        return name

    def queue(self) -> Listing:
        return Listing({name: QueueEntry(name, name, int(s.get("nice", 10000)),
                                         int(s.get("priority", 1)),
                                         str(s.get("state", "RUNNING")),
                                         str(s.get("reason", "None")))
                        for name, s in self.world.status.items() if s.get("in_squeue")})

    def cancel(self, job_id: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        status = self.world.status.get(job_id, {})
        code = status.get("scancel_exit", 0)
        self.world.actions.append(("scancel", job_id, {"exit": code, "steps": list(steps)}))
        return CancelOutcome(code, 1, acted=code == 0 and bool(status.get("in_squeue")))

    def renice(self, job_id: str, nice: int) -> None:
        self.world.actions.append(("renice", job_id, {"nice": nice}))


class ScenarioContainers:
    """For scenario files: a container's state in its API is ``world.status[key]
    ["container"]`` (default ``Complete``); a change through the API is recorded in
    ``world.actions`` (``api_cancel``, ``api_unlock``) and in the world."""

    def __init__(self, world: Any) -> None:
        self.world = world

    def state(self, uuid: str) -> str:
        return str(self.world.status.get(uuid, {}).get("container", "Complete"))

    def cancel(self, uuid: str) -> None:
        self._change(uuid, "api_cancel", "Cancelled")

    def unlock(self, uuid: str) -> None:
        self._change(uuid, "api_unlock", "Queued")

    def _change(self, uuid: str, action: str, state: str) -> None:
        self.world.status.setdefault(uuid, {})["container"] = state
        self.world.actions.append((action, uuid, {}))


def _simulation(world: Any) -> tuple[Any, Any, Any]:
    return GUARDS, effects(ScenarioSlurm(world), ScenarioContainers(world)), {}


BUILTIN = Builtin(
    spec=SPEC,
    guards=GUARDS,
    summary="Slurm container dispatch by job id: cancel after delay A, one scancel for the "
            "job's state, delay B with backoff, each retry only on a fresh squeue; global "
            "scancel limits",
    simulation=_simulation,
)
