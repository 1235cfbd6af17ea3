"""A plugin module for CLI tests: handlers for machines declared in spec files."""

from __future__ import annotations

import os
from pathlib import Path

from lifecycle import Effect, EffectCall, FollowUp, PermanentError, Retry


def _note(call: EffectCall) -> FollowUp:
    with Path(os.environ["PLUGIN_NOTES"]).open("a") as notes:
        notes.write(f"{call.key} {call.args}\n")
    return FollowUp("noted")


def _refuse(call: EffectCall) -> None:
    if not Path(os.environ["PLUGIN_NOTES"]).with_suffix(".allow").exists():
        raise PermanentError("the printer is on fire")


guards = {"urgent": lambda c: bool(c.payload.get("urgent"))}
effects = {"note": _note, "print": Effect(_refuse, Retry(max_attempts=1))}
