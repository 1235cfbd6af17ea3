"""Waiting in tests for an event, never for a time: ``until(condition, what)`` polls until the
condition holds, with a deadline only against a hang (a busy machine is slow, not wrong)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO


def until(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def read_until(stream: IO[str], phrase: str, what: str) -> str:
    """The lines read from ``stream`` up to the first that holds ``phrase``; an end of the
    stream before it fails with ``what`` (the process ended without it) and what it said."""
    said = ""
    while phrase not in said:
        line = stream.readline()
        assert line, f"{what}: {said}"
        said += line
    return said
