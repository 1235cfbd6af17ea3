"""The Slurm commands of a container dispatcher (the ``slurm_dispatch`` machine), with the
limits that keep a thousand cancels from flooding Slurm.

Jobs are named after their container (``sbatch --job-name=<uuid>``), so every command
addresses a job by name, as Arvados' ``crunch-dispatch-slurm`` does:

- submit: ``sbatch --job-name=<name> --nice=10000 --no-requeue [options] script|--wrap``;
- the queue: one ``squeue --all --noheader --format=%j %y %Q %T %r`` (name, nice, priority,
  state, reason) for every job, read line by line; a line that does not parse is warned
  about and skipped, never fatal;
- cancel, three steps, stopping at the first that fails: ``scancel --name=<name>
  --state=pending``, ``scancel --name=<name> --batch --signal=TERM --state=running`` and
  the same with ``--state=suspended`` (:data:`CANCEL_STEPS`; :func:`cancel_order` puts the
  one that reaches the job in the state squeue showed first). TERM to the batch shell only,
  so that the container's supervisor can stop the container itself; plain scancel would
  SIGKILL it after ``KillWait``. scancel exits 0 when no job matches, so cancelling a job
  that already left is harmless;
- renice: ``scontrol update JobName=<name> Nice=<n>``.

Every command is a subprocess (an argument list, never a shell) with a timeout.

The limits live here, in the one adapter object the worker's handler threads share, because
what they protect is local to where the commands run: Slurm's controller, and this host's
process table and file descriptors. The worker has no limits per effect name, and a
limit kept in the database would cost a transaction per command. With several dispatcher
processes each has its own limits (run one dispatcher per cluster, as Arvados does).

- :class:`CommandPool`: at most ``max_in_flight`` commands of any kind at once; a command
  waits for a slot (at most its timeout).
- :class:`ScancelRate`: at most ``per_second`` scancel invocations started a second, one
  tick of ``1 / per_second`` apart, each cancel's lead (the scancel that reaches its job)
  served before the other steps of any cancel. A long wait is never slept in a handler
  thread: :meth:`ScancelRate.reserve` says how long until a cancel's turn, and the machine
  waits that long in a state with a timer (``cancelling.throttled``), so no thread is held
  and the wait is in the journal; each invocation then waits only for its own tick
  (milliseconds) inside its slot.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..clock import Clock, SystemClock
from ..errors import SiteError
from ..logs import logger
from .slurm import SlurmCommands

log = logger(__name__)

INITIAL_NICE = 10000
"""The niceness every job is submitted with (Arvados' ``initialNiceValue``): room to renice
jobs up and down."""
SCANCELS_PER_SECOND = 50.0
"""The default rate limit R: a thousand jobs falling due together receive their signals
within 20 s, and 450 within a 10 s poll interval less the quick poll (the simulation's goal);
a fraction of what a controller answers (a scancel takes it about 10 ms)."""
SQUEUE_FORMAT = "%j %y %Q %T %r"
CANCEL_STEPS: tuple[tuple[str, ...], ...] = (
    ("--state=pending",),
    ("--batch", "--signal=TERM", "--state=running"),
    ("--batch", "--signal=TERM", "--state=suspended"),
)
"""The three scancel invocations of one cancel, in order (after ``--name=<name>``)."""


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One job as squeue lists it."""

    name: str
    nice: int
    priority: int
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What a three-step cancel did: the exit status of the step that failed (0 when all
    three exited 0; None when a command could not be run or timed out), and how many scancel
    invocations ran."""

    exit: int | None
    invocations: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.exit == 0


def parse_squeue(stdout: str) -> dict[str, QueueEntry]:
    """Jobs by name from ``squeue --format='%j %y %Q %T %r'``; a malformed line is logged
    and skipped (the reason, which may hold spaces, is the rest of the line)."""
    jobs: dict[str, QueueEntry] = {}
    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(None, 4)
        try:
            if len(parts) < 4:
                raise ValueError(f"{len(parts)} fields, not 5")
            name, nice, priority, state = parts[:4]
            entry = QueueEntry(name, int(nice), int(priority), state,
                               parts[4].strip() if len(parts) > 4 else "")
        except ValueError as exc:
            log.warning("squeue line %d ignored, it does not parse (%s): %r", number, exc,
                        line)
            continue
        jobs[entry.name] = entry
    return jobs


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

    lead: bool
    order: int
    count: int
    told: int
    """The start it was last told (microseconds)."""


class ScancelRate:
    """At most ``per_second`` scancel invocations started a second: each starts at least
    one tick (``1 / per_second``) after the one before. ``per_second=None``: no limit.

    The ticks go to the most urgent first. A cancel asks twice: for its lead (the one
    scancel that reaches the job as squeue last showed it) and then for the rest of its
    three steps, which only make sure. Every lead waiting is served before any rest, leads
    in the order they first asked (the earliest due first), then the rests likewise. So
    when a thousand cancels fall due together, each job receives its signal one tick after
    the one before, not three, and the steps that only make sure come after (or never, for
    a job that has left meanwhile: :meth:`forget`).

    :meth:`reserve` says how long until a cancel's invocations may begin, and at 0 takes
    their ticks. A long wait is never slept in a handler thread: the machine waits that long
    in a state with a timer (``cancelling.throttled``), then asks again. :meth:`turn`, called
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

    def reserve(self, key: str, count: int = len(CANCEL_STEPS), *, lead: bool = True) -> float:
        """Seconds until ``key``'s ``count`` invocations (its lead, or the rest of its cancel)
        may begin; 0.0: begin now (their ticks are taken)."""
        if not self.spacing:
            return 0.0
        now = self._now()
        with self._lock:
            ask = self._asks.get(key)
            if ask is None or ask.lead != lead or ask.count != count:
                ask = self._asks[key] = _Ask(lead, next(self._order), count, now)
            ahead = 0
            for other_key, other in list(self._asks.items()):
                if other.told < now - self.STALE:
                    del self._asks[other_key]
                elif (other is not ask and other.told >= now - self.GRACE
                      and (not other.lead, other.order) < (not lead, ask.order)):
                    ahead += other.count
            start = max(now, self._free, self._last + self.spacing) + ahead * self.spacing
            if start <= now:
                del self._asks[key]
                self._free = start + count * self.spacing
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


def cancel_order(state: str | None) -> tuple[int, ...]:
    """The three steps (indices in :data:`CANCEL_STEPS`) with the one that reaches a job in
    ``state``, as squeue last showed it, first: ``PENDING``, the pending step;
    ``SUSPENDED``, the suspended one; any other (``RUNNING``, ``COMPLETING``, ...) the TERM
    to a running job. Unknown (None): Arvados' order, pending first. The others follow in
    their order; the sequence is three steps either way."""
    lead = 0 if state is None else {"PENDING": 0, "SUSPENDED": 2}.get(state, 1)
    return (lead, *(i for i in range(len(CANCEL_STEPS)) if i != lead))


@dataclass
class SlurmDispatch(SlurmCommands):
    """The dispatcher's Slurm: the settings of :class:`~lifecycle.adapters.slurm.
    SlurmCommands` (``script`` or ``wrap``, ``sbatch_options``, the commands,
    ``command_prefix``, ``environment``, ``timeout``: seconds per command, and the longest
    wait for a slot in the pool), and the limits."""

    max_in_flight: int = 3
    scancels_per_second: float | None = SCANCELS_PER_SECOND
    clock: Clock = field(default_factory=SystemClock)
    sleep: Callable[[float], None] = time.sleep
    """How a scancel waits for its tick under the rate limit (a few milliseconds)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.pool = CommandPool(self.max_in_flight, self.timeout)
        self.rate = ScancelRate(self.scancels_per_second, self.clock)
        self.scancel_invocations = 0
        self._counting = threading.Lock()

    def submit(self, name: str) -> None:
        """Submit the container's job, named ``name``."""
        argv = self.sbatch_argv(name, f"--nice={INITIAL_NICE}", "--no-requeue")
        done = self.run(argv)
        if done.returncode != 0:
            raise self.failed(argv, done)
        log.info("container %s submitted: %s", name, done.stdout.strip())

    def queue(self) -> dict[str, QueueEntry]:
        """Every job in squeue, by name; SiteError when squeue fails."""
        argv = [self.squeue, "--all", "--noheader", f"--format={SQUEUE_FORMAT}"]
        done = self.run(argv)
        if done.returncode != 0:
            raise self.failed(argv, done)
        return parse_squeue(done.stdout)

    def cancel(self, name: str, steps: Sequence[int] = (0, 1, 2)) -> CancelOutcome:
        """The cancel's ``steps`` (indices in :data:`CANCEL_STEPS`; all three by default),
        stopping at the first that fails; never raises for a failed step, says which."""
        ran = 0
        for step in steps:
            argv = [self.scancel, f"--name={name}", *CANCEL_STEPS[step]]
            ran += 1
            try:
                done = self.run(argv, scancel=True)
            except SiteError as exc:
                return CancelOutcome(None, ran, str(exc))
            if done.returncode != 0:
                return CancelOutcome(done.returncode, ran, str(self.failed(argv, done)))
        return CancelOutcome(0, ran)

    def renice(self, name: str, nice: int) -> None:
        argv = [self.scontrol, "update", f"JobName={name}", f"Nice={nice}"]
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
