"""The Slurm commands of a container dispatcher (the ``slurm_dispatch`` machine), with the
limits that keep a thousand cancels from flooding Slurm.

Jobs are named after their container (``sbatch --job-name=<uuid>``), as Arvados'
``crunch-dispatch-slurm`` names them, but a job is known by its **job id**, never by a name
read back from Slurm: a name is whatever its submitter chose, and Slurm prints it verbatim,
blanks, ``|`` and line breaks included, so a name can look like another job's line.

- submit: ``sbatch --parsable --job-name=<name> --nice=10000 --no-requeue [options]
  script|--wrap``; the job id it prints is kept in the container's data. A name that
  squeue could not print on one line (a line feed or another control character) is refused
  before anything runs (:func:`~lifecycle.adapters.slurm.job_name_problem`).
- the queue: one ``squeue --json`` when this Slurm has it (Slurm 21.08 and later; settled at
  the first poll Slurm answers): every field is exact, whatever the names hold. Otherwise
  one ``squeue --all --noheader --format=%A|%y|%Q|%T|%r|%j``: the job id first and the name
  last, split once, so blanks and ``|`` in a name are the name's. A line that does not parse
  (the rest of a name that holds a line break) is skipped with a warning, and a job id found
  on two lines (one of them forged by such a name) is *unsure*: neither listed nor gone, so
  nothing is decided on it until a poll lists it once. Jobs are keyed by id; no line is
  attributed to a container by its name. squeue runs outside the pool below, as Arvados runs
  it.
- cancel: one ``scancel -v`` of the job id per turn, the step that reaches the job in the
  state squeue showed (:data:`CANCEL_STEPS`, :func:`cancel_step`): ``--state=pending``;
  ``--batch --signal=TERM --state=running`` (TERM to the batch shell only, so that the
  container's supervisor can stop the container itself; plain scancel would SIGKILL it
  after ``KillWait``); or the same with ``--state=suspended``. scancel exits 0 whether or
  not it matched the job, so whether it acted is read from its verbose report
  (``Terminating job <id>``, ``Signal 15 to batch job <id>``).
- renice: ``scontrol update JobId=<id> Nice=<n>``.

Every command is a subprocess (an argument list, never a shell) with a timeout; in a
``wrap`` line the name is ``"${SLURM_JOB_NAME}"``, expanded by the job's shell as a value.

The limits live here, in the one adapter object the worker's handler threads share, because
what they protect is local to where the commands run: Slurm's controller, and this host's
process table and file descriptors. The worker has no limits per effect name, and a
limit kept in the database would cost a transaction per command. With several dispatcher
processes each has its own limits (run one dispatcher per cluster, as Arvados does).

- :class:`CommandPool`: at most ``max_in_flight`` sbatch, scancel and scontrol commands at
  once; a command waits for a slot (at most its timeout).
- :class:`ScancelRate`: at most ``per_second`` scancel invocations started a second, one
  tick of ``1 / per_second`` apart, to the cancels in the order they fell due (the oldest
  first, so none is starved behind later ones). A long wait is never slept in a handler
  thread: :meth:`ScancelRate.reserve` says how long until a cancel's turn, and the machine
  waits that long in a state with a timer (``cancelling.throttled``), so no thread is held
  and the wait is in the journal; each invocation then waits only for its own tick
  (milliseconds) inside its slot.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..clock import Clock, SystemClock
from ..logs import logger
from .sites import SiteError
from .slurm import SlurmCommands, job_name_problem, says_gone

log = logger(__name__)

INITIAL_NICE = 10000
"""The niceness every job is submitted with (Arvados' ``initialNiceValue``): room to renice
jobs up and down."""
SCANCELS_PER_SECOND = 150.0
"""The default rate limit R: a thousand jobs falling due together receive their signals
within 7 s, less than a poll interval, so that no job lingers longer than under Arvados'
own cancel loop (``lifecycle simulate scancel-flood``), while the peak stays below the
200 a second that loop reaches."""
SQUEUE_FORMAT = "%A|%y|%Q|%T|%r|%j"
"""squeue's line when it has no ``--json``: job id, nice, priority, state, reason, and the
name last."""
CANCEL_STEPS: tuple[tuple[str, ...], ...] = (
    ("--state=pending",),
    ("--batch", "--signal=TERM", "--state=running"),
    ("--batch", "--signal=TERM", "--state=suspended"),
)
"""The scancel that reaches a pending, a running and a suspended job (before the job id)."""

FINISHED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
                      "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT"})
"""Job states squeue lists only when asked for every state (``--json`` always lists them):
the job has left the queue."""

_LINE = re.compile(r"(\d+)\|(-?\d+)\|(-?\d+)\|([A-Z_]+)\|([^|]*)\|(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One job as squeue lists it."""

    job_id: str
    name: str
    nice: int
    priority: int
    state: str
    reason: str


@dataclass(frozen=True)
class Listing:
    """One squeue: the jobs by id, and the ids it listed more than once (``unsure``: a job
    name holding a line break forged a line for one of them; neither listed nor gone)."""

    jobs: Mapping[str, QueueEntry]
    unsure: frozenset[str] = frozenset()

    def find(self, job_id: str | None, name: str) -> tuple[QueueEntry | None, bool]:
        """The job ``job_id`` (None: not listed), and whether the listing is sure of it.
        Without a job id (a container submitted before ids were kept), the one job named
        ``name``; two or more so named are unsure."""
        if job_id:
            return self.jobs.get(job_id), job_id not in self.unsure
        named = [job for job in self.jobs.values() if job.name == name]
        return (named[0] if named else None), len(named) <= 1


def parse_squeue(stdout: str) -> Listing:
    """Jobs by id from ``squeue --format=%A|%y|%Q|%T|%r|%j`` (the name last, split once, so
    it may hold blanks and ``|``). A line that does not parse is logged and skipped; a job id
    on two lines is unsure (see :class:`Listing`)."""
    jobs: dict[str, QueueEntry] = {}
    unsure: set[str] = set()
    for number, line in enumerate(stdout.split("\n"), 1):
        if not line.strip():
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            log.warning("squeue line %d ignored, it is not a job's line (a job name holding "
                        "a line break?): %r", number, line[:200])
            continue
        job_id, nice, priority, state, reason, name = match.groups()
        if job_id in jobs:
            log.warning("squeue listed job %s twice (a job name holding a line break forged "
                        "one of the lines): nothing is decided on it this time", job_id)
            unsure.add(job_id)
            continue
        jobs[job_id] = QueueEntry(job_id, name, int(nice), int(priority), state, reason)
    for job_id in unsure:
        del jobs[job_id]
    return Listing(jobs, frozenset(unsure))


def parse_squeue_json(text: str) -> Listing:
    """Jobs by id from ``squeue --json`` (Slurm 21.08's and later shapes: a state as a string
    or a list of flags, a number as an integer or ``{"set", "number"}``), without the
    finished jobs that ``--json`` lists and plain squeue does not (:data:`FINISHED`)."""
    try:
        document = json.loads(text)
        entries = document["jobs"]
        jobs = {}
        for job in entries:
            job_id = str(int(_number(job["job_id"])))
            state = job.get("job_state") or ""
            if isinstance(state, list):
                state = state[0] if state else ""
            if state in FINISHED:
                continue
            jobs[job_id] = QueueEntry(job_id, str(job.get("name") or ""),
                                      _number(job.get("nice")), _number(job.get("priority")),
                                      str(state), str(job.get("state_reason") or ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise SiteError(f"squeue --json: not the listing it should be ({exc!r}): "
                        f"{text[:200]!r}") from exc
    return Listing(jobs)


def _number(value: Any) -> int:
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set", True) else 0
    return int(value or 0)


class CommandPool:
    """At most ``size`` commands in flight; counts them, and the most ever at once."""

    def __init__(self, size: int, wait: float) -> None:
        if size < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {size}")
        self.size = size
        self.wait = wait
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    @contextlib.contextmanager
    def slot(self, what: str) -> Iterator[None]:
        if not self._slots.acquire(timeout=self.wait):
            raise SiteError(f"{what}: no free slot among {self.size} Slurm commands in "
                            f"flight within {self.wait:g} s")
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1
            self._slots.release()


@dataclass
class _Ask:
    """A cancel waiting for its turn under the rate limit."""

    order: int
    told: int
    """The start it was last told (microseconds)."""


class ScancelRate:
    """At most ``per_second`` scancel invocations started a second: each starts at least
    one tick (``1 / per_second``) after the one before. ``per_second=None``: no limit.

    The ticks go to the cancels in the order they first asked (the earliest due first): a
    cancel told to come back keeps its place, so none is starved behind later ones. When a
    thousand cancels fall due together, each job receives its signal one tick after the one
    before.

    :meth:`reserve` says how long until a cancel's scancel may begin, and at 0 takes its
    tick. A long wait is never slept in a handler thread: the machine waits that long in a
    state with a timer (``cancelling.throttled``), then asks again. :meth:`turn`, called
    for each invocation from inside its slot in the pool, says how long to wait before
    starting it: at least one tick after the last started (a few milliseconds once the
    cancel was granted). Times are counted in whole microseconds, so the spacing is
    exact."""

    GRACE = 1_000_000
    """A cancel told to start more than this long ago (microseconds) that has not come back
    no longer holds back the ones after it..."""
    STALE = 60_000_000
    """...and after this long it is forgotten (its job left while it waited)."""

    def __init__(self, per_second: float | None, clock: Clock | None = None) -> None:
        if per_second is not None and not per_second > 0:
            raise ValueError(f"scancels_per_second must be positive (or None), not "
                             f"{per_second}")
        self.per_second = per_second
        self.clock = clock or SystemClock()
        self.spacing = math.ceil(1_000_000 / per_second) if per_second else 0
        self._lock = threading.Lock()
        self._free = -(2**62)
        """The tick after every invocation granted."""
        self._last = -(2**62)
        self._asks: dict[str, _Ask] = {}
        self._order = itertools.count()

    def _now(self) -> int:
        return round(self.clock.now().timestamp() * 1_000_000)

    def reserve(self, key: str) -> float:
        """Seconds until ``key``'s scancel may begin; 0.0: begin now (its tick is taken)."""
        if not self.spacing:
            return 0.0
        now = self._now()
        stale, grace = now - self.STALE, now - self.GRACE
        with self._lock:
            asks = self._asks
            ask = asks.get(key)
            if ask is None:
                ask = asks[key] = _Ask(next(self._order), now)
            # one pass over the cancels waiting (a thousand when a thousand fall due
            # together, on every ask): the stale ones noted, the others before this one
            # that were told to start within the grace counted (its own order is no other's)
            mine, ahead, gone = ask.order, 0, []
            for other_key, other in asks.items():
                told = other.told
                if told < stale:
                    gone.append(other_key)
                elif told >= grace and other.order < mine:
                    ahead += 1
            for other_key in gone:
                del asks[other_key]
            start = max(now, self._free, self._last + self.spacing) + ahead * self.spacing
            if start <= now:
                del self._asks[key]
                self._free = start + self.spacing
                return 0.0
            ask.told = start
            return (start - now) / 1_000_000

    def turn(self) -> float:
        """Seconds to wait before starting a scancel invocation now; it is counted as
        started then."""
        if not self.spacing:
            return 0.0
        now = self._now()
        with self._lock:
            at = max(now, self._last + self.spacing)
            self._last = at
            self._free = max(self._free, at + self.spacing)
            return (at - now) / 1_000_000

    def forget(self, key: str) -> None:
        """``key`` no longer waits (its job left squeue)."""
        with self._lock:
            self._asks.pop(key, None)

    def waiting(self) -> int:
        """How many cancels wait for their turn."""
        with self._lock:
            return len(self._asks)


def cancel_step(state: str | None) -> int:
    """The step (index in :data:`CANCEL_STEPS`) that reaches a job in ``state`` as squeue
    last showed it: ``PENDING`` (or unknown: None), the pending step; ``SUSPENDED``, the
    suspended one; any other (``RUNNING``, ``COMPLETING``, ...) the TERM to a running job."""
    return 0 if state is None else {"PENDING": 0, "SUSPENDED": 2}.get(state, 1)


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a cancel did: the exit status of the step that failed (0 when none did; None
    when a command could not be run or timed out), how many scancel invocations ran, and
    whether one of them acted on the job (its verbose report says it signalled or
    terminated it; False: the job was in none of the states the steps asked for, or gone)."""

    exit: int | None
    invocations: int
    detail: str = ""
    acted: bool = False

    @property
    def ok(self) -> bool:
        return self.exit == 0


@dataclass
class SlurmDispatch(SlurmCommands):
    """The dispatcher's Slurm: the settings of :class:`~lifecycle.adapters.slurm.
    SlurmCommands` (``script`` or ``wrap``, ``sbatch_options``, the commands,
    ``command_prefix``, ``environment``, ``timeout``: seconds per command, and the longest
    wait for a slot in the pool), the limits, and ``squeue_json``: read squeue as JSON
    (True), as lines (False), or whichever this Slurm has, settled at the first poll that
    Slurm answers (None)."""

    max_in_flight: int = 3
    scancels_per_second: float | None = SCANCELS_PER_SECOND
    squeue_json: bool | None = None
    clock: Clock = field(default_factory=SystemClock)
    sleep: Callable[[float], None] = time.sleep
    """How a scancel waits for its tick under the rate limit (a few milliseconds)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.pool = CommandPool(self.max_in_flight, self.timeout)
        self.rate = ScancelRate(self.scancels_per_second, self.clock)
        self.scancel_invocations = 0
        self._counting = threading.Lock()

    def submit(self, name: str) -> str:
        """Submit the container's job, named ``name``; its job id. ValueError, before any
        command runs, for a name squeue could not list on one line."""
        problem = job_name_problem(name)
        if problem:
            raise ValueError(f"cannot submit a Slurm job named {name!r}: {problem}, and "
                             "Slurm prints job names verbatim, one job a line")
        argv = self.sbatch_argv(name, "--parsable", f"--nice={INITIAL_NICE}", "--no-requeue")
        job = self.submit_parsable(argv)        # in a slot of the pool, as every command
        log.info("container %s submitted as Slurm job %s", name, job)
        return job

    def queue(self) -> Listing:
        """Every job in squeue, by job id; SiteError when squeue fails. Outside the pool:
        a poll never waits behind the scancels it decides about."""
        refused = ""
        if self.squeue_json is not False:
            argv = [self.squeue, "--json"]
            done = super().run(argv)
            if done.returncode == 0 and done.stdout.lstrip().startswith("{"):
                if self.squeue_json is None:
                    log.info("squeue --json answers: squeue is read as JSON")
                    self.squeue_json = True
                return parse_squeue_json(done.stdout)
            if self.squeue_json:
                raise self.failed(argv, done)
            refused = (done.stderr.strip() or "no JSON")[:200]
        argv = [self.squeue, "--all", "--noheader", f"--format={SQUEUE_FORMAT}"]
        done = super().run(argv)
        if done.returncode != 0:   # Slurm is not answering: whether it has --json is open
            raise self.failed(argv, done)
        if self.squeue_json is None:  # lines answer where JSON did not: this Slurm lacks it
            log.info("squeue has no --json here (%s): squeue is read line by line, the job "
                     "id first and the name last", refused)
            self.squeue_json = False
        return parse_squeue(done.stdout)

    def cancel(self, job_id: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        """The cancel's ``steps`` (indices in :data:`CANCEL_STEPS`; all three by default)
        on job ``job_id``, stopping at the first that fails or acts, or when the job has
        left (scancel of a job id Slurm no longer knows exits 1: not a failure); never
        raises for a failed step, says which."""
        ran = 0
        acted = re.compile(rf"(?:Terminating job|Signal \d+ to (?:batch )?job) "
                           rf"{re.escape(job_id)}\b")
        for step in steps:
            argv = [self.scancel, "-v", *CANCEL_STEPS[step], job_id]
            ran += 1
            try:
                done = self.run(argv, scancel=True)
            except SiteError as exc:
                return CancelOutcome(None, ran, str(exc))
            if done.returncode != 0 and says_gone(done.stderr):
                return CancelOutcome(0, ran, f"job {job_id} has left: nothing to cancel")
            if done.returncode != 0:
                return CancelOutcome(done.returncode, ran, str(self.failed(argv, done)))
            if acted.search(done.stderr) and f"error on job id {job_id}:" not in done.stderr:
                return CancelOutcome(0, ran, acted=True)
        return CancelOutcome(0, ran, f"job {job_id} was in none of the states asked for")

    def renice(self, job_id: str, nice: int) -> None:
        argv = [self.scontrol, "update", f"JobId={job_id}", f"Nice={nice}"]
        done = self.run(argv)
        if done.returncode != 0:
            raise self.failed(argv, done)

    def run(self, argv: Sequence[str],
            scancel: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a command in a slot of the pool; a scancel also waits for its tick under the
        rate limit."""
        with self.pool.slot(" ".join([*self.command_prefix, *argv])):
            if scancel:
                wait = self.rate.turn()
                if wait > 0:
                    self.sleep(wait)
                with self._counting:
                    self.scancel_invocations += 1
            return super().run(argv)
