"""``job_exit``: an HTCondor local-universe job exit that writes the user log, the output ad,
the job queue and the email exactly as promised, across failures and crashes.

One resource per job, key ``CLUSTER.PROC``, created while the job runs and set going by
``exited`` with the exit payload (docs/incidents.md tells the incident). Each step is a state with
its effect, in the report's order by default: (a) the 005 event in the user log, (b) the
output ad, (c) the job-queue update, (d) the email; ``step_order: today`` takes today's
starter's, (a), (c), (d), (b). An effect's handler returns the follow-up trigger that moves
the resource to the next step in the transaction that marks the effect done, so a crash at
any instant either repeats a step (each is idempotent) or finds it done; (c) never happens
before (a), and (d) always follows (c). ``notification`` decides whether (d) is taken at all:
``queue_updated`` goes to ``emailing`` or straight to ``done`` by the guard
``notification_wanted``, whose verdict the journal keeps.

Identity: the key must be the job id of the data (checked whenever the data is validated,
at creation and at every change), and the ``exited`` payload carries the exit fields and
nothing else (:data:`EXIT_FIELDS`), so no exit can change which job exits, who is mailed or
which files are written.

A failing step is retried by the worker, never by a sleep, with HTCondor's knobs and
defaults: ``LOCAL_UNIVERSE_MAX_JOB_CLEANUP_RETRIES`` (5 retries after the first attempt)
and ``LOCAL_UNIVERSE_JOB_CLEANUP_RETRY_DELAY`` (30 s, no jitter), here
``$LIFECYCLE_JOB_EXIT_MAX_RETRIES`` and ``$LIFECYCLE_JOB_EXIT_RETRY_DELAY`` and for every
step, where HTCondor retries the queue update only. After the last attempt the effect
fails for good and ``gave_up`` moves the resource to ``stuck_<step>``, visible in
``lifecycle list`` and ``lifecycle stuck``; ``lifecycle retry`` runs the failed step again,
and the resource goes on from there. Every setting is read by :func:`settings_from_environment`.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..adapters import htcondor, smtp
from ..adapters.job_queue import DatabaseJobQueue, JobQueue
from ..clock import Clock, SystemClock
from ..compiled import GuardContext
from ..effects import Effect, EffectCall, FollowUp, Retry
from ..errors import InvalidInput, PermanentError
from ..file_writes import verified_append
from ..logs import logger
from ..spec import MachineSpec
from .builtin import Builtin

MIGRATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_migrations", "job_exit")
"""The machine's migration branch ``job_exit``: its job queue (``lifecycle_job_queue``)."""

log = logger(__name__)

MAX_RETRIES_VARIABLE = "LIFECYCLE_JOB_EXIT_MAX_RETRIES"
RETRY_DELAY_VARIABLE = "LIFECYCLE_JOB_EXIT_RETRY_DELAY"
USERLOG_FORMAT_VARIABLE = "LIFECYCLE_USERLOG_FORMAT_OPTIONS"
DIRECTORIES_VARIABLE = "LIFECYCLE_JOB_EXIT_DIRECTORIES"
EMAIL_DOMAIN_VARIABLE = "LIFECYCLE_EMAIL_DOMAIN"
UID_DOMAIN_VARIABLE = "LIFECYCLE_UID_DOMAIN"
RETIRED_VARIABLES = {"LIFECYCLE_JOB_EXIT_ATTEMPTS": MAX_RETRIES_VARIABLE}
DEFAULT_MAX_RETRIES = 5
DEFAULT_RETRY_DELAY = 30
HANDLER_TIMEOUT = 60.0

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_ID = 2**31 - 1
MAX_SECONDS = float(2**31 - 1)
"""The most seconds of CPU or wall time: what the user log's usage lines read back
(``ULogEvent::readRusageLine`` adds them up in a C ``int``)."""
EARLIEST = dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)
"""Times lie between these, so that a ClassAd date (seconds since the epoch, 0 meaning
"never") is positive and the user log's date has four digits of year in any time zone."""

Notification = Literal["Never", "Always", "Complete", "Error", "Start"]
_NOTIFICATIONS: tuple[str, ...] = ("Never", "Always", "Complete", "Error", "Start")

EXIT_FIELDS = ("exit_code", "exit_signal", "core_file", "remote_user_cpu", "remote_sys_cpu",
               "wall_clock", "image_size", "exited_at")
"""What the ``exited`` payload may carry: how the job ended and what it used."""


# -- settings --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    """How job exits are carried out (see :func:`settings_from_environment`)."""

    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries of a failed step after its first attempt (HTCondor's
    ``LOCAL_UNIVERSE_MAX_JOB_CLEANUP_RETRIES``): 5 means 6 attempts in all."""
    retry_delay: int = DEFAULT_RETRY_DELAY
    """Seconds between attempts, without jitter (``LOCAL_UNIVERSE_JOB_CLEANUP_RETRY_DELAY``)."""
    userlog_format: htcondor.UserLogFormat = field(default_factory=htcondor.UserLogFormat)
    directories: tuple[str, ...] = ()
    """When not empty, user logs and output ads must lie under one of these directories."""
    email_domain: str | None = None
    """HTCondor's ``EMAIL_DOMAIN``: the domain of a recipient given without one."""
    uid_domain: str | None = None
    """HTCondor's ``UID_DOMAIN`` (its default is the submit host's full name, which is what
    lifecycle uses when this is not set)."""

    @property
    def retry(self) -> Retry:
        return Retry(max_attempts=self.max_retries + 1, base=float(self.retry_delay),
                     cap=float(self.retry_delay), jitter=0.0)


def settings_from_environment(environ: Mapping[str, str] | None = None) -> Settings:
    """The job exit's settings, every one of them read here:

    - ``LIFECYCLE_JOB_EXIT_MAX_RETRIES`` (default 5) and ``LIFECYCLE_JOB_EXIT_RETRY_DELAY``
      (default 30): whole numbers, at least 0, with the meaning of HTCondor's
      ``LOCAL_UNIVERSE_MAX_JOB_CLEANUP_RETRIES`` and ``..._RETRY_DELAY``;
    - ``LIFECYCLE_USERLOG_FORMAT_OPTIONS``: as HTCondor's ``DEFAULT_USERLOG_FORMAT_OPTIONS``
      (``ISO_DATE``, ``UTC``, ``SUB_SECOND``, ``LEGACY``; default ISO date in local time);
    - ``LIFECYCLE_JOB_EXIT_DIRECTORIES``: absolute directories separated by ``:``; when set,
      every user log and output ad must lie under one of them;
    - ``LIFECYCLE_EMAIL_DOMAIN`` and ``LIFECYCLE_UID_DOMAIN``: HTCondor's ``EMAIL_DOMAIN``
      and ``UID_DOMAIN``, the domain a recipient without one is given.
    """
    env = os.environ if environ is None else environ
    for retired, current in RETIRED_VARIABLES.items():
        if env.get(retired, "").strip():
            raise InvalidInput(f"{retired} is no longer read: set {current}, the retries "
                                 "after the first attempt (as HTCondor counts them)")
    return Settings(
        max_retries=_whole(env, MAX_RETRIES_VARIABLE, DEFAULT_MAX_RETRIES),
        retry_delay=_whole(env, RETRY_DELAY_VARIABLE, DEFAULT_RETRY_DELAY),
        userlog_format=_userlog_format(env),
        directories=_directories(env),
        email_domain=_domain(env, EMAIL_DOMAIN_VARIABLE),
        uid_domain=_domain(env, UID_DOMAIN_VARIABLE))


def _domain(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", raw):
        raise InvalidInput(f"{name}={raw!r} is not a domain name")
    return raw


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"\d{1,9}", raw):
        raise InvalidInput(f"{name}={raw!r} is not a whole number of at least 0 (HTCondor's "
                             "knob is an integer too)")
    return int(raw)


def _userlog_format(env: Mapping[str, str]) -> htcondor.UserLogFormat:
    raw = env.get(USERLOG_FORMAT_VARIABLE, "")
    try:
        return htcondor.UserLogFormat.parse(raw)
    except ValueError as exc:
        raise InvalidInput(f"{USERLOG_FORMAT_VARIABLE}: {exc}") from None


def _directories(env: Mapping[str, str]) -> tuple[str, ...]:
    found: list[str] = []
    for part in env.get(DIRECTORIES_VARIABLE, "").split(":"):
        if not part.strip():
            continue
        try:
            found.append(normalised_path(part, DIRECTORIES_VARIABLE))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    return tuple(found)


def normalised_path(value: str, what: str) -> str:
    """``value`` if it is an absolute path without control characters or ``..``, with ``.``
    components, repeated and trailing slashes taken out; ValueError otherwise."""
    _text(value, what)
    if _CONTROL.search(value):
        raise ValueError(f"{what} {value!r} contains a control character")
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} is not an absolute path")
    if ".." in value.split("/"):
        raise ValueError(f"{what} {value!r} contains '..': give the path without it")
    return "/" + posixpath.normpath(value).lstrip("/")


def _under(path: str, directories: tuple[str, ...]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in directories)


# -- data ------------------------------------------------------------------------------------


def _text(value: str, field: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} is not valid Unicode text") from None
    return value


def _seconds(default: float) -> Any:
    return Field(default, ge=0, le=MAX_SECONDS, allow_inf_nan=False, strict=True)


class JobExitData(BaseModel):
    """A job_exit resource's data: the job, set at creation, and its exit, merged from the
    ``exited`` payload. Numbers are strict (a string or a boolean is not a number), times
    are ISO 8601 with a zone between 1970-01-02 and 9999-12-30. Validated with the context
    ``{"key": KEY}`` (as the engine does), the key must be ``CLUSTER.PROC``."""

    model_config = ConfigDict(extra="forbid")

    cluster: int = Field(ge=0, le=_MAX_ID, strict=True)
    proc: int = Field(ge=0, le=_MAX_ID, strict=True)
    owner: str = Field(strict=True)
    cmd: str = Field(strict=True)
    submit_host: str = Field(strict=True)
    userlog: str | None = Field(None, strict=True)
    output_ad: str | None = Field(None, strict=True)
    notify_user: str | None = Field(None, strict=True)
    notification: Notification = "Never"
    success_exit_code: int = Field(0, ge=0, le=255, strict=True)
    submitted_at: dt.datetime | None = None
    """When the job was submitted (``QDate``), if known."""
    started_at: dt.datetime | None = None
    """When the job started (``JobStartDate``), if known."""
    step_order: Literal["report", "today"] = "report"
    """``report`` (the default): (a) the user log, (b) the output ad, (c) the queue, (d)
    the mail, the order the report describes; ``today``: (a), (c), (d), (b), the order of
    today's starter (``JICLocalSchedd::notifyJobExit`` writes the output ad last). The
    default writes the output ad before the queue says Completed, so whatever waits on
    the queue (or the mail) finds the ad of this run in place."""
    ad: dict[str, bool | int | float | str] = Field(default_factory=dict)
    """The rest of the job's ad as the schedd has it (``Iwd``, ``Arguments``,
    ``JobBatchName``, ``EmailAttributes``, ``UidDomain``, the ``RemoteWallClockTime`` of
    earlier runs ...): appended whole to the output ad, and read for the mail. Every value
    must be one the old ClassAd syntax can hold."""
    # the exit (EXIT_FIELDS): exit_code, or exit_signal with an optional core_file
    exit_code: int | None = Field(None, ge=0, le=255, strict=True)
    exit_signal: int | None = Field(None, ge=1, le=64, strict=True)
    core_file: str | None = Field(None, strict=True)
    remote_user_cpu: float = _seconds(0.0)
    remote_sys_cpu: float = _seconds(0.0)
    wall_clock: float = _seconds(0.0)
    image_size: int = Field(0, ge=0, le=_MAX_ID, strict=True)
    """The job's virtual image size in KiB (``ImageSize``)."""
    exited_at: dt.datetime | None = None
    """When the job exited; when the payload does not say, the time step (a) first ran."""

    @field_validator("owner", "cmd")
    @classmethod
    def _plain_text(cls, value: str, info: ValidationInfo) -> str:
        problem = htcondor.old_syntax_problem(value)
        if problem is not None:  # the output ad would not read back, or would gain lines
            raise ValueError(f"{info.field_name} {value!r} {problem}: the output ad (old "
                             "ClassAd syntax) cannot hold it")
        return _text(value, str(info.field_name))

    @field_validator("submit_host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value or _CONTROL.search(value) or " " in value:
            raise ValueError(f"submit_host {value!r} is not a host name")
        return _text(value, "submit_host")

    @field_validator("userlog", "output_ad")
    @classmethod
    def _file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = normalised_path(value, str(info.field_name))
        directories = _directories(os.environ)  # the one setting that bears on data
        if directories and not _under(path, directories):
            raise ValueError(f"{info.field_name} {path!r} is outside the directories "
                             f"{DIRECTORIES_VARIABLE} allows ({':'.join(directories)})")
        return path

    @field_validator("ad")
    @classmethod
    def _old_syntax(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"ad: {name!r} is not a ClassAd attribute name")
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"ad: {name} = {item!r} is not a finite number")
            problem = htcondor.old_syntax_problem(item) if isinstance(item, str) else None
            if problem is not None:
                raise ValueError(f"ad: {name} = {item!r} {problem}: the output ad (old "
                                 "ClassAd syntax) cannot hold it")
        return value

    @field_validator("core_file")
    @classmethod
    def _core_file(cls, value: str | None) -> str | None:
        if value is not None:
            _text(value, "core_file")
            if _CONTROL.search(value):
                raise ValueError(f"core_file {value!r} contains a control character")
        return value

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

    @field_validator("submitted_at", "started_at", "exited_at", mode="before")
    @classmethod
    def _iso_time(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not isinstance(value, str | dt.datetime):
            raise ValueError(f"{info.field_name} must be an ISO 8601 time with a zone (e.g. "
                             f"2026-12-02T10:01:00Z), not {type(value).__name__} {value!r}")
        return value

    @field_validator("submitted_at", "started_at", "exited_at")
    @classmethod
    def _bounded(cls, value: dt.datetime | None, info: ValidationInfo) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"{info.field_name} needs a time zone (e.g. 2026-12-02T10:01:00Z)")
        try:
            inside = EARLIEST <= value.astimezone(dt.UTC) <= LATEST
        except (OverflowError, ValueError):
            inside = False
        if not inside:
            raise ValueError(f"{info.field_name} {value.isoformat()} is outside what the user "
                             f"log and ClassAds can hold ({EARLIEST:%Y-%m-%d} to "
                             f"{LATEST:%Y-%m-%d}, UTC)")
        return value

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> JobExitData:
        key = info.context.get("key") if isinstance(info.context, dict) else None
        if key is not None and key != f"{self.cluster}.{self.proc}":
            raise ValueError(f"the key {key!r} is not this job's id {self.cluster}.{self.proc}: "
                             "a job_exit resource's key is CLUSTER.PROC of its data")
        if self.exit_code is not None and self.exit_signal is not None:
            raise ValueError("give exit_code (a normal exit) or exit_signal (killed by a "
                             "signal), not both")
        if self.core_file is not None and self.exit_signal is None:
            raise ValueError("core_file goes with exit_signal: only a job killed by a "
                             "signal leaves a core")
        order = [(n, t) for n, t in (("submitted_at", self.submitted_at),
                                     ("started_at", self.started_at),
                                     ("exited_at", self.exited_at)) if t is not None]
        for (first, earlier), (then, later) in itertools.pairwise(order):
            if later < earlier:
                raise ValueError(f"{then} {later.isoformat()} is before {first} "
                                 f"{earlier.isoformat()}")
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
            wall_clock=self.wall_clock, image_size=self.image_size,
            submitted_at=self.submitted_at, started_at=self.started_at, job_ad=self.ad)

    def wants_mail(self) -> bool:
        """HTCondor's rule for a job that exited (``Email::shouldSend``): Never and Start
        send none, Always and Complete one, Error one for a signal, a core dump, or an exit
        code other than ``success_exit_code``."""
        if self.notification in ("Never", "Start"):
            return False
        if self.notification in ("Always", "Complete"):
            return True
        return (self.exit_signal is not None or self.core_file is not None
                or (self.exit_code or 0) != self.success_exit_code)

    def recipient(self, settings: Settings) -> str:
        """``notify_user``, else the owner; without a domain, as ``email_check_domain``
        gives one: ``EMAIL_DOMAIN``, else the ad's ``UidDomain``, else ``UID_DOMAIN``
        (whose default is the submit host's name)."""
        address = self.notify_user or self.owner
        if "@" in address:
            return address
        ad_domain = self.ad.get("UidDomain")
        domain = (settings.email_domain or (ad_domain if isinstance(ad_domain, str)
                                            and ad_domain else None)
                  or settings.uid_domain or self.submit_host)
        return f"{address}@{domain}"


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
         "guards": ["exit_fields_only", "exit_status_given", "key_is_job_id"],
         "effects": [{"name": "write_terminated_event", "on_failure": "gave_up"}],
         "ref": "docs/incidents.md: what HTCondor does today",
         "description": "the job exited (exit_code, or exit_signal with core_file); the "
                        "payload carries the exit fields and nothing else"},
        {"trigger": "userlog_written", "source": ["writing_userlog", "stuck_userlog"],
         "dest": "writing_output_ad", "guards": ["exit_time_only"],
         "unless": ["todays_order"],
         "effects": [{"name": "write_output_ad", "on_failure": "gave_up"}],
         "ref": "exit step (a)",
         "description": "the 005 event is in the user log (the payload: the exit time it "
                        "recorded)"},
        {"trigger": "userlog_written", "source": ["writing_userlog", "stuck_userlog"],
         "dest": "updating_queue", "guards": ["exit_time_only", "todays_order"],
         "effects": [{"name": "update_job_queue", "on_failure": "gave_up"}],
         "ref": "exit step (a); jic_local_schedd.cpp notifyJobExit",
         "description": "the 005 event is in the user log; today's starter updates the "
                        "queue next"},
        {"trigger": "output_ad_written", "source": ["writing_output_ad", "stuck_output_ad"],
         "dest": "updating_queue", "merge_payload": False, "unless": ["todays_order"],
         "effects": [{"name": "update_job_queue", "on_failure": "gave_up"}],
         "ref": "exit step (b)",
         "description": "the output ad is written"},
        {"trigger": "output_ad_written", "source": ["writing_output_ad", "stuck_output_ad"],
         "dest": "done", "merge_payload": False, "guards": ["todays_order"],
         "ref": "exit step (b), today's starter's last",
         "description": "the output ad is written, last"},
        {"trigger": "queue_updated", "source": ["updating_queue", "stuck_queue"],
         "dest": "emailing", "guards": ["notification_wanted"], "merge_payload": False,
         "effects": [{"name": "send_job_notification", "on_failure": "gave_up"}],
         "ref": "exit step (c)",
         "description": "the queue holds the job as Completed; its notification asks "
                        "for mail"},
        {"trigger": "queue_updated", "source": ["updating_queue", "stuck_queue"],
         "dest": "done", "unless": ["notification_wanted", "todays_order"],
         "merge_payload": False, "ref": "exit step (c)",
         "description": "the queue holds the job as Completed; no mail is asked for"},
        {"trigger": "queue_updated", "source": ["updating_queue", "stuck_queue"],
         "dest": "writing_output_ad", "guards": ["todays_order"],
         "unless": ["notification_wanted"], "merge_payload": False,
         "effects": [{"name": "write_output_ad", "on_failure": "gave_up"}],
         "ref": "exit step (c)",
         "description": "the queue holds the job as Completed; no mail is asked for: the "
                        "output ad next"},
        {"trigger": "email_sent", "source": ["emailing", "stuck_email"], "dest": "done",
         "merge_payload": False, "unless": ["todays_order"], "ref": "exit step (d)",
         "description": "the notification mail was accepted"},
        {"trigger": "email_sent", "source": ["emailing", "stuck_email"],
         "dest": "writing_output_ad", "merge_payload": False, "guards": ["todays_order"],
         "effects": [{"name": "write_output_ad", "on_failure": "gave_up"}],
         "ref": "exit step (d)",
         "description": "the notification mail was accepted: the output ad next"},
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


def _only(context: GuardContext, allowed: tuple[str, ...], trigger: str) -> bool:
    extra = sorted(set(context.payload) - set(allowed))
    if extra:
        raise ValueError(f"the {trigger} payload carries {', '.join(map(repr, extra))}, which "
                         f"it may not: it carries only {', '.join(allowed)}")
    return True


def exit_fields_only(context: GuardContext) -> bool:
    """The ``exited`` payload carries the exit fields and nothing else: raises, naming the
    field, for any other (a payload must not change which job exits, who is mailed or which
    files are written), so that the fire is refused and nothing changes."""
    return _only(context, EXIT_FIELDS, "exited")


def exit_time_only(context: GuardContext) -> bool:
    """``userlog_written`` carries at most the exit time step (a) recorded."""
    return _only(context, ("exited_at",), "userlog_written")


def exit_status_given(context: GuardContext) -> bool:
    """The ``exited`` payload says how the job ended."""
    return (context.payload.get("exit_code") is not None
            or context.payload.get("exit_signal") is not None)


def key_is_job_id(context: GuardContext) -> bool:
    """The resource's key is its job id, ``CLUSTER.PROC`` (a resource created before keys
    were checked at creation may have another)."""
    return context.key == f"{context.data.get('cluster')}.{context.data.get('proc')}"


def todays_order(context: GuardContext) -> bool:
    """The job's ``step_order`` is ``today``: (a), (c), (d), then (b)."""
    return context.data.get("step_order") == "today"


def notification_wanted(context: GuardContext) -> bool:
    """The job's ``notification`` asks for mail about this exit."""
    return JobExitData.model_validate(context.data).wants_mail()


GUARDS = {"exit_fields_only": exit_fields_only, "exit_time_only": exit_time_only,
          "exit_status_given": exit_status_given, "key_is_job_id": key_is_job_id,
          "notification_wanted": notification_wanted, "todays_order": todays_order}


# -- effect handlers -------------------------------------------------------------------------


class JobExitHandlers:
    """The four steps' handlers, talking to ``queue`` and ``mailer``."""

    def __init__(self, queue: JobQueue, mailer: smtp.Mailer, clock: Clock,
                 settings: Settings) -> None:
        self.queue = queue
        self.mailer = mailer
        self.clock = clock
        self.settings = settings

    def _job(self, call: EffectCall) -> JobExitData:
        try:
            return JobExitData.model_validate(call.data, context={"key": call.key})
        except ValidationError as exc:
            detail = "; ".join(str(e["msg"]) for e in exc.errors())
            raise PermanentError(f"job {call.key}: its data is not valid here: {detail}") from None

    @staticmethod
    def _exited_at(job: JobExitData) -> dt.datetime:
        if job.exited_at is not None:
            return job.exited_at
        raise PermanentError(f"job {job.job_id}: its exit time is unknown (step (a) records "
                             "it); was the resource moved by hand?")

    def _writable(self, job: JobExitData, path: str) -> None:
        """Refuse a file that resolves (through symbolic links) outside the configured
        directories, or that exists and is not a regular file."""
        directories = self.settings.directories
        if directories and not _under(os.path.realpath(path),
                                      tuple(os.path.realpath(d) for d in directories)):
            raise PermanentError(f"job {job.job_id}: {path} resolves to "
                                 f"{os.path.realpath(path)}, outside {DIRECTORIES_VARIABLE}")
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISREG(mode):
            raise PermanentError(f"job {job.job_id}: {path} is not a regular file")

    def write_terminated_event(self, call: EffectCall) -> FollowUp:
        """(a) Append the 005 event to the user log, exactly once (verified append). The
        exit time and the event's bytes are decided once and kept across attempts."""
        job = self._job(call)
        payload: dict[str, Any] = {}
        exited_at = job.exited_at
        if exited_at is None:
            saved = call.progress.get("exited_at")
            if isinstance(saved, str):
                exited_at = dt.datetime.fromisoformat(saved)
            else:
                exited_at = self.clock.now()
                call.save_progress({"exited_at": exited_at.isoformat()})
            payload["exited_at"] = exited_at.isoformat()
        if job.userlog is not None:
            self._writable(job, job.userlog)
            saved_event = call.progress.get("event")
            if isinstance(saved_event, str):
                event = saved_event.encode("utf-8")
            else:
                event = htcondor.terminated_event(job.termination(exited_at),
                                                  self.settings.userlog_format)
                call.save_progress({"event": event.decode("utf-8")})
            if not verified_append(call, job.userlog, event, name="userlog"):
                log.info("job %s: the terminate event was already in %s", job.job_id,
                         job.userlog)
        return FollowUp("userlog_written", payload)

    def write_output_ad(self, call: EffectCall) -> FollowUp:
        """(b) Append the job's final ad to the output ad file in the old syntax, as the
        starter does, exactly once (verified append; the bytes are kept across attempts)."""
        job = self._job(call)
        if job.output_ad is not None:
            self._writable(job, job.output_ad)
            saved = call.progress.get("output_ad")
            if isinstance(saved, str):
                record = saved.encode("utf-8")
            else:
                try:
                    record = htcondor.output_ad(job.termination(self._exited_at(job)))
                except ValueError as exc:
                    raise PermanentError(f"job {job.job_id}: no output ad written: {exc}") \
                        from None
                call.save_progress({"output_ad": record.decode("utf-8")})
            if not verified_append(call, job.output_ad, record, name="output_ad_offset"):
                log.info("job %s: the output ad was already in %s", job.job_id, job.output_ad)
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
        subject, body = htcondor.notification_text(end, self.clock.now())
        recipient = job.recipient(self.settings)
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


def retry_from_environment() -> Retry:
    """HTCondor's retries: 5 after the first attempt, 30 s apart, no jitter; or as set."""
    return settings_from_environment().retry


def make(*, queue: JobQueue | None = None, mailer: smtp.Mailer | None = None,
         retry: Retry | None = None, timeout: float | None = HANDLER_TIMEOUT,
         clock: Clock | None = None, settings: Settings | None = None) -> Builtin:
    """The machine with its handlers bound to ``queue`` (default: the job queue in
    lifecycle's database) and ``mailer`` (default: SMTP at ``$LIFECYCLE_SMTP_URL``).
    ``settings`` default to :func:`settings_from_environment`; ``retry`` (default: theirs)
    applies to every step; ``timeout`` abandons an attempt that hangs."""
    chosen = settings or settings_from_environment()
    handlers = JobExitHandlers(queue or DatabaseJobQueue(), mailer or smtp.SmtpMailer(),
                               clock or SystemClock(), chosen)
    policy = retry or chosen.retry
    effects: Mapping[str, Effect] = {
        name: Effect(getattr(handlers, name), policy, timeout=timeout)
        for name in ("write_terminated_event", "write_output_ad", "update_job_queue",
                     "send_job_notification")}
    return Builtin(
        spec=SPEC, guards=GUARDS, effects=effects, migrations=MIGRATIONS,
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
    """For scenario files: the queue in the scenario's database, a mailer that records, and
    HTCondor's default retries (6 attempts, 30 s apart)."""
    machine = make(queue=_ScenarioQueue(world), mailer=_ScenarioMailer(world),
                   settings=Settings(), clock=world.clock)
    return machine.guards, machine.effects, {}


BUILTIN = replace(make(), simulation=_simulation)
