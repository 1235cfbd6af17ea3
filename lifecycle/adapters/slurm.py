"""A drone site on Slurm, through its commands: ``sbatch`` to deploy, one ``squeue`` for the
status of many drones, ``scancel`` to stop, and a fenced ``scancel`` to terminate.

Every command runs as a subprocess (an argument list, never a shell) with a timeout; a
command that is missing, times out, or fails with a message raises :class:`SiteError` naming
the command and its stderr.

The status mapping is TARDIS's Slurm site adapter's (squeue's job state codes):

=================================================================  ==========
Slurm state                                                        status
=================================================================  ==========
PENDING, CONFIGURING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED,         Booting
SPECIAL_EXIT
RUNNING, COMPLETING, RESIZING, SIGNALING, STAGE_OUT                Running
SUSPENDED, STOPPED, RESV_DEL_HOLD                                  Stopped
COMPLETED, CANCELLED, PREEMPTED, TIMEOUT; a job squeue no longer   Deleted
knows
anything else (FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, ...)   Error
=================================================================  ==========

(TIMEOUT is Deleted in TARDIS's table: a drone that ran out of its time limit has ended,
and is not an error to clean up.)

``stop`` is plain ``scancel <id>``, as in TARDIS ("Slurm jobs cannot be stopped gracefully"):
Slurm sends SIGTERM to the job's processes and SIGKILL ``KillWait`` seconds later. With
``stop_signal="TERM"`` (or another signal) it is ``scancel --full --signal=<sig> <id>``
instead: the signal only, to the batch shell and every step, and the job ends when the drone
does.

``terminate(drone, expect)`` removes the job only if it is still in ``expect``:

- ``None``: ``scancel -v <id>``.
- ``Running``: ``scancel -v --state=RUNNING <id>``.
- ``Stopped``: ``scancel -v --state=SUSPENDED <id>``.
- ``Error``: scancel cannot filter on it, and needs not: Slurm's error states (FAILED,
  NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, DEADLINE) are all final, so a job still in one has
  nothing left to cancel, and a job that left it (requeued: pending or running again) is not
  the job the decision saw. One ``squeue`` says which; no scancel is run.
- ``Booting``: ``scontrol hold <id>``, then ``scancel -v --state=PENDING <id>``, and when
  nothing was cancelled because the job runs, ``scontrol release <id>`` to undo the hold.
  The hold is there because ``scancel --state=`` filters on the client (Slurm 22.05: it
  loads the job table, filters it, then sends the kill), so a job that starts between that
  load and the kill would still be killed. A held job cannot start, so after the hold the
  filter's answer stays true until the kill arrives. The hold only zeroes a running job's
  priority, and is released. When scancel fails, the job stays held (a held pending job
  cannot start) and the error says so; the effect's retry finishes the terminate.
  (``hold_before_cancel=False`` leaves the hold out.)
- ``Deleted``: nothing to remove; nothing is run.

scancel exits 0 whether or not it matched a job, so whether it *acted* is read from its
verbose report: it prints ``Terminating job <id>`` before each kill it sends and
``Kill job error on job id <id>: <reason>`` when slurmctld refused it (or, before filtering,
when the job is unknown or finished). ``acted`` is True exactly when the kill was sent and
not refused. When it did not act, one ``squeue`` says what the job is now, for ``detail``.
"""

from __future__ import annotations

import os
import re
import subprocess
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..logs import logger
from .sites import BOOTING, DELETED, ERROR, RUNNING, STOPPED, Drone, SiteError, Terminated

log = logger(__name__)

SLURM_STATES: Mapping[str, str] = {
    "PENDING": BOOTING,
    "CONFIGURING": BOOTING,
    "REQUEUED": BOOTING,
    "REQUEUE_HOLD": BOOTING,
    "REQUEUE_FED": BOOTING,
    "SPECIAL_EXIT": BOOTING,
    "RUNNING": RUNNING,
    "COMPLETING": RUNNING,
    "RESIZING": RUNNING,
    "SIGNALING": RUNNING,
    "STAGE_OUT": RUNNING,
    "SUSPENDED": STOPPED,
    "STOPPED": STOPPED,
    "RESV_DEL_HOLD": STOPPED,
    "COMPLETED": DELETED,
    "CANCELLED": DELETED,
    "PREEMPTED": DELETED,
    "TIMEOUT": DELETED,
}
"""Slurm job state (squeue ``%T``) → ResourceStatus; any other state is Error."""

FENCE_STATES: Mapping[str, str] = {BOOTING: "PENDING", RUNNING: "RUNNING", STOPPED: "SUSPENDED"}
"""The ``scancel --state`` that keeps a terminate to jobs still in the expected status."""

INVALID_JOB = "Invalid job id specified"
_NO_MATCH = "No active jobs match"
_GONE = (INVALID_JOB, "already finished", "already completing or completed")

Runner = Callable[[Sequence[str], float, Mapping[str, str] | None],
                  subprocess.CompletedProcess[str]]
"""Runs one command: (argv, timeout in seconds, environment or None) → its outcome. Raises
what :func:`subprocess.run` raises (FileNotFoundError, TimeoutExpired)."""


def run_command(argv: Sequence[str], timeout: float,
                env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False,
        env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
    )


def run_checked(runner: Runner, full: Sequence[str], timeout: float,
                env: Mapping[str, str] | None) -> subprocess.CompletedProcess[str]:
    """``runner(full, timeout, env)``, with a command that cannot run or does not answer
    turned into a :class:`SiteError` that says what to do."""
    shown = _show(full)
    log.debug("running %s", shown)
    try:
        return runner(full, timeout, env)
    except FileNotFoundError as exc:
        raise SiteError(f"{shown}: command not found ({exc.filename or full[0]}); install "
                        "Slurm's client commands or configure their paths") from exc
    except subprocess.TimeoutExpired as exc:
        raise SiteError(f"{shown}: no answer within {timeout:g} s (slurmctld down or "
                        "overloaded?)") from exc
    except OSError as exc:
        raise SiteError(f"{shown}: could not run: {exc}") from exc


def command_failed(full: Sequence[str], done: subprocess.CompletedProcess[str]) -> SiteError:
    """A command that answered with a non-zero exit, as a :class:`SiteError` with its
    message (without the noise of Slurm's select plugin)."""
    message = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()
    return SiteError(f"{_show(full)} failed (exit {done.returncode}): "
                     + " / ".join(line for line in message if "select/" not in line))


WRAP_NAME = '"${SLURM_JOB_NAME}"'
"""What ``{name}`` becomes in a ``wrap`` line: the job's name from its environment, expanded
by the shell as one word and never parsed as a command."""


_CONTROL_NAMES = {"\n": "a line feed", "\r": "a carriage return", "\t": "a tab",
                  "\x00": "a NUL"}


def job_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a Slurm job's name that squeue lists on one line (None: it
    can). Slurm prints names verbatim, so a line feed or another control character in one
    would let it spill into, or forge, another job's line."""
    if not name:
        return "it is empty"
    for position, char in enumerate(name):
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            what = _CONTROL_NAMES.get(char) or unicodedata.name(char, "a control character")
            return f"it holds {what} (U+{ord(char):04X}) at position {position}"
    return None


def resource_status(slurm_state: str) -> str:
    """The ResourceStatus of a Slurm job state as squeue prints it (``%T``)."""
    return SLURM_STATES.get(slurm_state.strip().upper(), ERROR)


@dataclass
class SlurmCommands:
    """Slurm's client commands as a program that submits jobs named after what they run
    (a drone, a container) runs them; :class:`SlurmSite` and the container dispatcher's
    ``SlurmDispatch`` share these settings.

    ``script`` is the batch script and its arguments (``["/opt/drone/start.sh", "--pool",
    "x"]``); or ``wrap`` is a command line for ``sbatch --wrap``. ``sbatch_options`` are added
    before it (``["--partition=debug", "--time=12:00:00", "--output=/logs/{name}.out"]``);
    ``{name}`` in an option or a script argument becomes the job's name (each is one
    argument: no shell reads it). In ``wrap``, which Slurm runs with ``sh``, ``{name}``
    becomes ``"${SLURM_JOB_NAME}"``: the shell expands the name as a value when the job runs
    and never reads it as code, whatever it holds (``;``, quotes, ``$(...)``) and however
    ``{name}`` is quoted in the line.

    ``sbatch``, ``squeue``, ``scancel`` and ``scontrol`` are the commands (names looked up on
    PATH, or paths); ``command_prefix`` goes before each (``["sudo", "-u", "pilot"]``), and
    ``environment`` is added to the process environment (``{"SLURM_CONF": ...}``).
    ``timeout``: seconds per command; ``runner`` runs one (a subprocess by default).
    """

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
    runner: Runner = run_command

    def __post_init__(self) -> None:
        if bool(self.script) == (self.wrap is not None):
            raise ValueError(f"{type(self).__name__} needs exactly one of script=[path, "
                             "args...] or wrap='command line'")

    def sbatch_argv(self, name: str, *flags: str) -> list[str]:
        """``sbatch FLAGS --job-name=<name> OPTIONS script|--wrap=...``, ``{name}`` replaced
        by ``name`` in the options, the script's arguments and ``wrap``."""
        argv = [self.sbatch, *flags, f"--job-name={name}",
                *(o.replace("{name}", name) for o in self.sbatch_options)]
        if self.wrap is not None:
            argv.append(f"--wrap={self.wrap.replace('{name}', WRAP_NAME)}")
        else:
            argv.extend(a.replace("{name}", name) for a in self.script)
        return argv

    def submit_parsable(self, argv: Sequence[str]) -> str:
        """Run ``sbatch --parsable ...`` (``argv``); the job id it printed."""
        done = self.run(argv)
        if done.returncode != 0:
            raise self.failed(argv, done)
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        match = re.fullmatch(r"(\d+)(;.*)?", lines[-1]) if lines else None
        if match is None:
            raise SiteError(f"{_show(argv)}: no job id in its output {done.stdout!r}")
        return match.group(1)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run one command (after ``command_prefix``, with ``environment``); SiteError when
        it cannot run or does not answer within ``timeout``."""
        env = {**os.environ, **self.environment} if self.environment else None
        return run_checked(self.runner, [*self.command_prefix, *argv], self.timeout, env)

    def failed(self, argv: Sequence[str],
               done: subprocess.CompletedProcess[str]) -> SiteError:
        """The SiteError of a command that exited non-zero."""
        return command_failed([*self.command_prefix, *argv], done)


@dataclass
class SlurmSite(SlurmCommands):
    """A site whose drones are Slurm batch jobs named after the drone (the settings of
    :class:`SlurmCommands`, and these)."""

    max_ids_per_call: int = 1000
    stop_signal: str | None = None
    hold_before_cancel: bool = True
    drone_minimum_lifetime: float | None = None
    """TARDIS's site setting: seconds an available drone runs before it is drained (None:
    until the pool releases it). The drone's deploy copies it into the drone's data."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.drone_minimum_lifetime is not None and not self.drone_minimum_lifetime > 0:
            raise ValueError("SlurmSite drone_minimum_lifetime is a positive number of seconds "
                             f"(or None), not {self.drone_minimum_lifetime}")
        if self.max_ids_per_call < 1:
            raise ValueError(f"SlurmSite max_ids_per_call must be at least 1, "
                             f"not {self.max_ids_per_call}")

    # -- the Site protocol ---------------------------------------------------------------------

    def deploy(self, drone: Drone) -> str:
        """``sbatch --parsable --job-name=<name> [options] script|--wrap``; the job id."""
        argv = self.sbatch_argv(drone.name, "--parsable")
        job = self.submit_parsable(argv)
        log.info("drone %r deployed as Slurm job %s", drone.name, job)
        return job

    def status(self, drones: Sequence[Drone]) -> dict[str, str]:
        """The status of every drone from one ``squeue`` per ``max_ids_per_call`` drones; a
        drone without a job id, or whose job squeue does not know, is Deleted."""
        result = {d.name: DELETED for d in drones if not d.remote_id}
        ids = list(dict.fromkeys(d.remote_id for d in drones if d.remote_id))
        states: dict[str, str] = {}
        for start in range(0, len(ids), self.max_ids_per_call):
            states.update(self._squeue(ids[start:start + self.max_ids_per_call]))
        for d in drones:
            if d.remote_id:
                result[d.name] = resource_status(states.get(d.remote_id, "COMPLETED"))
        return result

    def stop(self, drone: Drone) -> None:
        """``scancel <id>`` (or, with ``stop_signal``, ``scancel --full --signal=<sig>``)."""
        if not drone.remote_id:
            return
        argv = [self.scancel]
        if self.stop_signal:
            argv += ["--full", f"--signal={self.stop_signal}"]
        argv.append(drone.remote_id)
        done = self.run(argv)
        if done.returncode != 0 and not says_gone(done.stderr):
            raise self.failed(argv, done)

    def terminate(self, drone: Drone, expect: str | None) -> Terminated:
        """Cancel the job only while it is in ``expect`` (see the module's docstring)."""
        job = drone.remote_id
        if not job:
            return Terminated(False, "no Slurm job: the drone was never deployed")
        if expect == DELETED:
            return Terminated(False, f"job {job} was expected gone: nothing to remove")
        if expect == ERROR:
            return self._terminate_error(drone.name, job)
        if expect is not None and expect not in FENCE_STATES:
            raise ValueError(f"cannot fence a terminate of drone {drone.name!r} on {expect!r}: "
                             f"scancel filters on {', '.join(FENCE_STATES)} (or None; "
                             f"{ERROR} and {DELETED} need no scancel)")
        fence = FENCE_STATES.get(expect) if expect else None
        held = False
        if fence == "PENDING" and self.hold_before_cancel:
            hold = [self.scontrol, "hold", job]
            done = self.run(hold)
            if done.returncode != 0:
                if says_gone(done.stderr):
                    return Terminated(False, f"job {job} is not pending: "
                                             f"{_first_line(done.stderr)}")
                raise self.failed(hold, done)
            held = True
        argv = [self.scancel, "-v", *([f"--state={fence}"] if fence else []), job]
        try:
            done = self.run(argv)
            refused = _kill_error(done.stderr, job)
            if (done.returncode != 0
                    and not (says_gone(done.stderr) or _NO_MATCH in done.stderr)) or (
                    refused is not None and not says_gone(refused)):
                raise self.failed(argv, done)
        except SiteError as exc:
            if held:
                raise SiteError(f"{exc} (job {job} was held first: it cannot start until a "
                                "retry of the terminate cancels it, or releases it if it "
                                "was running)") from exc
            raise
        if refused is None and re.search(rf"Terminating job {re.escape(job)}\b", done.stderr):
            log.info("drone %r: Slurm job %s cancelled (expected %s)", drone.name, job,
                     fence or "any state")
            return Terminated(True, f"job {job} cancelled" + (f" while {fence}" if fence else ""))
        try:
            now = self._squeue([job]).get(job)
            why = f"job {job} is {now}" if now else f"job {job} is no longer known to Slurm"
        except SiteError as exc:
            now = None
            why = f"job {job} was not cancelled (its state now is unknown: {exc})"
        if held and now is not None and (resource_status(now) == RUNNING
                                         or now == "CONFIGURING"):
            self._release(job)  # it started before the hold: give it its priority back
        if fence:
            why += f", not {fence}: left alone"
        log.info("drone %r: %s", drone.name, why)
        return Terminated(False, why)

    def _terminate_error(self, name: str, job: str) -> Terminated:
        """A terminate fenced on Error: Slurm's error states are final, so there is nothing
        to cancel; a job no longer in one (requeued) is left alone."""
        now = self._squeue([job]).get(job)
        if now is None:
            why = f"job {job} is no longer known to Slurm: nothing to remove"
        elif resource_status(now) == ERROR:
            why = f"job {job} is {now}: it has ended, nothing to cancel"
        else:
            why = f"job {job} is {now}, no longer in an error state: left alone"
        log.info("drone %r: %s", name, why)
        return Terminated(False, why)

    # -- plumbing ------------------------------------------------------------------------------

    def _squeue(self, ids: Sequence[str]) -> dict[str, str]:
        """Job id → Slurm state for the ids squeue knows, from one call (more only when squeue
        refuses the list over an id it does not know: then the missing ones one by one)."""
        argv = [self.squeue, "-o", "%A|%N|%T", "-h", "-t", "all", f"--job={','.join(ids)}"]
        done = self.run(argv)
        if done.returncode != 0 and INVALID_JOB not in done.stderr:
            raise self.failed(argv, done)
        states = _parse_squeue(done.stdout)
        if done.returncode != 0 and len(ids) > 1:
            for job in ids:
                if job not in states:
                    states.update(self._squeue([job]))
        return states

    def _release(self, job: str) -> None:
        argv = [self.scontrol, "release", job]
        try:
            done = self.run(argv)
        except SiteError as exc:
            log.warning("could not undo the hold on Slurm job %s: %s", job, exc)
            return
        if done.returncode != 0 and not says_gone(done.stderr):
            log.warning("could not undo the hold on Slurm job %s: %s", job,
                        done.stderr.strip())



def _parse_squeue(stdout: str) -> dict[str, str]:
    states: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0]:
            states[parts[0].strip()] = parts[2].strip()
    return states


def _kill_error(stderr: str, job: str) -> str | None:
    match = re.search(rf"Kill job error on job id {re.escape(job)}: (.*)", stderr)
    return match.group(1).strip() if match else None


def says_gone(stderr: str) -> bool:
    """Whether a command's complaint is that its job has ended or Slurm no longer knows it."""
    return any(marker in stderr for marker in _GONE)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _show(argv: Sequence[str]) -> str:
    return " ".join(argv)
