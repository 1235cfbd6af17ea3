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


def spec(*, guarded: bool = False, nested: bool = False) -> dict[str, Any]:
    """``nested``: ``a`` and ``b`` are parents of one leaf each (``a.x``, ``b.y``), and the
    resource, in a leaf, flips by its parent's edge (entering the other's initial child)."""
    guards = [GUARD] if guarded else []
    states: list[Any] = ["a", "b"]
    if nested:
        states = [{"name": "a", "initial": "x", "states": ["x"]},
                  {"name": "b", "initial": "y", "states": ["y"]}]
    return {
        "name": MACHINE,
        "states": states,
        "initial": "a",
        "transitions": [
            {"trigger": TRIGGER, "source": "a", "dest": "b", "guards": guards},
            {"trigger": TRIGGER, "source": "b", "dest": "a", "guards": guards},
        ],
    }


def other(state: str) -> str:
    return "b" if state == "a" else "a"
