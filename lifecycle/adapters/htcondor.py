"""HTCondor's formats: the job event log ("user log") and ClassAds, and the text of a job's
notification mail.

- :func:`terminated_event`: a 005 "Job terminated" event as HTCondor writes it (ISO date in
  UTC, normal or abnormal termination with the core file line, the four usage lines, the four
  byte lines, the closing ``...``), which ``htcondor2.JobEventLog`` reads back.
- :func:`format_ad`: a ClassAd in the new syntax (``[ Name = value; ... ]``). Strings are
  quoted with C-style escapes, so every value reads back unchanged with ``classad2`` and no
  value can add an attribute. (The old, line-based syntax cannot: it escapes only ``"``, so a
  newline or a trailing backslash in a string breaks it.)
- :func:`notification_text`: subject and body of the mail, like HTCondor's job notification.

Pure functions: no I/O here.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

UTC = dt.UTC

# JobStatus codes
IDLE, RUNNING, REMOVED, COMPLETED, HELD, TRANSFERRING_OUTPUT, SUSPENDED = 1, 2, 3, 4, 5, 6, 7
JOB_STATUS_NAMES = {IDLE: "Idle", RUNNING: "Running", REMOVED: "Removed",
                    COMPLETED: "Completed", HELD: "Held",
                    TRANSFERRING_OUTPUT: "Transferring Output", SUSPENDED: "Suspended"}

JOB_TERMINATED = 5

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
    ``exit_code`` (a normal exit) and ``exit_signal`` (killed by a signal) is set."""

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
    bytes_sent: int = 0
    bytes_received: int = 0

    def __post_init__(self) -> None:
        if (self.exit_code is None) == (self.exit_signal is None):
            raise ValueError(f"job {self.job_id}: give exit_code or exit_signal, exactly one")
        if self.exited_at.tzinfo is None:
            raise ValueError(f"job {self.job_id}: exited_at {self.exited_at} has no time zone")

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


def event_time(when: dt.datetime) -> str:
    """An event header's date: ISO, UTC, whole seconds, with ``Z`` so that readers in any
    time zone take it as UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def usage(seconds: float) -> str:
    """``D HH:MM:SS``, HTCondor's rusage and duration format."""
    total = int(max(0.0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days} {hours:02d}:{minutes:02d}:{secs:02d}"


def terminated_event(end: JobTermination) -> bytes:
    """The 005 "Job terminated" event of ``end``, closing ``...`` included."""
    lines = [f"{JOB_TERMINATED:03d} ({end.cluster:03d}.{end.proc:03d}.000) "
             f"{event_time(end.exited_at)} Job terminated."]
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
    remote = f"Usr {usage(end.remote_user_cpu)}, Sys {usage(end.remote_sys_cpu)}"
    local = f"Usr {usage(0)}, Sys {usage(0)}"
    lines += [f"\t\t{remote}  -  Run Remote Usage", f"\t\t{local}  -  Run Local Usage",
              f"\t\t{remote}  -  Total Remote Usage", f"\t\t{local}  -  Total Local Usage"]
    lines += [f"\t{end.bytes_sent}  -  Run Bytes Sent By Job",
              f"\t{end.bytes_received}  -  Run Bytes Received By Job",
              f"\t{end.bytes_sent}  -  Total Bytes Sent By Job",
              f"\t{end.bytes_received}  -  Total Bytes Received By Job", "..."]
    return ("\n".join(lines) + "\n").encode("utf-8")


# -- ClassAds ------------------------------------------------------------------------------

IDENTITY_ATTRIBUTES = ("ClusterId", "ProcId", "Owner", "Cmd")
TERMINAL_ATTRIBUTES = (
    "JobStatus", "LastJobStatus", "ExitBySignal", "ExitCode", "ExitSignal", "JobCoreDumped",
    "CompletionDate", "EnteredCurrentStatus", "RemoteUserCpu", "RemoteSysCpu",
    "RemoteWallClockTime", "BytesSent", "BytesRecvd",
)


def terminal_attributes(end: JobTermination) -> dict[str, ClassAdValue]:
    """What a job's end sets in its ad: ``JobStatus = 4`` and the exit attributes."""
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
    attributes.update({
        "JobCoreDumped": end.core_dumped,
        "CompletionDate": end.completion_date,
        "EnteredCurrentStatus": end.completion_date,
        "RemoteUserCpu": float(end.remote_user_cpu),
        "RemoteSysCpu": float(end.remote_sys_cpu),
        "RemoteWallClockTime": float(end.wall_clock),
        "BytesSent": float(end.bytes_sent),
        "BytesRecvd": float(end.bytes_received),
    })
    return attributes


def final_ad(end: JobTermination) -> dict[str, ClassAdValue]:
    """The job's final ad, as the output ad holds it."""
    return {"ClusterId": end.cluster, "ProcId": end.proc, "Owner": end.owner, "Cmd": end.cmd,
            **terminal_attributes(end)}


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


def format_ad(ad: Mapping[str, ClassAdValue]) -> bytes:
    """``ad`` in the new ClassAd syntax, one attribute a line: what ``classad2.parseOne``
    reads back with every value unchanged."""
    lines = ["["]
    for name, value in ad.items():
        if not _ATTRIBUTE.match(name):
            raise ValueError(f"{name!r} is not a ClassAd attribute name")
        lines.append(f"  {name} = {literal(value)};")
    lines.append("]")
    return ("\n".join(lines) + "\n").encode("utf-8")


# -- the notification mail -------------------------------------------------------------------


def displayed(text: str) -> str:
    """``text`` with control characters shown as escapes, so that a command line cannot
    forge lines of a mail."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def metric_units(count: float) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024.0 or unit == "TB":
            return f"{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def exit_text(end: JobTermination) -> str:
    if end.exit_signal is not None:
        return f"died on signal {end.exit_signal}"
    return f"exited normally with status {end.exit_code}"


def notification_text(end: JobTermination) -> tuple[str, str]:
    """Subject and body of the job's notification mail, like HTCondor's. The subject holds
    nothing but the job id; strings from the job appear only in the body, escaped."""
    subject = f"Condor Job {end.cluster}.{end.proc}"
    cpu = end.remote_user_cpu + end.remote_sys_cpu
    when = end.exited_at.astimezone(UTC).strftime("%a %b %d %H:%M:%S %Y UTC")
    lines = [
        "This is an automated email from the Condor system",
        f'on machine "{displayed(end.submit_host)}".  Do not reply.',
        "",
        f"Condor job {end.cluster}.{end.proc}",
        f"\t{displayed(end.cmd)}",
        exit_text(end),
    ]
    if end.core_file is not None:
        lines.append(f"Core file is: {displayed(end.core_file)}")
    lines += [
        "",
        "",
        f"Completed at:        {when}",
        f"Real Time:           {usage(end.wall_clock)}",
        "",
        "Statistics from last run:",
        f"Allocation/Run time:     {usage(end.wall_clock)}",
        f"Remote User CPU Time:    {usage(end.remote_user_cpu)}",
        f"Remote System CPU Time:  {usage(end.remote_sys_cpu)}",
        f"Total Remote CPU Time:   {usage(cpu)}",
        "",
        "Network:",
        f"{metric_units(end.bytes_received):>10} Run Bytes Received By Job",
        f"{metric_units(end.bytes_sent):>10} Run Bytes Sent By Job",
    ]
    return subject, "\n".join(lines) + "\n"


__all__ = [
    "COMPLETED", "IDENTITY_ATTRIBUTES", "JOB_STATUS_NAMES", "RUNNING", "TERMINAL_ATTRIBUTES",
    "ClassAdValue", "JobId", "JobTermination", "event_time", "final_ad", "format_ad",
    "notification_text", "quote", "terminal_attributes", "terminated_event", "usage",
]
