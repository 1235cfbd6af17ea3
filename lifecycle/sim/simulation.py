"""What a simulation is: a name, a summary, a run and its options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Simulation:
    name: str
    summary: str
    run: Callable[..., dict[str, Any]]
    """``run(seed=, progress=, **options) -> report``: a JSON-able report, the same for
    the same seed and options (but for its ``timing``), with ``measures``: a list of
    ``{"what", "before", "after"}``, the lines of the demo's table."""
    options: Mapping[str, tuple[type, Any, str]] = field(default_factory=dict)
    """name -> (type, default, help)"""
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Options for the quick run `lifecycle demo` makes."""
