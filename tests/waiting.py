"""Waiting in tests for an event, never for a time: ``until(condition, what)`` polls until the
condition holds, with a deadline only against a hang (a busy machine is slow, not wrong)."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
