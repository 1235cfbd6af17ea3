"""The Slurm commands of a container dispatcher (the ``slurm_dispatch`` machine), with the
limits that keep a thousand cancels from flooding Slurm.

Jobs are named after their container (``sbatch --job-name=<uuid>``), so every command
addresses a job by name, as Arvados' ``crunch-dispatch-slurm`` does:

- submit: ``sbatch --job-name=<name> --nice=10000 --no-requeue [options] script|--wrap``;
- the queue: one ``squeue --all --noheader --format=%j %y %Q %T %r`` (name, nice, priority,
  state, reason) for every job, read line by line; a line that does not parse is warned
  about and skipped, never fatal;
- cancel, three steps, stopping at the first that fails: ``scancel --name=<name>
  --state=pending``, then ``scancel --name=<name> --batch --signal=TERM --state=running``,
  then the same with ``--state=suspended``. TERM to the batch shell only, so that the
  container's supervisor can stop the container itself; plain scancel would SIGKILL it
  after ``KillWait``. scancel exits 0 when no job matches, so cancelling a job that already
  left is harmless;
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
  tick of ``1 / per_second`` apart. A long wait is never slept in a handler thread:
  :meth:`ScancelRate.reserve` books a cancel's ticks and says how long until its first,
  and the machine waits that long in a state with a timer (``cancelling.throttled``), so
  no thread is held and the wait is in the journal; each invocation then waits only for
  its own tick (milliseconds) inside its slot.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..clock import Clock, SystemClock
from ..errors import SiteError
from .slurm import Runner, command_failed, run_checked, run_command

log = logging.getLogger(__name__)

INITIAL_NICE = 10000
"""The niceness every job is submitted with (Arvados' ``initialNiceValue``): room to renice
jobs up and down."""
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


class ScancelRate:
    """At most ``per_second`` scancel invocations started a second: each starts at least
    ``1 / per_second`` after the one before (a ticker), first come, first served.

    :meth:`reserve` books a cancel's invocations the next free ticks, after every tick
    already booked, and says how long until its first: the machine waits that long in a
    state with a timer (no thread is held), then asks again and is told 0. :meth:`turn`,
    called for each invocation from inside its slot in the pool, says how long to wait
    before starting it: until its booked tick, and at least one tick after the last
    invocation started (a few milliseconds when the cancel was booked). Times are counted
    in whole microseconds, so the spacing is exact. ``per_second=None``: no limit."""

    def __init__(self, per_second: float | None, clock: Clock | None = None) -> None:
        if per_second is not None and not per_second > 0:
            raise ValueError(f"scancels_per_second must be positive (or None), not "
                             f"{per_second}")
        self.per_second = per_second
        self.clock = clock or SystemClock()
        self.spacing = math.ceil(1_000_000 / per_second) if per_second else 0
        self._lock = threading.Lock()
        self._next = -(2**62)
        self._last = -(2**62)
        self._booked: dict[str, deque[int]] = {}

    def _now(self) -> int:
        return round(self.clock.now().timestamp() * 1_000_000)

    def reserve(self, key: str, count: int = len(CANCEL_STEPS)) -> float:
        """Seconds until ``key``'s cancel may begin (booking it if it is not yet booked);
        0.0: begin now."""
        if not self.spacing:
            return 0.0
        now = self._now()
        with self._lock:
            ticks = self._booked.get(key)
            if not ticks:
                self._forget_stale(now)
                first = max(now, self._next)
                ticks = deque(first + i * self.spacing for i in range(count))
                self._booked[key] = ticks
                self._next = first + count * self.spacing
            return max(0, ticks[0] - now) / 1_000_000

    def turn(self, key: str) -> float:
        """Seconds to wait before starting the next scancel invocation for ``key``; the
        invocation is counted as started then."""
        if not self.spacing:
            return 0.0
        now = self._now()
        with self._lock:
            ticks = self._booked.get(key)
            booked = ticks.popleft() if ticks else None
            if ticks is not None and not ticks:
                del self._booked[key]
            at = max(now, self._last + self.spacing, booked if booked is not None else now)
            if booked is None:
                self._next = max(self._next, at + self.spacing)
            self._last = at
            return (at - now) / 1_000_000

    def _forget_stale(self, now: int) -> None:
        """Bookings whose cancel never came (its job left while it waited)."""
        stale = [k for k, ticks in self._booked.items()
                 if ticks and ticks[-1] < now - 60_000_000]
        for key in stale:
            del self._booked[key]


@dataclass
class SlurmDispatch:
    """The dispatcher's Slurm: ``script`` (the batch script and its arguments) or ``wrap``
    (a command line for ``sbatch --wrap``), ``sbatch_options`` before it; ``{name}`` in
    any of them becomes the container's name. ``command_prefix`` goes before each command,
    ``environment`` is added to theirs (``{"SLURM_CONF": ...}``). ``timeout``: seconds per
    command, and the longest wait for a slot in the pool."""

    script: Sequence[str] = ()
    wrap: str | None = None
    sbatch_options: Sequence[str] = ()
    sbatch: str = "sbatch"
    squeue: str = "squeue"
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    command_prefix: Sequence[str] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    max_in_flight: int = 3
    scancels_per_second: float | None = 10.0
    clock: Clock = field(default_factory=SystemClock)
    runner: Runner = run_command
    sleep: Callable[[float], None] = time.sleep
    """How a scancel waits for its turn under the rate limit (a few milliseconds)."""

    def __post_init__(self) -> None:
        if bool(self.script) == (self.wrap is not None):
            raise ValueError("SlurmDispatch needs exactly one of script=[path, args...] or "
                             "wrap='command line'")
        self.pool = CommandPool(self.max_in_flight, self.timeout)
        self.rate = ScancelRate(self.scancels_per_second, self.clock)
        self.scancel_invocations = 0
        self._counting = threading.Lock()

    def submit(self, name: str) -> None:
        """Submit the container's job, named ``name``."""
        argv = [self.sbatch, f"--job-name={name}", f"--nice={INITIAL_NICE}", "--no-requeue",
                *(o.replace("{name}", name) for o in self.sbatch_options)]
        if self.wrap is not None:
            argv.append(f"--wrap={self.wrap.replace('{name}', name)}")
        else:
            argv.extend(a.replace("{name}", name) for a in self.script)
        done = self._run(argv)
        if done.returncode != 0:
            raise self._failed(argv, done)
        log.info("container %s submitted: %s", name, done.stdout.strip())

    def queue(self) -> dict[str, QueueEntry]:
        """Every job in squeue, by name; SiteError when squeue fails."""
        argv = [self.squeue, "--all", "--noheader", f"--format={SQUEUE_FORMAT}"]
        done = self._run(argv)
        if done.returncode != 0:
            raise self._failed(argv, done)
        return parse_squeue(done.stdout)

    def cancel(self, name: str) -> CancelOutcome:
        """The three-step cancel; never raises for a failed step, says which."""
        ran = 0
        for step in CANCEL_STEPS:
            argv = [self.scancel, f"--name={name}", *step]
            ran += 1
            try:
                done = self._run(argv, turn_of=name)
            except SiteError as exc:
                return CancelOutcome(None, ran, str(exc))
            if done.returncode != 0:
                return CancelOutcome(done.returncode, ran, str(self._failed(argv, done)))
        return CancelOutcome(0, ran)

    def renice(self, name: str, nice: int) -> None:
        argv = [self.scontrol, "update", f"JobName={name}", f"Nice={nice}"]
        done = self._run(argv)
        if done.returncode != 0:
            raise self._failed(argv, done)

    def _run(self, argv: Sequence[str],
             turn_of: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command in a slot of the pool; a scancel for ``turn_of`` also waits for
        its turn under the rate limit."""
        full = [*self.command_prefix, *argv]
        env = {**os.environ, **self.environment} if self.environment else None
        shown = " ".join(full)
        with self.pool.slot(shown):
            if turn_of is not None:
                wait = self.rate.turn(turn_of)
                if wait > 0:
                    self.sleep(wait)
                with self._counting:
                    self.scancel_invocations += 1
            return run_checked(self.runner, full, self.timeout, env)

    def _failed(self, argv: Sequence[str],
                done: subprocess.CompletedProcess[str]) -> SiteError:
        return command_failed([*self.command_prefix, *argv], done)
