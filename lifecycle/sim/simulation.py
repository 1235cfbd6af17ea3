"""What a simulation is: a name, a summary, a run and its options."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RANGES = {">0": "more than 0", ">=0": "0 or more", ">=1": "1 or more", "0..1": "from 0 to 1"}


class Option(NamedTuple):
    """An option of a simulation: its type, default and help, and for a number the values
    that make sense (a key of :data:`RANGES`; empty: any). A value out of range is refused
    before anything runs: a negative count or a zero interval would give an empty report or
    a loop that never ends, not an error."""

    kind: type
    default: Any
    help: str
    range: str = ""
    choices: tuple[str, ...] = ()

    def parse(self, raw: str) -> Any:
        """``raw`` as this option's value; ValueError saying what it takes."""
        if self.kind is bool:
            if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError("true or false")
            return raw.lower() in ("1", "true", "yes")
        if self.choices and raw not in self.choices:
            raise ValueError(f"one of {', '.join(self.choices)}")
        what = f"a{' finite' if self.kind is float else 'n'} {self.kind.__name__}"
        if self.range:
            what += f", {RANGES[self.range]}"
        try:
            value = self.kind(raw)
        except ValueError:
            raise ValueError(what) from None
        if self.kind is float and not math.isfinite(value):
            raise ValueError(what)
        low = {">0": 0, ">=0": 0, ">=1": 1, "0..1": 0}.get(self.range)
        if low is not None and (value < low or (self.range == ">0" and value == 0)
                                or (self.range == "0..1" and value > 1)):
            raise ValueError(what)
        return value


@dataclass(frozen=True)
class Simulation:
    name: str
    summary: str
    run: Callable[..., dict[str, Any]]
    """``run(seed=, progress=, **options) -> report``: a JSON-able report, the same for
    the same seed and options (but for its ``timing``), with ``measures``: a list of
    ``{"what", "before", "after"}``, the lines of the demo's table."""
    options: Mapping[str, Option] = field(default_factory=dict)
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Options for the quick run `lifecycle demo` makes."""
