"""Faults for the job_exit tests: a job queue that fails, hangs or raises; crash points that
kill the worker's own process with SIGKILL; and the engines their subprocess workers run."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from lifecycle import Effect, EffectCall, Engine, FollowUp, Retry, Store
from lifecycle.adapters.htcondor import ClassAdValue, JobId
from lifecycle.adapters.job_queue import DatabaseJobQueue, JobQueue, Writes
from lifecycle.adapters.smtp import SmtpMailer
from lifecycle.clock import Clock
from lifecycle.machines import job_exit

SENDER = "condor@submit.example.org"
FAST = Retry(max_attempts=30, base=0.01, cap=0.05, jitter=0.5)


class QueueDown(ConnectionError):
    """The schedd does not answer."""


class FaultyQueue(JobQueue):
    """The database queue behind faults: the first ``fail_times`` calls raise ``error``; the
    next ``hang_times`` calls sleep ``hang`` seconds first (longer than the effect's timeout,
    so the worker abandons them); while ``down`` is set or ``down_file`` exists, every call
    raises; while ``hang_file`` exists, every call blocks (and creates ``hang_file``.hanging,
    for a test to see that it does)."""

    def __init__(self, *, fail_times: int = 0, error: BaseException | None = None,
                 hang: float = 0.0, hang_times: int = 0, down: threading.Event | None = None,
                 down_file: Path | None = None, hang_file: Path | None = None) -> None:
        self.inner = DatabaseJobQueue()
        self.fail_times = fail_times
        self.error = error or QueueDown("schedd at <127.0.0.1:9618> does not answer")
        self.hang = hang
        self.hang_times = hang_times
        self.down = down
        self.down_file = down_file
        self.hang_file = hang_file
        self.calls = 0
        self.failures = 0
        self.hangs = 0
        self.lock = threading.Lock()

    def complete(self, job: JobId, ad: Mapping[str, ClassAdValue], *, key: str,
                 now: dt.datetime) -> Writes | None:
        with self.lock:
            self.calls += 1
            fail = self.failures < self.fail_times
            if fail:
                self.failures += 1
            hang = not fail and self.hangs < self.hang_times
            if hang:
                self.hangs += 1
        if self.hang_file is not None:
            if self.hang_file.exists():
                self.hang_file.with_name(self.hang_file.name + ".hanging").touch()
            deadline = time.monotonic() + 120
            while self.hang_file.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        if hang:
            time.sleep(self.hang)
        if fail or (self.down is not None and self.down.is_set()) or (
                self.down_file is not None and self.down_file.exists()):
            raise self.error
        return self.inner.complete(job, ad, key=key, now=now)


class RecordingMailer:
    """Keeps the messages instead of sending them."""

    sender = SENDER

    def __init__(self) -> None:
        self.sent: list[tuple[str, EmailMessage]] = []
        self.lock = threading.Lock()

    def send(self, message: EmailMessage, recipient: str) -> None:
        with self.lock:
            self.sent.append((recipient, message))


class Crasher:
    """Kills its own process with SIGKILL at named points, at random, after noting the point
    and the job in ``log`` (so that a test can tell which windows were hit)."""

    def __init__(self, seed: int, probability: float, log: Path) -> None:
        self.rng = random.Random(seed)
        self.probability = probability
        self.log = log

    def point(self, name: str, key: str) -> None:
        if self.rng.random() < self.probability:
            with open(self.log, "a") as notes:
                notes.write(f"{name} {key}\n")
            os.kill(os.getpid(), signal.SIGKILL)


class _Inside:
    """The call, with a crash point after each save of progress (between the offset saved
    by the verified append and the record written)."""

    def __init__(self, call: EffectCall, crash: Callable[[str], None]) -> None:
        self._call = call
        self._crash = crash

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def save_progress(self, values: dict[str, Any]) -> None:
        self._call.save_progress(values)
        self._crash("saved_progress")


def crash_engine(url: str, crash_log: Path, seed: int, probability: float,
                 smtp_url: str) -> Engine:
    """The job_exit machine with crash points in every step: at the start of each handler,
    after each save of progress, inside the queue update's transaction, after the SMTP
    server accepted the mail, and after each handler returned (before the commit)."""
    crasher = Crasher(seed, probability, crash_log)

    class CrashingQueue(JobQueue):
        inner = DatabaseJobQueue()

        def complete(self, job: JobId, ad: Mapping[str, ClassAdValue], *, key: str,
                     now: dt.datetime) -> Writes | None:
            writes = self.inner.complete(job, ad, key=key, now=now)
            assert writes is not None

            def crashing(tx: Any) -> None:   # the effect's Transaction
                writes(tx)
                crasher.point("queue:in_commit", str(job))

            return crashing

    class CrashingMailer:
        sender = SENDER

        def __init__(self) -> None:
            self.inner = SmtpMailer(smtp_url, sender=SENDER, timeout=10)

        def send(self, message: EmailMessage, recipient: str) -> None:
            self.inner.send(message, recipient)
            crasher.point("email:accepted", str(message["Subject"]).rsplit(" ", 1)[-1])

    real_append = job_exit.verified_append

    def torn_then_whole(call: Any, path: str | os.PathLike[str], record: bytes, *,
                        name: str | None = None) -> bool:
        """The output ad's verified append, after a first try that dies with half the ad
        appended (its offset saved, as the real append saves it first)."""
        if name == "output_ad_offset" and name not in call.progress:
            target = Path(path)
            with open(target, "ab") as handle:
                call.save_progress({name: handle.seek(0, os.SEEK_END)})
                handle.write(record[: len(record) // 2])
            crasher.point("write_output_ad:half_written", target.name.removesuffix(".ad"))
        return real_append(call, path, record, name=name)

    job_exit.verified_append = torn_then_whole  # type: ignore[assignment]  # this process only

    class LostClaims(logging.Handler):
        """A mail whose completion this worker could not record (its claim was taken over),
        or whose send failed (the server may have accepted it all the same), may be sent
        again: note it as a possible window hit."""

        def emit(self, record: logging.LogRecord) -> None:
            args = record.args if isinstance(record.args, tuple) else ()
            if not args or args[0] != "send_job_notification":
                return
            if "the claim was lost" in record.msg:
                point = "email:claim_lost"
            elif "failed (attempt" in record.msg or "failed for good" in record.msg:
                point = "email:failed"
            else:
                return
            with open(crash_log, "a") as notes:
                notes.write(f"{point} {args[2]}\n")

    worker_log = logging.getLogger("lifecycle.worker")  # the worker logs effects' outcomes
    worker_log.setLevel(logging.INFO)
    worker_log.propagate = False
    warnings = logging.StreamHandler(sys.stderr)  # the run's stderr keeps to what went wrong
    warnings.setLevel(logging.WARNING)
    worker_log.addHandler(warnings)
    worker_log.addHandler(LostClaims())

    builtin = job_exit.make(queue=CrashingQueue(), mailer=CrashingMailer(), retry=FAST,
                            timeout=30)
    effects: dict[str, Effect] = {}
    for name, effect in builtin.effects.items():
        def wrapped(call: EffectCall, inner: Any = effect.handler,
                    step: str = name) -> FollowUp | None:
            crasher.point(f"{step}:claimed", call.key)
            inside = _Inside(call, lambda what: crasher.point(f"{step}:{what}", call.key))
            result: FollowUp | None = inner(inside)
            crasher.point(f"{step}:after", call.key)
            return result

        effects[name] = Effect(wrapped, effect.retry, timeout=effect.timeout)
    return Engine(Store(url), [builtin.spec], guards=builtin.guards, effects=effects)


def hang_engine(url: str, hang_file: Path, clock: Clock | None = None) -> Engine:
    """The job_exit machine whose queue blocks while ``hang_file`` exists."""
    builtin = job_exit.make(queue=FaultyQueue(hang_file=hang_file), mailer=RecordingMailer(),
                            retry=FAST, timeout=60, clock=clock)
    return Engine(Store(url), [builtin.spec], guards=builtin.guards, effects=builtin.effects,
                  clock=clock)
