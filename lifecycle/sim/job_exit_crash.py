"""``lifecycle simulate job-exit-crash``: many local-universe job exits while the process
doing them dies at random points and the job queue goes away for a while.

Before, the incident's procedure (HTCondor's starter): the four steps run one after the other in
memory; a death before the queue update leaves the job Running, so it runs again and exits
again (a second 005 event, a second output ad); a death between the queue update and the
mail loses the mail; a queue that does not answer is tried six times (HTCondor's default of
five retries after the first attempt), 30 s apart, blocking, then given up (the job runs
again).

After, the ``job_exit`` machine with its real handlers (user log files, output ads, the job
queue table, a mailer that keeps what it sends) on a temporary database: a death drops the
worker with its claims (the effect stays claimed until its lease expires and another worker
takes it over); the queue outage makes the update fail and retry with backoff, and jobs
that ran out of attempts (HTCondor's defaults: six, 30 s apart, whatever the environment
says) are resumed with ``retry`` once the queue is back.

Both runs share one fault plan drawn from the seed: which step of which job the process dies
at (after the step's I/O, before anything records it), and when the queue is down.
"""

from __future__ import annotations

import datetime as dt
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from ..adapters.htcondor import ClassAdValue, JobId
from ..adapters.job_queue import (
    DatabaseJobQueue,
    JobQueue,
    Writes,
    queue_ad,
    submit,
)
from ..clock import SimulatedClock
from ..effects import Effect, EffectCall, FollowUp
from ..engine import Engine
from ..machines import job_exit
from ..outbox_admin import retry_failed
from ..store import Store
from ..worker_core import Working
from .loop import EventLoop, Progress
from .simulation import Option, Simulation, new_database
from .worker import InlineWorker

START = "2026-01-01T00:00:00Z"
STEPS = ("write_terminated_event", "write_output_ad", "update_job_queue",
         "send_job_notification")
LEASE = 300.0


@dataclass(frozen=True, slots=True)
class Plan:
    """The faults one run meets, the same for the old procedure and the machine."""

    exits: list[float]                     # when each job exits, seconds from the start
    deaths: dict[int, int]                 # job index -> the step (0..3) the process dies at
    outage: tuple[float, float]            # the queue is down from .. to
    wants_mail: list[bool]


def draw(loop: EventLoop, options: Mapping[str, Any]) -> Plan:
    rng = loop.rng
    jobs = int(options["jobs"])
    span = float(options["hours"]) * 3600
    exits = sorted(rng.uniform(0, span) for _ in range(jobs))
    deaths = {i: rng.randrange(4) for i in range(jobs) if rng.random() < options["crashes"]}
    start = rng.uniform(0.2, 0.6) * span
    outage = (start, start + float(options["outage"]))
    wants_mail = [rng.random() < 0.7 for _ in range(jobs)]
    return Plan(exits, deaths, outage, wants_mail)


# -- before: the starter's procedure -----------------------------------------------------------


def before(plan: Plan) -> dict[str, Any]:
    """Count what the incident's procedure does with the plan."""
    events = ads = mails = lost = reruns = 0
    duplicated_events = duplicated_ads = 0
    longest_block = 0.0
    for i, exited in enumerate(plan.exits):
        job_events = job_ads = 0
        attempt = 0
        while True:
            attempt += 1
            died_at = plan.deaths.get(i) if attempt == 1 else None
            job_events += 1                                  # (a) the 005 event
            if died_at == 0:
                reruns += 1
                continue                                     # still Running: runs again
            job_ads += 1                                     # (b) the output ad
            if died_at == 1:
                reruns += 1
                continue
            down = plan.outage[0] <= exited < plan.outage[1]
            if down:                       # (c) 6 attempts, 30 s apart: 5 waits, blocking
                longest_block = max(longest_block, 5 * 30.0)
                if exited + 150 < plan.outage[1]:
                    reruns += 1                              # gave up: the job runs again
                    exited = plan.outage[1]
                    continue
            if died_at == 2:                                 # updated, then died before (d)
                lost += int(plan.wants_mail[i])
                break
            if died_at == 3:                                 # died during the mail: lost
                lost += int(plan.wants_mail[i])
                break
            mails += int(plan.wants_mail[i])                 # (d)
            break
        events += job_events
        ads += job_ads
        duplicated_events += int(job_events > 1)
        duplicated_ads += int(job_ads > 1)
    return {"jobs": len(plan.exits), "jobs_with_duplicate_events": duplicated_events,
            "jobs_with_duplicate_ads": duplicated_ads, "lost_mails": lost, "reruns": reruns,
            "longest_block_seconds": longest_block, "mails": mails, "events": events,
            "ads": ads}


# -- after: the machine ----------------------------------------------------------------------


class _Death(BaseException):
    """The worker process dies: nothing after the I/O is recorded."""


class SimQueue(JobQueue):
    """The database queue, down during the outage."""

    def __init__(self, loop: EventLoop, outage: tuple[float, float]) -> None:
        self.loop = loop
        self.outage = outage
        self.inner = DatabaseJobQueue()

    def complete(self, job: Any, ad: Mapping[str, ClassAdValue], *, key: str,
                 now: dt.datetime) -> Writes | None:
        if self.outage[0] <= self.loop.elapsed < self.outage[1]:
            raise ConnectionError("schedd at <127.0.0.1:9618> does not answer")
        return self.inner.complete(job, ad, key=key, now=now)


@dataclass
class SimMailer:
    sender: str = "condor@submit.example.org"
    sent: list[tuple[str, str]] = field(default_factory=list)
    """(subject, Message-ID) of each message sent."""

    def send(self, message: EmailMessage, recipient: str) -> None:
        self.sent.append((str(message["Subject"]), str(message["Message-ID"])))


class _DyingWorker(InlineWorker):
    """A worker process that dies when a handler says so: its claims stay behind and its
    heartbeat stops."""

    def __init__(self, engine: Engine, *, lease: float, seed: int) -> None:
        super().__init__(engine, lease=lease, seed=seed)
        self.dead = False

    def carry_out(self, call: EffectCall, working: Working) -> bool:
        try:
            return super().carry_out(call, working)
        except _Death:
            self._die(working)
            return False

    def _die(self, working: Working) -> None:
        """The process is gone: nothing more is recorded, given back or renewed."""
        self.dead = True
        self.core.stop(fast=True)
        working.close()
        self.core.heartbeat_stopped()


def after(plan: Plan, loop: EventLoop, clock: SimulatedClock, directory: Path,
          progress: Progress | None) -> dict[str, Any]:
    store = new_database(directory / "job_exit.db")
    queue = SimQueue(loop, plan.outage)
    mailer = SimMailer()
    machine = job_exit.make(queue=queue, mailer=mailer, clock=clock, timeout=None,
                            settings=job_exit.Settings())
    died: set[tuple[int, int]] = set()

    def dying(step: int, effect: Effect) -> Effect:
        def handler(call: EffectCall) -> FollowUp | None:
            result = effect.handler(call)   # the step's I/O happens ...
            job = int(call.key.split(".")[0]) - 1000
            if plan.deaths.get(job) == step and (job, step) not in died:
                died.add((job, step))
                raise _Death  # ... and the process dies before the outcome is recorded
            return result

        return Effect(handler, effect.retry, effect.timeout)

    effects = {name: dying(STEPS.index(name), effect)
               for name, effect in machine.effects.items()}
    engine = Engine(store, [machine.spec], guards=machine.guards, effects=effects,
                    clock=clock)
    workers = {"current": _DyingWorker(engine, lease=LEASE, seed=0)}
    restarts = [0]

    def work() -> None:
        worker = workers["current"]
        worker.run_until_idle()
        if worker.dead:  # a new worker process takes over after the lease expired
            restarts[0] += 1
            workers["current"] = _DyingWorker(engine, lease=LEASE, seed=restarts[0])
            loop.after(LEASE + 1, work)

    for i, exited in enumerate(plan.exits):
        key = f"{1000 + i}.0"

        def exit_job(i: int = i, key: str = key) -> None:
            data = {"cluster": 1000 + i, "proc": 0, "owner": "alice",
                    "cmd": "/home/alice/analyse", "submit_host": "submit.example.org",
                    "userlog": str(directory / f"user{i % 10}.log"),
                    "output_ad": str(directory / f"{key}.ad"),
                    "notify_user": "alice@example.org" if plan.wants_mail[i] else None,
                    "notification": "Always" if plan.wants_mail[i] else "Never"}
            submit(store, _job_id(key), {"Owner": "alice"}, clock.now())
            engine.create("job_exit", key, data, actor="schedd")
            engine.fire(key, "exited", {"exit_code": 0, "wall_clock": 60.0,
                                        "remote_user_cpu": 42.0,
                                        "exited_at": clock.now().isoformat()},
                        actor="starter")
            work()

        loop.at(exited, exit_job)
    span = max(plan.exits[-1] if plan.exits else 0.0, plan.outage[1]) + 10
    loop.every(60.0, work, until=span + 4 * LEASE)

    def resume_stuck() -> None:  # the operator, once the queue is back
        for resource in engine.resources("job_exit"):
            if resource.state.startswith("stuck_"):
                retry_failed(engine, f"job_exit:{resource.key}")
        work()

    loop.at(plan.outage[1] + 1, resume_stuck)
    loop.run(span + 5 * LEASE, progress)
    counts = _count(directory, engine, store, mailer, plan)
    counts["restarts"] = restarts[0]
    store.dispose()
    return counts


def _job_id(key: str) -> JobId:
    cluster, proc = key.split(".")
    return JobId(int(cluster), int(proc))


def _count(directory: Path, engine: Engine, store: Store, mailer: SimMailer,
           plan: Plan) -> dict[str, Any]:
    events: dict[str, int] = {}
    for log in directory.glob("user*.log"):
        for cluster in re.findall(r"^005 \((\d+)\.", log.read_text(), flags=re.MULTILINE):
            events[cluster] = events.get(cluster, 0) + 1
    copies: dict[str, int] = {}
    per_job_mail: dict[str, int] = {}
    for subject, message_id in mailer.sent:
        copies[message_id] = copies.get(message_id, 0) + 1
        found = re.search(r"Job (\d+)\.", subject)
        if found:
            per_job_mail[found.group(1)] = per_job_mail.get(found.group(1), 0) + 1
    duplicated_events = duplicated_ads = lost = reruns = done = 0
    for i in range(len(plan.exits)):
        cluster = str(1000 + i)
        duplicated_events += int(events.get(cluster, 0) > 1)
        ad_file = directory / f"{cluster}.0.ad"
        ads = ad_file.read_text().count("ClusterId =") if ad_file.exists() else 0
        duplicated_ads += int(ads > 1)
        queued = queue_ad(store, _job_id(f"{cluster}.0"))
        reruns += int(queued is None or queued.updates != 1)
        if plan.wants_mail[i] and per_job_mail.get(cluster, 0) == 0:
            lost += 1
        done += int(engine.get(f"job_exit:{cluster}.0").state == "done")
    return {"jobs": len(plan.exits), "jobs_done": done,
            "jobs_with_duplicate_events": duplicated_events,
            "jobs_with_duplicate_ads": duplicated_ads, "lost_mails": lost, "reruns": reruns,
            "mails": len(mailer.sent),
            "duplicate_mails_same_message_id": sum(n - 1 for n in copies.values() if n > 1)}


DEFAULTS: dict[str, Any] = {"jobs": 200, "hours": 1.0, "crashes": 0.2, "outage": 600.0}


def simulate(*, seed: int = 1, progress: Progress | None = None, store: Store | None = None,
             prefix: str = "", **changes: Any) -> dict[str, Any]:
    """Both: the incident's procedure and the machine, on one fault plan."""
    del store, prefix  # the machine's run needs files beside its database: a directory
    options = {**DEFAULTS, **{k: v for k, v in changes.items() if v is not None}}
    started = time.perf_counter()
    clock = SimulatedClock(START)
    loop = EventLoop(clock, seed)
    plan = draw(loop, options)
    old = before(plan)
    with tempfile.TemporaryDirectory(prefix="lifecycle-job-exit-") as directory:
        new = after(plan, loop, clock, Path(directory), progress)
    measures = [
        {"what": "jobs with a duplicated 005 event", "before": old["jobs_with_duplicate_events"],
         "after": new["jobs_with_duplicate_events"]},
        {"what": "jobs whose output ad was written twice",
         "before": old["jobs_with_duplicate_ads"], "after": new["jobs_with_duplicate_ads"]},
        {"what": "jobs whose mail was lost", "before": old["lost_mails"],
         "after": new["lost_mails"]},
        {"what": "jobs run again (queue not updated exactly once)", "before": old["reruns"],
         "after": new["reruns"]},
    ]
    return {"simulation": "job-exit-crash", "seed": seed, "options": options,
            "plan": {"deaths": len(plan.deaths), "outage": list(plan.outage)},
            "before": old, "after": new, "measures": measures, "hints": [],
            "timing": {"seconds": round(time.perf_counter() - started, 2)}}


SIMULATION = Simulation(
    name="job-exit-crash",
    summary="HTCondor local-universe job exits, with process deaths and a queue outage",
    run=simulate,
    options={
        "jobs": Option(int, DEFAULTS["jobs"], "job exits", ">=1"),
        "hours": Option(float, DEFAULTS["hours"], "simulated hours over which they exit", ">0"),
        "crashes": Option(float, DEFAULTS["crashes"], "share of jobs whose process dies once",
                          "0..1"),
        "outage": Option(float, DEFAULTS["outage"], "seconds the job queue is down", ">=0"),
    },
    demo={"jobs": 60},
)
