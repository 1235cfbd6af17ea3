"""A plugin for the worker fault tests (``LIFECYCLE_PLUGINS=procs.gated``): the handler of
``work`` appends ``start KEY ATTEMPT`` and ``end KEY ATTEMPT`` to $GATED_CALLS, waits while
$GATED_GATE exists, and then for $GATED_SECONDS more. Its follow-up's writes, in the
transaction that records the effect done, append ``writing KEY ATTEMPT`` and, for the key
$GATED_HOLD_KEY, wait while $GATED_HOLD exists (that transaction held open)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from lifecycle import Effect, EffectCall, FollowUp

SPEC = {
    "name": "gated", "initial": "idle", "final": ["done"],
    "states": ["idle", "working", "done"],
    "transitions": [
        {"trigger": "go", "source": "idle", "dest": "working", "effects": ["work"]},
        {"trigger": "finished", "source": "working", "dest": "done"},
    ],
}


def _note(line: str) -> None:
    # one write of a whole line to a file opened for appending: lines of concurrent
    # handlers (and processes) never interleave
    descriptor = os.open(os.environ["GATED_CALLS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(descriptor, f"{line}\n".encode())
    finally:
        os.close(descriptor)


def _work(call: EffectCall) -> FollowUp:
    _note(f"start {call.key} {call.attempt}")
    gate = Path(os.environ.get("GATED_GATE", "/nonexistent"))
    while gate.exists():
        time.sleep(0.02)
    time.sleep(float(os.environ.get("GATED_SECONDS", "0")))
    _note(f"end {call.key} {call.attempt}")
    return FollowUp("finished", writes=lambda tx: _writing(call))


def _writing(call: EffectCall) -> None:
    _note(f"writing {call.key} {call.attempt}")
    hold = Path(os.environ.get("GATED_HOLD", "/nonexistent"))
    while call.key == os.environ.get("GATED_HOLD_KEY") and hold.exists():
        time.sleep(0.02)


effects = {"work": Effect(_work, timeout=600.0)}


def calls(path: Path) -> list[tuple[str, str, int]]:
    """(start or end, key, attempt) of every line written so far."""
    if not path.exists():
        return []
    return [(what, key, int(attempt)) for what, key, attempt in
            (line.split() for line in path.read_text().splitlines())]
