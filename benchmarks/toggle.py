"""The machine every case runs: two states, ``a`` and ``b``, and ``flip`` between them."""

from __future__ import annotations

from typing import Any

from lifecycle import GuardContext

MACHINE = "toggle"
KEY = "r-1"
TRIGGER = "flip"
GUARD = "enabled"


def enabled(context: GuardContext) -> bool:
    """The one guard of the guarded variant: as cheap as a guard gets, so the numbers show
    the machinery that calls it."""
    return context.version > 0


def spec(*, guarded: bool = False) -> dict[str, Any]:
    guards = [GUARD] if guarded else []
    return {
        "name": MACHINE,
        "states": ["a", "b"],
        "initial": "a",
        "transitions": [
            {"trigger": TRIGGER, "source": "a", "dest": "b", "guards": guards},
            {"trigger": TRIGGER, "source": "b", "dest": "a", "guards": guards},
        ],
    }


def other(state: str) -> str:
    return "b" if state == "a" else "a"
