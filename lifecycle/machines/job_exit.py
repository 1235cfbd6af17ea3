"""``job_exit``: an HTCondor local-universe job exit that writes the user log, the output ad,
the job queue and the email exactly as promised, across failures and crashes.

One resource per job, key ``CLUSTER.PROC``, created while the job runs and set going by
``exited`` with the exit payload (docs/incidents.md tells the incident). Each step is a state with
its effect, in HTCondor's order: (a) the 005 event in the user log, (b) the output ad, (c) the
job-queue update, (d) the email. An effect's handler returns the follow-up trigger that moves
the resource to the next step in the transaction that marks the effect done, so a crash at
any instant either repeats a step (each is idempotent) or finds it done; (c) never happens
before (a), and (d) always follows (c). ``notification`` decides whether (d) is taken at all:
``queue_updated`` goes to ``emailing`` or straight to ``done`` by the guard
``notification_wanted``, whose verdict the journal keeps.

A failing step is retried by the worker with backoff, never by a sleep (default like
HTCondor's ``LOCAL_UNIVERSE_MAX_JOB_CLEANUP_RETRIES`` and ``..._RETRY_DELAY``: 5 attempts,
30 s apart; ``$LIFECYCLE_JOB_EXIT_ATTEMPTS``, ``$LIFECYCLE_JOB_EXIT_RETRY_DELAY``). After the
last attempt the effect fails for good and ``gave_up`` moves the resource to
``stuck_<step>``, visible in ``lifecycle list`` and ``lifecycle stuck``; ``lifecycle retry``
runs the failed step again, and the resource goes on from there.
"""

from __future__ import annotations

import datetime as dt
import glob
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..adapters import htcondor, smtp
from ..adapters.job_queue import DatabaseJobQueue, JobQueue
from ..clock import Clock, SystemClock
from ..compiled import GuardContext
from ..effects import Effect, EffectCall, FollowUp, Retry
from ..errors import LifecycleError, PermanentError
from ..files import atomic_write, verified_append
from ..spec import MachineSpec
from .builtin import Builtin

log = logging.getLogger(__name__)

ATTEMPTS_VARIABLE = "LIFECYCLE_JOB_EXIT_ATTEMPTS"
RETRY_DELAY_VARIABLE = "LIFECYCLE_JOB_EXIT_RETRY_DELAY"
DEFAULT_ATTEMPTS = 5
DEFAULT_RETRY_DELAY = 30.0
HANDLER_TIMEOUT = 60.0

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_ID = 2**31 - 1
Notification = Literal["Never", "Always", "Complete", "Error"]
_NOTIFICATIONS: tuple[str, ...] = ("Never", "Always", "Complete", "Error")


def _text(value: str, field: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} is not valid Unicode text") from None
    return value


def _path(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    _text(value, field)
    if _CONTROL.search(value):
        raise ValueError(f"{field} {value!r} contains a control character")
    return value


class JobExitData(BaseModel):
    """A job_exit resource's data: the job, set at creation, and its exit, merged from the
    ``exited`` payload."""

    model_config = ConfigDict(extra="forbid")

    cluster: int = Field(ge=0, le=_MAX_ID)
    proc: int = Field(ge=0, le=_MAX_ID)
    owner: str
    cmd: str
    submit_host: str
    userlog: str | None = None
    output_ad: str | None = None
    notify_user: str | None = None
    notification: Notification = "Never"
    success_exit_code: int = Field(0, ge=-_MAX_ID - 1, le=_MAX_ID)
    # the exit: exit_code, or exit_signal with an optional core_file
    exit_code: int | None = Field(None, ge=-_MAX_ID - 1, le=_MAX_ID)
    exit_signal: int | None = Field(None, ge=1, le=255)
    core_file: str | None = None
    remote_user_cpu: float = Field(0.0, ge=0, allow_inf_nan=False)
    remote_sys_cpu: float = Field(0.0, ge=0, allow_inf_nan=False)
    wall_clock: float = Field(0.0, ge=0, allow_inf_nan=False)
    bytes_sent: int = Field(0, ge=0)
    bytes_received: int = Field(0, ge=0)
    exited_at: dt.datetime | None = None
    """When the job exited; when the payload does not say, the time step (a) first ran."""

    @field_validator("owner", "cmd")
    @classmethod
    def _plain_text(cls, value: str, info: Any) -> str:
        return _text(value, info.field_name)

    @field_validator("submit_host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value or _CONTROL.search(value) or " " in value:
            raise ValueError(f"submit_host {value!r} is not a host name")
        return _text(value, "submit_host")

    @field_validator("userlog", "output_ad")
    @classmethod
    def _absolute_path(cls, value: str | None, info: Any) -> str | None:
        checked = _path(value, info.field_name)
        if checked is not None and not checked.startswith("/"):
            raise ValueError(f"{info.field_name} {checked!r} is not an absolute path")
        return checked

    @field_validator("core_file")
    @classmethod
    def _core_file(cls, value: str | None) -> str | None:
        return _path(value, "core_file")

    @field_validator("notify_user")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            problem = smtp.address_problem(value)
            if problem is not None:
                raise ValueError(f"notify_user {value!r} {problem}")
        return value

    @field_validator("notification", mode="before")
    @classmethod
    def _notification(cls, value: Any) -> Any:
        if isinstance(value, str):
            for name in _NOTIFICATIONS:
                if value.strip().lower() == name.lower():
                    return name
        return value

    @field_validator("exited_at")
    @classmethod
    def _aware(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("exited_at needs a time zone (e.g. 2026-12-02T10:01:00Z)")
        return value

    @model_validator(mode="after")
    def _one_exit(self) -> JobExitData:
        if self.exit_code is not None and self.exit_signal is not None:
            raise ValueError("give exit_code (a normal exit) or exit_signal (killed by a "
                             "signal), not both")
        if self.core_file is not None and self.exit_signal is None:
            raise ValueError("core_file goes with exit_signal: only a job killed by a "
                             "signal leaves a core")
        return self

    @property
    def job_id(self) -> htcondor.JobId:
        return htcondor.JobId(self.cluster, self.proc)

    def termination(self, exited_at: dt.datetime) -> htcondor.JobTermination:
        return htcondor.JobTermination(
            cluster=self.cluster, proc=self.proc, owner=self.owner, cmd=self.cmd,
            submit_host=self.submit_host, exited_at=exited_at, exit_code=self.exit_code,
            exit_signal=self.exit_signal, core_file=self.core_file,
            remote_user_cpu=self.remote_user_cpu, remote_sys_cpu=self.remote_sys_cpu,
            wall_clock=self.wall_clock, bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received)

    def wants_mail(self) -> bool:
        """HTCondor's rule for a job that exited: Never, Always, Complete, or Error (a
        signal, a core dump, or an exit code other than ``success_exit_code``)."""
        if self.notification == "Never":
            return False
        if self.notification in ("Always", "Complete"):
            return True
        return (self.exit_signal is not None or self.core_file is not None
                or self.exit_code != self.success_exit_code)

    def recipient(self) -> str:
        """``notify_user``, else the owner at the submit host (as HTCondor adds a domain)."""
        return self.notify_user or f"{self.owner}@{self.submit_host}"


SPEC = MachineSpec.model_validate({
    "name": "job_exit",
    "description": "An HTCondor local-universe job exit: (a) the user log's terminate event, "
                   "(b) the output ad, (c) the job-queue update, (d) the email, each a step "
                   "that is done exactly once across failures and crashes.",
    "initial": "running",
    "final": ["done"],
    "states": [
        {"name": "running", "description": "the job runs; its exit has not been reported"},
        {"name": "writing_userlog", "description": "(a) the 005 event goes to the user log"},
        {"name": "writing_output_ad", "description": "(b) the final ad goes to the output "
                                                     "ad file"},
        {"name": "updating_queue", "description": "(c) the job queue learns the job "
                                                  "completed"},
        {"name": "emailing", "description": "(d) the notification mail is sent"},
        {"name": "done", "description": "every step is done"},
        {"name": "stuck_userlog", "description": "(a) failed for good: `lifecycle retry`"},
        {"name": "stuck_output_ad", "description": "(b) failed for good: `lifecycle retry`"},
        {"name": "stuck_queue", "description": "(c) failed for good: `lifecycle retry`"},
        {"name": "stuck_email", "description": "(d) failed for good: `lifecycle retry`"},
    ],
    "transitions": [
        {"trigger": "exited", "source": "running", "dest": "writing_userlog",
         "guards": ["exit_status_given", "key_is_job_id"],
         "effects": [{"name": "write_terminated_event", "on_failure": "gave_up"}],
         "ref": "docs/incidents.md: what HTCondor does today",
         "description": "the job exited (exit_code, or exit_signal with core_file)"},
        {"trigger": "userlog_written", "source": ["writing_userlog", "stuck_userlog"],
         "dest": "writing_output_ad",
         "effects": [{"name": "write_output_ad", "on_failure": "gave_up"}],
         "ref": "exit step (a)",
         "description": "the 005 event is in the user log"},
        {"trigger": "output_ad_written", "source": ["writing_output_ad", "stuck_output_ad"],
         "dest": "updating_queue",
         "effects": [{"name": "update_job_queue", "on_failure": "gave_up"}],
         "ref": "exit step (b)",
         "description": "the output ad is written"},
        {"trigger": "queue_updated", "source": ["updating_queue", "stuck_queue"],
         "dest": "emailing", "guards": ["notification_wanted"],
         "effects": [{"name": "send_job_notification", "on_failure": "gave_up"}],
         "ref": "exit step (c)",
         "description": "the queue holds the job as Completed; its notification asks "
                        "for mail"},
        {"trigger": "queue_updated", "source": ["updating_queue", "stuck_queue"],
         "dest": "done", "unless": ["notification_wanted"],
         "ref": "exit step (c)",
         "description": "the queue holds the job as Completed; no mail is asked for"},
        {"trigger": "email_sent", "source": ["emailing", "stuck_email"], "dest": "done",
         "ref": "exit step (d)",
         "description": "the notification mail was accepted"},
        {"trigger": "gave_up", "source": "writing_userlog", "dest": "stuck_userlog",
         "merge_payload": False, "description": "(a) failed for good"},
        {"trigger": "gave_up", "source": "writing_output_ad", "dest": "stuck_output_ad",
         "merge_payload": False, "description": "(b) failed for good"},
        {"trigger": "gave_up", "source": "updating_queue", "dest": "stuck_queue",
         "merge_payload": False, "description": "(c) failed for good"},
        {"trigger": "gave_up", "source": "emailing", "dest": "stuck_email",
         "merge_payload": False, "description": "(d) failed for good"},
    ],
    "data_model": JobExitData,
})

STEPS = ("writing_userlog", "writing_output_ad", "updating_queue", "emailing", "done")
STUCK = ("stuck_userlog", "stuck_output_ad", "stuck_queue", "stuck_email")


# -- guards ----------------------------------------------------------------------------------


def exit_status_given(context: GuardContext) -> bool:
    """The ``exited`` payload says how the job ended."""
    return (context.payload.get("exit_code") is not None
            or context.payload.get("exit_signal") is not None)


def key_is_job_id(context: GuardContext) -> bool:
    """The resource's key is its job id, ``CLUSTER.PROC``."""
    return context.key == f"{context.data.get('cluster')}.{context.data.get('proc')}"


def notification_wanted(context: GuardContext) -> bool:
    """The job's ``notification`` asks for mail about this exit."""
    return JobExitData.model_validate(context.data).wants_mail()


GUARDS = {"exit_status_given": exit_status_given, "key_is_job_id": key_is_job_id,
          "notification_wanted": notification_wanted}


# -- effect handlers -------------------------------------------------------------------------


class JobExitHandlers:
    """The four steps' handlers, talking to ``queue`` and ``mailer``."""

    def __init__(self, queue: JobQueue, mailer: smtp.Mailer, clock: Clock) -> None:
        self.queue = queue
        self.mailer = mailer
        self.clock = clock

    def _job(self, call: EffectCall) -> JobExitData:
        return JobExitData.model_validate(call.data)

    @staticmethod
    def _exited_at(job: JobExitData) -> dt.datetime:
        if job.exited_at is not None:
            return job.exited_at
        raise PermanentError(f"job {job.job_id}: its exit time is unknown (step (a) records "
                             "it); was the resource moved by hand?")

    def write_terminated_event(self, call: EffectCall) -> FollowUp:
        """(a) Append the 005 event to the user log, exactly once (verified append)."""
        job = self._job(call)
        payload: dict[str, Any] = {}
        exited_at = job.exited_at
        if exited_at is None:
            # the exit time is decided once, kept across attempts, and merged into the data
            saved = call.progress.get("exited_at")
            if isinstance(saved, str):
                exited_at = dt.datetime.fromisoformat(saved)
            else:
                exited_at = self.clock.now()
                call.save_progress({"exited_at": exited_at.isoformat()})
            payload["exited_at"] = exited_at.isoformat()
        if job.userlog is not None:
            event = htcondor.terminated_event(job.termination(exited_at))
            if not verified_append(call, job.userlog, event, name="userlog"):
                log.info("job %s: the terminate event was already in %s", job.job_id,
                         job.userlog)
        return FollowUp("userlog_written", payload)

    def write_output_ad(self, call: EffectCall) -> FollowUp:
        """(b) Write the final ad to the output ad file, whole or not at all."""
        job = self._job(call)
        if job.output_ad is not None:
            ad = htcondor.final_ad(job.termination(self._exited_at(job)))
            _remove_temporaries(Path(job.output_ad))
            atomic_write(job.output_ad, htcondor.format_ad(ad))
        return FollowUp("output_ad_written")

    def update_job_queue(self, call: EffectCall) -> FollowUp:
        """(c) Mark the job Completed in the queue, in the transaction that marks this
        effect done (or, for a queue elsewhere, at once and idempotently)."""
        job = self._job(call)
        ad = htcondor.final_ad(job.termination(self._exited_at(job)))
        writes = self.queue.complete(job.job_id, ad, key=call.idempotency_key,
                                     now=self.clock.now())
        return FollowUp("queue_updated", writes=writes)

    def send_job_notification(self, call: EffectCall) -> FollowUp:
        """(d) Send the notification mail. Its Message-ID is the same on every attempt."""
        job = self._job(call)
        end = job.termination(self._exited_at(job))
        subject, body = htcondor.notification_text(end)
        recipient = job.recipient()
        sender = self.mailer.sender
        try:
            message = smtp.build_message(
                sender=sender, recipient=recipient, subject=subject, body=body,
                message_id=smtp.message_id(call.idempotency_key,
                                           sender.rpartition("@")[2]),
                date=self.clock.now())
        except ValueError as exc:
            raise PermanentError(f"job {job.job_id}: no mail sent: {exc}; set notify_user "
                                 "to a plain address") from None
        self.mailer.send(message, recipient)
        return FollowUp("email_sent")


def _remove_temporaries(target: Path) -> None:
    """Remove the temporary files an earlier attempt that was killed in the middle of
    :func:`atomic_write` left beside ``target``."""
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        stale.unlink(missing_ok=True)
        log.info("removed %s, left by an attempt that died while writing %s", stale, target)


def retry_from_environment() -> Retry:
    """5 attempts 30 s apart (a tenth of each taken off at random), or as configured."""
    attempts = _setting(ATTEMPTS_VARIABLE, DEFAULT_ATTEMPTS, int)
    delay = _setting(RETRY_DELAY_VARIABLE, DEFAULT_RETRY_DELAY, float)
    if attempts < 1 or delay <= 0:
        raise LifecycleError(f"{ATTEMPTS_VARIABLE} must be at least 1 and "
                             f"{RETRY_DELAY_VARIABLE} more than 0 seconds")
    return Retry(max_attempts=attempts, base=delay, cap=delay, jitter=0.1)


def _setting(name: str, default: Any, kind: type) -> Any:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return kind(raw)
    except ValueError:
        raise LifecycleError(f"{name}={raw!r} is not a {'whole ' if kind is int else ''}"
                             "number") from None


def make(*, queue: JobQueue | None = None, mailer: smtp.Mailer | None = None,
         retry: Retry | None = None, timeout: float | None = HANDLER_TIMEOUT,
         clock: Clock | None = None) -> Builtin:
    """The machine with its handlers bound to ``queue`` (default: the job queue in
    lifecycle's database) and ``mailer`` (default: SMTP at ``$LIFECYCLE_SMTP_URL``).
    ``retry`` applies to every step (default: :func:`retry_from_environment`); ``timeout``
    abandons an attempt that hangs."""
    handlers = JobExitHandlers(queue or DatabaseJobQueue(), mailer or smtp.SmtpMailer(),
                               clock or SystemClock())
    policy = retry or retry_from_environment()
    effects: Mapping[str, Effect] = {
        name: Effect(getattr(handlers, name), policy, timeout=timeout)
        for name in ("write_terminated_event", "write_output_ad", "update_job_queue",
                     "send_job_notification")}
    return Builtin(
        spec=SPEC, guards=GUARDS, effects=effects,
        summary="HTCondor local-universe job exit: user log, output ad, job queue, email, "
                "each exactly once across failures and crashes")


class _ScenarioQueue(JobQueue):
    """The job queue in the scenario's database, down while the world says so."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.inner = DatabaseJobQueue()

    def complete(self, job: Any, ad: Mapping[str, Any], *, key: str,
                 now: dt.datetime) -> Any:
        name = f"{job.cluster}.{job.proc}"
        down = self.world.status.get(name, {}).get("queue") == "down"
        self.world.actions.append(("queue", name, {"down": down}))
        if down:
            raise ConnectionError("schedd at <127.0.0.1:9618> does not answer")
        return self.inner.complete(job, ad, key=key, now=now)


class _ScenarioMailer:
    """Keeps the mail in the world's actions; refuses while the world says so."""

    sender = "condor@submit.example.org"

    def __init__(self, world: Any) -> None:
        self.world = world

    def send(self, message: Any, recipient: str) -> None:
        name = str(message["Subject"]).rpartition(" ")[2]
        refused = self.world.status.get(name, {}).get("mail") == "refuse"
        self.world.actions.append(("mail", name, {"to": recipient, "refused": refused}))
        if refused:
            raise ConnectionError("451 try again later")


def _simulation(world: Any) -> tuple[Any, Any, Any]:
    """For scenario files: the queue in the scenario's database and a mailer that records."""
    machine = make(queue=_ScenarioQueue(world), mailer=_ScenarioMailer(world),
                   retry=Retry(max_attempts=5, base=30, cap=30, jitter=0), clock=world.clock)
    return machine.guards, machine.effects, {}


BUILTIN = replace(make(), simulation=_simulation)
