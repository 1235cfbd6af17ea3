"""HTCondor's formats: the job event log ("user log") and ClassAds, and the text of a job's
notification mail, as HTCondor's own code writes them for a local-universe job.

- :func:`terminated_event`: a 005 "Job terminated" event as ``TerminatedEvent::formatBody``
  writes it (``src/condor_utils/condor_event.cpp``), with what the local-universe starter
  puts in it (``src/condor_starter.V6.1/local_user_log.cpp``): the job's CPU time in the
  "Run Local Usage" line, zero in the remote and total lines, zero bytes (a local job
  transfers no files). The header's date follows :class:`UserLogFormat`, HTCondor's
  ``DEFAULT_USERLOG_FORMAT_OPTIONS``: by default the ISO date in local time without a zone.
  ``htcondor2.JobEventLog`` reads it back.
- :func:`final_ad`: the job's whole ad with its exit written in, with the attributes and
  types of the real one (``ExitBySignal`` a boolean, ``ExitReason`` a string,
  ``JobDuration`` a real, dates integers ...). :func:`output_ad` is what the starter appends
  to the output ad file: that ad in the old, line-based syntax (:func:`old_syntax`, which is
  ``sPrintAd``'s). The old syntax escapes only ``"``, so a control character or a backslash
  before a quote or at the end of a string would break it or add an attribute:
  :func:`old_syntax_problem` says so, and such a string is refused.
- :func:`notification_text`: subject and body of the job's mail as ``Email::sendExit``
  writes them (``src/condor_utils/email_cpp.cpp``, ``email.cpp``): the subject
  ``[Condor] Condor Job 42.0`` (``EMAIL_SUBJECT_PROLOG``), the job's command line, batch
  and directory, the figures at the time of the mail, the ``EmailAttributes`` block and
  the signature.

Pure functions: no I/O here.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


@functools.cache
def classads() -> Any:
    """``classad2``, HTCondor's ClassAd library (the optional extra
    lifecycle-fsm[htcondor]), or None without it: imported when first needed (an ad
    printed, a policy evaluated, a hook's output read), not by every command that loads
    the machines that use it."""
    try:
        import classad2  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - depends on the installation
        return None
    return classad2


UTC = dt.UTC

# JobStatus codes
IDLE, RUNNING, REMOVED, COMPLETED, HELD, TRANSFERRING_OUTPUT, SUSPENDED = 1, 2, 3, 4, 5, 6, 7
JOB_STATUS_NAMES = {IDLE: "Idle", RUNNING: "Running", REMOVED: "Removed",
                    COMPLETED: "Completed", HELD: "Held",
                    TRANSFERRING_OUTPUT: "Transferring Output", SUSPENDED: "Suspended"}
LOCAL_UNIVERSE = 12

JOB_TERMINATED = 5
EMAIL_SUBJECT_PROLOG = "[Condor] "

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ATTRIBUTE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ID = re.compile(r"^(\d+)\.(\d+)$")
_MAX_ID = 2**31 - 1

ClassAdValue = bool | int | float | str


class JobId(NamedTuple):
    """``CLUSTER.PROC``."""

    cluster: int
    proc: int

    @classmethod
    def parse(cls, text: str) -> JobId:
        match = _ID.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a job id: write CLUSTER.PROC, e.g. 42.0")
        cluster, proc = int(match.group(1)), int(match.group(2))
        if cluster > _MAX_ID or proc > _MAX_ID:
            raise ValueError(f"job id {text!r} is out of range (at most {_MAX_ID})")
        return cls(cluster, proc)

    def __str__(self) -> str:
        return f"{self.cluster}.{self.proc}"


@dataclass(frozen=True, slots=True)
class JobTermination:
    """How a job ended, and what HTCondor's exit records say about it. Exactly one of
    ``exit_code`` (a normal exit) and ``exit_signal`` (killed by a signal) is set;
    ``submitted_at`` (``QDate``) and ``started_at`` (``JobStartDate``) when known."""

    cluster: int
    proc: int
    owner: str
    cmd: str
    submit_host: str
    exited_at: dt.datetime
    exit_code: int | None = None
    exit_signal: int | None = None
    core_file: str | None = None
    remote_user_cpu: float = 0.0
    remote_sys_cpu: float = 0.0
    wall_clock: float = 0.0
    image_size: int = 0
    submitted_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    job_ad: Mapping[str, ClassAdValue] | None = None
    """The rest of the job's ad as the schedd has it (``Iwd``, ``Arguments``,
    ``JobBatchName``, ``EmailAttributes``, the ``RemoteWallClockTime`` of earlier runs ...)."""

    def __post_init__(self) -> None:
        if (self.exit_code is None) == (self.exit_signal is None):
            raise ValueError(f"job {self.job_id}: give exit_code or exit_signal, exactly one")
        for name in ("exited_at", "submitted_at", "started_at"):
            when = getattr(self, name)
            if when is not None and when.tzinfo is None:
                raise ValueError(f"job {self.job_id}: {name} {when} has no time zone")

    @property
    def job_id(self) -> JobId:
        return JobId(self.cluster, self.proc)

    @property
    def by_signal(self) -> bool:
        return self.exit_signal is not None

    @property
    def core_dumped(self) -> bool:
        return self.core_file is not None

    @property
    def completion_date(self) -> int:
        """Seconds since the epoch, as ClassAds keep times."""
        return int(self.exited_at.timestamp())


# -- the user log ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserLogFormat:
    """How an event header writes its date: HTCondor's ``DEFAULT_USERLOG_FORMAT_OPTIONS``.
    The default is HTCondor's: ``ISO_DATE`` in local time without a zone."""

    iso_date: bool = True
    utc: bool = False
    sub_second: bool = False

    @classmethod
    def parse(cls, text: str) -> UserLogFormat:
        """Options as HTCondor reads them (``ULogEvent::parse_opts``): names separated by
        commas or spaces, any case, ``!`` before one turns it off; ``LEGACY`` turns the
        three off (``MM/DD hh:mm:ss``, which has no year), ``!LEGACY`` turns ISO_DATE on.
        The XML and JSON formats are not offered; an unknown name is an error."""
        iso, utc, sub = True, False, False  # HTCondor's USERLOG_FORMAT_DEFAULT: ISO_DATE
        for token in re.split(r"[\s,]+", text.strip()):
            if not token:
                continue
            on = not token.startswith("!")
            name = token.lstrip("!").upper()
            if name == "ISO_DATE":
                iso = on
            elif name == "UTC":
                utc = on
            elif name == "SUB_SECOND":
                sub = on
            elif name == "LEGACY":
                if on:
                    iso = utc = sub = False
                else:
                    iso = True
            else:
                raise ValueError(f"{token!r} is not a user log format option; the options are "
                                 "ISO_DATE, UTC, SUB_SECOND and LEGACY, each may be "
                                 "negated with '!'")
        return cls(iso, utc, sub)


def event_time(when: dt.datetime, form: UserLogFormat = UserLogFormat()) -> str:
    """An event header's date as ``ULogEvent::formatHeader`` writes it: in local time (the
    process's time zone) or, with ``UTC``, in UTC followed by ``Z``."""
    moment = when.astimezone(UTC) if form.utc else when.astimezone()
    if form.iso_date:
        text = (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
                f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}")
    else:
        text = (f"{moment.month:02d}/{moment.day:02d} "
                f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}")
    if form.sub_second:
        text += f".{moment.microsecond // 1000:03d}"
    return text + ("Z" if form.utc else "")


def usage(seconds: float) -> str:
    """``D HH:MM:SS``, the user log's usage format (``ULogEvent::formatRusage``): whole
    seconds, the fraction cut off as the starter's ``(time_t)`` cast does."""
    total = int(max(0.0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days} {hours:02d}:{minutes:02d}:{secs:02d}"


def rusage_line(user: float, system: float) -> str:
    return f"Usr {usage(user)}, Sys {usage(system)}"


def terminated_event(end: JobTermination, form: UserLogFormat = UserLogFormat()) -> bytes:
    """The 005 "Job terminated" event of ``end``, closing ``...`` included. The job's CPU
    time is local usage (the local universe's starter runs the job on the submit machine);
    the remote and total lines and the byte counts are zero, as that starter writes them.
    A core file's path is written when known (HTCondor's shadow writes it for its jobs;
    the local starter does not know it and writes ``(0) No core file``)."""
    lines = [f"{JOB_TERMINATED:03d} ({end.cluster:03d}.{end.proc:03d}.000) "
             f"{event_time(end.exited_at, form)} Job terminated."]
    if end.exit_signal is None:
        lines.append(f"\t(1) Normal termination (return value {end.exit_code})")
    else:
        lines.append(f"\t(0) Abnormal termination (signal {end.exit_signal})")
        if end.core_file is None:
            lines.append("\t(0) No core file")
        else:
            if _CONTROL.search(end.core_file):
                raise ValueError(f"job {end.job_id}: core file path {end.core_file!r} has a "
                                 "control character, which would break the event log")
            lines.append(f"\t(1) Corefile in: {end.core_file}")
    zero = rusage_line(0, 0)
    lines += [f"\t\t{zero}  -  Run Remote Usage",
              f"\t\t{rusage_line(end.remote_user_cpu, end.remote_sys_cpu)}  -  Run Local Usage",
              f"\t\t{zero}  -  Total Remote Usage", f"\t\t{zero}  -  Total Local Usage"]
    lines += ["\t0  -  Run Bytes Sent By Job", "\t0  -  Run Bytes Received By Job",
              "\t0  -  Total Bytes Sent By Job", "\t0  -  Total Bytes Received By Job", "..."]
    return ("\n".join(lines) + "\n").encode("utf-8")


# -- ClassAds ------------------------------------------------------------------------------

IDENTITY_ATTRIBUTES = ("ClusterId", "ProcId", "Owner", "Cmd")
TERMINAL_ATTRIBUTES = (
    "JobStatus", "LastJobStatus", "ExitBySignal", "ExitCode", "ExitSignal", "ExitReason",
    "JobCoreDumped", "JobDuration", "CompletionDate", "EnteredCurrentStatus",
    "RemoteUserCpu", "RemoteSysCpu", "RemoteWallClockTime", "ImageSize",
)


def signal_name(number: int) -> str:
    """The C library's description of a signal (``strsignal``), as HTCondor prints it."""
    try:
        name = signal.strsignal(number)
    except ValueError:
        name = None
    return name or f"Unknown signal {number}"


def exit_reason(end: JobTermination) -> str | None:
    """``ExitReason`` as the starter sets it for a job killed by a signal
    (``UserProc::PublishUpdateAd``: "died on " and ``DaemonCore::GetExceptionString``);
    None for a normal exit, which has none."""
    if end.exit_signal is None:
        return None
    return f"died on signal {end.exit_signal} ({signal_name(end.exit_signal)})"


def terminal_attributes(end: JobTermination) -> dict[str, ClassAdValue]:
    """What a job's end sets in its ad: ``JobStatus = 4`` and the exit attributes, with the
    real ad's types. ``JobCoreDumped`` is set (true) only when the job dumped core, as the
    starter does (``OsProc::PublishUpdateAd``)."""
    attributes: dict[str, ClassAdValue] = {
        "JobStatus": COMPLETED,
        "LastJobStatus": RUNNING,
        "ExitBySignal": end.by_signal,
    }
    if end.exit_signal is None:
        assert end.exit_code is not None
        attributes["ExitCode"] = end.exit_code
    else:
        attributes["ExitSignal"] = end.exit_signal
        attributes["ExitReason"] = exit_reason(end) or ""
    if end.core_dumped:
        attributes["JobCoreDumped"] = True
    attributes.update({
        "JobDuration": float(end.wall_clock),
        "CompletionDate": end.completion_date,
        "EnteredCurrentStatus": end.completion_date,
        "RemoteUserCpu": float(end.remote_user_cpu),
        "RemoteSysCpu": float(end.remote_sys_cpu),
        "RemoteWallClockTime": earlier_runs(end) + float(end.wall_clock),
        "ImageSize": end.image_size,
    })
    return attributes


def earlier_runs(end: JobTermination) -> float:
    """The wall-clock seconds of the job's earlier runs: its ad's ``RemoteWallClockTime``
    before this run is added."""
    value = (end.job_ad or {}).get("RemoteWallClockTime", 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else 0.0


def final_ad(end: JobTermination) -> dict[str, ClassAdValue]:
    """The job's final ad: its whole ad with the exit written into it, as the starter's
    output ad holds it (identity and exit attributes are the exit's, whatever the ad
    said)."""
    ad: dict[str, ClassAdValue] = {**(end.job_ad or {}),
        "ClusterId": end.cluster, "ProcId": end.proc, "Owner": end.owner, "Cmd": end.cmd,
        "JobUniverse": LOCAL_UNIVERSE}
    if end.submitted_at is not None:
        ad["QDate"] = int(end.submitted_at.timestamp())
    if end.started_at is not None:
        ad["JobStartDate"] = int(end.started_at.timestamp())
    ad.update(terminal_attributes(end))
    return ad


def quote(value: str) -> str:
    """A ClassAd string literal (new syntax) that reads back as exactly ``value``."""
    out = ['"']
    for ch in value:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\x00":
            raise ValueError("a ClassAd string cannot hold a NUL character")
        elif ch < " " or ch == "\x7f":
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def literal(value: ClassAdValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a ClassAd real must be finite, not {value!r}")
        return repr(value)
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"no ClassAd literal for {type(value).__name__} {value!r}")


def old_syntax_problem(value: str) -> str | None:
    """Why the string ``value`` cannot be written in the old ClassAd syntax and read back
    unchanged, or None. The old syntax escapes ``"`` only: a control character (a newline
    would start another attribute) or a backslash before a quote or at the end breaks it."""
    if _CONTROL.search(value):
        return "contains a control character"
    if value.endswith("\\") or '\\"' in value:
        return "has a backslash before a quote or at its end"
    return None


def old_syntax(ad: Mapping[str, ClassAdValue | None]) -> str:
    """``ad`` in the old ClassAd syntax, one ``Name = value`` a line: with HTCondor's
    ClassAd library when it is installed (its unparser is ``sPrintAd``'s, byte for byte),
    else the same lines in the ad's order. A value :func:`old_syntax_problem` refuses
    raises ValueError: it would not read back (or would add an attribute)."""
    present = {k: v for k, v in ad.items() if v is not None}
    for name, value in present.items():
        if not _ATTRIBUTE.match(name):
            raise ValueError(f"{name!r} is not a ClassAd attribute name")
        problem = old_syntax_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise ValueError(f"{name} = {value!r} {problem}: the old ClassAd syntax cannot "
                             "hold it")
    classad2 = classads()
    if classad2 is not None:
        printed = str(classad2.ClassAd(present).printOld())
        return printed if printed.endswith("\n") or not printed else f"{printed}\n"
    return "".join(f"{name} = " + ('"' + value.replace('"', '\\"') + '"'
                                    if isinstance(value, str) else literal(value)) + "\n"
                   for name, value in present.items())


def output_ad(end: JobTermination) -> bytes:
    """What the starter appends to the job's output ad file at its exit
    (``JobInfoCommunicator::writeOutputAdFile``: ``fopen(..., "a")``, then ``fPrintAd``
    with no delimiter): the final ad in the old syntax. Two runs' ads follow each other
    with nothing between them, so a reader of the whole file sees one ad whose values are
    the last run's."""
    return old_syntax(final_ad(end)).encode("utf-8")


# -- the notification mail -------------------------------------------------------------------


def displayed(text: str) -> str:
    """``text`` with control characters shown as escapes, so that a command line cannot
    forge lines of a mail."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def duration(seconds: float) -> str:
    """``format_time``'s ``DDD+HH:MM:SS`` (days right-aligned in three columns), HTCondor's
    format for times in mail."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days:3d}+{hours:02d}:{minutes:02d}:{secs:02d}"


def ctime(when: dt.datetime) -> str:
    """C's ``ctime`` in local time (the process's time zone), without its newline:
    ``Wed Dec  2 10:01:00 2026``."""
    moment = when.astimezone()
    return f"{moment:%a %b} {moment.day:2d} {moment:%H:%M:%S} {moment.year}"


def exit_text(end: JobTermination) -> str:
    """``printExitString``: the exit reason for a signal, else the status."""
    reason = exit_reason(end)
    if reason is not None:
        return reason
    return f"exited normally with status {end.exit_code}"


SIGNATURE = ("\n\n-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=\n"
             "Questions about this message or HTCondor in general?\n"
             "The Official HTCondor Homepage is https://htcondor.org/\n")


def display_args(ad: Mapping[str, ClassAdValue]) -> str:
    """``ArgList::GetArgsStringForDisplay``: ``Arguments``, else ``Args``, else nothing."""
    for name in ("Arguments", "Args"):
        value = ad.get(name)
        if isinstance(value, str):
            return value
    return ""


def custom_attributes(ad: Mapping[str, ClassAdValue]) -> str:
    """``construct_custom_attributes``: for each attribute ``EmailAttributes`` names (a
    list split at commas and spaces) that the ad has, ``Name = value``, after a blank line
    pair; nothing when it names none."""
    names = ad.get("EmailAttributes")
    if not isinstance(names, str):
        return ""
    lines = [f"{name} = {literal(ad[name])}" for name in re.split(r"[\s,]+", names)
             if name and name in ad]
    return "\n\n" + "".join(f"{displayed(line)}\n" for line in lines) if lines else ""


def notification_text(end: JobTermination, now: dt.datetime) -> tuple[str, str]:
    """Subject and body of the job's notification mail at ``now``, as ``Email::sendExit``
    writes them (``writeJobId``, ``writeExit``, ``writeCustom``) for a local-universe job
    (no network section: a local job transfers nothing). As HTCondor's: "Completed at" and
    "Real Time" are taken when the mail is written, "Submitted at" is ``QDate`` (the epoch
    when unknown), the last run lasted from ``JobStartDate`` (the shadow's birthdate; 0
    when unknown) to now, and the total adds the ``RemoteWallClockTime`` of earlier runs.
    Dates are in local time, as ``ctime`` writes them. The subject holds nothing but the
    job id; strings from the job appear only in the body, escaped."""
    ad = end.job_ad or {}
    subject = f"{EMAIL_SUBJECT_PROLOG}Condor Job {end.cluster}.{end.proc}"
    cpu = int(end.remote_user_cpu + end.remote_sys_cpu)
    args = display_args(ad)
    lines = [
        "This is an automated email from the Condor system",
        f'on machine "{displayed(end.submit_host)}".  Do not reply.',
        "",
        f"Condor job {end.cluster}.{end.proc}",
        f"\t{displayed(end.cmd)}" + (f" {displayed(args)}" if args else ""),
    ]
    for name, words in (("JobBatchName", "from batch"), ("Iwd", "submitted from directory")):
        value = ad.get(name)
        if isinstance(value, str) and value:
            lines.append(f"\t{words} {displayed(value)}")
    lines.append(exit_text(end))
    if end.core_dumped:
        lines.append("Core file generated")
    submitted = int(end.submitted_at.timestamp()) if end.submitted_at is not None else 0
    mailed = int(now.timestamp())
    began = int(end.started_at.timestamp()) if end.started_at is not None else 0
    last_run = mailed - began if began else 0
    lines += [
        "", "",
        f"Submitted at:        {ctime(dt.datetime.fromtimestamp(submitted, UTC))}",
        f"Completed at:        {ctime(now)}",
        f"Real Time:           {duration(mailed - submitted)}",
        "",
        f"Virtual Image Size:  {end.image_size} Kilobytes",
        "",
        "Statistics from last run:",
        f"Allocation/Run time:     {duration(last_run)}",
        f"Remote User CPU Time:    {duration(end.remote_user_cpu)}",
        f"Remote System CPU Time:  {duration(end.remote_sys_cpu)}",
        f"Total Remote CPU Time:   {duration(cpu)}",
        "",
        "Statistics totaled from all runs:",
        f"Allocation/Run time:     {duration(earlier_runs(end) + last_run)}",
    ]
    return subject, "\n".join(lines) + "\n" + custom_attributes(ad) + SIGNATURE


__all__ = [
    "COMPLETED", "EMAIL_SUBJECT_PROLOG", "IDENTITY_ATTRIBUTES", "JOB_STATUS_NAMES",
    "LOCAL_UNIVERSE", "RUNNING", "TERMINAL_ATTRIBUTES", "ClassAdValue", "JobId",
    "JobTermination", "UserLogFormat", "ctime", "custom_attributes", "display_args",
    "duration", "earlier_runs", "event_time", "exit_reason", "final_ad",
    "notification_text", "old_syntax", "old_syntax_problem", "output_ad", "quote",
    "signal_name",
    "terminal_attributes", "terminated_event", "usage",
]
