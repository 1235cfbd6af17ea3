"""The pid of a worker script started through the session's fork server (tests/zygote.py):
the client's pid (``Popen.pid``) is not the command's, and a test that stops, kills or
signals the worker by its pid must name the worker's own."""

from __future__ import annotations

import subprocess


def said_pid(process: subprocess.Popen[str]) -> int:
    """The pid the script says first on its stdout (``pid N``); the same as the client's
    where the client ran the real program instead (it exec'd it)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("pid "), f"the worker did not say its pid: {line!r}"
    return int(line.split()[1])
