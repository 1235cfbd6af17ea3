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
- :class:`ScancelRate`: at most ``per_second`` scancel invocations started in any one
  second. It never makes a caller sleep: :meth:`ScancelRate.reserve` either grants a cancel
  now or books it a slot later and says how long to wait, and the machine waits in a state
  with a timer (``cancelling.throttled``), so no handler thread is held and the wait is in
  the journal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..clock import Clock, SystemClock
from ..errors import SiteError
from .slurm import Runner, run_command

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


@dataclass(slots=True)
class _Grant:
    at: float
    count: int


class ScancelRate:
    """At most ``per_second`` scancel invocations started in any one-second window, granted
    first come, first served.

    :meth:`reserve` grants ``count`` invocations (one cancel's three) at once when the last
    second leaves room, and otherwise books them the earliest slot that does, after every
    slot already booked, and returns the seconds until it. A caller that comes back for its
    key at or after its slot gets it without a new booking. A cancel of more invocations
    than ``per_second`` is granted alone in its second. ``per_second=None``: no limit."""

    def __init__(self, per_second: float | None, clock: Clock | None = None) -> None:
        if per_second is not None and not per_second > 0:
            raise ValueError(f"scancels_per_second must be positive (or None), not "
                             f"{per_second}")
        self.per_second = per_second
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._grants: deque[_Grant] = deque()
        self._booked: dict[str, float] = {}

    def reserve(self, key: str, count: int = len(CANCEL_STEPS)) -> float:
        """Seconds to wait before cancelling ``key``: 0.0 means go now (and is counted)."""
        now = self.clock.now().timestamp()
        if self.per_second is None:
            return 0.0
        with self._lock:
            booked = self._booked.get(key)
            if booked is not None:
                if booked <= now:
                    del self._booked[key]
                    return 0.0
                return booked - now
            at = self._earliest(count, now)
            self._grants.append(_Grant(at, count))
            if at <= now:
                return 0.0
            self._booked[key] = at
            return at - now

    def _earliest(self, count: int, now: float) -> float:
        assert self.per_second is not None
        at = max(now, self._grants[-1].at) if self._grants else now
        while self._grants and self._grants[0].at + 1.0 <= at:
            self._grants.popleft()  # out of every window from here on
        while True:
            window = [g for g in self._grants if g.at + 1.0 > at]
            if not window or sum(g.count for g in window) + count <= self.per_second:
                return at
            at = window[0].at + 1.0  # when the oldest grant of the window drops out


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
            with self._counting:
                self.scancel_invocations += 1
            try:
                done = self._run(argv)
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

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        full = [*self.command_prefix, *argv]
        env = {**os.environ, **self.environment} if self.environment else None
        shown = " ".join(full)
        with self.pool.slot(shown):
            log.debug("running %s", shown)
            try:
                return self.runner(full, self.timeout, env)
            except FileNotFoundError as exc:
                raise SiteError(f"{shown}: command not found ({exc.filename or full[0]}); "
                                "install Slurm's client commands or configure their "
                                "paths") from exc
            except subprocess.TimeoutExpired as exc:
                raise SiteError(f"{shown}: no answer within {self.timeout:g} s (slurmctld "
                                "down or overloaded?)") from exc
            except OSError as exc:
                raise SiteError(f"{shown}: could not run: {exc}") from exc

    def _failed(self, argv: Sequence[str],
                done: subprocess.CompletedProcess[str]) -> SiteError:
        message = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()
        return SiteError(f"{' '.join([*self.command_prefix, *argv])} failed (exit "
                         f"{done.returncode}): " + " / ".join(
                             line for line in message if not re.search(r"select/", line)))
