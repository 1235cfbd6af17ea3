"""``lifecycle simulate scancel-flood``: many containers finish at once while Slurm takes a
random time to clear their jobs, dispatched by Arvados' ``crunch-dispatch-slurm`` as it was
when the incident was reported, as it is today, and by the ``slurm_dispatch`` machine.

The world, the same for both (drawn from the seed): each job lingers in squeue after its
container finished for a random time (exponential, mean ``linger_mean``: COMPLETING, an
epilog, a supervisor that is slow to exit) and leaves by itself then, or ``exit_time``
(uniform) after the TERM of a ``scancel --batch --signal=TERM --state=running`` reached
it, whichever comes first. Slurm's controller answers one command at a time, ``ctld_rate``
a second, first come first served, so a command takes longer when many are queued before
it. squeue is asked every ``poll_interval`` seconds, from a random phase.

Two befores, read from Arvados' source (``services/crunch-dispatch-slurm``):

- ``before``, the incident's code (the 11669 fix): when a container finishes, its goroutine
  cancels at once (delay A = 0) with one plain ``scancel --name`` (SIGTERM to the job),
  under one mutex that sbatch, scancel *and squeue* share (one Slurm command at a time);
  then it waits for the next squeue, and if the job is still listed logs "still in squeue
  after scancel", sleeps 1 s (delay B) and, unless a poll meanwhile showed the job gone,
  cancels again.
- ``master``, today's: the same loop with three scancels per cancel (pending; TERM to the
  batch shell of a running job; the same for a suspended one), at most 3 of sbatch, scancel
  and scontrol in flight (a semaphore), squeue outside it, and no guard against a cancel
  after the job left (that extra cancel, a race between two goroutines, is not counted, in
  Arvados' favour).

After: the ``slurm_dispatch`` machine, its engine, store, timers and worker, and its
:class:`~lifecycle.machines.slurm_dispatch.Dispatcher` looking every ``quick_poll`` seconds
whether a poll is due (:meth:`~lifecycle.machines.slurm_dispatch.Dispatcher.poll_if_due`),
with the rate limit of the real adapter
(:class:`~lifecycle.adapters.slurm_dispatch.ScancelRate`) on the simulated clock and the
container API in memory. squeue shows a lingering job RUNNING, so the machine's one scancel
per turn is the TERM to a running job. A command's wait for a slot in the pool of
``max_in_flight`` is modelled as the command starting later in simulated time (its handler
returns at once here); squeue is outside the pool, as in Arvados today.

Counted for each: scancel invocations, the most commands in flight at once, the most
scancel invocations started in any one second, the longest a job lingered after its
container finished, and where that time goes (the longest from the container's end to its
first cancel falling due, from there to the TERM reaching the job, and from the TERM to the
job leaving), how many jobs lingered past the goal's bound, and "still in squeue" log
lines (in all, and the most for one container).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters.container_api import COMPLETE, RUNNING, MemoryContainerAPI
from ..adapters.slurm_dispatch import (
    SCANCELS_PER_SECOND,
    CancelOutcome,
    Listing,
    QueueEntry,
    ScancelRate,
)
from ..clock import SimulatedClock
from ..engine import Engine
from ..errors import raise_first
from ..machines import slurm_dispatch as machine
from ..store import Store
from .loop import EventLoop, Progress
from .simulation import Option, Simulation
from .worker import InlineWorker

START = "2026-01-01T00:00:00Z"
RUNNING_STEP = 1
"""The index, in CANCEL_STEPS, of the scancel that sends TERM to a running job."""
PLAIN = -1
"""A plain ``scancel`` (the incident's code): SIGTERM to the job, whatever its state."""


@dataclass
class Job:
    name: str
    lingers: float
    """When the job would leave squeue by itself (its container finished at 0)."""
    exit_time: float
    """How long it takes to leave once a TERM reached it."""
    leaves_at: float = math.inf
    termed_at: float | None = None
    due_at: float | None = None
    """When its first cancel asked for its turn under the rate limit (the machine's)."""
    first_scancel_at: float | None = None
    cancels: int = 0
    log_lines: int = 0

    def __post_init__(self) -> None:
        self.leaves_at = self.lingers

    def term(self, at: float) -> None:
        if self.termed_at is None:
            self.termed_at = at
        self.leaves_at = min(self.leaves_at, at + self.exit_time)


class SlurmModel:
    """Slurm's controller, answering one command at a time (``ctld_rate`` a second, first
    come first served), a pool of ``pool_size`` commands in flight (more wait for a slot, in
    order), and the jobs; in the loop's simulated seconds."""

    def __init__(self, loop: EventLoop, ctld_rate: float, pool_size: int,
                 turn: Callable[[], float] | None = None) -> None:
        self.loop = loop
        self.turn = turn
        """The rate limit's wait before a scancel starts (None: no limit)."""
        self.ctld_rate = ctld_rate
        self.pool_size = pool_size
        self.jobs: dict[str, Job] = {}
        self.ctld_free = 0.0
        self.busy = 0
        self.most_in_flight = 0
        self.queued: deque[tuple[str | None, Callable[[], None] | None]] = deque()
        self.scancel_starts: list[float] = []

    def command(self, scancel_of: str | None,
                then: Callable[[], None] | None = None, *, pooled: bool = True) -> None:
        """Run a command (a scancel of ``scancel_of``'s job, or another) now, or when a slot
        frees (``pooled=False``: now, outside the pool); ``then`` when it has ended."""
        if not pooled or self.busy < self.pool_size:
            self._start(scancel_of, then, pooled)
        else:
            self.queued.append((scancel_of, then))

    def _start(self, scancel_of: str | None, then: Callable[[], None] | None,
               pooled: bool = True) -> None:
        start = self.loop.elapsed
        self.busy += pooled
        self.most_in_flight = max(self.most_in_flight, self.busy)
        if scancel_of is not None:
            if self.turn is not None:      # waits for its tick in its slot
                start += self.turn()
            self.scancel_starts.append(start)
            job = self.jobs[scancel_of]
            if job.first_scancel_at is None:
                job.first_scancel_at = start
        end = max(start, self.ctld_free) + 1.0 / self.ctld_rate
        self.ctld_free = end

        def ended() -> None:
            self.busy -= pooled
            if pooled and self.queued:
                self._start(*self.queued.popleft())
            if then is not None:
                then()

        self.loop.at(end, ended)

    def cancel(self, name: str, steps: Sequence[int] = (0, 1, 2),
               done: Callable[[], None] | None = None, *, begins: bool = True) -> None:
        """The scancels ``steps`` (indices in CANCEL_STEPS), one after the other, of a cancel
        that ``begins`` here (or goes on); ``done`` after the last. The one to running jobs
        sends the TERM."""
        job = self.jobs[name]
        job.cancels += begins

        def step(i: int) -> None:
            if i > 0 and steps[i - 1] in (RUNNING_STEP, PLAIN):
                job.term(self.loop.elapsed)       # the TERM reached the job's batch shell
            if i == len(steps):
                if done is not None:
                    done()
                return
            self.command(name, lambda: step(i + 1))

        step(0)

    def listed(self, name: str) -> bool:
        return self.jobs[name].leaves_at > self.loop.elapsed

    def figures(self, bound: float) -> dict[str, Any]:
        jobs = list(self.jobs.values())
        return {
            "scancel_invocations": len(self.scancel_starts),
            "most_in_flight": self.most_in_flight,
            "most_scancels_in_one_second": most_in_a_second(self.scancel_starts),
            "longest_linger": round(max((j.leaves_at for j in jobs), default=0.0), 3),
            "lingered_past_bound": sum(1 for j in jobs
                                       if j.leaves_at > bound + j.exit_time + 1e-9),
            "containers_cancelled": sum(1 for j in jobs if j.cancels),
            "still_in_squeue_lines": sum(j.log_lines for j in jobs),
            "most_lines_for_one_container": max((j.log_lines for j in jobs), default=0),
        }


def most_in_a_second(starts: Sequence[float]) -> int:
    """The most starts in any window [t, t + 1 s) (in whole microseconds, as the clock)."""
    ordered = sorted(round(at * 1_000_000) for at in starts)
    most = first = 0
    for last, at in enumerate(ordered):
        while ordered[first] + 1_000_000 <= at:
            first += 1
        most = max(most, last - first + 1)
    return most


def draw_world(loop: EventLoop, options: dict[str, Any], names: Sequence[str],
               pool_size: int) -> SlurmModel:
    model = SlurmModel(loop, options["ctld_rate"], pool_size)
    low, high = options["exit_time"]
    for name in names:
        model.jobs[name] = Job(name, loop.rng.expovariate(1.0 / options["linger_mean"]),
                               loop.rng.uniform(low, high))
    return model


# -- before: Arvados' policies ----------------------------------------------------------------


def before(seed: int, options: dict[str, Any]) -> dict[str, Any]:
    """The incident's code: one plain scancel per cancel, one command at a time (squeue
    too), and no cancel once a poll showed the job gone."""
    return _arvados(seed, options, steps=(PLAIN,), pool_size=1, squeue_pooled=True,
                    guard=True)


def master(seed: int, options: dict[str, Any]) -> dict[str, Any]:
    """Today's code: three scancels per cancel, 3 commands in flight, squeue outside."""
    return _arvados(seed, options, steps=(0, 1, 2), pool_size=3, squeue_pooled=False,
                    guard=False)


def _arvados(seed: int, options: dict[str, Any], *, steps: Sequence[int], pool_size: int,
             squeue_pooled: bool, guard: bool) -> dict[str, Any]:
    clock = SimulatedClock(START)
    loop = EventLoop(clock, seed)
    names = [f"c{i:05d}" for i in range(1, options["containers"] + 1)]
    model = draw_world(loop, options, names, pool_size)
    phase = loop.rng.uniform(0, options["poll_interval"])
    waiting: list[str] = []      # goroutines blocked in HasUUID until the next poll
    left: set[str] = set()       # jobs a poll no longer listed: their context is done

    def cancel(name: str) -> None:
        if guard and name in left:
            return
        if model.jobs[name].due_at is None:
            model.jobs[name].due_at = loop.elapsed
        model.cancel(name, steps, done=lambda: waiting.append(name))

    def answer() -> None:
        left.update(n for n in names if not model.listed(n))
        for name in list(waiting):
            waiting.remove(name)
            if model.listed(name):
                model.jobs[name].log_lines += 1     # "still in squeue after scancel"
                loop.after(1.0, functools.partial(cancel, name))
        if waiting or any(model.listed(n) for n in names) or model.busy:
            loop.after(options["poll_interval"], poll)

    def poll() -> None:
        if squeue_pooled:        # waits for the mutex; answers as of its end
            model.command(None, answer)
        else:
            model.command(None, pooled=False)
            answer()

    for name in names:                              # all finish at once; delay A is 0
        loop.at(0.0, functools.partial(cancel, name))
    loop.at(phase, poll)
    loop.run(options["limit"])
    figures = model.figures(options["poll_interval"])       # Arvados' delay A is 0
    figures.update(where_the_time_went(model))
    return figures


# -- after: the machine ----------------------------------------------------------------------


class SimulatedSlurm:
    """The machine's Slurm over the model, on the engine's simulated clock; squeue shows a
    lingering job RUNNING (its batch shell has not exited)."""

    def __init__(self, model: SlurmModel, loop: EventLoop, rate: ScancelRate) -> None:
        self.model = model
        self.loop = loop
        self.rate = rate

    def submit(self, name: str) -> str:
        """A new job, which stays until cancelled; its id is its name."""
        self.model.command(None)
        self.model.jobs[name] = Job(name, math.inf, 1.0)
        return name

    def queue(self) -> Listing:
        self.model.command(None, pooled=False)
        return Listing({name: QueueEntry(name, name, 10000, 1, "RUNNING", "None")
                        for name in self.model.jobs if self.model.listed(name)})

    def cancel(self, job_id: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        acted = self.model.listed(job_id) and RUNNING_STEP in steps
        self.model.cancel(job_id, steps[:1] if acted else steps)
        return CancelOutcome(0, 1 if acted else len(steps), acted=acted)

    def renice(self, job_id: str, nice: int) -> None:
        self.model.command(None)


class _TimedRate(ScancelRate):
    """The rate limit, noting when each job's first cancel first asked for its turn."""

    def __init__(self, per_second: float | None, clock: SimulatedClock,
                 loop: EventLoop, jobs: Mapping[str, Job]) -> None:
        super().__init__(per_second, clock)
        self.loop = loop
        self.jobs = jobs

    def reserve(self, key: str) -> float:
        job = self.jobs.get(key)
        if job is not None and job.due_at is None:
            job.due_at = self.loop.elapsed
        return super().reserve(key)


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if "still in squeue" in record.msg:
            key = str(record.args[0]) if isinstance(record.args, tuple) else "?"
            self.lines[key] = self.lines.get(key, 0) + 1


def after(seed: int, options: dict[str, Any], store: Store, prefix: str,
          progress: Progress | None) -> dict[str, Any]:
    clock = SimulatedClock(START)
    loop = EventLoop(clock, seed)
    keys = [f"{prefix}c{i:05d}" for i in range(1, options["containers"] + 1)]
    model = draw_world(loop, options, keys, options["max_in_flight"])
    phase = loop.rng.uniform(0, options["poll_interval"])
    rate = _TimedRate(options["scancels_per_second"], clock, loop, model.jobs)
    model.turn = rate.turn
    slurm = SimulatedSlurm(model, loop, rate)
    api = MemoryContainerAPI({key: RUNNING for key in keys})
    engine = Engine(store, [machine.SPEC], guards=machine.GUARDS,
                    effects=machine.effects(slurm, api), clock=clock)
    worker = InlineWorker(engine, seed=seed)
    logger = logging.getLogger(f"{__name__}.after")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    counter = _Counter()
    logger.addHandler(counter)
    settings = machine.Settings(delay_a=options["delay_a"], delay_b=options["delay_b"],
                                poll_interval=options["poll_interval"],
                                log_interval=options["log_interval"],
                                quick_poll=options["quick_poll"])
    dispatcher = machine.Dispatcher(engine, slurm, settings, logger=logger)
    woken: set[float] = set()

    def work() -> None:
        worker.run_until_idle()
        with store.reading() as db:   # the next timer, to wake the worker then
            db.execute(store.sql.soonest_due, {})
            soonest = db.fetchall()[0][0]
        if soonest is not None:
            due = (store.time_value(soonest) - loop.start).total_seconds()
            if due > loop.elapsed and due not in woken:
                woken.add(due)
                loop.at(due, work)

    # The dispatcher has been running all along: its polls fall at the same phase as
    # Arvados' (the last one before the finish, one interval earlier), and it looks whether
    # a poll is due every quick_poll seconds.
    dispatcher.last_poll = loop.start + dt.timedelta(seconds=phase - options["poll_interval"])
    first_tick = phase % options["quick_poll"]

    def tick(number: int) -> None:
        """The dispatcher's loop: every quick_poll seconds, a poll if one is due."""
        report = dispatcher.poll_if_due()
        if report is not None:
            work()
            if not report.containers:
                return
        loop.at(first_tick + (number + 1) * options["quick_poll"],
                functools.partial(tick, number + 1))

    def finish() -> None:
        for key in keys:
            dispatcher.add(key, state="running", job_id=key)
        for key in keys:
            api.set(key, COMPLETE)
        # every crunch-run's report at this instant, written as the engine's batches
        raise_first(engine.fire_many(
            [(f"{machine.MACHINE}:{key}", "container_done", {"container_state": COMPLETE},
              "crunch-run", None) for key in keys], on_stale="raise"))
        work()

    loop.at(0.0, finish)
    loop.at(first_tick, functools.partial(tick, 0))
    try:
        loop.run(options["limit"], progress)
    finally:
        logger.removeHandler(counter)
    for key, lines in counter.lines.items():
        model.jobs[key].log_lines = lines
    figures = model.figures(bound(options))
    figures.update(where_the_time_went(model))
    figures["log_lines_left_out"] = dispatcher.still_in_squeue.suppressed
    figures["left_in_squeue"] = sum(1 for k in keys if model.listed(k))
    gone = engine.resources(machine.MACHINE, state="gone")
    figures["containers_gone"] = sum(1 for r in gone if r.key in model.jobs)
    figures["api_changes"] = len(api.changes)
    cancelled = [k for k in keys if model.jobs[k].cancels]
    figures["example"] = cancelled[-1] if cancelled else (keys[0] if keys else None)
    return figures


def where_the_time_went(model: SlurmModel) -> dict[str, float]:
    """For the jobs cancelled, the longest of each leg from the container's end to the job
    leaving: to its first cancel's turn being asked for (delay A and a fresh squeue), from
    there to the TERM reaching it (the rate limit and the pool), and from the TERM to
    leaving (its own exit time)."""
    jobs = [j for j in model.jobs.values() if j.due_at is not None]
    termed = [j for j in jobs if j.termed_at is not None]
    return {
        "longest_to_cancel_due": round(max((j.due_at or 0.0 for j in jobs), default=0.0), 3),
        "longest_due_to_term": round(max(((j.termed_at or 0.0) - (j.due_at or 0.0)
                                          for j in termed), default=0.0), 3),
        "longest_term_to_gone": round(max((j.leaves_at - (j.termed_at or 0.0)
                                           for j in termed), default=0.0), 3),
    }


DEFAULTS: dict[str, Any] = {
    "containers": 1000, "linger_mean": 8.0, "exit_time": (2.0, 20.0), "ctld_rate": 200.0,
    "poll_interval": 10.0, "delay_a": machine.Settings.delay_a,
    "delay_b": machine.Settings.delay_b,
    "scancels_per_second": SCANCELS_PER_SECOND, "max_in_flight": 3, "log_interval": 60.0,
    "quick_poll": 1.0, "limit": 3600.0,
}


def simulate(*, seed: int = 1, progress: Progress | None = None, store: Store | None = None,
             prefix: str = "", **changes: Any) -> dict[str, Any]:
    """Arvados' two policies and the machine on one world; the machine's on ``store``
    (default: a temporary one)."""
    options = {**DEFAULTS, **{k: v for k, v in changes.items() if v is not None}}
    started = time.perf_counter()
    old, today = before(seed, options), master(seed, options)
    with tempfile.TemporaryDirectory(prefix="lifecycle-scancel-flood-") as directory:
        target = store or Store.new_sqlite(Path(directory) / "run.db")
        try:
            new = after(seed, options, target, prefix, progress)
        finally:
            if store is None:
                target.dispose()
    example = new.pop("example")
    report: dict[str, Any] = {
        "simulation": "scancel-flood", "seed": seed,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
        "columns": {"before": "Arvados 11669", "master": "Arvados today",
                    "after": "lifecycle"},
        "before": old, "master": today, "after": new,
        "goal": {"scancels_per_second": options["scancels_per_second"],
                 "in_flight": options["max_in_flight"],
                 "linger": f"delay A + one poll + its exit time = {bound(options):g} s "
                           "+ its exit time"},
        "timing": {"seconds": round(time.perf_counter() - started, 2)},
        "hints": [f"lifecycle history slurm_dispatch:{example}   a container whose job "
                  "lingered past delay A: the squeue each scancel rested on, and the "
                  "delays"] if example else [],
    }
    rows = [
        ("scancel invocations", "scancel_invocations", None),
        ("most scancels started in one second", "most_scancels_in_one_second", None),
        ("most Slurm commands in flight", "most_in_flight", None),
        ("longest linger after finishing (s)", "longest_linger", _seconds),
        ("longest: finished to cancel due (s)", "longest_to_cancel_due", _seconds),
        ("longest: cancel due to TERM sent (s)", "longest_due_to_term", _seconds),
        ("longest: TERM to leaving squeue (s)", "longest_term_to_gone", _seconds),
        ("jobs lingering past delay A + a poll + their exit time", "lingered_past_bound",
         None),
        ('"still in squeue" log lines', "still_in_squeue_lines", None),
    ]
    report["measures"] = [
        {"what": what, **{column: (shown or _same)(figures[field])
                          for column, figures in (("before", old), ("master", today),
                                                  ("after", new))}}
        for what, field, shown in rows]
    return report


def _same(value: Any) -> Any:
    return value


def bound(options: Mapping[str, Any]) -> float:
    """What a job may linger beyond its own exit time: delay A and one poll."""
    return float(options["delay_a"] + options["poll_interval"])


def _seconds(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else str(value)


SIMULATION = Simulation(
    name="scancel-flood",
    summary="Arvados dispatching containers that finish together: the scancel loop",
    run=simulate,
    options={
        "containers": Option(int, DEFAULTS["containers"], "containers finishing at once", ">=1"),
        "linger_mean": Option(float, DEFAULTS["linger_mean"],
                              "mean seconds a job lingers in squeue by itself", ">0"),
        "ctld_rate": Option(float, DEFAULTS["ctld_rate"], "commands slurmctld answers a second",
                            ">0"),
        "poll_interval": Option(float, DEFAULTS["poll_interval"], "seconds between squeue polls",
                                ">0"),
        "delay_a": Option(float, DEFAULTS["delay_a"], "the machine's delay A, seconds", ">=0"),
        "delay_b": Option(float, DEFAULTS["delay_b"], "the machine's delay B, seconds", ">=0"),
        "scancels_per_second": Option(float, DEFAULTS["scancels_per_second"],
                                      "the machine's scancel rate limit R", ">0"),
        "max_in_flight": Option(int, DEFAULTS["max_in_flight"],
                                "the machine's pool P of Slurm commands in flight", ">=1"),
        "log_interval": Option(float, DEFAULTS["log_interval"],
                               "seconds between repeats of a container's \"still in squeue\"",
                               ">0"),
        "quick_poll": Option(float, DEFAULTS["quick_poll"],
                             "the machine's soonest poll after the last while a scancel is due",
                             ">0"),
    },
    demo={"containers": 200},
)
