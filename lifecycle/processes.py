"""Who holds a claim, and whether that process is certainly gone.

A worker writes its process's identity beside each claim it takes: the host's boot id, its
PID namespace, its pid and the process's start time. Another worker on the same host (same
boot, same PID namespace) can then tell for certain that the claimant died (its pid is gone,
is a zombie, or belongs to a process started later) and take the claim over at once instead
of waiting for the lease to run out. A claimant on another host, in another PID namespace or
on a system without ``/proc`` is never judged: its lease decides.

Losing a database connection is not dying: a claimant is judged by its process alone, so a
worker whose connections were cut keeps its claims and renews them when it reconnects.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink(PROC / "self" / "ns" / "pid")
    except OSError:
        return None


def _start_and_state(pid: int) -> tuple[str, str] | None:
    """A process's start time (clock ticks after boot) and state letter, or None if there is
    no such process. The command name in the second field may hold spaces and parentheses:
    the fields are counted after its last ')'."""
    stat = _read(PROC / str(pid) / "stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (fields[19], fields[0]) if len(fields) > 19 else None


def host_prefix() -> str | None:
    """``BOOT_ID/PID_NAMESPACE/`` of this process, or None where /proc cannot tell."""
    boot, namespace = _read(PROC / "sys" / "kernel" / "random" / "boot_id"), _pid_namespace()
    if not boot or not namespace:
        return None
    return f"{boot}/{namespace}/"


def this_process() -> str | None:
    """This process's identity, ``BOOT_ID/PID_NAMESPACE/PID/START``, or None where /proc
    cannot tell (the claim then lives by its lease alone)."""
    prefix, pid = host_prefix(), os.getpid()
    started = _start_and_state(pid)
    if prefix is None or started is None:
        return None
    return f"{prefix}{pid}/{started[0]}"


def is_gone(claimant: str, prefix: str | None = None) -> bool:
    """Whether the process ``claimant`` names has certainly ended: it ran on this host since
    its last boot, in this PID namespace, and its pid is free, a zombie's, or another
    process's. False whenever that cannot be known."""
    prefix = host_prefix() if prefix is None else prefix
    if not prefix or not claimant.startswith(prefix):
        return False
    try:
        pid_text, start = claimant[len(prefix):].split("/")
        pid = int(pid_text)
    except ValueError:
        return False
    found = _start_and_state(pid)
    return found is None or found[0] != start or found[1] in ("Z", "X")


__all__ = ["host_prefix", "is_gone", "this_process"]
